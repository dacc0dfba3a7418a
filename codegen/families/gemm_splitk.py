"""Split-K for the tensor-core GEMM kernels: when the output has fewer tiles than the GPU has
SMs, the k tiles are cut into ``split`` contiguous slices, one block per (tile, slice), so that
more blocks share the work and each walks a shorter K.

Deterministic, no atomics: every slice block stores its fp32 accumulator tile, whole (a slice
with no k tile stores zeros), into the scratch buffer ``partials`` laid out
[batch][slice][M][NP] (NP: N rounded up to 8, so that each 8-column chunk is two aligned
float4); a second kernel sums the slices of each element in slice order and runs the same
tile epilogue as the single-kernel path (gemm_epilogue.tile_epilogue). The slice is folded into
blockIdx.z: ``blockIdx.z = batch * SPLIT + slice``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..indexing import c_extent
from ..kernel import Kernel, Scratch
from .gemm_epilogue import stage_accumulators, tile_epilogue
from .gemm_problem import MAX_GRID_Z, Problem, declare, dynamic_grid, index_type_of, tensor_core_types

PARTIALS = "partials"
MAX_SPLIT = 16
# A convolution's wgrad reduces over N*P*Q (10^5 and more for a ResNet layer at N=32) into a
# few output tiles (K x C*R*S): more slices to fill the GPU, each still long.
MAX_GRAD_SPLIT = 64
MIN_SLICE_K = 512  # k per slice at least: 16 mma.sync or 8 wgmma k tiles, to pay for the reduction
# The reduction kernel's block: 256 threads, BN = 128 columns; one 8-column chunk per thread of a
# slice group (reduce_groups), so 16 rows with one group, 1 with 16
REDUCE_BN, REDUCE_THREADS = 128, 256


@dataclass(frozen=True)
class KSlices:
    """Which k tiles a tensor-core block walks: all KTILES (``split`` 1, the kernel as without
    split-K, word for word), or the ``slice_tiles`` tiles of its slice from ``kt_first`` on."""

    split: int

    @property
    def count(self) -> str:
        """The number of k tiles the block walks (a C expression)."""
        return "KTILES" if self.split == 1 else "slice_tiles"

    def tile(self, kt: str) -> str:
        """The global k tile of the block's ``kt``-th tile."""
        return kt if self.split == 1 else f"(kt_first + {kt})"

    @property
    def batch_index(self) -> str:
        return "blockIdx.z" if self.split == 1 else "(blockIdx.z / SPLIT)"

    def setup(self) -> list[str]:
        """The block's slice, after KTILES is defined."""
        if self.split == 1:
            return []
        return [
            f"constexpr int SPLIT = {self.split}, SLICE_TILES = (KTILES + SPLIT - 1) / SPLIT;",
            "// The last slices may hold fewer k tiles, or none (they store a zero tile).",
            "const int kt_first = (blockIdx.z % SPLIT) * SLICE_TILES;",
            "const int slice_tiles = max(0, min(KTILES - kt_first, SLICE_TILES));",
        ]


