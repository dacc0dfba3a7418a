"""Dynamic shapes, attention over symbolic sequence lengths: a forward ``sdpa`` whose Sq and / or
Skv are symbols (a prefill whose prompt length ranges over 1..8192, a decode whose key length
grows) compiles once for the range. On the CPU: the lowering (a prefill grid of ceil(Sq / rows
per block) row blocks per (head, sequence) computed at launch, the Hopper kernel's item count
from its EXTENT argument and its Q/K/V maps' sequence dims and strides encoded per call; a
decode variant per range of Skv sharing the static plans' KV split), the refusals naming the
node and symbols, the signature, NVRTC for sm_80 and sm_90(a), the flash and decode kernels run
by tests/cpu_emulation.py against the reference at lengths off the tiles, and the dynamic graph's
reference against the static one's; the `gpu` tests run one plan per kernel path at lengths 1,
17, 129, 1000 and the maximum."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from codegen import emit_partition
from codegen.kernel import strip_header
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.program import ArgKind, GridExtent
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from graphdnn.specialize import specialize
from tests import cpu_emulation
from tests.attention_cases import AttentionCase

CAUSAL = {"use_causal_mask": True}
BOTTOM_RIGHT = {"use_causal_mask_bottom_right": True}
# Each case, the kernel sm_90 gives it by default (sm_80: flash for wgmma) and the lengths the
# GPU test runs it at (sq, skv or seq).
DYNAMIC: dict[str, tuple[AttentionCase, str, list[dict[str, int]]]] = {
    "decode_gqa_d128": (
        AttentionCase(b=3, hq=16, hk=4, sq=1, skv_max=4100, d=128, dv=128), "decode_mma",
        [{"skv": n} for n in (1, 17, 129, 1000, 4100)],
    ),
    "decode_bshd_d64_padded": (
        AttentionCase(b=2, hq=8, hk=1, sq=1, skv_max=2000, d=64, dv=64, layout="bshd", padding=True), "decode_mma",
        [{"skv": n} for n in (1, 129, 1999)],
    ),
    "decode_fp32_two_rows_bottom_right": (
        AttentionCase(b=2, hq=8, hk=2, sq=2, skv_max=700, d=64, dv=64, data_type=DataType.FLOAT, options=BOTTOM_RIGHT),
        "decode", [{"skv": n} for n in (1, 17, 129, 700)],
    ),
    "prefill_causal_d128": (
        AttentionCase(b=2, hq=4, hk=4, one_length=True, sq_max=1100, d=128, dv=128, options=CAUSAL), "wgmma",
        [{"seq": n} for n in (1, 17, 129, 1000, 1100)],
    ),
    "prefill_gqa_causal_d64_bshd": (
        AttentionCase(b=2, hq=8, hk=2, one_length=True, sq_max=700, layout="bshd", options=CAUSAL), "wgmma",
        [{"seq": n} for n in (1, 17, 129, 700)],
    ),
    "prefill_bottom_right_two_lengths": (
        AttentionCase(b=2, hq=4, hk=2, sq_max=300, skv_max=400, options=BOTTOM_RIGHT), "wgmma",
        [{"sq": 1, "skv": 17}, {"sq": 129, "skv": 17}, {"sq": 300, "skv": 400}, {"sq": 17, "skv": 1}],
    ),
    "prefill_padding_window": (
        AttentionCase(
            b=3, hq=4, hk=2, one_length=True, sq_max=600, padding=True,
            options={"use_causal_mask": True, "sliding_window_length": 100},
        ),
        "wgmma", [{"seq": n} for n in (1, 129, 600)],
    ),
    "prefill_bias_alibi": (
        AttentionCase(
            b=2, hq=6, hk=3, one_length=True, sq_max=300, bias=(False, True, True, True),
            options={"use_causal_mask": True, "use_alibi_mask": True},
        ),
        "wgmma", [{"seq": n} for n in (1, 17, 300)],
    ),
    "prefill_flash_d72": (
        AttentionCase(b=2, hq=4, hk=2, one_length=True, sq_max=400, d=72, dv=40, options=CAUSAL), "flash",
        [{"seq": n} for n in (1, 17, 129, 400)],
    ),
    "prefill_batch_and_seq_gqa_causal": (
        AttentionCase(hq=8, hk=2, batch_max=5, one_length=True, sq_max=600, options=CAUSAL), "wgmma",
        [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 129}, {"batch": 5, "seq": 600}],
    ),
    "prefill_flash_batch_and_two_lengths": (
        AttentionCase(hq=4, hk=2, batch_max=4, sq_max=200, skv_max=300, d=72, dv=40, padding=True, options=BOTTOM_RIGHT),
        "flash", [{"batch": 1, "sq": 17, "skv": 1}, {"batch": 4, "sq": 200, "skv": 129}],
    ),
    "prefill_fp32_simt_q_only": (
        AttentionCase(b=2, hq=4, hk=2, sq_max=200, skv=45, d=40, dv=24, data_type=DataType.FLOAT), "simt",
        [{"sq": n} for n in (1, 17, 200)],
    ),
}  # fmt: skip


def _dim_source(ir: gd.Graph, name: str, axis: int) -> tuple[int, int]:
    return next(t.id for t in ir.inputs if t.name == name), axis


# -- lowering --------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [80, 90])
def test_a_prefill_grid_is_ceil_sq_over_the_block_rows_per_head_and_sequence(arch: int) -> None:
    case, _, _ = DYNAMIC["prefill_causal_d128"]
    plan = gd.compile(case.build(), arch=f"sm_{arch}", cache=None)
    (launch,) = plan.program.launches
    seq = _dim_source(plan.graph, "q", 2)
    assert launch.blocks is not None and launch.blocks.dims == (seq,) and launch.blocks.divisor == 128
    assert launch.blocks.multiplier == case.hq * case.b
    for n in (1, 128, 129, 1100):
        blocks = -(-n // 128) * case.hq * case.b
        assert launch.at({seq: n}).grid == ((min(blocks, sm_count(90)) if arch == 90 else blocks), 1, 1)
    assert [a.axis for a in launch.args if a.kind is ArgKind.EXTENT] == [2]


@pytest.mark.parametrize("arch", [80, 90])
def test_with_a_symbolic_batch_too_the_row_blocks_are_times_the_batch(arch: int) -> None:
    case, _, _ = DYNAMIC["prefill_batch_and_seq_gqa_causal"]
    plan = gd.compile(case.build(), arch=f"sm_{arch}", cache=None)
    (launch,) = plan.program.launches
    seq, batch = _dim_source(plan.graph, "q", 2), _dim_source(plan.graph, "q", 0)
    blocks = launch.blocks
    assert blocks is not None and blocks.dims == (seq,) and blocks.times == (batch,)
    assert blocks.multiplier == case.hq and GridExtent.from_json(blocks.to_json()) == blocks
    for n, b in ((1, 1), (129, 3), (600, 5)):
        items = -(-n // 128) * case.hq * b
        assert launch.at({seq: n, batch: b}).grid == ((min(items, sm_count(90)) if arch == 90 else items), 1, 1)


def test_the_hopper_kernel_encodes_the_lengths_of_its_maps_per_call() -> None:
    case, _, _ = DYNAMIC["prefill_bottom_right_two_lengths"]
    plan = gd.compile(case.build(), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    assert "_wgmma_" in launch.name
    sq, skv = _dim_source(plan.graph, "q", 2), _dim_source(plan.graph, "k", 2)
    maps = {a.tensor: a.tensor_map for a in launch.args if a.kind is ArgKind.TENSOR_MAP}
    names = {t.id: t.name for t in plan.graph.tensors}
    for tensor, tensor_map in maps.items():
        assert tensor_map is not None
        length = sq if names[tensor] == "q" else skv
        # dims d, s, h, b innermost first, then byte strides of s, h, b: [B, H, S, D] has S in h's and b's
        at = tensor_map.at({length: 77})
        heads = case.hq if names[tensor] == "q" else case.hk
        assert at.dims == (64, 77, heads, case.b)
        assert at.strides == (128, 77 * 128, heads * 77 * 128)


def test_decode_variants_are_the_static_plans_of_their_key_lengths() -> None:
    """GQA 4 decode, batch 4, Skv 128..32768 on sm_90: the static plans split the keys more as
    they grow; each variant launches the static plan's grid and split at both ends of its range,
    and differs from its kernels only in reading SKV (and the strides holding it) at run time."""
    case = AttentionCase(b=4, hq=32, hk=8, sq=1, skv_max=32768, d=128, dv=128)
    ir = case.build().validate()
    plan = gd.compile(ir, arch="sm_90", cache=None)
    variants: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for launch in plan.program.launches:
        assert launch.bucket is not None and launch.blocks is None  # the batch is static: so is the grid
        shape = (launch.grid, launch.block, launch.shared_bytes)
        variants.setdefault((launch.bucket.low, launch.bucket.high), []).append(shape)
    for (low, high), shapes in variants.items():
        for n in (low, high):
            static = gd.compile(specialize(ir, {"skv": n}), arch="sm_90", cache=None).program.launches
            assert [(s.grid, s.block, s.shared_bytes) for s in static] == shapes, n
    tops = {high for _, high in variants}
    assert len(tops) > 4 and max(tops) == 32768


def test_static_kernels_read_no_lengths() -> None:
    case = dataclasses.replace(DYNAMIC["prefill_causal_d128"][0], one_length=False, sq_max=None, sq=100, skv=100)
    plan = gd.compile(case.build(), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    assert launch.blocks is None and all(a.kind is not ArgKind.EXTENT for a in launch.args)
    assert "constexpr int HQ = 4, GROUP = 1, SQ = 100, SKV = 100;" in plan.kernels[0].source


def test_the_signature_and_the_plan_cache_cover_the_length_range(tmp_path: Path) -> None:
    def sdpa(name: str, top: int) -> gd.Graph:
        g = gd.OperationGraphSpec("dyn", io_data_type="half", compute_data_type="float")
        seq = g.dim(name, 1, top)
        q, k, v = (g.tensor([2, 2, seq, 64], name=n) for n in "qkv")
        g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True, name="attn")[0].set_output(True)
        return g.validate()

    assert signature(sdpa("seq", 512)) == signature(sdpa("prompt", 512))
    assert signature(sdpa("seq", 512)) != signature(sdpa("seq", 513))
    cache = gd.PlanCache(tmp_path)
    plan = gd.compile(sdpa("seq", 512), arch="sm_90", cache=cache)
    assert gd.compile(sdpa("prompt", 512), arch="sm_90", cache=cache).program == plan.program
    assert (cache.counters.compiles, cache.counters.hits) == (1, 1)  # one plan for the range, whatever its name


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_the_dynamic_kernels_compile(name: str, arch: int) -> None:
    case, kind, _ = DYNAMIC[name]
    ir = case.build().validate()
    (program,) = emit_partition(fuse(ir, arch=arch), arch)
    assert f"_{'flash' if arch == 80 and kind == 'wgmma' else kind}_" in program.kernels[0].name
    for kernel in {k.name: k for k in program.kernels}.values():
        assert "dyn0" in strip_header(kernel.source) or kernel.name.startswith("gd_sdpa_decode_combine")
        assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


# -- refusals --------------------------------------------------------------------------------
def _refusal(graph: gd.OperationGraphSpec, arch: str = "sm_90") -> str:
    with pytest.raises(gd.UnsupportedError) as caught:
        gd.compile(graph, arch=arch, cache=None)
    return str(caught.value)


def _graph(dims: list[Any], *, kv_dims: list[Any] | None = None, **options: Any) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec("dyn", io_data_type="half", compute_data_type="float")
    symbols = {"batch": g.dim("batch", 1, 8), "seq": g.dim("seq", 1, 512), "rows": g.dim("rows", 1, 4)}
    q_dims = [symbols.get(d, d) for d in dims]
    k_dims = [symbols.get(d, d) for d in (kv_dims or dims)]
    q = g.tensor(q_dims, name="q")
    k, v = (g.tensor(k_dims, name=n) for n in "kv")
    g.sdpa(q, k, v, attn_scale=0.125, name="attn", **options)[0].set_output(True)
    return g


SUFFIX = ". Run it with backend='reference', or build a static graph for each shape"


def test_symbolic_heads_are_refused_naming_the_node_and_symbol() -> None:
    with pytest.raises(gd.ShapeError) as caught:
        _graph([2, "rows", 40, 64]).validate()
    assert str(caught.value) == (
        "node 'attn': sdpa cannot take a symbolic dim as Q 'q' dim 1 (rows): dividing needs the value of symbolic "
        "dim rows (rows in 1..4); that dim must be static"
    )


def test_a_symbolic_batch_with_symbolic_lengths_is_refused_on_the_decode_kernels() -> None:
    assert _refusal(_graph(["batch", 2, 1, 64], kv_dims=["batch", 2, "seq", 64])) == (
        "fused node 'attn' (attention: attn) has a symbolic batch and symbolic sequence lengths (batch in 1..8, seq "
        "in 1..512) on the decode kernels, whose KV split depends on both (a variant per range of one of them); give "
        "the batch or Skv a static size" + SUFFIX
    )


def test_a_symbolic_page_count_is_refused() -> None:
    g = gd.OperationGraphSpec("dyn", io_data_type="half", compute_data_type="float")
    pages = g.dim("pages", 1, 64)
    q = g.tensor([2, 2, 1, 64], name="q")
    k, v = (g.tensor([pages, 2, 16, 64], name=n) for n in "kv")
    tables = [g.tensor([2, 1, 4, 1], data_type="int32", name=n) for n in ("tk", "tv")]
    lengths = [g.tensor([2, 1, 1, 1], data_type="int32", name=n) for n in ("lq", "lkv")]
    g.sdpa(
        q, k, v, use_padding_mask=True, seq_len_q=lengths[0], seq_len_kv=lengths[1],
        paged_attention_k_table=tables[0], paged_attention_v_table=tables[1], name="attn",
    )[0].set_output(True)  # fmt: skip
    assert _refusal(g) == (
        "fused node 'attn' (attention: attn) has symbolic dims other than the batch and the sequence lengths (pages "
        "in 1..64); attention kernels take the batch (dim 0) and the sequence lengths (dim 2 of Q and of K and V) as "
        "runtime extents only" + SUFFIX
    )


def test_a_symbolic_sq_on_the_decode_kernel_is_refused() -> None:
    assert _refusal(_graph([2, 2, "rows", 64], kv_dims=[2, 2, 300, 64])) == (
        "fused node 'attn' (attention: attn) has a symbolic Sq (rows in 1..4) of at most 4 query rows, which take the "
        "decode kernel; its blocks pack the query rows of a kv head at compile time (give Sq a static size, or a "
        "range reaching past 4 for the flash kernels)" + SUFFIX
    )


def test_a_tuned_decode_kernel_takes_no_symbolic_sq() -> None:
    ir = _graph([2, 2, "seq", 64]).validate()
    partition = fuse(ir, arch=90)
    (fused,) = partition.nodes
    with pytest.raises(gd.UnsupportedError, match=r"take no symbolic Sq \(seq in 1..512\); the flash kernels do"):
        emit_partition(partition, 90, {fused.name: {"path": "decode"}})


def test_dropout_over_symbolic_lengths_is_refused() -> None:
    case = AttentionCase(hq=8, hk=2, one_length=True, sq_max=100, dropout=0.5)
    assert _refusal(case.build()) == (
        "fused node 'attention' (attention: attention) has symbolic dims (seq in 1..100) with dropout; those "
        "attention kernels take no runtime extents yet" + SUFFIX
    )


def test_a_symbolic_key_length_mismatch_names_the_role() -> None:
    """K and V over different symbols: V's dims must be K's (shape inference, as the node is added)."""
    g = gd.OperationGraphSpec("dyn", io_data_type="half", compute_data_type="float")
    a, b = g.dim("a", 1, 64), g.dim("b", 1, 64)
    q = g.tensor([2, 2, a, 64], name="q")
    k, v = g.tensor([2, 2, a, 64], name="k"), g.tensor([2, 2, b, 64], name="v")
    with pytest.raises(gd.ShapeError) as caught:
        g.sdpa(q, k, v, name="attn")
    assert str(caught.value) == (
        "node 'attn', tensor 'v': V has dims [2, 2, b, 64]; expected [B, Hk, Skv, Dv] with K's [B, Hk, Skv] = [2, 2, a]"
    )


# -- the kernels, run on the CPU ------------------------------------------------------------------
CPU_CASES: dict[str, tuple[AttentionCase, list[dict[str, int]]]] = {
    "flash_fp16_causal_padding": (
        AttentionCase(
            b=2, hq=4, hk=2, one_length=True, sq_max=150, d=32, dv=32, data_type=DataType.HALF, padding=True,
            options=CAUSAL,
        ),
        [{"seq": 1}, {"seq": 17}, {"seq": 150}],
    ),
    "flash_fp16_bottom_right_bias_two_lengths": (
        AttentionCase(
            b=1, hq=2, hk=1, sq_max=40, skv_max=70, d=16, dv=24, data_type=DataType.HALF,
            bias=(False, True, True, True), options={**BOTTOM_RIGHT, "use_alibi_mask": True},
        ),
        [{"sq": 33, "skv": 9}, {"sq": 1, "skv": 70}, {"sq": 40, "skv": 40}],
    ),
    "flash_fp16_batch_and_seq": (
        AttentionCase(hq=2, hk=1, batch_max=3, one_length=True, sq_max=80, d=16, dv=16, data_type=DataType.HALF),
        [{"batch": 1, "seq": 65}, {"batch": 3, "seq": 9}],
    ),
    "decode_mma_fp16_bshd": (
        AttentionCase(b=2, hq=4, hk=1, sq=1, skv_max=1300, d=16, dv=16, data_type=DataType.HALF, layout="bshd"),
        [{"skv": 1}, {"skv": 129}, {"skv": 1300}],
    ),
    "decode_fp32_window": (
        AttentionCase(
            b=2, hq=4, hk=2, sq=2, skv_max=900, d=24, dv=8, data_type=DataType.FLOAT,
            options={**BOTTOM_RIGHT, "sliding_window_length": 300},
        ),
        [{"skv": 1}, {"skv": 17}, {"skv": 900}],
    ),
}  # fmt: skip


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_the_kernels_match_the_reference_at_lengths_off_the_tiles_on_the_cpu(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Emitted once for sm_80 (the flash kernel, the decode ones with their KV split variants
    and combine), run at lengths off the tiles and at the maximum."""
    case, lengths = CPU_CASES[name]
    cpu_emulation.check_across_the_range(case.build(), lengths, tmp_path_factory)


