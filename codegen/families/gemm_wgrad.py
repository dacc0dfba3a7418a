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

An image gathered element by element (C not a multiple of 8: gemm_wgrad_gather.py) takes one
column tile, the narrowest of GATHER_WIDTHS that covers N (the stem's 147 in 160), 3 stages:
at 64 x 128 or less (72 KB, 164 registers: three blocks per SM) without prefetch and slices
for three waves; wider, two blocks per SM fit whatever the registers, so with prefetch and
slices for two waves. Measured on an H200 (benchmarks/wgrad.py, 2026-11-28): the stem
(7x7 s2, 3 -> 64 @224, batch 32) 106.9 us against 146.8 without prefetch and 143.5 for three
waves; a 3x3 12 -> 64 @56 39.0 us against 42.9 with prefetch at two waves.
sm_80 keeps the mma.sync heuristic (gemm_mma.tile_config).
"""

from __future__ import annotations

from graphdnn.arch import sm_count

from .gemm_problem import Problem, tensor_core_layout
from .gemm_sm90 import ARCH, BLOCK_K_BYTES
from .gemm_splitk import output_tiles

MIN_SLICE_TILES = 4  # k tiles per slice at least: the partial tile's store and its reduction pay for it
GATHER_WIDTHS = (64, 128, 160, 192, 256)  # a gathered image's column tiles (160: k-contiguous B only)


def default_choice(p: Problem, arch: int) -> dict[str, object] | None:
    """The wgmma choice for the wgrad ``p`` on sm_``arch`` (module docstring), or None off sm_90."""
    if arch != ARCH or p.node.op != "conv_wgrad":
        return None
    if tensor_core_layout(p) == "nk":
        return _gathered(p, arch)
    if p.m <= 64:
        bm, bn, stages, waves = 64, 64 if p.n <= 64 else 128, 3, 3
    else:
        bm, bn, waves = 128, 64 if p.n <= 64 else 192 if p.n % 192 == 0 and p.n % 256 else 128, 1
        stages = 6 if bn == 64 else 4
    return {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages, "split_k": _slices(p, bm, bn, waves, arch)}


def _gathered(p: Problem, arch: int) -> dict[str, object]:
    """A wgrad whose image is gathered element by element (module docstring)."""
    bm, bn = 64 if p.m <= 64 else 128, next((w for w in GATHER_WIDTHS if w >= p.n), 128)
    three_blocks = bm == 64 and bn <= 128
    waves = 3 if three_blocks else 2
    split = _slices(p, bm, bn, waves, arch)
    return {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": 3, "split_k": split, "prefetch": not three_blocks}


def _slices(p: Problem, bm: int, bn: int, waves: int, arch: int) -> int:
    """K slices for ``waves`` waves of blocks, each keeping MIN_SLICE_TILES k tiles at least."""
    k_tiles = -(-p.k // (BLOCK_K_BYTES // p.a.data_type.itemsize))
    return max(1, min(-(-waves * sm_count(arch) // output_tiles(p, bm, bn)), k_tiles // MIN_SLICE_TILES))
