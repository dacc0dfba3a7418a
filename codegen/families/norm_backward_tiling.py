"""How the one-pass instance / group norm backward kernel (norm_backward_sets.py) covers a tile.

A *tile* is one sample's run of CB consecutive channels, whole groups (instance norm: a group is
one channel), with all their spatial positions; a block holds its grad and x in registers, at
most HELD_BYTES of each per thread, 16-byte vectors where the layout allows. The thread layouts
keep the loads coalesced in both packed layouts:

- NHWC: a tile is S rows (spatial positions, C elements apart) of CB contiguous channels, I =
  CB / w vectors of w elements each. Thread t takes column t % I of rows t / I + k * T / I, so a
  thread's w channels never change: it accumulates per element, then the threads of a column add
  up (lanes of a warp by shuffles, the warps through shared memory). Instance norm takes CB = w
  channels (w sets a tile), group norm the fewest whole groups that are a multiple of w.
- NCHW: a tile (CB = channels of one group) is CB runs of S contiguous elements. A team of P
  threads walks one channel's I = S / w vectors (lane + P * q), TM teams take channels team +
  TM * j; each team adds up with ``gd::group_sum``.

:func:`plan` returns the tiling, or why there is none: a tile that does not fit at 1024 threads,
grad, x and dx not sharing one packed NCHW or NHWC layout, dx not written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphdnn.layout import channels_last_order, packed_strides

from .direct_common import anchor_of, written
from .direct_norm import NormBackward

MAX_THREADS = 1024
HELD_BYTES = 128  # of each of grad and x, per thread, in registers: eight 16-byte vectors
SHARED_BYTES = 32 * 1024  # the most the column partials of an NHWC tile may take


@dataclass(frozen=True)
class Tiling:
    """How a block covers its tile (the names of the module docstring)."""

    nhwc: bool
    samples: int  # N
    channels: int  # C
    group: int  # Cg: channels per set
    spatial: int  # S
    width: int  # w: elements per vector
    tile: int  # CB: channels per tile
    threads: int  # T
    columns: int  # I: NHWC vectors per row; NCHW vectors per channel
    team: int  # NHWC: rows per pass (T / I); NCHW: P, threads per channel
    teams: int  # NCHW: TM, channels walked at once (NHWC: 1)
    slots: int  # vectors of each of grad and x a thread holds
    per_sm: int = 0  # blocks resident per SM (launch bounds), with a grid of that many per SM; 0: a block per tile
    grid: int = 0  # blocks when resident

    @property
    def prefetch(self) -> bool:
        """Whether blocks walk several tiles, each asking the next one into L2."""
        return 0 < self.grid < self.blocks

    @property
    def blocks(self) -> int:
        return self.samples * (self.channels // self.tile)

    @property
    def shuffled(self) -> bool:
        """NHWC: the rows of a column within a warp are added by shuffles (I divides 32)."""
        return self.columns < 32 and 32 % self.columns == 0

    @property
    def partial_rows(self) -> int:
        """NHWC: the partial sums each column leaves in shared memory (one per warp, or per row)."""
        return self.threads // max(self.columns, 32) if self.shuffled else self.team


def _strides(dims: tuple[int, ...], nhwc: bool) -> tuple[int, ...]:
    return packed_strides(dims, channels_last_order(len(dims)) if nhwc else None)


def plan(b: NormBackward) -> Tiling | str:
    """The tiling of the one-pass kernel, or why it does not apply (the direct kernels run)."""
    anchor = anchor_of(b.fused)
    x = anchor.input("input")
    grad, dx = anchor.input("grad"), anchor.output("dx")
    assert x is not None and grad is not None and dx is not None
    if not written(b.fused, dx):
        return "dx is not written"
    dims = x.static_dim
    layouts = [nhwc for nhwc in (False, True) if all(t.static_stride == _strides(dims, nhwc) for t in (grad, x, dx))]
    if not layouts:
        return "grad, x and dx do not share one packed NCHW or NHWC layout"
    nhwc = layouts == [True]  # NCHW where both describe the memory (one channel, or one position)
    samples, channels = dims[0], dims[1]
    spatial = math.prod(dims[2:])
    groups = getattr(anchor.attributes, "groups", channels)
    group = channels // groups
    itemsize = itemsize_of(b)
    elements = 16 // itemsize
    tiling = _nhwc(samples, channels, group, spatial, elements, itemsize) if nhwc else None
    if not nhwc:
        tiling = _nchw(samples, channels, group, spatial, elements, itemsize)
    if tiling is None:
        return f"a tile of {group}+ channels x {spatial} positions does not fit {HELD_BYTES} bytes a thread"
    return tiling


def _largest_width(elements: int, divides: int) -> int:
    width = elements
    while divides % width:
        width //= 2
    return width


def _nhwc(samples: int, channels: int, group: int, spatial: int, elements: int, itemsize: int) -> Tiling | None:
    width = _largest_width(elements, channels)
    groups = channels // group
    tile = next(group * m for m in range(1, groups + 1) if groups % m == 0 and (group * m) % width == 0)
    columns = tile // width
    if columns > 32:
        return None
    rows = 1
    while rows * columns < 32 or -(-spatial // rows) * width * itemsize > HELD_BYTES:
        rows *= 2
        if rows * columns > MAX_THREADS:
            return None
    threads = rows * columns
    t = Tiling(True, samples, channels, group, spatial, width, tile, threads, columns, rows, 1, -(-spatial // rows))
    return t if 2 * t.partial_rows * tile * 8 <= SHARED_BYTES else None


def _nchw(samples: int, channels: int, group: int, spatial: int, elements: int, itemsize: int) -> Tiling | None:
    width = _largest_width(elements, spatial)
    columns = spatial // width
    best: tuple[tuple[int, ...], Tiling] | None = None
    for teams in (d for d in range(1, group + 1) if group % d == 0):
        team = 32
        while team * teams <= MAX_THREADS:
            walks = -(-columns // team)
            slots = (group // teams) * walks
            if slots * width * itemsize <= HELD_BYTES:
                threads = team * teams
                wasteful = 8 * (team * walks - columns) > columns  # over 1/8 of the lanes idle
                # Few idle lanes, then blocks near 256 threads, then few channels a team; idle: fewest threads.
                score = (1, threads, 0) if wasteful else (0, abs(threads.bit_length() - 9), group // teams)
                tiling = Tiling(
                    False, samples, channels, group, spatial, width, group, threads, columns, team, teams, slots
                )
                if best is None or score < best[0]:
                    best = (score, tiling)
            team *= 2
    return best[1] if best else None


def itemsize_of(b: NormBackward) -> int:
    """Bytes of the widest of grad, x and dx: the vector width follows from it."""
    return max(t.data_type.itemsize for t in (b.grad, b.x, b.dx))
