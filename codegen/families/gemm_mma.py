"""The GEMM family's mma.sync tensor-core path (sm_80+: fp16/bf16 inputs, fp32 accumulation,
m16n8k16; int8 inputs, s32 accumulation, m16n8k32; from sm_89 fp8 inputs, fp32 accumulation,
m16n8k32): a multi-stage ``cp.async`` pipeline into XOR-swizzled shared memory (conflict-free
``ldmatrix``), warp tiles of 64x32, then the accumulator tile staged through shared memory
for the epilogue (gemm_block.py).

Shared-memory tiles, ldmatrix fragments and k steps are the same in bytes for every operand
type: a k tile is 64 bytes of k (32 16-bit or 64 8-bit elements), a tensor-core step 32 bytes
(k16 or k32). 8-bit B is read K-major only (ldmatrix.trans moves 16-bit elements)."""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules import FusedNode

from ..context import EmitContext
from ..kernel import Kernel
from .gemm_block import BlockShape, TensorCoreBlock
from .gemm_loaders import SmemTiles
from .gemm_problem import Problem, tensor_core_types
from .gemm_splitk import KSlices, heuristic_split, output_tiles, tuned_split
from .tensor_core import mma_fragments, zero

_SWIZZLES = r"""
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 64-byte rows (BK = 32
// elements): XOR-swizzled so that the 8 rows one ldmatrix phase reads hit 8 distinct
// bank groups, and so do the 8 chunks of a cp.async wave.
__device__ __forceinline__ int swizzle64(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// The same for rows of ROW_BYTES = BN * 2 bytes (the k-major B tile): chunk ^ (row & 7).
template <int ROW_BYTES> __device__ __forceinline__ int swizzle_rows(int row, int chunk) {
  return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}
"""


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    stages: int

    @property
    def threads(self) -> int:
        return (self.block_m // 64) * (self.block_n // 32) * 32


TILE_CANDIDATES = (TileConfig(128, 64, 4), TileConfig(128, 128, 3), TileConfig(64, 64, 4), TileConfig(64, 128, 4))


def tile_config(p: Problem, ctx: EmitContext) -> tuple[TileConfig, int]:
    """The tile and the number of K slices (split-K, gemm_splitk.py): the tuned choice if there
    is one, else the narrowest N tile that covers N, and then either split-K, when the output
    tiles (of 128 rows, 64 when M is that short) leave SMs idle and K is long, or no split and
    smaller M tiles when there would be too few blocks to fill the GPU (132 SMs)."""
    split = tuned_split(ctx, p)
    if "block_m" in ctx.tuning:
        tuned = TileConfig(int(ctx.tuning["block_m"]), int(ctx.tuning["block_n"]), int(ctx.tuning["stages"]))  # type: ignore[call-overload]
        return tuned, split or 1
    block_n = 64 if p.n <= 64 else 128
    if split is None and (p.is_conv or not p.is_dynamic):  # no split-K for a dynamic matmul's M (gemm.py)
        block_m = 64 if p.m <= 64 else 128
        split = heuristic_split(p, output_tiles(p, block_m, block_n), ctx.arch)
        if split > 1:
            return _tile(block_m, block_n), split
    block_m = 128 if output_tiles(p, 128, block_n) >= 264 else 64
    return _tile(block_m, block_n), split or 1


def _tile(block_m: int, block_n: int) -> TileConfig:
    return next(c for c in TILE_CANDIDATES if (c.block_m, c.block_n) == (block_m, block_n))


def mma_kernel(
    fused: FusedNode,
    ctx: EmitContext,
    p: Problem,
    tile: TileConfig,
    split: int,
    block_type: type[TensorCoreBlock] = TensorCoreBlock,
) -> Kernel:
    """``block_type``: how blocks find their tiles (a grouped GEMM's blocks read them from the
    expert offsets, gemm_grouped.py)."""
    types = tensor_core_types(p)
    assert types is not None
    size = types.element_bytes
    shape = BlockShape(tile.block_m, tile.block_n, 64 // size, tile.stages, tile.threads, size)
    tiles = SmemTiles(
        shape.block_k,
        "swizzle64",
        f"swizzle_rows<{tile.block_n * size}>",
        f"swizzle_rows<{tile.block_m * 2}>",
        chunk=types.chunk,
    )
    block = block_type(fused, p, shape, tiles, KSlices(split))
    shared = shape.shared_bytes
    lines = block.prelude(
        ["extern __shared__ __align__(128) unsigned char smem[];"],
        "const int warp_m = warp / (BN / 32), warp_n = warp % (BN / 32);",
    )
    lines += _main_loop(shape, p.a_layout, block.layout, block.slices, types.chunk, types.accumulator)
    lines += block.epilogue(_mma_staging(shape.c_stride, types.accumulator))
    functions = mma_fragments(p.a.data_type, p.b.data_type) + _SWIZZLES
    return block.kernel(ctx, lines, "_mma", functions, shared)


def _main_loop(
    shape: BlockShape, a_layout: str, layout: str, slices: KSlices, chunk: int, accumulator: str
) -> list[str]:
    """The multistage pipeline: tiles kt+STAGES-1 load while tile kt feeds the tensor cores.
    A k-contiguous ("mk") or m-contiguous ("km", 16-bit only, then transposed by ldmatrix); B
    likewise. ``chunk``: elements per 16 bytes; a tensor-core step covers two chunks of k."""
    bn, a_stage, b_stage = shape.block_n, shape.a_stage, shape.b_stage
    if a_layout == "mk":
        a_fragment = [
            "      const int row = warp_m * 64 + mi * 16 + (lane & 15);",
            f"      ldmatrix_x4(smem_addr(a_tile + swizzle64(row, kk / {chunk} + (lane >> 4))), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);",
        ]
    else:  # the four 8x8 matrices (m 0-7 | 8-15) x (k 0-7 | 8-15), m-fastest, lanes 8q.. address matrix q
        a_fragment = [
            "      const int krow = kk + ((lane >> 4) << 3) + (lane & 7);",
            "      const int chunk = (warp_m * 64 + mi * 16) / 8 + ((lane >> 3) & 1);",
            f"      ldmatrix_x4_trans(smem_addr(a_tile + swizzle_rows<{shape.block_m * 2}>(krow, chunk)), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);",
        ]
    if layout == "nk":
        b_fragments = [
            "#pragma unroll",
            "      for (int nj = 0; nj < 2; ++nj) {  // two 16-column halves of the warp's 32 columns",
            "        const int row = warp_n * 32 + nj * 16 + ((lane >> 4) << 3) + (lane & 7);",
            f"        const int chunk = kk / {chunk} + ((lane >> 3) & 1);",
            "        ldmatrix_x4(smem_addr(b_tile + swizzle64(row, chunk)), b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);",
            "      }",
        ]
    else:
        b_fragments = [
            "#pragma unroll",
            "      for (int nj = 0; nj < 2; ++nj) {",
            "        const int krow = kk + ((lane >> 3) & 1) * 8 + (lane & 7);",
            "        const int chunk = (warp_n * 32 + nj * 16) / 8 + (lane >> 4);",
            f"        ldmatrix_x4_trans(smem_addr(b_tile + swizzle_rows<{bn * 2}>(krow, chunk)), b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);",
            "      }",
        ]
    return [
        f"{accumulator} acc[4][4][4];  // [m16 tile][n8 tile][fragment]: the warp's 64x32 block",
        "#pragma unroll",
        "for (int i = 0; i < 4; ++i)",
        "#pragma unroll",
        "  for (int j = 0; j < 4; ++j)",
        "#pragma unroll",
        f"    for (int e = 0; e < 4; ++e) acc[i][j][e] = {zero(accumulator)};",
        "#pragma unroll",
        "for (int s = 0; s < STAGES - 1; ++s) {",
        "  load_tile(s, s);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "}",
        f"for (int kt = 0; kt < {slices.count}; ++kt) {{",
        '  asm volatile("cp.async.wait_group %0;\\n" ::"n"(STAGES - 2));',
        "  __syncthreads();  // tile kt is in shared memory, and everyone is done with tile kt-1",
        "  load_tile((kt + STAGES - 1) % STAGES, kt + STAGES - 1);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        f"  const unsigned char* a_tile = a_smem + (kt % STAGES) * {a_stage};",
        f"  const unsigned char* b_tile = b_smem + (kt % STAGES) * {b_stage};",
        "#pragma unroll",
        f"  for (int kk = 0; kk < BK; kk += {2 * chunk}) {{",
        "    unsigned a[4][4], b[4][2];",
        "#pragma unroll",
        "    for (int mi = 0; mi < 4; ++mi) {",
        *a_fragment,
        "    }",
        *("  " + line for line in b_fragments),
        "#pragma unroll",
        "    for (int mi = 0; mi < 4; ++mi)",
        "#pragma unroll",
        "      for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);",
        "  }",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        "__syncthreads();  // the pipeline's shared memory is reused for the accumulator tile",
    ]


def _mma_staging(c_stride: int, accumulator: str) -> list[str]:
    """The warp's 64x32 accumulators (mma.sync fragments, ``accumulator`` values) into the staged tile."""
    return [
        "#pragma unroll",
        "for (int mi = 0; mi < 4; ++mi)",
        "#pragma unroll",
        "  for (int ni = 0; ni < 4; ++ni) {",
        "    const int row = warp_m * 64 + mi * 16 + (lane >> 2), col = warp_n * 32 + ni * 8 + (lane & 3) * 2;",
        f"    *reinterpret_cast<{accumulator}2*>(staged + row * {c_stride} + col) = make_{accumulator}2(acc[mi][ni][0], acc[mi][ni][1]);",
        f"    *reinterpret_cast<{accumulator}2*>(staged + (row + 8) * {c_stride} + col) = make_{accumulator}2(acc[mi][ni][2], acc[mi][ni][3]);",
        "  }",
    ]