# -- property: the dynamic graph computes what the static graph of its lengths computes -----------
@settings(max_examples=10, deadline=None)
@given(sq=st.integers(1, 12), skv=st.integers(1, 12), mask=st.sampled_from(["causal", "bottom_right", "window"]))
def test_the_dynamic_reference_equals_the_static_one(sq: int, skv: int, mask: str) -> None:
    options: dict[str, Any] = {
        "causal": CAUSAL,
        "bottom_right": BOTTOM_RIGHT,
        "window": {**BOTTOM_RIGHT, "sliding_window_length": 3},
    }[mask]
    base = AttentionCase(b=2, hq=4, hk=2, d=8, dv=8, options=options, bias=(False, True, True, True))
    static = dataclasses.replace(base, sq=sq, skv=skv).build().validate()
    dynamic = dataclasses.replace(base, sq_max=12, skv_max=12).build().validate()
    feeds = random_inputs(static, sq * 13 + skv)
    result, expected = gd.reference.execute(dynamic, feeds), gd.reference.execute(static, feeds)
    for name, array in expected.items():
        np.testing.assert_array_equal(result[name], array)


# -- on the GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_one_plan_runs_across_the_lengths_on_the_gpu(name: str, tmp_path: Path) -> None:
    from tests.gpu_check import check_one_plan_across_the_range

    case, kind, lengths = DYNAMIC[name]
    check_one_plan_across_the_range(case.build(), kind, lengths, tmp_path)
