"""``moe_grouped_matmul`` on the warp-specialised TMA engine (gemm_ws.py, sm_90a): the engine's
producer, consumers, mbarrier ring and epilogue, over a persistent schedule of the grouped
GEMM's tiles found from the offsets on the GPU (gemm_grouped_block.py's ``grouped_tile``).

The tensor maps stay static although the experts' rows are known only at run time:

- A's map covers all S rows of the token. A tile starts at its group's first row (anywhere,
  not a multiple of 128) and reads 128 rows from there; the rows past its group's end belong
  to the next expert (or lie past S, where TMA reads zeros): they are multiplied, and the
  epilogue stores none of them (its row bound GM is the group's end);
- B's map is the weight as [E, K, N] (3-d, so that a ragged K reads zeros past each expert's
  K rows, never the next expert's), the box's expert coordinate the tile's.

Units ``blockIdx.x``, ``+ gridDim.x``, ... walk (row tile, column tile) pairs, column tiles
fastest, as the non-persistent kernel's blocks do; a unit's row tile is found by the warp
that needs it (``grouped_tile`` takes a whole warp, its answer lands in the warp's slot of
shared memory): warp 0 of the producer warpgroup (lane 0 issues the copies) and each consumer
warp. Every warp walks the same units and finds the same tiles; the first unit past the last
tile ends the walk. A tile of rows no expert holds reads no k tile and stores zeros.
"""

from __future__ import annotations

from graphdnn.ir import Tensor

from .gemm_grouped_block import GROUP_BYTES, NO_TILE, SCHEDULE, ZERO_ROWS, row_tiles
from .gemm_problem import Problem
from .gemm_ws import THREADS
from .gemm_ws_schedule import TileSchedule


class GroupedSchedule(TileSchedule):
    """The grouped GEMM's units (module docstring)."""

    name = "_grouped"
    warp_wide = True
    shared_bytes = GROUP_BYTES * (THREADS // 32)  # each warp's (expert, first row, end)
    device_functions = SCHEDULE

    def __init__(self, p: Problem) -> None:
        super().__init__(p)
        offsets = p.node.input("first_token_offset")
        assert offsets is not None
        self.offsets = offsets
        self.experts = p.b.static_dim[0]

    def tiles(self, block_m: int, block_n: int) -> int:
        """Every (row tile, column tile) pair any offsets can make."""
        return row_tiles(self.p.m, self.experts, block_m) * -(-self.p.n // block_n)

    def sizes(self, k_tiles: int, tiles_total: int, split: int) -> list[str]:
        assert split == 1
        p = self.p
        return [
            f"constexpr int GN = {p.n}, GK = {p.k}, KTILES = {k_tiles}, TILES_N = (GN + BN - 1) / BN;",
            f"constexpr int TILES = {tiles_total};  // at most: the offsets' tiles end the walk earlier",
        ]

    def setup(self) -> list[str]:
        return [
            "long long* const groups = reinterpret_cast<long long*>(smem_raw + (empty + STAGES * 8 - smem_addr(smem_raw)));",
        ]

    def unit(self, itype: str, names: dict[int, str]) -> list[str]:
        slot = GROUP_BYTES // 8
        return [
            "for (int unit = blockIdx.x; unit < TILES; unit += gridDim.x) {",
            f"  long long* const group = groups + {slot} * warp;  // this warp's (expert, first row, end)",
            f"  grouped_tile<{self.experts}, BM, {self.offsets.static_stride[0]}>({names[self.offsets.id]}, "
            f"{self.p.m}, (long long)(unit / TILES_N), group);",
            "  __syncwarp();",
            "  const int expert = (int)group[0];",
            f"  const {itype} m0 = ({itype})group[1], GM = ({itype})group[2];  // the tile's first row, its group's end",
            "  __syncwarp();  // read by every lane before the next unit's answer lands",
            f"  if (expert == {NO_TILE}) break;  // past the last tile, as every later unit",
            "  const int n0 = (int)(unit % TILES_N) * BN;",
            f"  const int kt_first = 0, kt_end = expert == {ZERO_ROWS} ? 0 : KTILES;  // zero rows read nothing",
        ]

    def map_coordinates(self, t: Tensor, matrix: tuple[str, str]) -> list[str]:
        """The token's box: its rows (a unit axis adds none); the weight's: the tile's expert too."""
        return [*matrix, "expert"] if t.id == self.p.b.id and self.experts != 1 else list(matrix)
