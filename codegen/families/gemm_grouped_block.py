"""The blocks of the tensor-core grouped GEMM (``moe_grouped_matmul``, gemm_grouped.py): how each
block finds its tile from the per-expert offsets on the GPU, so that one launch covers every
expert although their row counts are known only at run time.

A group is a run of rows one matrix multiplies: expert e holds rows [first(e), end(e)) with
first(e) = offsets[e] clamped to [0, S] and end(e) the lowest first row of the experts after
it (S for the last): the op's rule, the last expert whose offset is at or before the row
(docs/ops.md), for any offsets, rising or not. The rows before every offset, which no expert
holds, form one more group whose output is zero (no k tile is read). Each group is cut into
row tiles of BM rows, the last one ragged (its rows past the group are predicated off by the
loaders and the epilogue, GM being the group's end); a group without rows has no tile.

The launch has one block per (row tile, column tile) pair that can exist, column tiles
fastest (consecutive blocks share their A rows, and an expert's weights stay in L2 while its
row tiles pass): sum over groups of ceil(rows / BM) <= S / BM + (groups with rows), at most
S / BM + min(E + 1, S) row tiles. Warp 0 of each block walks the experts last to first, 32
at a time (a warp's suffix minimum gives each expert's end, a suffix sum its tiles' place),
stops at the block's tile and leaves (expert, first row, end) in shared memory; blocks past
the last tile return at once.
"""

from __future__ import annotations

from ..context import EmitContext
from ..kernel import Kernel
from .gemm_block import TensorCoreBlock

NO_TILE = -2  # the expert of a block past the last tile
# The block's (expert, first row, end) sit in dynamic shared memory past the block's tiles: a
# static __shared__ array would push a tile of exactly 48 KiB over the 48 KiB a kernel may
# use without opting in, and the launch opts in for the dynamic bytes only.
GROUP_BYTES = 32
ZERO_ROWS = -1  # the expert of a tile of rows that no expert holds

SCHEDULE = r"""
// Tile `tile` of the grouped GEMM's row tiles (gemm_grouped_block.py), counted from the last
// expert's: group[0] = its expert (ZERO_ROWS: rows no expert holds; NO_TILE: past the last
// tile), group[1] = its first row, group[2] = the end of its group's rows. Warp 0 only.
template <int E, int BM, long long STRIDE, typename O>
__device__ __forceinline__ void grouped_tile(const O* offsets, long long rows, long long tile, long long* group) {
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  long long later = rows;  // the lowest first row of the experts after the current 32
  for (int base = (E - 1) / 32 * 32; base >= 0; base -= 32) {
    const int e = base + lane;
    const long long first = e < E ? min(max((long long)offsets[e * STRIDE], 0LL), rows) : rows;
    long long low = first, upto;  // suffix minimum of the first rows, then suffix sum of the tiles
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long other = __shfl_down_sync(all, low, d);
      if (lane + d < 32) low = min(low, other);
    }
    low = min(low, later);
    long long end = __shfl_down_sync(all, low, 1);
    if (lane == 31) end = later;
    const long long tiles = end > first ? (end - first + BM - 1) / BM : 0;
    upto = tiles;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long other = __shfl_down_sync(all, upto, d);
      if (lane + d < 32) upto += other;
    }
    const unsigned holders = __ballot_sync(all, upto > tile);
    if (holders != 0u) {
      if (lane == 31 - __clz(holders)) {
        group[0] = e;
        group[1] = first + (tile - (upto - tiles)) * BM;
        group[2] = end;
      }
      return;
    }
    tile -= __shfl_sync(all, upto, 0);
    later = __shfl_sync(all, low, 0);
  }
  if (lane == 0) {  // rows [0, later) belong to no expert
    group[0] = tile * BM < later ? ZERO_ROWS : NO_TILE;
    group[1] = tile * BM;
    group[2] = later;
  }
}
""".replace("ZERO_ROWS", str(ZERO_ROWS)).replace("NO_TILE", str(NO_TILE))


def row_tiles(rows: int, experts: int, block_m: int) -> int:
    """How many row tiles the launch provides for: the most any offsets can make (module docstring)."""
    return rows // block_m + min(experts + 1, rows)


class GroupedBlock(TensorCoreBlock):
    """A tensor-core block of a grouped GEMM: its tile from the offsets (module docstring), the
    weights of its expert as B, and no k tile for rows no expert holds (their output is zero)."""

    def sizes(self) -> list[str]:
        p = self.p
        return [f"constexpr int GN = {p.n}, GK = {p.k}, EXPERT_KTILES = {-(-p.k // self.shape.block_k)};"]

    def tile_origin(self) -> list[str]:
        p, s, itype = self.p, self.shape, self.itype
        offsets = p.node.input("first_token_offset")
        assert offsets is not None
        experts, stride = offsets.static_dim[0], offsets.static_stride[0]
        columns = -(-p.n // s.block_n)
        return [
            f"long long* const group = reinterpret_cast<long long*>(smem + {s.shared_bytes});  // expert, first row, end",
            f"if (warp == 0) grouped_tile<{experts}, BM, {stride}>({self.names[offsets.id]}, {p.m}, "
            f"(long long)(blockIdx.x / {columns}), group);",
            "__syncthreads();",
            f"if (group[0] == {NO_TILE}) return;",
            "const int expert = (int)group[0];",
            f"const {itype} block_m = ({itype})group[1], GM = ({itype})group[2];",
            f"const int block_n = (int)(blockIdx.x % {columns}) * BN;",
            f"const int KTILES = expert == {ZERO_ROWS} ? 0 : EXPERT_KTILES;  // zero rows read nothing",
            f"const {itype} a_base = 0;",
            f"const {itype} b_base = ({itype})max(expert, 0) * {p.b.static_stride[0]};",
        ]

    def kernel(
        self, ctx: EmitContext, body: list[str], path: str, device_functions: str, shared: int, arch_suffix: str = ""
    ) -> Kernel:
        functions = device_functions + SCHEDULE
        return super().kernel(ctx, body, "_grouped" + path, functions, shared + GROUP_BYTES, arch_suffix)

    def grid(self) -> tuple[int, int, int]:
        p, s = self.p, self.shape
        experts = p.b.static_dim[0]
        return (row_tiles(p.m, experts, s.block_m) * -(-p.n // s.block_n), 1, 1)
