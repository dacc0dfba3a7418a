"""The attention backward family's kernels: the three kernels and their scratch, which path
each case takes (mma.sync for fp16/bf16 up to head dim 128, SIMT otherwise or when tuned so;
the wgmma kernels on sm_90 when tuned so, and why not where they cannot),
every case compiled for sm_80 and sm_90, and the SIMT and (fp16) mma.sync kernels run on the
CPU (tests/cpu_emulation.py) against the reference. The GPU runs every case in
test_gpu_attention_backward.py."""

from __future__ import annotations

import re

import pytest

from codegen import emitter
from codegen.context import EmitContext
from codegen.families import attention_backward_ws
from codegen.families.attention_backward import (
    CONSUMERS,
    MMA,
    SIMT,
    WGMMA,
    WGMMA_COPIES,
    WGMMA_PRODUCER,
    WGMMA_PRODUCER_BEHIND,
    WGMMA_PRODUCER_KV,
    WGMMA_PRODUCER_PINGPONG,
    WGMMA_PRODUCER_WIDE,
)
from codegen.families.attention_backward_wgmma import shared_bytes
from codegen.nvrtc import compile_cubin
from fusion_rules import Family, fuse
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.attention_backward_cases import (
    CASES,
    CPU_CASES,
    WGMMA_ALONE_CASES,
    WGMMA_CASES,
    BackwardCase,
    cpu_runs,
    matches_on_the_cpu,
)
from tests.compile_check import compile_graphs, ptxas_report


def backward_program(case: str, tuning: dict[str, object] | None = None, arch: int = 90):  # type: ignore[no-untyped-def]
    graph = (CASES | CPU_CASES | WGMMA_CASES | WGMMA_ALONE_CASES)[case].build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION_BACKWARD]
    return graph, fused, emitter(fused.family)(fused, EmitContext(graph, signature(graph), arch, tuning or {}))


@pytest.mark.parametrize("case", sorted(CASES))
def test_delta_then_dkdv_then_dq_with_a_delta_per_row(case: str) -> None:
    """The sm_80 kernels (sm_90 takes the same where the wgmma kernels do not apply)."""
    _, fused, program = backward_program(case, arch=80)
    delta, dkdv, dq = program.kernels
    assert "_delta_" in delta.name and "_dkdv_" in dkdv.name and "_dq_" in dq.name
    (scratch,) = program.scratch
    c = CASES[case]
    assert scratch.bytes == 4 * c.b * c.hq * c.sq
    assert "atomic" not in dkdv.source + dq.source  # deterministic: every element summed by one thread
    assert fused.nodes == (fused.anchor,) and fused.anchor.op == "sdpa_backward"
    assert {t.name for t in fused.outputs} == {"dq", "dk", "dv"}
    tensor_cores = c.data_type.value in ("half", "bfloat16") and c.kv_type is None and max(c.d, c.dv) <= 128
    path = "_mma_" if tensor_cores else "_simt_"
    assert path in dkdv.name and path in dq.name
    if tensor_cores:
        assert 0 < dkdv.shared_bytes <= 160 * 1024 and "mma.sync" in dkdv.source and "ldmatrix" in dq.source


@pytest.mark.parametrize("case", sorted(CASES))
def test_sm90_takes_the_wgmma_kernels_where_they_apply_and_the_sm80_ones_elsewhere(case: str) -> None:
    """The wgmma dK/dV kernel measured fastest: the producer warpgroup's; at head dim 64 with
    128-row query tiles, or K and V in registers under a causal mask; at 128 with dQ's product a
    tile behind and the warpgroups taking turns."""
    names = [k.name.rsplit("_", 1)[0] for k in backward_program(case)[2].kernels]
    if case in WGMMA_CASES:
        c = WGMMA_CASES[case]
        causal = any(c.options.get(m) for m in ("use_causal_mask", "use_causal_mask_bottom_right"))
        dkdv = "dkdv_wgmma_ws_" + (("kv" if causal else "wide") if c.d == 64 else "pingpong")
        assert names == ["gd_sdpa_backward_delta", f"gd_sdpa_backward_{dkdv}", "gd_sdpa_backward_dq_convert"]
    else:
        assert names == [k.name.rsplit("_", 1)[0] for k in backward_program(case, arch=80)[2].kernels]


