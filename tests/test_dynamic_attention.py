"""Dynamic shapes, attention slice: a forward ``sdpa`` over a symbolic batch (static heads,
lengths and head dims) compiles once for its range. On the CPU: the lowering (a grid of one
block per work item computed at launch, the Hopper kernel's item count from its EXTENT argument
and its Q/K/V tensor maps' batch dim encoded per call), the flash and SIMT kernels identical to
the static plan's, the decode kernels' variants (one per range of batches sharing the static
plans' KV split) identical to the static plans', the signature, the refusals (a batch inside
the strides, dropout; symbolic lengths: test_dynamic_attention_lengths.py), NVRTC for sm_80 and
sm_90(a), the flash and decode kernels (dense and paged) run by tests/cpu_emulation.py against
the reference across the range, and the dynamic graph's reference against the static graph's at
random batches; the `gpu` tests run one plan per kernel path at batch 1, a prime and the maximum."""

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
from graphdnn.program import ArgKind
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from graphdnn.specialize import specialize
from tests import cpu_emulation
from tests.attention_cases import CASES, AttentionCase, PagedCase

MAX = 24
# Each case over batch 1..MAX, and the kernel sm_90 gives it by default (sm_80: flash for wgmma).
DYNAMIC: dict[str, tuple[AttentionCase | PagedCase, str]] = {
    "gqa_causal_d64": (dataclasses.replace(CASES["gqa_4to1_causal"], batch_max=MAX), "wgmma"),
    "d128_bshd": (dataclasses.replace(CASES["d128_bshd"], batch_max=MAX), "wgmma"),
    "padding_bottom_right": (dataclasses.replace(CASES["padding_causal_bottom_right"], batch_max=MAX), "wgmma"),
    "bias_per_batch_and_key": (dataclasses.replace(CASES["bias_per_key"], batch_max=MAX), "wgmma"),
    "bias_broadcast_over_batch": (
        AttentionCase(hq=2, hk=2, sq=65, skv=65, bias=(False, True, True, True), batch_max=MAX),
        "wgmma",
    ),
    "sliding_window_causal": (dataclasses.replace(CASES["sliding_window_causal"], batch_max=MAX), "wgmma"),
    "alibi_causal_6_heads": (dataclasses.replace(CASES["alibi_causal_6_heads"], batch_max=MAX), "wgmma"),
    "kv_shared_across_batch": (dataclasses.replace(CASES["kv_shared_across_batch"], batch_max=MAX), "wgmma"),
    "d72_dv40": (dataclasses.replace(CASES["d72_dv40"], batch_max=MAX), "flash"),
    "fp32_simt": (dataclasses.replace(CASES["fp32_simt"], batch_max=MAX), "simt"),
    # decode: KV splits that fall as the batch grows, a variant per power-of-two range of it
    "decode_gqa_padded": (
        AttentionCase(hq=16, hk=4, sq=1, skv=1100, d=128, dv=128, padding=True, batch_max=MAX), "decode_mma"
    ),
    "decode_fp32_two_rows": (
        AttentionCase(
            hq=8, hk=2, sq=2, skv=700, d=64, dv=64, data_type=DataType.FLOAT, batch_max=MAX,
            options={"use_causal_mask_bottom_right": True},
        ),
        "decode",
    ),
    "paged_decode": (PagedCase(hq=8, hk=2, max_len=700, page_size=16, d=128, dv=128, batch_max=MAX), "decode_mma"),
    "paged_prefill": (PagedCase(hq=4, hk=2, sq=40, max_len=300, page_size=16, batch_max=MAX), "flash"),
}  # fmt: skip


def _q(ir: gd.Graph) -> int:
    return next(t.id for t in ir.inputs if t.name == "q")


