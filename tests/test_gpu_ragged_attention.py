"""Packed (ragged) sequences on the GPU against the reference: every RAGGED_CASES case (packed
or padded K/V, GQA, head dims 64/128/72-40, masks, a sequence of no rows, spare tokens,
max_seq_len_q, fp32 on the SIMT kernel), each tuning choice (flash and Hopper) on one case,
and offsets out of order."""

from __future__ import annotations

import zlib

import pytest

from codegen.emit import candidates
from fusion_rules import Family, fuse
from tests.attention_cases import RAGGED_CASES, offsets_out_of_order
from tests.gpu_check import check_on_gpu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", sorted(RAGGED_CASES))
def test_ragged_cases_match_reference(name: str) -> None:
    case = RAGGED_CASES[name]
    plan = check_on_gpu(case.build(), feeds=case.feeds(zlib.crc32(name.encode())))
    assert any("ragged_fill" in kernel.name for kernel in plan.kernels)


def test_every_tuning_choice_matches_reference() -> None:
    case = RAGGED_CASES["packed_qkv_causal"]
    graph = case.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    for choice in candidates(fused, 90):
        check_on_gpu(graph, feeds=case.feeds(1), tuning={fused.name: choice})


def test_offsets_out_of_order_match_reference() -> None:
    case = RAGGED_CASES["packed_qkv_causal"]
    check_on_gpu(case.build(), feeds=offsets_out_of_order(case.feeds(2)))