def test_each_tuning_takes_its_kernels_and_nothing_else_is_a_choice() -> None:
    assert all("_simt_" in k.name for k in backward_program("d128_bshd", SIMT)[2].kernels[1:])
    assert all("_mma_" in k.name for k in backward_program("d128_bshd", MMA)[2].kernels[1:])
    with pytest.raises(UnsupportedError, match=r"attention_backward tuning \{'path': 'tma'\} is not one"):
        backward_program("d128_bshd", {"path": "tma"})
    with pytest.raises(UnsupportedError, match=r"'attention_backward': the mma.sync kernels take fp16 or bf16"):
        backward_program("fp32_simt", MMA)


@pytest.mark.parametrize("case", sorted(WGMMA_CASES))
def test_wgmma_kernels_compile_for_sm90(case: str) -> None:
    """Delta (and dq_accum zeroed), the wgmma dK/dV kernel (every thread copying) adding into
    dq_accum, dQ's conversion."""
    _, _, program = backward_program(case, WGMMA_COPIES)
    delta, dkdv, convert = program.kernels
    assert "_dkdv_wgmma_" in dkdv.name and "_dq_convert_" in convert.name and dkdv.arch_suffix == "a"
    assert "wgmma.mma_async" in dkdv.source and "cp.reduce.async.bulk" in dkdv.source and "dq_accum" in delta.source
    c = WGMMA_CASES[case]
    assert [s.bytes for s in program.scratch] == [4 * c.b * c.hq * c.sq, 4 * c.b * c.hq * c.sq * c.d]
    assert dkdv.shared_bytes == shared_bytes(c.d) <= 227 * 1024
    for kernel in program.kernels:
        compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


@pytest.mark.parametrize("case", sorted(WGMMA_CASES))
def test_the_warp_specialised_wgmma_kernel_compiles_for_sm90(case: str) -> None:
    """A producer warpgroup's TMA loads (four tensor maps: Q, dO, K, V) into an mbarrier ring,
    registers moved to the consumers; the same preprocess and conversion kernels."""
    _, _, program = backward_program(case, WGMMA_PRODUCER)
    _, dkdv, convert = program.kernels
    assert "_dkdv_wgmma_ws_" in dkdv.name and "_dq_convert_" in convert.name and dkdv.arch_suffix == "a"
    for needed in ("cp.async.bulk.tensor.4d", "setmaxnreg.inc", "stmatrix", "cp.reduce.async.bulk", "mbar_wait(full"):
        assert needed in dkdv.source, needed
    assert sum(p.kind.name == "TENSOR_MAP" for p in dkdv.params) == 4 and dkdv.block == (384, 1, 1)
    c = WGMMA_CASES[case]
    assert dkdv.shared_bytes == attention_backward_ws.shared_bytes(c.d, attention_backward_ws.stages(c.d)) <= 227 * 1024
    assert attention_backward_ws.stages(c.d) == (2 if c.d == 128 else 4)
    for kernel in program.kernels:
        compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


@pytest.mark.parametrize("case", sorted(c for c in WGMMA_CASES if WGMMA_CASES[c].d == 64))
def test_k_and_v_in_registers_compile_for_sm90_at_head_dim_64(case: str) -> None:
    """Sᵀ's and dPᵀ's products take K and V as register A fragments (ldmatrix, once)."""
    _, _, program = backward_program(case, WGMMA_PRODUCER_KV)
    dkdv = program.kernels[1]
    assert "_dkdv_wgmma_ws_kv_" in dkdv.name and "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in dkdv.source
    assert "wgmma_rs_k(s, kf[kk]" in dkdv.source and "wgmma_rs_k(dp, vf[kk]" in dkdv.source
    compile_cubin(dkdv.source, dkdv.name, 90, dkdv.arch_suffix)


