"""Attention backward on the GPU against the reference: every case of attention_backward_cases.py
as a training step (sdpa then sdpa_backward: the forward kernel's O and STATS feed the backward;
fp16/bf16 cases on the wgmma kernels on sm_90 where they apply, else up to head dim 128 on the
mma.sync kernels), the SIMT kernels where tensor cores
would run, the CPU cases (sdpa_backward alone, O and STATS from the forward reference), rows and
keys no one sees (zero gradients), run-to-run determinism (mma.sync), and the Hopper wgmma
kernels (taken with their tuning) on their cases, run after run."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import graphdnn as gd
from codegen.families.attention_backward import MMA, SIMT, WGMMA, WGMMA_COPIES, WGMMA_PRODUCER, WGMMA_PRODUCER_KV
from codegen.families.attention_backward import WGMMA_PRODUCER_BEHIND as BEHIND
from codegen.families.attention_backward import WGMMA_PRODUCER_PINGPONG as PINGPONG
from codegen.families.attention_backward import WGMMA_PRODUCER_WIDE as WIDE
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.compare import tolerance
from graphdnn.random_inputs import random_inputs
from tests.attention_backward_cases import CASES, CPU_CASES, WGMMA_ALONE_CASES, WGMMA_CASES
from tests.gpu_check import check_on_gpu, poisoned, relative_error, to_device, to_numpy

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_step_matches_reference(case: str) -> None:
    check_on_gpu(CASES[case].build(), seed=zlib.crc32(case.encode()))


@pytest.mark.parametrize(
    "case", ["d128_gqa_causal_fp16", "padding_causal_bottom_right_fp16", "alibi_causal_6_heads", "dropout_gqa_causal"]
)
def test_simt_kernels_match_reference_where_tensor_cores_would_run(case: str) -> None:
    graph = CASES[case].build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION_BACKWARD]
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: SIMT})
    assert any("_dkdv_simt_" in kernel.name for kernel in plan.kernels)


def backward_node(graph: gd.OperationGraphSpec) -> str:
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION_BACKWARD]
    return fused.name


@pytest.mark.parametrize(("tuning", "kernel"), [(WGMMA_COPIES, "_dkdv_wgmma_"), (WGMMA_PRODUCER, "_dkdv_wgmma_ws_")])
@pytest.mark.parametrize("case", sorted(WGMMA_CASES))
def test_wgmma_kernels_match_reference(case: str, tuning: dict[str, object], kernel: str) -> None:
    """Either dK/dV kernel: every thread copying, or fed by a TMA producer warpgroup."""
    graph = WGMMA_CASES[case].build()
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={backward_node(graph): tuning})
    assert any(kernel in k.name for k in plan.kernels)


@pytest.mark.parametrize("case", sorted(c for c in WGMMA_CASES if WGMMA_CASES[c].d == 64))
def test_wgmma_kernel_with_k_and_v_in_registers_matches_reference(case: str) -> None:
    graph = WGMMA_CASES[case].build()
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={backward_node(graph): WGMMA_PRODUCER_KV})
    assert any("_dkdv_wgmma_ws_kv_" in k.name for k in plan.kernels)


NEW_CHOICES = {  # by the kernel name's ending
    "wide": WIDE,
    "behind": BEHIND,
    "pingpong": PINGPONG,
}


@pytest.mark.parametrize(
    "case",
    [
        f"{c}-{choice}"
        for c in sorted(WGMMA_CASES)
        for choice in (("wide",) if WGMMA_CASES[c].d == 64 else ("behind", "pingpong"))
    ],
)
def test_the_producer_kernels_new_choices_match_reference(case: str) -> None:
    """128-row query tiles at head dim 64; dQ's product a tile behind at 128, with or without the
    warpgroups taking turns."""
    name, choice = case.rsplit("-", 1)
    graph = WGMMA_CASES[name].build()
    plan = check_on_gpu(graph, seed=zlib.crc32(name.encode()), tuning={backward_node(graph): NEW_CHOICES[choice]})
    assert any(f"_dkdv_wgmma_ws_{choice}_" in k.name for k in plan.kernels)


@pytest.mark.parametrize(
    ("tuning", "case"),
    [(t, "gqa_4to1_causal") for t in (WGMMA, WGMMA_PRODUCER, WGMMA_PRODUCER_KV, WIDE)]
    + [(BEHIND, "d128_gqa_causal_fp16"), (PINGPONG, "d128_gqa_causal_fp16")],
)
def test_wgmma_dq_is_right_run_after_run(tuning: dict[str, object], case: str) -> None:
    """Each run's preprocess kernel zeroes dq_accum before the bulk reductions add into it."""
    import torch

    graph = WGMMA_CASES[case].build()
    ir = graph.validate()
    feeds = random_inputs(ir, 13)
    expected = reference.execute(ir, feeds)
    plan = gd.compile(ir, tuning={backward_node(graph): tuning})
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    for _ in range(3):
        outputs = {t.name: poisoned(t) for t in ir.outputs}
        plan.execute({**pack, **outputs})
        torch.cuda.synchronize()
        for t in ir.outputs:
            assert relative_error(to_numpy(outputs[t.name]), expected[t.name]) <= tolerance(t.data_type), t.name