def _items(case: AttentionCase, block_m: int) -> int:
    """Work items per sequence: row blocks times heads."""
    return -(-case.sq // block_m) * case.hq


# -- lowering --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gqa_causal_d64", "d72_dv40", "fp32_simt"])
def test_the_grid_is_one_block_per_work_item_of_the_call(name: str) -> None:
    case, _ = DYNAMIC[name]
    for arch in (80, 90):
        plan = gd.compile(case.build(), arch=f"sm_{arch}", cache=None)
        (launch,) = plan.program.launches
        q = _q(plan.graph)
        blocks = launch.blocks
        assert blocks is not None and blocks.dims == ((q, 0),) and blocks.grid_axis == 0
        kind = "simt" if name == "fp32_simt" else "wgmma" if arch == 90 and name == "gqa_causal_d64" else "flash"
        assert f"_{kind}_" in launch.name
        per_block = {"simt": 4, "flash": 128, "wgmma": 128}[kind]
        assert blocks.multiplier == _items(case, per_block) and blocks.divisor == 1
        for batch in (1, 13, MAX):
            expected = batch * _items(case, per_block)
            if kind == "wgmma":  # persistent: one block per SM at most, the item count an argument
                expected = min(expected, sm_count(90))
            assert launch.at({(q, 0): batch}).grid == (expected, 1, 1)
        extents = [a for a in launch.args if a.kind is ArgKind.EXTENT]
        assert extents == ([gd.program.Arg(ArgKind.EXTENT, tensor=q, axis=0)] if kind == "wgmma" else [])


def test_the_flash_and_simt_kernels_are_the_static_plans() -> None:
    """Strides stay static (the batch outermost), so only the grid depends on the batch."""
    for name, arch in (("d72_dv40", 80), ("d72_dv40", 90), ("fp32_simt", 90), ("gqa_causal_d64", 80)):
        case, _ = DYNAMIC[name]
        ir = case.build().validate()
        (dynamic,) = gd.compile(ir, arch=f"sm_{arch}", cache=None).kernels
        (static,) = gd.compile(specialize(ir, {"batch": 5}), arch=f"sm_{arch}", cache=None).kernels
        assert strip_header(dynamic.source) == strip_header(static.source), name


def test_the_hopper_kernel_counts_its_items_and_encodes_the_batch_of_its_maps() -> None:
    case, _ = DYNAMIC["d128_bshd"]
    plan = gd.compile(case.build(), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    source = plan.kernels[0].source
    assert f"const int WORK = (int)({_items(case, 128)} * dyn0);  // this call's" in source
    maps = {a.tensor: a.tensor_map for a in launch.args if a.kind is ArgKind.TENSOR_MAP}
    names = {t.id: t.name for t in plan.graph.tensors}
    assert sorted(names[t] for t in maps) == ["k", "q", "v"]
    q = _q(plan.graph)  # the batch's value is read from Q's dim 0 for every map
    for tensor_map in maps.values():
        assert tensor_map is not None
        # dims d, s, h, b innermost first: b (position 3) is the call's, the byte strides static
        assert [(p, s.coefficient, s.dims) for p, s in tensor_map.symbolic] == [(3, 1, ((q, 0),))]
        assert tensor_map.dims[3] == MAX
        assert tensor_map.at({(q, 0): 7}).dims[3] == 7


def test_static_attention_takes_no_extents() -> None:
    case = CASES["gqa_4to1_causal"]
    plan = gd.compile(case.build(), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    assert launch.blocks is None and all(a.kind is not ArgKind.EXTENT for a in launch.args)
    assert all(not a.tensor_map.symbolic for a in launch.args if a.tensor_map is not None)


def test_the_signature_covers_the_range_not_the_name() -> None:
    def sdpa(name: str, top: int) -> gd.Graph:
        g = gd.OperationGraphSpec("dyn", io_data_type="half", compute_data_type="float")
        batch = g.dim(name, 1, top)
        q, k, v = (g.tensor([batch, 2, 40, 64], name=n) for n in "qkv")
        g.sdpa(q, k, v, attn_scale=0.125, use_causal_mask=True, name="attn")[0].set_output(True)
        return g.validate()

    assert signature(sdpa("batch", 64)) == signature(sdpa("requests", 64))
    assert signature(sdpa("batch", 64)) != signature(sdpa("batch", 65))
    plan = gd.compile(sdpa("batch", 64), arch="sm_90", cache=None)
    assert plan.program == gd.compile(sdpa("requests", 64), arch="sm_90", cache=None).program


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_the_dynamic_kernels_compile(name: str, arch: int) -> None:
    case, kind = DYNAMIC[name]
    ir = case.build().validate()
    (program,) = emit_partition(fuse(ir, arch=arch), arch)
    assert f"_{'flash' if arch == 80 and kind == 'wgmma' else kind}_" in program.kernels[0].name
    for kernel in program.kernels:
        assert kernel.blocks is not None
        assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


@pytest.mark.parametrize("choice", [{"path": "wgmma", "block_n": 128, "pingpong": False, "persistent": False}])
def test_a_tuned_hopper_kernel_takes_the_batch_too(choice: dict[str, object]) -> None:
    case, _ = DYNAMIC["gqa_causal_d64"]
    ir = case.build().validate()
    partition = fuse(ir, arch=90)
    (fused,) = partition.nodes
    (program,) = emit_partition(partition, 90, {fused.name: choice})
    (kernel,) = program.kernels
    assert kernel.blocks is not None and kernel.blocks.cap == 2**31 - 1  # one block per item
    assert compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


# -- refusals --------------------------------------------------------------------------------
def _refusal(graph: gd.OperationGraphSpec, arch: str = "sm_90") -> str:
    with pytest.raises(gd.UnsupportedError) as caught:
        gd.compile(graph, arch=arch, cache=None)
    return str(caught.value)


def test_a_batch_inside_the_strides_is_refused() -> None:
    """[S, B, H, D] in memory: the sequence stride holds the batch."""
    g = gd.OperationGraphSpec("dyn_sbhd", io_data_type="half", compute_data_type="float")
    batch = g.dim("batch", 1, 8)
    q, k, v = (g.tensor([batch, 2, 40, 64], stride=[128, 64, 128 * batch, 1], name=n) for n in "qkv")
    g.sdpa(q, k, v, attn_scale=0.125, name="attn")[0].set_output(True)
    assert "has the symbolic batch inside its strides (batch in 1..8); attention kernels take" in _refusal(g)


def test_dropout_over_a_symbolic_batch_is_refused() -> None:
    case = dataclasses.replace(CASES["dropout_half_gqa"], batch_max=4)
    assert _refusal(case.build()) == (
        "fused node 'attention' (attention: attention) has symbolic dims (batch in 1..4) with dropout; those "
        "attention kernels take no runtime extents yet. Run it with backend='reference', or build a static graph "
        "for each shape"
    )


def test_decode_variants_are_the_static_plans_of_their_batches() -> None:
    """GQA 4 decode over Skv 4096, batch 1..256, sm_90: the static plans split the keys less as
    the batch grows; each variant is the static plan's kernels at every batch of its range."""
    case = AttentionCase(hq=32, hk=8, sq=1, skv=4096, d=128, dv=128, padding=True, batch_max=256)
    ir = case.build().validate()
    plan = gd.compile(ir, arch="sm_90", cache=None)
    variants: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    q = _q(plan.graph)
    for launch, kernel in zip(plan.program.launches, plan.kernels):
        assert launch.bucket is not None and launch.blocks is not None
        for batch in {launch.bucket.low, launch.bucket.high}:
            shape = (launch.at({(q, 0): batch}).grid, launch.block, launch.shared_bytes)
            variants.setdefault((batch, launch.bucket.high), []).append((*shape, strip_header(kernel.source)))
    tops = sorted({high for _, high in variants})
    assert tops[-1] == 256 and len(tops) == 9  # splits 16, 11, 8, 6, 5, 4, 3, 2 and 1
    for (batch, _), kernels in variants.items():
        static = gd.compile(specialize(ir, {"batch": batch}), arch="sm_90", cache=None)
        launches = zip(static.program.launches, static.kernels)
        # at batch 1 the static kernels also drop the batch offsets (b is 0): the same launches
        expected = [(s.grid, s.block, s.shared_bytes, strip_header(k.source)) for s, k in launches]
        assert [k[: 3 if batch == 1 else 4] for k in kernels] == [k[: 3 if batch == 1 else 4] for k in expected], batch
    assert len(variants[(1, tops[0])]) == 2 and len(variants[(256, 256)]) == 1  # split-KV + combine; one kernel


def test_a_tuned_decode_choice_serves_the_whole_range() -> None:
    case, _ = DYNAMIC["decode_fp32_two_rows"]
    ir = case.build().validate()
    partition = fuse(ir, arch=90)
    (fused,) = partition.nodes
    (program,) = emit_partition(partition, 90, {fused.name: {"path": "decode", "split": 3}})
    decode, combine = program.kernels
    assert decode.bucket is None and decode.blocks is not None and combine.blocks is not None
    assert decode.blocks.multiplier == 2 * 3 and combine.blocks.multiplier == 8 * 2  # kv heads x split; rows
    (_, partial_lse) = program.scratch
    assert partial_lse.bytes == 4 * MAX * 8 * 2 * 3  # the partials of the largest batch


# -- the kernels, run on the CPU ------------------------------------------------------------------
CPU_CASES: dict[str, AttentionCase | PagedCase] = {
    "flash_fp16_causal_padding": AttentionCase(
        hq=4, hk=2, sq=40, skv=33, d=32, dv=32, data_type=DataType.HALF, padding=True, batch_max=3,
        options={"use_causal_mask": True},
    ),
    "decode_mma_fp16_padding": AttentionCase(
        hq=4, hk=1, sq=1, skv=600, d=16, dv=16, data_type=DataType.HALF, padding=True, batch_max=3
    ),
    "decode_fp32_window": AttentionCase(
        hq=4, hk=2, sq=2, skv=555, d=24, dv=8, data_type=DataType.FLOAT, batch_max=3,
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 300},
    ),
    "paged_decode_fp16": PagedCase(
        hq=8, hk=2, max_len=600, page_size=16, d=32, dv=32, data_type=DataType.HALF, batch_max=3
    ),
    "flash_fp16_bias_alibi_window": AttentionCase(
        hq=2, hk=1, sq=21, skv=37, d=16, dv=24, data_type=DataType.HALF, bias=(False, True, False, True),
        options={"use_alibi_mask": True, "use_causal_mask_bottom_right": True, "sliding_window_length": 9},
        batch_max=3,
    ),
}  # fmt: skip


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_the_kernels_match_the_reference_across_the_range_on_the_cpu(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Emitted once for sm_80 (the flash and decode kernels, the decode ones with their KV split
    and combine), run at batch 1, 2 and 3; O stored in pairs and element by element. (The SIMT kernel's warps meet at __syncwarp, which the emulation's
    fibers do not.)"""
    cpu_emulation.check_across_the_range(CPU_CASES[name].build(), [{"batch": n} for n in (1, 2, 3)], tmp_path_factory)


# -- property: the dynamic graph computes what the static graph of its batch computes --------------
@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 6), masks=st.sampled_from(["causal", "window", "alibi", "padding", "bias"]))
def test_the_dynamic_reference_equals_the_static_one(batch: int, masks: str) -> None:
    options: dict[str, Any] = {
        "causal": {"use_causal_mask": True},
        "window": {"use_causal_mask": True, "sliding_window_length": 5},
        "alibi": {"use_causal_mask": True, "use_alibi_mask": True},
    }.get(masks, {})
    base = AttentionCase(
        hq=4,
        hk=2,
        sq=11,
        skv=13,
        d=8,
        dv=8,
        options=options,
        padding=masks == "padding",
        bias=(True, True, False, True) if masks == "bias" else None,
    )
    static = dataclasses.replace(base, b=batch).build().validate()
    dynamic = dataclasses.replace(base, batch_max=6).build().validate()
    feeds = random_inputs(static, batch)
    result, expected = gd.reference.execute(dynamic, feeds), gd.reference.execute(static, feeds)
    assert result.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(result[name], array)


# -- on the GPU -----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_one_plan_runs_across_the_range_on_the_gpu(name: str, tmp_path: Path) -> None:
    from tests.gpu_check import check_one_plan_across_the_range

    case, kind = DYNAMIC[name]
    check_one_plan_across_the_range(case.build(), kind, [{"batch": 1}, {"batch": 13}, {"batch": MAX}], tmp_path)