def producer_choices(d: int) -> list[tuple[str, dict[str, object]]]:
    """(case, tuning): the producer kernel's choices for one head dim, on every wgmma case of it."""
    tunings = [WGMMA_PRODUCER, WGMMA_PRODUCER_KV, WGMMA_PRODUCER_WIDE] if d == 64 else [WGMMA_PRODUCER]
    tunings += [WGMMA_PRODUCER_BEHIND, WGMMA_PRODUCER_PINGPONG] if d == 128 else []
    return [(case, tuning) for case in sorted(WGMMA_CASES) if WGMMA_CASES[case].d == d for tuning in tunings]


@pytest.mark.parametrize(("case", "tuning"), producer_choices(64) + producer_choices(128))
def test_every_producer_kernel_choice_compiles_for_sm90a_without_spills(case: str, tuning: dict[str, object]) -> None:
    """128-row query tiles (head dim 64): Sᵀ and dPᵀ of 64 keys by 128 rows (m64n128 steps), Q and
    dO boxes of 128 rows, two stages, dS from the packed P. dQ a tile behind (head dim 128): three
    dS buffers and their mbarriers; with the warpgroups taking turns, two more named barriers.
    Every choice within its warpgroups' registers (``setmaxnreg``), no serialised wgmma."""
    _, _, program = backward_program(case, tuning)
    dkdv = program.kernels[1]
    consumers, d = CONSUMERS[str(tuning)], WGMMA_CASES[case].d
    ring = attention_backward_ws.stages(d, consumers)
    assert f"_dkdv_wgmma_ws{consumers.suffix}_" in dkdv.name
    assert f"BQ = {consumers.rows}, STAGES = {ring}, DS_RING = {consumers.ds_buffers};" in dkdv.source
    n128 = "wgmma.mma_async.sync.aligned.m64n128k16" in dkdv.source  # Sᵀ's at 128 rows, dV's and dK's at D 128
    assert n128 == (consumers.rows == 128 or d == 128)
    assert ("unpack2(p[" in dkdv.source) == consumers.packed_p == (consumers.rows == 128)
    assert ("mbar_wait(ds_full + 8 * behind_buffer" in dkdv.source) == consumers.dq_behind
    assert ('bar.arrive %0, 256;\\n" ::"r"(4 + 1 - wg)' in dkdv.source) == consumers.pingpong
    static = 2 * ring * consumers.rows * 4  # lse_s and delta_s
    assert dkdv.shared_bytes == attention_backward_ws.shared_bytes(d, ring, consumers) <= 227 * 1024 - static
    report = ptxas_report(dkdv, 90)
    assert re.findall(r"(\d+) bytes spill stores", report) == ["0"], report[-600:]
    assert "serializ" not in report, report[-600:]


@pytest.mark.parametrize(
    ("case", "tuning", "message"),
    [
        ("d128_bshd", WGMMA_PRODUCER_WIDE, "128-row query tiles are for head dim 64 only, not 128"),
        ("gqa_4to1_causal", WGMMA_PRODUCER_BEHIND, "dQ's product a tile behind is for head dim 128 only, not 64"),
        ("gqa_4to1_causal", WGMMA_PRODUCER_PINGPONG, "dQ's product a tile behind is for head dim 128 only, not 64"),
    ],
)
def test_the_producer_kernels_new_choices_say_why_not_at_the_other_head_dim(
    case: str, tuning: dict[str, object], message: str
) -> None:
    with pytest.raises(UnsupportedError, match=f"'attention_backward': {message}"):
        backward_program(case, tuning)


@pytest.mark.parametrize(
    ("case", "o_vectors"), [("d64_half_alone_causal", True), ("d128_bf16_alone_bshd", True), ("d128_bshd", False)]
)
def test_the_hopper_memory_passes_move_16_bytes_a_thread_where_the_rows_take_them(case: str, o_vectors: bool) -> None:
    """delta reads O and dO 16 bytes at a time where both are in Q's 16-bit type (a training
    step's O is the forward's fp32), dQ's conversion stores 16 bytes; both compile."""
    delta, _, convert = backward_program(case)[2].kernels
    assert ("const uint4 ov" in delta.source) == o_vectors and "make_float4(0.0f" in delta.source
    assert "make_uint4(pack2(scale * acc[0]" in convert.source and "if (aligned)" in convert.source
    for kernel in (delta, convert):
        compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


