"""RoPE folded into attention on the GPU against the reference: the default path (the Q prologue
of the flash and Hopper kernels, the tensor-core decode kernel's rotations, the pre-pass), then
the first launch choice of every other path, on awkward shapes, by theta and by cos/sin tables."""

from __future__ import annotations

import zlib

import pytest

from codegen.emit import candidates
from fusion_rules import Family, fuse
from graphdnn.runtime.driver import current_gpu_arch
from tests.gpu_check import check_on_gpu
from tests.rotary_cases import GPU_CASES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_rotary_attention_matches_reference(case: str) -> None:
    graph = GPU_CASES[case].build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    assert fused.rule == "rotary_attention"
    check_on_gpu(graph, seed=zlib.crc32(case.encode()))


@pytest.mark.parametrize("case", ["odd_gqa_causal_d128", "decode_gqa", "d64_fp16_not_causal"])
def test_every_attention_path_reads_the_rotated_operands(case: str) -> None:
    graph = GPU_CASES[case].build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    firsts: dict[object, dict[str, object]] = {}
    for choice in candidates(fused, current_gpu_arch()):
        firsts.setdefault(choice.get("path"), choice)
    assert len(firsts) >= 2
    for choice in firsts.values():
        check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice})
