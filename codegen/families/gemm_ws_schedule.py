"""The warp-specialised GEMM engine's tile schedule (gemm_ws.py): which output tile and K slice
each unit of a persistent block computes, and where its operands' boxes sit in their tensor
maps. The producer and the consumers open every unit with the same lines, so they agree on
each tile without talking to each other.

``TileSchedule`` is a matmul's or a convolution's: units ``blockIdx.x``, ``+ gridDim.x``, ...
over (tile, K slice), the tiles rasterised GROUP_M tile rows at a time, the batch outermost. A
grouped GEMM's (gemm_grouped_ws.py) finds each unit's expert and rows from the offsets on the
GPU instead.
"""

from __future__ import annotations

from graphdnn.ir import Tensor

from ..indexing import c_extent
from .gemm_problem import Problem, batch_coords
from .gemm_splitk import output_tiles


class TileSchedule:
    """The tiles of ``p`` (module docstring); a subclass changes what a unit is."""

    name = ""  # what the kernel's name adds after the pattern's
    warp_wide = False  # a unit's first lines need a whole warp: the producer is a warp, lane 0 issues
    shared_bytes = 0  # its own shared memory, past the mbarriers (``setup`` names it)
    device_functions = ""

    def __init__(self, p: Problem) -> None:
        self.p = p

    def tiles(self, block_m: int, block_n: int) -> int:
        """How many output tiles the launch provides for (its units without split-K)."""
        return output_tiles(self.p, block_m, block_n)

    def sizes(self, k_tiles: int, tiles_total: int, split: int) -> list[str]:
        """GM, GN, GK, KTILES, the tile counts and the K slices: constants, but a dynamic problem's M
        and batch count read from its EXTENT arguments, and the tile counts that follow from them."""
        p = self.p
        fixed = f"GN = {p.n}, GK = {p.k}, KTILES = {k_tiles}"
        slices = f"SPLIT = {split}, SLICE_TILES = (KTILES + SPLIT - 1) / SPLIT"
        if not p.is_dynamic:
            return [
                f"constexpr int GM = {p.m}, {fixed};",
                "constexpr int TILES_M = (GM + BM - 1) / BM, TILES_N = (GN + BN - 1) / BN, BATCH_TILES = TILES_M * TILES_N;",
                f"constexpr int TILES = {tiles_total}, {slices};",
            ]
        return [
            f"const int GM = (int){c_extent(p.m_extent)};",
            f"constexpr int {fixed}, TILES_N = (GN + BN - 1) / BN, {slices};",
            "const int TILES_M = (GM + BM - 1) / BM, BATCH_TILES = TILES_M * TILES_N;",
            f"const int TILES = (int){c_extent(p.batch_count)} * BATCH_TILES;  // this call's",
        ]

    def setup(self) -> list[str]:
        """Lines after the mbarriers' addresses (``full``, ``empty``) that name ``shared_bytes``."""
        return []

    def unit(self, itype: str, names: dict[int, str]) -> list[str]:
        """Opens the loop over the block's units: the unit's k tiles ``kt_first`` .. ``kt_end``, its
        tile's first row ``m0`` and column ``n0``, and what the epilogue reads besides (a
        matmul's output batch coordinates c0..; ``names``: the kernel's tensor parameters)."""
        return [*units(), *("  " + line for line in tile_coordinates(self.p, itype))]

    def consumer_unit(self, itype: str, names: dict[int, str]) -> list[str]:
        """The consumers' ``unit``: the same lines, unless the producer tells them their tiles."""
        return self.unit(itype, names)

    def map_coordinates(self, t: Tensor, matrix: tuple[str, str]) -> list[str]:
        """The tensor-map coordinates of operand ``t``'s box: ``matrix`` (inner, outer) then its batch axes."""
        p = self.p
        shift = len(p.batch) - (len(t.dim) - 2)
        batch = [f"(int)c{axis + shift}" for axis in range(len(t.dim) - 3, -1, -1) if t.dim[axis] != 1]
        return [*matrix, *batch]


def units() -> list[str]:
    """The persistent loop over (tile, K slice) units, a slice's units adjacent, and the unit's
    k tiles ``kt_first`` .. ``kt_end`` (the last slices may hold fewer, or none)."""
    return [
        "for (int unit = blockIdx.x; unit < TILES * SPLIT; unit += gridDim.x) {",
        "  const int tile = unit / SPLIT, slice = unit % SPLIT;",
        "  const int kt_first = slice * SLICE_TILES, kt_end = min(KTILES, kt_first + SLICE_TILES);",
    ]


def tile_coordinates(p: Problem, itype: str) -> list[str]:
    """Tile ``tile`` -> its first row ``m0``, column ``n0`` and the output batch coordinates c0..:
    GROUP_M tile rows at a time, column by column within the group."""
    return [
        "const int batch = tile / BATCH_TILES, t = tile % BATCH_TILES;",
        "const int first = t / (GROUP_M * TILES_N) * GROUP_M, rows = min(TILES_M - first, GROUP_M);",
        "const int tm = first + t % (GROUP_M * TILES_N) % rows, tn = t % (GROUP_M * TILES_N) / rows;",
        f"const {itype} m0 = ({itype})tm * BM;",
        "const int n0 = tn * BN;",
        *batch_coords(p, itype, "batch"),
    ]