def test_k_and_v_in_registers_say_why_not_at_head_dim_128() -> None:
    with pytest.raises(
        UnsupportedError, match=r"'attention_backward': K and V stay in registers at head dim 64 only, not 128"
    ):
        backward_program("d128_bshd", WGMMA_PRODUCER_KV)


def test_the_wgmma_choices_name_their_dkdv_kernel() -> None:
    """``{"path": "wgmma"}`` alone is the default kernel for the problem; ``producer`` names one."""
    names = {str(t): backward_program("d128_bshd", t)[2].kernels[1].name for t in (WGMMA, WGMMA_COPIES, WGMMA_PRODUCER)}
    assert "_dkdv_wgmma_ws_" in names[str(WGMMA_PRODUCER)] and "_ws_" not in names[str(WGMMA_COPIES)]
    default = backward_program("d128_bshd")[2].kernels[1].name
    assert names[str(WGMMA)] == default


@pytest.mark.parametrize("tuning", [WGMMA, WGMMA_PRODUCER])
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("d72_dv40", "head dims D=72, Dv=40"),
        ("d64_dv128_runtime_scale", "head dims D=64, Dv=128"),
        ("padding_with_empty_sequences", "padding or packed sequences"),
        ("dropout_gqa_causal", "a bias, ALiBi, a sliding window or dropout"),
        ("sliding_window_causal", "a bias, ALiBi, a sliding window or dropout"),
        ("mixed_types_simt", "not all fp16 or all bf16"),
    ],
)
def test_the_wgmma_tuning_says_why_it_cannot_take_a_problem(case: str, reason: str, tuning: dict[str, object]) -> None:
    with pytest.raises(UnsupportedError, match=f"node 'attention_backward': the wgmma kernels do not take .*{reason}"):
        backward_program(case, tuning)


def test_a_deterministic_backward_keeps_the_kernels_that_sum_in_a_fixed_order() -> None:
    options = {"use_causal_mask": True, "use_deterministic_algorithm": True}
    graph = BackwardCase(hq=8, hk=2, sq=129, skv=129, forward=False, options=options).build().validate()
    (fused,) = [f for f in fuse(graph).nodes if f.family is Family.ATTENTION_BACKWARD]
    program = emitter(fused.family)(fused, EmitContext(graph, signature(graph), 90, {}))
    assert all("_mma_" in k.name for k in program.kernels[1:]) and len(program.scratch) == 1
    with pytest.raises(UnsupportedError, match="do not take use_deterministic_algorithm"):
        emitter(fused.family)(fused, EmitContext(graph, signature(graph), 90, WGMMA))


def test_sm80_keeps_the_mma_kernels_and_refuses_wgmma() -> None:
    assert all("_mma_" in k.name for k in backward_program("d128_gqa_causal_fp16", arch=80)[2].kernels[1:])
    with pytest.raises(UnsupportedError, match="the target is sm_80, not sm_90"):
        backward_program("d128_gqa_causal_fp16", WGMMA, arch=80)


def test_the_simt_kernels_of_every_case_compile_for_sm80_and_sm90() -> None:
    """What the tensor-core cases would run with the SIMT tuning (the GPU tests compare both)."""
    for arch in (80, 90):
        for case in ("d128_gqa_causal_fp16", "padding_causal_bottom_right_fp16", "alibi_causal_6_heads"):
            for kernel in backward_program(case, SIMT)[2].kernels:
                compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


def test_every_case_compiles_for_sm80_and_sm90() -> None:
    report = compile_graphs([case.build().validate() for case in CASES.values()])
    assert not report.failures, "\n\n".join(report.failures)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("case", "path", "aligned"), cpu_runs(CPU_CASES))
def test_kernels_match_reference_on_the_cpu(
    case: str, path: str, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    graph, fused, program = backward_program(case, SIMT if path == "simt" else {})
    assert all(f"_{path}_" in k.name for k in program.kernels[1:])
    matches_on_the_cpu(graph, fused, program, CPU_CASES[case].consistent_feeds(graph, 7), aligned, tmp_path_factory)
