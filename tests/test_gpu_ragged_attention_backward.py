"""Packed (ragged) sequences through ``sdpa_backward`` on the GPU against the reference: every
ragged training step of attention_backward_cases.py (packed or padded K/V, GQA, head dims
64/128/72-40, masks, a sequence of no rows, spare tokens, max_seq_len_q, dropout, fp32 on the
SIMT kernels), the SIMT kernels where the mma.sync ones would run, offsets out of order, and the
backward alone on the CPU-emulation cases (outputs poisoned: the fill's zeros are checked)."""

from __future__ import annotations

import zlib

import pytest

from codegen.families.attention_backward import SIMT
from fusion_rules import Family, fuse
from tests.attention_backward_cases import RAGGED_CASES, RAGGED_CPU_CASES
from tests.attention_cases import offsets_out_of_order
from tests.gpu_check import check_on_gpu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(RAGGED_CASES))
def test_ragged_training_steps_match_reference(name: str) -> None:
    case = RAGGED_CASES[name]
    plan = check_on_gpu(case.build(), feeds=case.feeds(zlib.crc32(name.encode())))
    assert sum("ragged_fill" in kernel.name for kernel in plan.kernels) == 2  # forward's outputs, then gradients


@pytest.mark.parametrize("name", ["packed_qkv_causal", "max_rows_cut_to_100", "packed_q_padded_kv"])
def test_simt_kernels_match_reference_where_tensor_cores_would_run(name: str) -> None:
    case = RAGGED_CASES[name]
    graph = case.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION_BACKWARD]
    plan = check_on_gpu(graph, feeds=case.feeds(4), tuning={fused.name: SIMT})
    assert any("_dkdv_simt_" in kernel.name for kernel in plan.kernels)


def test_offsets_out_of_order_match_reference() -> None:
    case = RAGGED_CASES["packed_qkv_causal"]
    check_on_gpu(case.build(), feeds=offsets_out_of_order(case.feeds(2)))


@pytest.mark.parametrize("name", sorted(RAGGED_CPU_CASES))
def test_backward_alone_matches_reference(name: str) -> None:
    case = RAGGED_CPU_CASES[name]
    check_on_gpu(case.build(), feeds=case.feeds(3))
