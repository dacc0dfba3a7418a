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

The producer warp walks units ``blockIdx.x``, ``+ gridDim.x``, ... over (row tile, column
tile) pairs, column tiles fastest, as the non-persistent kernel's blocks do, and finds each
unit's row tile with ``grouped_tile`` (a whole warp; lane 0 issues the copies). It tells the
consumers: the first ring stage of every unit carries the unit's (expert, first row, group
end, first column) in a shared-memory slot beside it, written before the stage's full
barrier is arrived on (the arrival releases the write, the consumers' wait acquires it), so
the consumers never search the offsets themselves. A unit with no k tile (rows no expert
holds: their output is zero) still takes one stage, without copies, which the consumers hand
back at once; the first unit past the last tile takes one too, and ends the consumers' walk.
"""

from __future__ import annotations

from graphdnn.ir import Tensor

from .gemm_grouped_block import GROUP_BYTES, NO_TILE, SCHEDULE, ZERO_ROWS, row_tiles
from .gemm_problem import Problem
from .gemm_ws_schedule import TileSchedule

MAX_STAGES = 8  # the ring's tile slots: more than any engine tile's stages (gemm_ws.tiles: 6 at most)
SLOT = GROUP_BYTES // 8  # long longs per slot: expert, first row, group end, first column


class GroupedSchedule(TileSchedule):
    """The grouped GEMM's units (module docstring)."""

    name = "_grouped"
    warp_wide = True
    shared_bytes = GROUP_BYTES * (1 + MAX_STAGES)  # the producer's search, then one slot per stage
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
            f'static_assert(STAGES <= {MAX_STAGES}, "a tile slot per stage");',
        ]

    def setup(self) -> list[str]:
        return [
            "// the producer's search of the offsets, then each stage's tile slot (expert, first row, end, first column)",
            "long long* const search = reinterpret_cast<long long*>(smem_raw + (empty + STAGES * 8 - smem_addr(smem_raw)));",
            f"long long* const told = search + {SLOT};",
        ]

    def unit(self, itype: str, names: dict[int, str]) -> list[str]:
        """The producer's: finds the unit's tile, then tells it on the unit's first stage."""
        return [
            "for (int unit = blockIdx.x;; unit += gridDim.x) {  // until the first unit past the last tile",
            f"  grouped_tile<{self.experts}, BM, {self.offsets.static_stride[0]}>({names[self.offsets.id]}, "
            f"{self.p.m}, (long long)(unit / TILES_N), search);",
            "  __syncwarp();",
            "  const int expert = (int)search[0];",
            f"  const {itype} m0 = ({itype})search[1];",
            "  const long long end = search[2];",
            "  __syncwarp();  // read by every lane before the next unit's search writes",
            "  const int n0 = (int)(unit % TILES_N) * BN;",
            "  const int kt_first = 0, kt_end = expert < 0 ? 0 : KTILES;  // zero rows, or past the last tile: none",
            "  mbar_wait(empty + 8 * stage, phase ^ 1);",
            "  if (lane == 0) {  // the unit's first stage carries its tile",
            f"    long long* const slot = told + {SLOT} * stage;",
            "    slot[0] = expert, slot[1] = m0, slot[2] = end, slot[3] = n0;",
            "  }",
            "  if (kt_end == 0) {  // a stage without copies",
            "    if (lane == 0) mbar_arrive(full + 8 * stage);",
            "    if (++stage == STAGES) stage = 0, phase ^= 1;",
            f"    if (expert == {NO_TILE}) break;",
            "  }",
        ]

    def consumer_unit(self, itype: str, names: dict[int, str]) -> list[str]:
        """The consumers': the tile the producer told on the unit's first stage."""
        return [
            "for (;;) {",
            "  mbar_wait(full + 8 * stage, phase);  // the unit's first stage: its tile's slot is written",
            f"  const long long* const slot = told + {SLOT} * stage;",
            "  const int expert = (int)slot[0];",
            f"  const {itype} m0 = ({itype})slot[1], GM = ({itype})slot[2];  // the tile's first row, its group's end",
            "  const int n0 = (int)slot[3];",
            f"  if (expert == {NO_TILE}) break;  // past the last tile",
            f"  const int kt_first = 0, kt_end = expert == {ZERO_ROWS} ? 0 : KTILES;",
            "  if (kt_end == 0) {  // zero rows: the stage goes back at once",
            "    __syncwarp();",
            "    if (lane == 0) mbar_arrive(empty + 8 * stage);",
            "    if (++stage == STAGES) stage = 0, phase ^= 1;",
            "  }",
        ]

    def map_coordinates(self, t: Tensor, matrix: tuple[str, str]) -> list[str]:
        """The token's box: its rows (a unit axis adds none); the weight's: the tile's expert too."""
        return [*matrix, "expert"] if t.id == self.p.b.id and self.experts != 1 else list(matrix)
