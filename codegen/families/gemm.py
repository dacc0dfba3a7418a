"""GEMM family: convolution forward (as an implicit GEMM, gemm_problem.py) and matmul, with a
fused epilogue (gemm_epilogue.py). This module picks the path and lists the launch choices.

Two paths, both always correct:
- tensor cores (``mma.sync``: fp16/bf16 inputs, fp32 accumulation; int8 inputs, exact s32
  accumulation; from sm_89 fp8 inputs, fp32 accumulation; gemm_mma.py) when the channel / K
  dims are contiguous in memory in 16-byte chunks: a multi-stage ``cp.async``
  pipeline into XOR-swizzled shared memory (gemm_loaders.py), then the accumulator tile is
  staged through shared memory so that the epilogue reads operands and writes the output in
  contiguous 16-byte vectors (gemm_block.py). On sm_90 the same problems can take ``wgmma``
  instead (gemm_sm90.py: same loaders and epilogue), when the tuning choice asks for it;
- SIMT, one output element per thread, for everything else (gemm_simt.py), fp8 on sm_80
  included (no fp8 tensor cores there: each element is widened to fp32 in the kernel). An
  8-bit matmul the tensor cores cannot read (B not K-major, K not in 16-byte chunks) is
  refused with the layout it needs (gemm_problem.eight_bit_refusal) rather than run slowly.

Problems with fewer output tiles than the GPU has SMs and a long K take split-K on either
tensor-core path (gemm_splitk.py): a second kernel sums the K slices and runs the epilogue.

On sm_90, matmuls with enough tiles to fill the GPU take the persistent warp-specialised TMA
engine (gemm_ws.py) unless a tuning says otherwise.
"""

from __future__ import annotations

import dataclasses

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import FusedProgram
from .gemm_mma import TILE_CANDIDATES, mma_kernel, tile_config
from .gemm_problem import eight_bit_refusal, on_tensor_cores, problem_of
from .gemm_simt import simt_kernel
from .gemm_sm90 import candidates as wgmma_candidates
from .gemm_sm90 import wgmma_kernel
from .gemm_splitk import output_tiles, reduce_kernel, scratch, split_choices, tuned_split
from .gemm_ws import candidates as ws_candidates
from .gemm_ws import default_choice as default_ws
from .gemm_ws import ws_kernel


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    assert fused.anchor is not None
    problem = problem_of(fused.anchor)
    refusal = eight_bit_refusal(problem, ctx.arch)
    if refusal is not None:
        raise UnsupportedError(refusal)
    if not on_tensor_cores(problem, ctx.arch):
        return FusedProgram(fused.name, (simt_kernel(fused, ctx, problem),))
    default = None if ctx.tuning else default_ws(problem, ctx.arch)
    if default is not None:
        return FusedProgram(fused.name, (ws_kernel(fused, dataclasses.replace(ctx, tuning=default), problem),))
    if ctx.tuning.get("path") == "ws":
        return FusedProgram(fused.name, (ws_kernel(fused, ctx, problem),))
    if ctx.tuning.get("path") == "wgmma":
        split = tuned_split(ctx, problem) or 1
        kernel = wgmma_kernel(fused, ctx, problem, split)
    else:
        tile, split = tile_config(problem, ctx)
        kernel = mma_kernel(fused, ctx, problem, tile, split)
    if split == 1:
        return FusedProgram(fused.name, (kernel,))
    return FusedProgram(fused.name, (kernel, reduce_kernel(fused, ctx, problem, split)), (scratch(problem, split),))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Launch choices the runtime may time on the GPU (autotuning); empty on the SIMT path.
    The mma.sync tiles (no "path" key) and, for problems with few output tiles, their split-K
    variants ("split_k"), then on sm_90 the wgmma ones ({"path": "wgmma", ...})."""
    assert fused.anchor is not None
    problem = problem_of(fused.anchor)
    if not on_tensor_cores(problem, arch):
        return []
    mma: list[dict[str, object]] = [
        {"block_m": c.block_m, "block_n": c.block_n, "stages": c.stages} for c in TILE_CANDIDATES
    ]
    split: list[dict[str, object]] = [
        {"block_m": c.block_m, "block_n": c.block_n, "stages": c.stages, "split_k": s}
        for c in TILE_CANDIDATES
        for s in split_choices(problem, output_tiles(problem, c.block_m, c.block_n), arch)
    ]
    return mma + split + wgmma_candidates(problem, arch) + ws_candidates(problem, arch)