def output_tiles(p: Problem, block_m: int, block_n: int) -> int:
    """Blocks of a launch without split-K: output tiles times batch indices."""
    return -(-p.m // block_m) * -(-p.n // block_n) * math.prod(p.batch)


def heuristic_split(p: Problem, tiles: int, arch: int) -> int:
    """How many K slices when nothing is tuned: 1 (no split-K) once the ``tiles`` output tiles
    fill the SMs of sm_``arch``; else enough slices to fill about one wave of blocks, each slice
    keeping at least MIN_SLICE_K of K, at most MAX_SPLIT (MAX_GRAD_SPLIT for a conv gradient)."""
    sms = sm_count(arch)
    return 1 if tiles >= sms else max(1, min(-(-sms // tiles), _most_slices(p)))


def _integer(p: Problem) -> bool:
    """int8 operands: their s32 accumulators are exact, fp32 partials would not be (no split-K)."""
    types = tensor_core_types(p)
    return types is not None and types.integer


def split_choices(p: Problem, tiles: int, arch: int) -> list[int]:
    """The split-K variants autotuning times for a tile giving ``tiles`` output tiles: the
    heuristic's split, half and twice it (within the same limits); none for many tiles."""
    best = heuristic_split(p, tiles, arch)
    if best == 1:
        return []
    return sorted({s for s in (best // 2, best, 2 * best) if 2 <= s <= _most_slices(p)})


def _most_slices(p: Problem) -> int:
    if _integer(p):
        return 1
    most = MAX_GRAD_SPLIT if p.is_grad else MAX_SPLIT
    return min(p.k // MIN_SLICE_K, most, MAX_GRID_Z // math.prod(p.batch))


def tuned_split(ctx: EmitContext, p: Problem) -> int | None:
    """The tuning's split_k; 1 for a tuned tile without one (a choice made before split-K
    existed names today's kernel); None when nothing is tuned (the heuristic decides)."""
    if "split_k" not in ctx.tuning:
        return 1 if "block_m" in ctx.tuning else None
    split = ctx.tuning["split_k"]
    if not isinstance(split, int) or isinstance(split, bool) or not 1 <= split <= MAX_GRID_Z // math.prod(p.batch):
        raise UnsupportedError(
            f"GEMM tuning {ctx.tuning}: split_k must be an integer from 1 to {MAX_GRID_Z // math.prod(p.batch)} "
            f"(K slices times {math.prod(p.batch)} batch indices fill at most {MAX_GRID_Z} grid layers)"
        )
    if split > 1 and _integer(p):
        raise UnsupportedError(
            f"GEMM tuning {ctx.tuning}: int8 GEMMs take no split-K (their int32 sums would pass through fp32 partials)"
        )
    return split


def padded_n(p: Problem) -> int:
    """Floats per row of a partial tile: N rounded up to whole 8-column chunks."""
    return -(-p.n // 8) * 8


def scratch(p: Problem, split: int) -> Scratch:
    return Scratch(PARTIALS, math.prod(p.batch) * split * p.m * padded_n(p) * 4)


def store_partials(p: Problem, c_stride: int, staging: list[str]) -> list[str]:
    """A slice block's epilogue: its staged fp32 tile into ``partials`` (rows of NP floats), in
    8-column chunks; nothing else of the fused epilogue runs here."""
    return [
        *stage_accumulators(staging),
        *partial_chunks(p, "blockIdx.z", lambda col: f"staged + row * {c_stride} + {col}"),
    ]


def partial_chunks(p: Problem, layer: str, staged: Callable[[str], str]) -> list[str]:
    """The staged BM x BN fp32 tile into the partial tile of grid layer ``layer`` (batch * SPLIT
    + slice), 8 columns a thread; ``staged(col)``: the address of the tile's 4 floats at ``row``,
    ``col``. Rows and columns past the output are left alone."""
    return [
        f"constexpr int NP = {padded_n(p)};",
        f"float* const partial = partials + (size_t){layer} * GM * NP;  // this (batch, slice)'s M x NP tile",
        "for (int chunk = tid; chunk < BM * BN / 8; chunk += THREADS) {",
        "  const int row = chunk / (BN / 8), col = (chunk % (BN / 8)) * 8;",
        "  if (block_m + row >= GM || block_n + col >= GN) continue;",
        "  float* const dst = partial + (size_t)(block_m + row) * NP + block_n + col;",
        f"  *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>({staged('col')});",
        f"  *reinterpret_cast<float4*>(dst + 4) = *reinterpret_cast<const float4*>({staged('col + 4')});",
        "}",
    ]


def reduce_groups(p: Problem, split: int, arch: int) -> int:
    """Slice groups of the reduction: 1 (each thread sums every slice of its chunk), or more for
    a small output with many slices (a wgrad's 64 x 576 dw over 88 slices is 4,608 chunks, a few
    warps per SM each walking a long chain of loads): the slices are cut into that many
    contiguous groups, each summed by its own threads, so that the launch has threads for two
    blocks of REDUCE_THREADS per SM."""
    chunks = p.m * -(-p.n // 8) * math.prod(p.batch)
    target = 2 * sm_count(arch) * REDUCE_THREADS
    most = min(16, 1 << max(0, (split // 2).bit_length() - 1))  # two slices a group at least
    return next(g for g in (1, 2, 4, 8, 16) if g >= most or chunks * g >= target)


def reduce_kernel(fused: FusedNode, ctx: EmitContext, p: Problem, split: int) -> Kernel:
    """The second kernel: per output element, the sum of the slices' partials in a fixed order
    (bitwise reproducible: each slice group's in slice order, then the groups in order; one
    group is plain slice order), then the fused epilogue; one grid layer per batch index."""
    groups = reduce_groups(p, split, ctx.arch)
    tile_rows = REDUCE_THREADS // (REDUCE_BN // 8) // groups  # one chunk per thread of a group
    params, names = declare(fused, p)
    params.scratch(PARTIALS, "const float")
    itype = index_type_of(fused, p)
    aligned = params.aligned_flag()
    sums = _slice_sums("acc8", "0", "PER" if groups > 1 else "SPLIT")
    fetch = [
        "if (block_n + col >= GN) continue;  // a chunk wholly past the last column",
        "#pragma unroll",
        "for (int e = 0; e < 8; ++e) acc8[e] = 0.0f;",
        *sums,
    ]
    if groups > 1:
        fetch += [
            "for (int g = 1; g < GROUPS; ++g) {  // the other groups' sums, in group order",
            "  const float4 lo = group_sums[g - 1][chunk][0], hi = group_sums[g - 1][chunk][1];",
            "  acc8[0] += lo.x; acc8[1] += lo.y; acc8[2] += lo.z; acc8[3] += lo.w;",
            "  acc8[4] += hi.x; acc8[5] += hi.y; acc8[6] += hi.z; acc8[7] += hi.w;",
            "}",
        ]
    sizes = f"GN = {p.n}, NP = {padded_n(p)}, SPLIT = {split}"
    rows = (
        [f"const int GM = (int){c_extent(p.m_extent)};", f"constexpr int {sizes};"]
        if p.is_dynamic
        else [f"constexpr int GM = {p.m}, {sizes};"]
    )
    body = [
        f"constexpr int BM = {tile_rows}, BN = {REDUCE_BN}, THREADS = {REDUCE_THREADS};",
        *rows,
        "const int tid = threadIdx.x;",
        f"const {itype} block_m = ({itype})blockIdx.x * BM;",
        "const int block_n = blockIdx.y * BN;",
        *(
            ["if (block_m >= GM) return;  // a tile past this call's M: the grid is sized for the largest"]
            if p.is_dynamic
            else []
        ),
        *(_group_sums(groups, itype) if groups > 1 else []),
        *tile_epilogue(fused, p, names, itype, aligned, fetch),
    ]
    name, source = kernel_source(
        ctx, fused, pattern_name(fused) + "_splitk_reduce", params, REDUCE_THREADS, indent(body, 1)
    )
    grid = (-(-p.m // tile_rows), -(-p.n // REDUCE_BN), math.prod(p.batch))
    blocks = dynamic_grid(p, tile_rows)
    return Kernel(name, source, grid, (REDUCE_THREADS, 1, 1), 0, tuple(params.bindings), alignment=16, blocks=blocks)


def _slice_sums(acc: str, first: str, count: str) -> list[str]:
    """Adds the ``count`` partials of slices ``first``.. of the chunk at row ``m``, column
    ``block_n + col`` to ``acc`` (8 floats), in slice order."""
    end = "SPLIT" if count == "SPLIT" else f"min(SPLIT, {first} + {count})"
    return [
        f"for (int slice = {first}; slice < {end}; ++slice) {{  // a fixed order: the same sum every run",
        "  const float* const part = partials + ((size_t)(blockIdx.z * SPLIT + slice) * GM + m) * NP + block_n + col;",
        "  const float4 lo = *reinterpret_cast<const float4*>(part), hi = *reinterpret_cast<const float4*>(part + 4);",
        f"  {acc}[0] += lo.x; {acc}[1] += lo.y; {acc}[2] += lo.z; {acc}[3] += lo.w;",
        f"  {acc}[4] += hi.x; {acc}[5] += hi.y; {acc}[6] += hi.z; {acc}[7] += hi.w;",
        "}",
    ]


def _group_sums(groups: int, itype: str) -> list[str]:
    """Slice groups 1..GROUPS-1 (threads CHUNKS and up): each thread sums its chunk's slices of
    its group into shared memory; group 0 (the first CHUNKS threads) sums its own slices in the
    epilogue's fetch and adds these in group order."""
    return [
        f"constexpr int GROUPS = {groups}, CHUNKS = BM * BN / 8, PER = (SPLIT + GROUPS - 1) / GROUPS;",
        "__shared__ float4 group_sums[GROUPS - 1][CHUNKS][2];",
        "if (tid >= CHUNKS) {",
        "  const int chunk = tid % CHUNKS, group = tid / CHUNKS;",
        "  const int row = chunk / (BN / 8), col = (chunk % (BN / 8)) * 8;",
        f"  const {itype} m = block_m + row;",
        "  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};",
        "  if (m < GM && block_n + col < GN) {",
        *("    " + line for line in _slice_sums("sum", "group * PER", "PER")),
        "  }",
        "  group_sums[group - 1][chunk][0] = make_float4(sum[0], sum[1], sum[2], sum[3]);",
        "  group_sums[group - 1][chunk][1] = make_float4(sum[4], sum[5], sum[6], sum[7]);",
        "}",
        "__syncthreads();",
    ]
