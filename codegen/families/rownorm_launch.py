"""Row normalization's launch choices (threads_per_row G, rows_per_block R, vectors_per_thread V,
and optionally blocks_per_sm B, a resident grid: see rownorm.py), sized by a register estimate
so that ``__launch_bounds__`` does not make the kernel spill. They come from ``ctx.tuning`` when
the runtime autotuned them over :func:`candidates`, else from :func:`heuristic`.

A dynamic graph's kernel serves every row count in its range with one choice: the heuristic
sizes it for the most rows, and it is never pipelined (whether blocks walk two row groups
or more depends on the rows of the call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import GraphError
from graphdnn.symbolic import upper

from .rownorm_layout import RowLayout, analyze

MAX_THREADS = 1024
BLOCK_TARGET = 128  # threads per block the heuristic aims at (several blocks per SM overlap their phases)
BUSY_THREADS = 65536  # below rows * G threads (16 warps per SM of an H100), the heuristic widens the groups
MAX_VECTORS = 8  # vectors a thread holds at most (unrolled code size, registers)
REGISTERS_PER_SM = 65536
MAX_REGISTERS = 255
OVERHEAD_REGISTERS = 32  # indices, offsets, statistics: the estimate's fixed part
# The pipelined loop's fixed part: also the next row's offsets, and a margin (its registers are
# capped by __launch_bounds__, and held columns cannot be re-derived: too low an estimate spills).
PIPELINED_OVERHEAD_REGISTERS = 48
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
RESIDENT_WARPS = (8, 12, 16, 32)  # warps per SM the pipelined candidates keep resident


@dataclass(frozen=True)
class Config:
    threads_per_row: int  # G
    rows_per_block: int  # R
    vectors_per_thread: int  # V
    blocks_per_sm: int = 0  # B: 0, a block per R rows; else a resident grid of pipelined blocks

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    def chunks(self, layout: RowLayout) -> int:
        """Passes over the row per statistic: 1 when the row fits in registers."""
        return -(-layout.width // (self.threads_per_row * self.vectors_per_thread * layout.vec))

    def groups(self, layout: RowLayout) -> int:
        """Groups of R rows: the blocks of a grid that is not resident (at the most rows of a dynamic layout)."""
        return -(-upper(layout.rows) // self.rows_per_block)

    def pipelined(self, layout: RowLayout, sms: int) -> bool:
        """Whether each thread prefetches its next row: a resident grid (on ``sms`` SMs) where
        some block walks two row groups or more, the row in registers; never for dynamic rows."""
        resident = self.blocks_per_sm * sms
        return (
            self.blocks_per_sm > 0
            and not layout.dynamic
            and self.chunks(layout) == 1
            and self.groups(layout) > resident
        )

    def holds_columns(self, layout: RowLayout, sms: int) -> bool:
        """Whether the per-column operands stay in registers across rows (pipelined, where they fit)."""
        needed = registers(layout, self.vectors_per_thread, pipelined=True, hold=True)
        fits = needed <= _limit(self.threads, self.blocks_per_sm)
        return self.pipelined(layout, sms) and bool(layout.columns) and fits

    def as_dict(self) -> dict[str, int]:
        return {
            "threads_per_row": self.threads_per_row,
            "rows_per_block": self.rows_per_block,
            "vectors_per_thread": self.vectors_per_thread,
            "blocks_per_sm": self.blocks_per_sm,
        }


def registers(layout: RowLayout, vectors: int, pipelined: bool = False, hold: bool = False) -> float:
    """Registers a thread needs (an estimate): its share of the row as loaded, and a fixed part;
    pipelined, the next row's raw vectors stay live through the apply pass and its operand
    loads, and the per-column operands when held."""
    if not pipelined:
        return vectors * layout.vec * layout.held_bytes / 4 + OVERHEAD_REGISTERS
    per_element = layout.held_bytes + layout.apply_bytes + (layout.column_bytes if hold else 0)
    return vectors * layout.vec * per_element / 4 + PIPELINED_OVERHEAD_REGISTERS


def _limit(threads: int, blocks_per_sm: int = 0) -> int:
    """Registers per thread __launch_bounds__ leaves with ``blocks_per_sm`` blocks resident."""
    return min(MAX_REGISTERS, REGISTERS_PER_SM // (threads * max(1, blocks_per_sm)))


def _fits(layout: RowLayout, group: int, rows_per_block: int, vectors: int, blocks_per_sm: int = 0) -> bool:
    """Whether a thread's share of the row fits the registers __launch_bounds__ leaves it (with
    ``blocks_per_sm`` blocks resident: the pipelined loop)."""
    needed = registers(layout, vectors, pipelined=blocks_per_sm > 0)
    return needed <= _limit(group * rows_per_block, blocks_per_sm)


def _rows_per_block(group: int, target: int = BLOCK_TARGET) -> int:
    return max(1, target // group)


def _config(layout: RowLayout, group: int, rows_per_block: int) -> Config:
    """The fewest vectors per thread that hold the row, or the most that fit (then it loops)."""
    vectors = -(-layout.vectors // group)
    while vectors > 1 and (vectors > MAX_VECTORS or not _fits(layout, group, rows_per_block, vectors)):
        vectors -= 1
    return Config(group, rows_per_block, vectors)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def heuristic(layout: RowLayout) -> Config:
    """About 4 vectors per thread (loads in flight), the group a power of two that then covers
    the row; wider groups when there are too few rows to occupy the GPU; 128-thread blocks."""
    group = min(MAX_THREADS, _pow2_at_least(-(-layout.vectors // 4)))
    while group < MAX_THREADS and upper(layout.rows) * group < BUSY_THREADS and -(-layout.vectors // group) > 1:
        group *= 2
    return _config(layout, group, _rows_per_block(group))


def _pipelined(layout: RowLayout, arch: int, base: Config) -> list[Config]:
    """Resident pipelined grids of ``base``'s blocks keeping 8 to 32 warps per SM: those
    whose registers fit, where some block walks two row groups or more, and there are vectors
    to prefetch (a strided row's elements are loaded where used)."""
    found = []
    for warps in RESIDENT_WARPS:
        blocks = warps * 32 // base.threads
        config = Config(base.threads_per_row, base.rows_per_block, base.vectors_per_thread, blocks)
        if (
            1 <= blocks <= MAX_BLOCKS_PER_SM
            and layout.raw_bytes > 0
            and config.pipelined(layout, sm_count(arch))
            and _fits(layout, base.threads_per_row, base.rows_per_block, base.vectors_per_thread, blocks)
        ):
            found.append(config)
    return found


def _single_wave(layout: RowLayout, arch: int, base: Config) -> Config | None:
    """``base`` with every block resident at once, where its grid is a little more than the SMs
    hold at the occupancy its registers allow: ``__launch_bounds__`` asks for the blocks per SM
    the grid needs, which caps the registers (ptxas then overlaps fewer of the row's loads with
    its conversion: the floor is x[] and the fixed part). One wave of one row group per block
    ends when DRAM drains; a second, partial wave adds a whole load-reduce-store latency."""
    blocks = -(-base.groups(layout) // sm_count(arch))
    floor = base.vectors_per_thread * layout.vec * layout.compute_bytes / 4 + OVERHEAD_REGISTERS
    if (
        2 <= blocks <= MAX_BLOCKS_PER_SM
        and blocks * base.threads <= MAX_THREADS_PER_SM
        and base.chunks(layout) == 1
        and floor <= _limit(base.threads, blocks) < registers(layout, base.vectors_per_thread)
    ):
        return Config(base.threads_per_row, base.rows_per_block, base.vectors_per_thread, blocks)
    return None


def candidates(fused: FusedNode, arch: int) -> list[dict[str, int]]:
    """Launch choices worth timing (the heuristic's first): groups holding 1 to 8 vectors per
    thread, with 128- and 256-thread blocks (rows too long for registers loop); the heuristic's
    launch in a single wave where its grid is just over one; then pipelined resident grids
    (sized for ``arch``'s SMs) of the heuristic's group and of the group half its size (twice the
    vectors per thread), 128-thread blocks."""
    return [c.as_dict() for c in layout_candidates(analyze(fused), arch)]


def layout_candidates(layout: RowLayout, arch: int) -> list[Config]:
    """:func:`candidates` for a layout (whose register bytes per element size them)."""
    first = heuristic(layout)
    found = [first]
    group = min(_pow2_at_least(-(-layout.vectors // MAX_VECTORS)), MAX_THREADS // 4)
    while group <= min(MAX_THREADS, _pow2_at_least(layout.vectors)):
        for target in (BLOCK_TARGET, 2 * BLOCK_TARGET):
            choice = _config(layout, group, _rows_per_block(group, target))
            if choice not in found:
                found.append(choice)
        group *= 2
    wave = _single_wave(layout, arch, first)
    found += [wave] if wave is not None and wave not in found else []
    for group in (first.threads_per_row, first.threads_per_row // 2):
        if group >= 1:
            base = _config(layout, group, _rows_per_block(group))
            found += [c for c in _pipelined(layout, arch, base) if c not in found]
    return list(dict.fromkeys(found))  # two warp counts can make the same blocks per SM


def configured(layout: RowLayout, tuning: dict[str, object]) -> Config:
    """The tuned choice when there is one (checked), else the heuristic's."""
    if not tuning:
        return heuristic(layout)
    try:
        config = Config(**{key: int(cast(int, value)) for key, value in tuning.items()})
    except TypeError:
        raise GraphError(
            f"row_norm tuning {tuning} has unknown keys; expected threads_per_row, rows_per_block, "
            "vectors_per_thread and optionally blocks_per_sm"
        ) from None
    group, threads = config.threads_per_row, config.threads
    if group < 1 or group & (group - 1) or threads > MAX_THREADS or threads % 32 or config.rows_per_block < 1:
        raise GraphError(
            f"row_norm tuning {tuning}: threads_per_row must be a power of two and threads_per_row * "
            f"rows_per_block a multiple of 32 up to {MAX_THREADS}"
        )
    if not 1 <= config.vectors_per_thread <= MAX_VECTORS:
        raise GraphError(f"row_norm tuning {tuning}: vectors_per_thread must be 1 to {MAX_VECTORS}")
    blocks = config.blocks_per_sm
    if blocks < 0 or blocks > MAX_BLOCKS_PER_SM or blocks * threads > MAX_THREADS_PER_SM:
        raise GraphError(
            f"row_norm tuning {tuning}: blocks_per_sm must be 0 to {MAX_BLOCKS_PER_SM}, with blocks_per_sm * "
            f"threads at most {MAX_THREADS_PER_SM}"
        )
    return config
