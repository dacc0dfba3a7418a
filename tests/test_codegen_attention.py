"""The attention family's kernels: which path each case takes, that every case's kernels
compile for sm_80 and sm_90, and the mma.sync forward on the CPU (tests/cpu_emulation.py)
with and without the scale folded into its exponents (the GPU runs every case in
test_gpu_attention.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from codegen import emitter
from codegen.context import EmitContext
from codegen.emit import candidates
from codegen.families.attention_decode import DECODE_MAX_SQ
from codegen.families.attention_flash import FlashConfig, shared_bytes
from codegen.families.attention_problem import attention_of, folds_scale
from codegen.families.attention_wgmma import supported as wgmma_supported
from codegen.nvrtc import compile_cubin
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.arch import sm_count
from graphdnn.compare import relative_error
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.lower import lower
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_cases import CASES, self_attention
from tests.compile_check import compile_graphs
from tests.test_codegen_gemm_sm90 import sass


def attention_node(case: str):  # type: ignore[no-untyped-def]
    graph = CASES[case].build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION]
    return graph, fused


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(
    ("case", "folded", "aligned"), [("gqa_4to1_causal", True, 1), ("d16_fp16_runtime_scale", False, 0)]
)
def test_the_mma_sync_forward_matches_the_reference_on_the_cpu(
    case: str, folded: bool, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Folded scale or not; O written as 4-byte pairs (aligned) or element by element."""
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    graph = dataclasses.replace(CASES[case], data_type=DataType.HALF).build().validate()  # the emulation's half
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION]
    assert folds_scale(attention_of(fused)) is folded
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 80, {}))
    assert [k.name.split("_")[2] for k in program.kernels] == ["flash"]
    feeds = random_inputs(graph, 3)
    expected = reference.execute(graph, feeds)
    got = cpu_emulation.run(fused, program, feeds, aligned, build_dir)
    for t in graph.outputs:
        assert relative_error(got[t.name], expected[t.name]) < 2e-3, t.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_is_one_attention_kernel(case: str) -> None:
    graph, fused = attention_node(case)
    kernels = lower(fuse(graph, arch=90), 90, signature(graph), lambda content_hash: content_hash).sources
    (source,) = kernels.values()
    # on sm_90 the Hopper kernel where it takes the problem
    if CASES[case].sq <= DECODE_MAX_SQ:
        path = "_decode"  # few query rows: the split-KV decode kernel (test_codegen_attention_decode.py)
    else:
        path = "_simt" if case.endswith("_simt") else "_wgmma" if case in WGMMA_CASES else "_flash"
    assert path in source.name
    assert "score" in source.source  # the score matrix stays in registers: no S-sized scratch
    assert fused.nodes == (fused.anchor,)


def test_every_case_compiles_for_sm80_and_sm90() -> None:
    graphs = [case.build().validate() for case in CASES.values()]
    graphs += [self_attention(t).validate() for t in (DataType.BFLOAT16, DataType.FLOAT)]
    report = compile_graphs(graphs)
    assert not report.failures, "\n\n".join(report.failures)


@pytest.mark.parametrize("case", ["d128_bshd", "d256_fp16", "one_row_one_key"])
def test_flash_candidates_fit_shared_memory_and_compile(case: str) -> None:
    graph, fused = attention_node(case)
    choices = [c for c in candidates(fused, 90) if "path" not in c]  # the mma.sync kernel's
    assert len(choices) >= 2
    attention = attention_of(fused)
    partition = fuse(graph, arch=80)
    position = [f.name for f in partition.nodes].index(fused.name)
    for choice in choices:
        assert shared_bytes(attention, FlashConfig(int(choice["warps"]), int(choice["block_n"]))) <= 160 * 1024
        (source,) = lower(partition, 80, signature(graph), lambda h: h, tuning={position: choice}).sources.values()
        compile_cubin(source.source, source.name, 80, source.arch_suffix)


WGMMA_CASES = sorted(name for name in CASES if wgmma_supported(attention_of(attention_node(name)[1]), 90))


def test_the_hopper_kernel_is_offered_for_head_dims_64_and_128_with_contiguous_rows() -> None:
    assert {"gqa_4to1_causal", "d128_bshd", "padding_causal_bottom_right", "bias_full"} <= set(WGMMA_CASES)

    def hopper_choices(case: str, arch: int) -> list[dict[str, object]]:
        return [c for c in candidates(attention_node(case)[1], arch) if c.get("path") == "wgmma"]

    for case in ("d256_fp16", "d72_dv40", "d100_scalar_loads", "fp32_simt"):
        assert hopper_choices(case, 90) == []
    assert {(c["block_n"], c["pingpong"], c["persistent"]) for c in hopper_choices("d128_bshd", 90)} == {
        (bn, pingpong, persistent) for bn in (64, 128) for pingpong in (False, True) for persistent in (False, True)
    }
    assert hopper_choices("d128_bshd", 80) == []
    graph, fused = attention_node("d256_fp16")
    partition = fuse(graph, arch=90)
    position = [f.name for f in partition.nodes].index(fused.name)
    with pytest.raises(UnsupportedError, match=r"head dims \[64, 128\].*not D=256"):
        lower(partition, 90, signature(graph), lambda h: h, tuning={position: {"path": "wgmma"}})


