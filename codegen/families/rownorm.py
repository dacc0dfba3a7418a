"""Row normalization: layernorm / rmsnorm, optionally after a residual add, with an epilogue.

Geometry. The normalized axes are where the scale is not 1 (graphdnn.ops.norms.per_row);
a *row* is one index of the other axes, D elements long. Every tensor's offset splits into
a row part (from the row's coordinates, computed once per row) and a column part: the
position j in the row itself when the tensor is *packed* along the row (the normalized
axes contiguous, in the norm input's memory order), else from j's coordinates and the
tensor's strides (any layout, broadcasts included).

Threads. A group of G consecutive threads (a power of two) owns a row, R rows per block.
A thread holds its share of the row in registers: V vectors of VEC elements (compile-time
counts), its vector k covering columns (k*G + lane)*VEC ..., so a warp's accesses are
consecutive 16-byte chunks. Every load of the row is issued before any is used; the mean,
then the centered variance (RMS: the mean square) come from the registers, summed over
the group with gd::group_sum (fp32 accumulation); y and the epilogue are then computed
from the same registers and stored.

Paths. The vector path (16-byte accesses) needs every full-size tensor packed along the
row, D and the row strides multiples of VEC (checked here) and the runtime ``aligned``
flag; the scalar path (the same mapping with VEC = 1, still coalesced) takes every other
case.

Long rows. A row that does not fit the register budget (e.g. 65536 elements) is walked in
chunks of G*V*VEC elements, three times: for the mean, for the centered variance, and to
apply. The re-reads come from L2 (one row is at most a few hundred KB and only a few rows
per SM are in flight), the numerics stay those of the register path, and no shared-memory
limit applies, whatever the row length and type.

Resident grids (``blocks_per_sm`` B > 0). The grid is at most B blocks per SM of the target,
resident together (``__launch_bounds__`` caps the registers to fit B), each walking rows R at
a time. Where some block walks two row groups or more and the row fits in registers, the rows
are pipelined: as soon as a row's raw vectors are converted, the thread issues the loads of
its next row into the same register buffer, so they are in flight through this row's
reductions, normalization and stores (DRAM is kept busy through every block's compute phases
instead of relying on other blocks to be loading meanwhile), and where the registers allow,
the packed per-column operands (the scale, the bias) are loaded and converted once per thread
and held across rows. The main path is pipelined (the vector path; the element path when the
layout has no vectors); the misaligned-pointer fallback and chunked rows walk the same grid
without prefetching. Where every block has one row group, B only makes the grid one wave.

Launch choices (threads_per_row G, rows_per_block R, vectors_per_thread V, blocks_per_sm B)
come from ``ctx.tuning`` when the runtime autotuned them over :func:`candidates`, else from
:func:`heuristic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from fusion_rules import FusedNode
from graphdnn.errors import GraphError
from graphdnn.ir import Node, Tensor
from graphdnn.layout import storage_extent, stride_order
from graphdnn.ops.norms import NormOp

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name, scalar_value
from ..cuda_types import cuda_type, load, store
from ..indexing import coordinates, index_type, offset, restricted
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal

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
# SMs of the target's largest part (A100, H100/H200 SXM), for resident grids; on a part with
# fewer the extra blocks start as others finish (correct, a longer tail).
SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132}
DEFAULT_SMS = 132
RESIDENT_WARPS = (8, 12, 16, 32)  # warps per SM the pipelined candidates keep resident


@dataclass(frozen=True)
class RowLayout:
    """What the kernel's shape depends on: the row geometry and how each tensor is reached."""

    x: Tensor  # what is normalized: the norm's input (the residual sum when there is a prologue)
    norm_axes: frozenset[int]
    order: tuple[int, ...]  # x's axes, outermost first: rows and columns are enumerated in this order
    rows: int
    width: int  # D, elements per row
    packed: frozenset[int]  # ids of tensors whose column offset is j
    vec: int  # elements per access on the vector path; 1: the scalar path only
    compute_bytes: int  # register bytes per element of x[] (float or double)
    raw_bytes: float  # register bytes per element of the raw vectors the load pass reads (0: none)
    apply_bytes: float  # register bytes per element of the raw vectors the apply pass loads
    columns: tuple[int, ...]  # ids of packed inputs that are the same for every row (scale, bias)
    column_bytes: float  # register bytes per element to hold the columns converted, less their raw vectors

    @property
    def held_bytes(self) -> float:
        """Register bytes per element a thread holds while the load pass is in flight."""
        return self.compute_bytes + self.raw_bytes

    @property
    def row_axes(self) -> frozenset[int]:
        return frozenset(range(len(self.x.dim))) - self.norm_axes

    @property
    def vectors(self) -> int:
        """Vector accesses per row."""
        return -(-self.width // self.vec)


def memory_tensors(fused: FusedNode) -> list[Tensor]:
    """The tensors the kernel reaches through pointers."""
    return [t for t in (*fused.inputs, *fused.outputs) if not t.is_pass_by_value]


def analyze(fused: FusedNode) -> RowLayout:
    anchor = fused.anchor
    assert anchor is not None
    x = anchor.input("input")
    assert x is not None
    grouping = cast(NormOp, anchor.definition).checked(anchor)[1]
    axes = frozenset(grouping.axes)
    order = stride_order(x.dim, x.stride)
    width = math.prod(x.dim[axis] for axis in axes)
    memory = memory_tensors(fused)
    packed = frozenset(t.id for t in memory if _packed_along_row(t, x, axes, order))
    full = [t for t in memory if t.dim == x.dim]
    vec = 16 // max((t.data_type.itemsize for t in full), default=16)
    vectorizable = (
        width % vec == 0
        and all(t.id in packed for t in full)
        and all(_row_strides_divisible(t, x, axes, vec) for t in memory if t.id in packed)
    )
    vec = vec if vectorizable else 1
    loaded = fused.prologue.input_tensors() if fused.prologue is not None else [x]
    raw = sum(_raw_bytes(t, vec) for t in {t.id: t for t in loaded}.values() if t.id in packed)
    applied = [t for t in _apply_operands(fused) if t.id in packed]
    columns = [t for t in applied if t.dim != x.dim and _same_for_every_row(t, x, axes)]
    compute_bytes = 8 if compute_of(memory) == "double" else 4
    return RowLayout(
        x,
        axes,
        order,
        x.numel // width,
        width,
        packed,
        vec,
        compute_bytes,
        raw,
        sum(_raw_bytes(t, vec) for t in applied),
        tuple(sorted(t.id for t in columns)),
        sum(compute_bytes - _raw_bytes(t, vec) for t in columns),
    )


def _apply_operands(fused: FusedNode) -> list[Tensor]:
    """The memory inputs the apply pass reads: the norm's parameters and the epilogue's operands."""
    anchor = fused.anchor
    x = anchor.input("input") if anchor is not None else None
    assert anchor is not None and x is not None
    read = [t for role in ("scale", "bias") if (t := anchor.input(role)) is not None]
    read += [t for node in fused.epilogue for t in node.input_tensors()]
    inputs = {t.id for t in fused.inputs if not t.is_pass_by_value}
    return [t for t in {t.id: t for t in read}.values() if t.id in inputs and t.id != x.id]


def _raw_bytes(t: Tensor, vec: int) -> float:
    """Register bytes per element of ``t``'s raw vectors: whole 32-bit registers, so a 16-bit
    element alone (vec 1) takes four."""
    return max(4, t.data_type.itemsize * vec) / vec


def _packed_along_row(t: Tensor, x: Tensor, axes: frozenset[int], order: tuple[int, ...]) -> bool:
    """Whether ``t``'s offset along the normalized axes is the row position j (in ``order``)."""
    shift = len(x.dim) - len(t.dim)
    expected, spans = 1, False
    for axis in reversed(order):
        if axis not in axes or x.dim[axis] == 1:
            continue
        extent = t.dim[axis - shift] if axis >= shift else 1
        if extent == 1 or t.stride[axis - shift] != expected:
            return False
        expected *= extent
        spans = True
    return spans


def _same_for_every_row(t: Tensor, x: Tensor, axes: frozenset[int]) -> bool:
    """Whether ``t`` broadcasts over the rows (extent 1 along every row axis)."""
    shift = len(x.dim) - len(t.dim)
    return all(d == 1 for a, d in enumerate(t.dim) if a + shift not in axes)


def _row_strides_divisible(t: Tensor, x: Tensor, axes: frozenset[int], vec: int) -> bool:
    """Every row of ``t`` starts on a vector boundary (given an aligned pointer)."""
    shift = len(x.dim) - len(t.dim)
    return all(s % vec == 0 for a, (d, s) in enumerate(zip(t.dim, t.stride)) if d > 1 and a + shift not in axes)


# -- launch choices ------------------------------------------------------------------------------
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
        """Groups of R rows: the blocks of a grid that is not resident."""
        return -(-layout.rows // self.rows_per_block)

    def pipelined(self, layout: RowLayout, sms: int) -> bool:
        """Whether each thread prefetches its next row: a resident grid (on ``sms`` SMs) where
        some block walks two row groups or more, the row in registers."""
        resident = self.blocks_per_sm * sms
        return self.blocks_per_sm > 0 and self.chunks(layout) == 1 and self.groups(layout) > resident

    def holds_columns(self, layout: RowLayout, sms: int) -> bool:
        """Whether the per-column operands stay in registers across rows (pipelined, where they fit)."""
        needed = _registers(layout, self.vectors_per_thread, pipelined=True, hold=True)
        fits = needed <= _limit(self.threads, self.blocks_per_sm)
        return self.pipelined(layout, sms) and bool(layout.columns) and fits

    def as_dict(self) -> dict[str, int]:
        return {
            "threads_per_row": self.threads_per_row,
            "rows_per_block": self.rows_per_block,
            "vectors_per_thread": self.vectors_per_thread,
            "blocks_per_sm": self.blocks_per_sm,
        }


def _registers(layout: RowLayout, vectors: int, pipelined: bool = False, hold: bool = False) -> float:
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
    needed = _registers(layout, vectors, pipelined=blocks_per_sm > 0)
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


def sm_count(arch: int) -> int:
    return SM_COUNT.get(arch, DEFAULT_SMS)


def heuristic(layout: RowLayout) -> Config:
    """About 4 vectors per thread (loads in flight), the group a power of two that then covers
    the row; wider groups when there are too few rows to occupy the GPU; 128-thread blocks."""
    group = min(MAX_THREADS, _pow2_at_least(-(-layout.vectors // 4)))
    while group < MAX_THREADS and layout.rows * group < BUSY_THREADS and -(-layout.vectors // group) > 1:
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
        and floor <= _limit(base.threads, blocks) < _registers(layout, base.vectors_per_thread)
    ):
        return Config(base.threads_per_row, base.rows_per_block, base.vectors_per_thread, blocks)
    return None


def candidates(fused: FusedNode, arch: int) -> list[dict[str, int]]:
    """Launch choices worth timing (the heuristic's first): groups holding 1 to 8 vectors per
    thread, with 128- and 256-thread blocks (rows too long for registers loop); the heuristic's
    launch in a single wave where its grid is just over one; then pipelined resident grids
    (sized for ``arch``'s SMs) of the heuristic's group and of the group half its size (twice the
    vectors per thread), 128-thread blocks."""
    layout = analyze(fused)
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
    return [c.as_dict() for c in found]


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


# -- the kernel ---------------------------------------------------------------------------------
STATISTICS = {"mean": "mean", "inv_variance": "rstd"}  # the norm's statistics outputs and their C variables


def epsilon(anchor: Node, names: dict[int, str], compute: str) -> str:
    t = anchor.input("epsilon")
    assert t is not None
    return scalar_value(t, names.get(t.id), compute)


def normalize(fused: FusedNode, values: epilogue.Values) -> None:
    """Define y, then the epilogue, in ``values`` (x is defined; ``mean``, ``rstd`` are C
    variables): y = (x - mean) * rstd * scale + bias (RMS norm: x * rstd * scale (+ bias)),
    and the statistics outputs where the epilogue reads them."""
    anchor = fused.anchor
    assert anchor is not None
    read = {t.id for node in fused.epilogue for t in node.input_tensors()}
    for role, variable in STATISTICS.items():
        t = anchor.output(role)
        if t is not None and t.id in read:
            values.define_rounded(t, variable)
    x, scale, bias, y = anchor.input("input"), anchor.input("scale"), anchor.input("bias"), anchor.output("y")
    assert x is not None and scale is not None and y is not None
    centered = values.get(x) if anchor.op == "rmsnorm" else f"({values.get(x)} - mean)"
    scaled = f"{centered} * rstd * {values.get(scale)}"
    normalized = f"{scaled} + {values.get(bias)}" if bias is not None else scaled
    values.define_rounded(y, normalized)
    epilogue.apply(fused.epilogue, values)


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    layout = analyze(fused)
    return FusedProgram(fused.name, (_RowKernel(fused, ctx, layout, configured(layout, ctx.tuning)).kernel(),))


class _Operands:
    """How a pass reaches each tensor at the current element (vector slot k, element e),
    recording the packed tensors it reads as vectors and whether it needs j's coordinates."""

    def __init__(self, kernel: _RowKernel, vector_name: str, width: int) -> None:
        self.kernel = kernel
        self.vector_name = vector_name  # C name of the vector holding a packed tensor's elements, {id}
        self.width = width
        self.vectors: dict[int, Tensor] = {}
        self.columns = False

    def __call__(self, t: Tensor) -> str:
        k = self.kernel
        if t.is_pass_by_value:
            return scalar_value(t, k.names[t.id], k.compute)
        if t.id in k.held:
            return f"col{t.id}[k * {self.width} + e]"
        if t.id in k.layout.packed:
            self.vectors[t.id] = t
            return f"gd::element<{k.compute}>({self.vector_name.format(id=t.id)}, e)"
        return load(t.data_type, self.element(t), k.compute)

    def element(self, t: Tensor) -> str:
        """``t``'s element at column j + e, through its strides."""
        column = self.kernel.column_offset(t)
        self.columns |= column != "0"
        return f"{self.kernel.names[t.id]}[{self.kernel.row_offset(t)} + {column}]"


class _RowKernel:
    def __init__(self, fused: FusedNode, ctx: EmitContext, layout: RowLayout, config: Config) -> None:
        anchor = fused.anchor
        assert anchor is not None
        self.fused, self.ctx, self.layout, self.config = fused, ctx, layout, config
        self.anchor = anchor
        self.centered = anchor.op == "layernorm"
        self.x = layout.x
        self.rank = len(self.x.dim)
        self.memory = memory_tensors(fused)
        self.compute = compute_of(self.memory)
        self.chunks = config.chunks(layout)
        self.slots = config.vectors_per_thread * layout.vec  # elements a thread holds
        chunk = config.threads_per_row * self.slots
        self.sms = sm_count(ctx.arch)
        self.blocks = config.groups(layout)
        if config.blocks_per_sm:
            self.blocks = min(self.blocks, config.blocks_per_sm * self.sms)
        # Margins: the row loop steps past ROWS once, inactive rows' offsets run past the end.
        margins = [2 * storage_extent(t.dim, t.stride) for t in self.memory]
        self.itype = index_type(self.memory, 2 * layout.rows, layout.width + chunk, *margins)
        self.params = KernelParams()
        self.names = {t.id: self.params.tensor(t) for t in fused.inputs}
        self.names.update({t.id: self.params.tensor(t, writable=True) for t in fused.outputs})
        self.aligned = self.params.aligned_flag()
        stats = [anchor.output(role) for role in ("mean", "inv_variance")]
        self.stats = {t.id: t for t in stats if t is not None}
        written = {t.id for t in fused.outputs}
        self.writes_sum = fused.prologue is not None and self.x.id in written
        # Outputs computed per element in the apply pass: y and the epilogue's results.
        self.results = [t for t in fused.outputs if t.id != self.x.id and t.id not in self.stats]
        # Per-column operands held in registers across rows (col{id}[]) on the path being written.
        self.held: dict[int, Tensor] = {}

    # -- offsets -------------------------------------------------------------------------------
    def row_offset(self, t: Tensor) -> str:
        part = offset(restricted(t, self.layout.row_axes, self.rank), self.x.dim, "r")
        return "0" if part == "0" else f"o{t.id}"

    def column_offset(self, t: Tensor) -> str:
        """The column part of ``t``'s offset at element j + e (general tensors)."""
        return offset(restricted(t, self.layout.norm_axes, self.rank), self.x.dim, "c")

    def row_prelude(self) -> list[str]:
        """The row's coordinates and each tensor's row offset."""
        dims = [1 if axis in self.layout.norm_axes else extent for axis, extent in enumerate(self.x.dim)]
        lines = coordinates("row", dims, self.layout.order, "r", self.itype)
        for t in self.memory:
            part = offset(restricted(t, self.layout.row_axes, self.rank), self.x.dim, "r")
            if part != "0":
                lines.append(f"const {self.itype} o{t.id} = {part};")
        return lines

    def column_coordinates(self) -> list[str]:
        dims = [extent if axis in self.layout.norm_axes else 1 for axis, extent in enumerate(self.x.dim)]
        return coordinates("(j + e)", dims, self.layout.order, "c", self.itype)

    # -- per-slot loops ------------------------------------------------------------------------
    def guard(self, rows: bool) -> str:
        """The condition for vector slot k (column j) of this thread to hold row elements."""
        conditions = []
        if rows and self.layout.rows % self.config.rows_per_block:
            conditions.append("active")
        if self.chunks * self.config.threads_per_row * self.slots != self.layout.width:
            conditions.append("j < WIDTH")
        return " && ".join(conditions) or "true"

    def slot_loop(
        self, width: int, body: list[str], otherwise: list[str] | None = None, rows: bool = True
    ) -> list[str]:
        """``for k``: body for each vector slot of the row this thread holds (guarded)."""
        lines = [
            "#pragma unroll",
            f"for (int k = 0; k < {self.slots // width}; ++k) {{",
            f"  const {self.itype} j = chunk + (k * GROUP + lane) * {width};",
        ]
        guard = self.guard(rows)
        if guard == "true":
            lines += ["  {", *indent(body, 2).splitlines(), "  }"]
        else:
            lines += [f"  if ({guard}) {{", *indent(body, 2).splitlines(), "  }"]
            if otherwise:
                lines += ["  else {", *indent(otherwise, 2).splitlines(), "  }"]
        return [*lines, "}"]

    def element_loop(self, width: int, body: list[str]) -> list[str]:
        if width == 1:
            return ["const int e = 0;", *body]
        return ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {{", *indent(body, 1).splitlines(), "}"]

    def vec_type(self, t: Tensor, width: int) -> str:
        return f"gd::Vec<{cuda_type(t.data_type)}, {width}>"

    def stores(
        self, outputs: list[tuple[Tensor, str]], width: int, operands: _Operands
    ) -> tuple[list[str], list[str], list[str]]:
        """(declarations, per-element statements, after-loop statements) storing each output's value."""
        declare, each, after = [], [], []
        for t, value in outputs:
            stored = store(t.data_type, value)
            if t.id in self.layout.packed:
                declare.append(f"{self.vec_type(t, width)} out{t.id};")
                each.append(f"out{t.id}.v[e] = {stored};")
                after.append(f"gd::store_vec<{cuda_type(t.data_type)}, {width}>({self.pointer(t)} + j, out{t.id});")
            else:
                each.append(f"{operands.element(t)} = {stored};")
        return declare, each, after

    def pointer(self, t: Tensor) -> str:
        row = self.row_offset(t)
        return self.names[t.id] if row == "0" else f"{self.names[t.id]} + {row}"

    def vector_loads(self, tensors: dict[int, Tensor], width: int, target: str, declare: bool) -> list[str]:
        return [
            f"{'const ' + self.vec_type(t, width) + ' ' if declare else ''}{target.format(id=t.id)} = "
            f"gd::load_vec<{cuda_type(t.data_type)}, {width}>({self.pointer(t)} + j);"
            for t in tensors.values()
        ]

    # -- passes --------------------------------------------------------------------------------
    def load_values(self, width: int, write_sum: bool) -> tuple[dict[int, Tensor], list[str]]:
        """(the packed tensors read as raw vectors in{id}[k], the statements that fill x[] from
        them: the rounded residual sum with a prologue, which is also stored when written)."""
        operands = _Operands(self, "in{id}[k]", width)
        values = epilogue.Values(self.compute, operands)
        if self.fused.prologue is not None:
            epilogue.apply([self.fused.prologue], values)
        value = values.get(self.x)
        element = [*values.statements, f"x[k * {width} + e] = {value};"]
        declare, each, after = self.stores([(self.x, values.stored(self.x))] if write_sum else [], width, operands)
        element = [*(self.column_coordinates() if operands.columns else []), *element, *each]
        zero = self.element_loop(width, [f"x[k * {width} + e] = 0;"])
        return operands.vectors, self.slot_loop(width, [*declare, *self.element_loop(width, element), *after], zero)

    def raw_vectors(self, raw: dict[int, Tensor], width: int) -> list[str]:
        return [f"{self.vec_type(t, width)} in{t.id}[{self.slots // width}];" for t in raw.values()]

    def raw_loads(self, raw: dict[int, Tensor], width: int) -> list[str]:
        """in{id}[] <- this thread's raw vectors of its row, every load in flight before any is used."""
        return self.slot_loop(width, self.vector_loads(raw, width, "in{id}[k]", declare=False)) if raw else []

    def load_pass(self, width: int, write_sum: bool, prefetched: bool = False) -> list[str]:
        """x[] <- this thread's elements of the row (the rounded residual sum with a prologue);
        ``prefetched``: the raw vectors are already loaded (the pipelined loop)."""
        raw, convert = self.load_values(width, write_sum)
        if prefetched:
            return convert
        return [*self.raw_vectors(raw, width), *self.raw_loads(raw, width), *convert]

    def apply_pass(self, width: int) -> list[str]:
        """y and the epilogue from x[], stored."""
        operands = _Operands(self, "a{id}", width)
        values = epilogue.Values(self.compute, operands)
        values.define(self.x, f"x[k * {width} + e]")
        normalize(self.fused, values)
        outputs = [(t, values.stored(t)) for t in self.results]
        declare, each, after = self.stores(outputs, width, operands)
        element = [*(self.column_coordinates() if operands.columns else []), *values.statements, *each]
        loads = self.vector_loads(operands.vectors, width, "a{id}", declare=True)
        return self.slot_loop(width, [*loads, *declare, *self.element_loop(width, element), *after])

    # -- statistics ----------------------------------------------------------------------------
    def reduce(self, value: str) -> str:
        scratch = "red" if self.config.threads_per_row > 32 else "nullptr"
        return f"gd::group_sum<GROUP, {self.compute}>({value}, {scratch}) / {literal(self.layout.width, self.compute)}"

    def squares(self, width: int) -> list[str]:
        """squares += this thread's (x - mean)^2 (RMS norm: x^2) over the elements it holds."""
        if not self.centered:
            return ["#pragma unroll", f"for (int i = 0; i < {self.slots}; ++i) squares += x[i] * x[i];"]
        step = [f"const {self.compute} d = x[k * {width} + e] - mean;", "squares += d * d;"]
        return self.slot_loop(width, self.element_loop(width, step), rows=False)

    def chunked(self, body: list[str]) -> list[str]:
        """``body`` for each chunk of the row (once, with chunk = 0, when the row fits in registers)."""
        if self.chunks == 1:
            return [f"const {self.itype} chunk = 0;", *body]
        return [
            "#pragma unroll 1",
            f"for (int c = 0; c < {self.chunks}; ++c) {{",
            f"  const {self.itype} chunk = ({self.itype})c * {self.config.threads_per_row * self.slots};",
            *indent(body, 1).splitlines(),
            "}",
        ]

    def statistics(self, width: int, prefetch: list[str] | None = None) -> list[str]:
        """mean and rstd of the row; the first pass also loads it (and writes the sum).
        ``prefetch``: the pipelined loop's raw vectors are loaded, and these statements (the next
        row's loads) follow the first pass's conversion."""
        c = self.compute
        sqrt = "sqrtf" if c == "float" else "sqrt"
        rstd = f"const {c} rstd = {literal(1, c)} / {sqrt}({self.reduce('squares')} + eps);"
        loaded = [*self.load_pass(width, self.writes_sum, prefetch is not None), *(prefetch or [])]
        if not self.centered:
            return [f"{c} squares = 0;", *self.chunked([*loaded, *self.squares(width)]), rstd]
        sums = ["#pragma unroll", f"for (int i = 0; i < {self.slots}; ++i) sum += x[i];"]
        lines = [f"{c} sum = 0;", *self.chunked([*loaded, *sums])]
        lines += [f"const {c} mean = {self.reduce('sum')};", f"{c} squares = 0;"]
        if self.chunks == 1:  # the row is still in registers
            lines += self.squares(width)
        else:
            lines += self.chunked([*self.load_pass(width, False), *self.squares(width)])
        return [*lines, rstd]

    def write_statistics(self) -> list[str]:
        stored = []
        for role, value in STATISTICS.items():
            t = self.anchor.output(role)
            if t is not None and t.id in self.names:
                stored.append(f"{self.names[t.id]}[{self.row_offset(t)}] = {store(t.data_type, value)};")
        if not stored:
            return []
        active = "active && " if self.layout.rows % self.config.rows_per_block else ""
        return [f"if ({active}lane == 0) {{", *indent(stored, 1).splitlines(), "}"]

    # -- walking the rows ------------------------------------------------------------------------
    def this_row(self, first: str) -> list[str]:
        """``row``, ``active`` and the row offsets of this thread's row in the group starting at ``first``."""
        return [
            f"const {self.itype} row = {first} + threadIdx.x / GROUP;",
            *(["const bool active = row < ROWS;"] if self.layout.rows % self.config.rows_per_block else []),
            *self.row_prelude(),
        ]

    def row_loop(self, width: int) -> list[str]:
        """Every row of this block's groups, the row's elements held width at a time."""
        per_row = [
            *self.this_row("first"),
            f"{self.compute} x[{self.slots}];  // this thread's elements of the row",
            *self.statistics(width),
            *self.write_statistics(),
        ]
        if self.chunks == 1:
            per_row += self.apply_pass(width)
        else:
            per_row += self.chunked([*self.load_pass(width, False), *self.apply_pass(width)])
        return self.walk(per_row)

    def walk(self, per_row: list[str]) -> list[str]:
        """``per_row`` for each group of rows of this block (first: the group's first row)."""
        step = f"({self.itype})gridDim.x * ROWS_PER_BLOCK"
        return [
            f"for ({self.itype} first = ({self.itype})blockIdx.x * ROWS_PER_BLOCK; first < ROWS; first += {step}) {{",
            *indent(per_row, 1).splitlines(),
            "}",
        ]

    def pipelined_row_loop(self, width: int) -> list[str]:
        """The row loop with this thread's next row prefetched into in{id}[] (and the per-column
        operands held in col{id}[] where they fit): the loads of row i + 1 are issued as soon as
        row i is converted to x[], and complete while row i is reduced, normalized and stored."""
        held = self.held_columns(width)
        raw, _ = self.load_values(width, self.writes_sum)
        step = f"({self.itype})gridDim.x * ROWS_PER_BLOCK"
        # Uniform over the block: every thread reaches the group_sum barriers the same times.
        prefetch = [
            f"if (first + {step} < ROWS) {{  // the next rows' loads, in flight through this row's work",
            *indent([*self.this_row(f"(first + {step})"), *self.raw_loads(raw, width)], 1).splitlines(),
            "}",
        ]
        per_row = [
            *self.this_row("first"),
            f"{self.compute} x[{self.slots}];  // this thread's elements of the row",
            *self.statistics(width, prefetch),
            *self.write_statistics(),
            *self.apply_pass(width),
        ]
        first_loads = [*self.this_row(f"({self.itype})blockIdx.x * ROWS_PER_BLOCK"), *self.raw_loads(raw, width)]
        return [
            *held,
            *self.raw_vectors(raw, width),
            "{  // the first rows' loads",
            f"  const {self.itype} chunk = 0;",
            *indent(first_loads, 1).splitlines(),
            "}",
            *self.walk(per_row),
        ]

    def held_columns(self, width: int) -> list[str]:
        """col{id}[] <- the per-column operands at this thread's columns, converted once for every
        row (where they fit); the passes written after this read them from there."""
        if not self.config.holds_columns(self.layout, self.sms):
            return []
        self.held = {t.id: t for t in self.fused.inputs if t.id in self.layout.columns}
        lines = [f"{self.compute} col{t.id}[{self.slots}];  // the same for every row" for t in self.held.values()]
        load = self.vector_loads(self.held, width, "a{id}", declare=True)
        convert = [
            line
            for t in self.held.values()
            for line in (
                f"col{t.id}[k * {width} + e] = gd::element<{self.compute}>(a{t.id}, e);",
                f"gd::hold(col{t.id}[k * {width} + e]);  // converted once, not in every row",
            )
        ]
        zero = self.element_loop(width, [f"col{t.id}[k * {width} + e] = 0;" for t in self.held.values()])
        body = self.slot_loop(width, [*load, *self.element_loop(width, convert)], zero, rows=False)
        return [*lines, "{", f"  const {self.itype} chunk = 0;", *indent(body, 1).splitlines(), "}"]

    def body(self) -> list[str]:
        g, layout = self.config.threads_per_row, self.layout
        lines = [
            f"constexpr {self.itype} ROWS = {layout.rows}, WIDTH = {layout.width};",
            f"constexpr int GROUP = {g}, ROWS_PER_BLOCK = {self.config.rows_per_block};",
            "const int lane = threadIdx.x % GROUP;  // this thread's place in its row's group",
            f"const {self.compute} eps = {epsilon(self.anchor, self.names, self.compute)};",
        ]
        if g > 32:
            lines.append(
                f"__shared__ {self.compute} red[{self.config.threads // 32}];  // group_sum's per-warp partials"
            )
        # The main path (vectors, or elements when the layout has none) is pipelined when chosen;
        # the element path behind the vector path is the plain row loop.
        pipelined = self.config.pipelined(layout, self.sms)
        main = self.pipelined_row_loop(layout.vec) if pipelined else self.row_loop(layout.vec)
        if layout.vec == 1:
            return lines + main
        self.held = {}
        return [
            *lines,
            f"if ({self.aligned}) {{  // {layout.vec}-element vector accesses",
            *indent(main, 1).splitlines(),
            "} else {  // a pointer is not aligned for vectors: element accesses, the same mapping",
            *indent(self.row_loop(1), 1).splitlines(),
            "}",
        ]

    def kernel(self) -> Kernel:
        threads = self.config.threads
        name, source = kernel_source(
            self.ctx,
            self.fused,
            pattern_name(self.fused),
            self.params,
            threads,
            indent(self.body(), 1),
            self.config.blocks_per_sm,
        )
        vectors = [t for t in self.memory if t.id in self.layout.packed]
        alignment = max((self.layout.vec * t.data_type.itemsize for t in vectors), default=16)
        grid = (min(self.blocks, 2**31 - 1), 1, 1)
        return Kernel(name, source, grid, (threads, 1, 1), 0, tuple(self.params.bindings), max(alignment, 16))