def test_tensor_core_kernels_run_where_they_apply() -> None:
    """On sm_90 the default is the wgmma kernels; the mma.sync ones when tuned so."""
    graph = CASES["d128_gqa_causal_fp16"].build()
    plan = check_on_gpu(graph, seed=1)
    assert any("_dkdv_wgmma_" in kernel.name for kernel in plan.kernels)
    plan = check_on_gpu(graph, seed=1, tuning={backward_node(graph): MMA})
    assert sum("_mma_" in kernel.name for kernel in plan.kernels) == 2


def run_alone(  # type: ignore[no-untyped-def]
    case: str, seed: int, chosen: dict[str, np.ndarray] | None = None, tuning: dict[str, object] | None = None
):
    """The backward-alone graph on consistent inputs (the node with ``tuning``): (the graph,
    outputs by name, the reference's)."""
    import torch

    spec = (CPU_CASES | WGMMA_ALONE_CASES)[case]
    ir = spec.build().validate()
    feeds = spec.consistent_feeds(ir, seed, chosen)
    expected = reference.execute(ir, feeds)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    pack = {t.name: feeds[t.name] if t.is_pass_by_value else to_device(feeds[t.name], t) for t in ir.inputs}
    node_tuning = None if tuning is None else {backward_node(spec.build()): tuning}
    gd.compile(ir, tuning=node_tuning).execute({**pack, **outputs})
    torch.cuda.synchronize()
    return ir, {name: to_numpy(value) for name, value in outputs.items()}, expected


@pytest.mark.parametrize("case", sorted(CPU_CASES))
def test_backward_alone_matches_reference(case: str) -> None:
    ir, got, expected = run_alone(case, 3)
    for t in ir.outputs:
        assert relative_error(got[t.name], expected[t.name]) <= tolerance(t.data_type), t.name


@pytest.mark.parametrize("tuning", [WGMMA, WGMMA_COPIES])
@pytest.mark.parametrize("case", sorted(WGMMA_ALONE_CASES))
def test_wgmma_backward_alone_with_16_bit_o_matches_reference(case: str, tuning: dict[str, object]) -> None:
    """The preprocess kernel's 16-byte reads of O and dO (the training step's O is fp32)."""
    ir, got, expected = run_alone(case, 7, tuning=tuning)
    for t in ir.outputs:
        assert relative_error(got[t.name], expected[t.name]) <= tolerance(t.data_type), t.name


def test_keys_and_rows_no_one_sees_get_zero_gradients() -> None:
    feeds = {"seq_q": np.array([17, 0, 5], np.int32).reshape(3, 1, 1, 1)}
    feeds["seq_kv"] = np.array([4, 13, 0], np.int32).reshape(3, 1, 1, 1)
    _, got, expected = run_alone("half_padding_bias_bshd", 5, feeds)
    assert (got["dk"][0, :, 4:] == 0).all() and (got["dv"][0, :, 4:] == 0).all()
    assert (got["dq"][1] == 0).all() and (got["dq"][2] == 0).all()
    for name in ("dq", "dk", "dv"):
        np.testing.assert_allclose(got[name], expected[name], atol=2e-2)


@pytest.mark.parametrize("case", ["gqa_4to1_causal", "d128_gqa_causal_fp16"])
def test_mma_gradients_are_bitwise_the_same_run_to_run(case: str) -> None:
    """No atomics on the mma.sync path: every gradient element is summed in a fixed order."""
    import torch

    graph = CASES[case].build()
    ir = graph.validate()
    feeds = random_inputs(ir, 11)
    plan = gd.compile(ir, tuning={backward_node(graph): MMA})
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    runs = []
    for _ in range(3):
        outputs = {t.name: poisoned(t) for t in ir.outputs}
        plan.execute({**pack, **outputs})
        torch.cuda.synchronize()
        runs.append({name: value.clone() for name, value in outputs.items()})
    for later in runs[1:]:
        for name, value in later.items():
            assert torch.equal(value, runs[0][name]), name