@pytest.mark.parametrize("case", WGMMA_CASES)
def test_the_hopper_kernel_compiles_for_sm90a(case: str) -> None:
    graph, fused = attention_node(case)
    partition = fuse(graph, arch=90)
    position = [f.name for f in partition.nodes].index(fused.name)
    (source,) = lower(
        partition, 90, signature(graph), lambda h: h, tuning={position: {"path": "wgmma"}}
    ).sources.values()
    assert "_wgmma_" in source.name and source.arch_suffix == "a"
    code = sass(compile_cubin(source.source, source.name, 90, source.arch_suffix))
    if code is not None:
        assert "HGMMA" in code and "LDL" not in code and "STL" not in code


@pytest.mark.parametrize("case", ["d128_bshd", "gqa_4to1_causal"])
def test_every_hopper_choice_compiles_without_spilling(case: str) -> None:
    graph, fused = attention_node(case)
    partition = fuse(graph, arch=90)
    position = [f.name for f in partition.nodes].index(fused.name)
    items = -(-CASES[case].sq // 128) * CASES[case].hq * CASES[case].b
    for choice in (c for c in candidates(fused, 90) if c.get("path") == "wgmma"):
        lowered = lower(partition, 90, signature(graph), lambda h: h, tuning={position: choice})
        (source,) = lowered.sources.values()
        (launch,) = lowered.program.launches
        assert launch.grid[0] == (min(items, sm_count(90)) if choice["persistent"] else items), choice
        assert ("turn_begin();" in source.source) == choice["pingpong"]
        assert f"BN = {choice['block_n']}," in source.source
        code = sass(compile_cubin(source.source, source.name, 90, source.arch_suffix))
        if code is not None:
            assert "LDL" not in code and "STL" not in code, choice


def test_the_hopper_producer_loads_by_tma_where_the_driver_can_describe_q_k_and_v() -> None:
    """TMA needs strides that are multiples of 16 bytes: a K and V broadcast over the batch
    (stride 0) are copied by the producer's threads instead."""
    for case, tma in (("d128_bshd", True), ("gqa_4to1_causal", True), ("kv_shared_across_batch", False)):
        graph, _ = attention_node(case)
        (source,) = lower(fuse(graph, arch=90), 90, signature(graph), lambda h: h).sources.values()
        assert "_wgmma_" in source.name
        assert ("tma_load(k_tile" in source.source) is tma, case
        assert ("cp.async.mbarrier.arrive" in source.source) is not tma, case


def test_simt_path_has_no_candidates() -> None:
    _, fused = attention_node("fp32_simt")
    assert candidates(fused, 90) == []


def test_a_tuning_outside_the_choices_is_a_clear_error() -> None:
    graph, fused = attention_node("d128_bshd")
    partition = fuse(graph, arch=90)
    position = [f.name for f in partition.nodes].index(fused.name)
    with pytest.raises(UnsupportedError, match=r"attention tuning .* is not one of"):
        lower(
            partition, 90, signature(graph), lambda h: h, tuning={position: {"warps": 3, "block_n": 64, "m_tiles": 1}}
        )
    with pytest.raises(UnsupportedError, match=r"attention tuning .*'block_n': 96.* is not one of"):
        lower(
            partition,
            90,
            signature(graph),
            lambda h: h,
            tuning={position: {"path": "wgmma", "block_n": 96, "pingpong": True}},
        )


@pytest.mark.parametrize("sq", [1, 70])  # the decode kernel, the flash ones
def test_a_window_wider_than_every_key_is_no_window(sq: int) -> None:
    """A sliding window of 2^32 keys hides nothing: the kernels take it as none (a 64-bit
    length in their int arithmetic did not compile), and the reference agrees."""
    import numpy as np

    from graphdnn import reference
    from graphdnn.random_inputs import random_inputs
    from tests.attention_cases import AttentionCase

    wide = AttentionCase(sq=sq, skv=90, options={"use_causal_mask": True, "sliding_window_length": 2**32})
    plain = AttentionCase(sq=sq, skv=90, options={"use_causal_mask": True})
    graph = wide.build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION]
    assert attention_of(fused).window == 0
    assert compile_graphs([graph]).failures == []
    feeds = random_inputs(graph, 3)
    want = reference.execute(plain.build().validate(), feeds)
    got = reference.execute(graph, feeds)
    assert all(np.array_equal(got[name], want[name]) for name in want)
