"""The default launch choice of a convolution weight gradient on sm_90 (conv_wgrad as a GEMM:
M = K output channels, N = R*S*C taps, K = N*P*Q pixels; gemm_problem.py).

The wgmma kernel (gemm_sm90.py, the loss read as a transposed A), with the tile and K slices
measured fastest on an H200 (benchmarks/wgrad.py, ResNet-50 layers at batch 32, each against
the other tiles with slices for one, two and three waves of blocks):
- M of 64 (a 64-channel layer): 64 x 128 tiles, 3 stages (73 KB of shared memory), slices for
  three waves, i.e. three blocks per SM: the kernel issues its gathers and tensor-core steps
  from the same warps, and three blocks hide each other's latencies best (64 x 192 tiles, two
  blocks per SM: 10% slower; one block per SM with deeper pipelines: 35% slower);
- else 128-row tiles, one block per SM with slices for one wave, 4 stages (6 for a 64-column
  tile, whose k tiles are small), 192 columns where N is a multiple of 192 but not of 256 (a
  3x3 filter over 128 channels: six tiles, none wasted).
Columns are 64 where N is that short. Every slice keeps MIN_SLICE_TILES k tiles at least.
sm_80 keeps the mma.sync heuristic (gemm_mma.tile_config).
"""

from __future__ import annotations

from graphdnn.arch import sm_count

from .gemm_problem import Problem
from .gemm_sm90 import ARCH, BLOCK_K_BYTES
from .gemm_splitk import output_tiles

MIN_SLICE_TILES = 4  # k tiles per slice at least: the partial tile's store and its reduction pay for it


def default_choice(p: Problem, arch: int) -> dict[str, object] | None:
    """The wgmma choice for the wgrad ``p`` on sm_``arch`` (module docstring), or None off sm_90."""
    if arch != ARCH or p.node.op != "conv_wgrad":
        return None
    if p.m <= 64:
        bm, bn, stages, waves = 64, 64 if p.n <= 64 else 128, 3, 3
    else:
        bm, bn, waves = 128, 64 if p.n <= 64 else 192 if p.n % 192 == 0 and p.n % 256 else 128, 1
        stages = 6 if bn == 64 else 4
    k_tiles = -(-p.k // (BLOCK_K_BYTES // p.a.data_type.itemsize))
    split = max(1, min(-(-waves * sm_count(arch) // output_tiles(p, bm, bn)), k_tiles // MIN_SLICE_TILES))
    return {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages, "split_k": split}
