"""Row normalization's layout analysis: the row geometry, how each tensor is reached, and the
register bytes per element the launch choices (rownorm_launch.py) budget for.

Geometry. The normalized axes are where the scale is not 1 (graphdnn.ops.norms.per_row);
a *row* is one index of the other axes, D elements long. Every tensor's offset splits into
a row part (from the row's coordinates, computed once per row) and a column part: the
position j in the row itself when the tensor is *packed* along the row (the normalized
axes contiguous, in the norm input's memory order), else from j's coordinates and the
tensor's strides (any layout, broadcasts included).

Dynamic graphs. The rows may be symbolic (a batch, a sequence length): their count and the
strides between rows are then products of symbols that the kernel reads as arguments. The
normalized axes must be static (a scale of ones normalizes over every axis but the first,
which may be symbolic: such a node is refused, :func:`extents_refusal`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.norms import NormOp
from graphdnn.symbolic import Extent, show_ranges, symbols_of

from ..context import compute_of
from ..indexing import divides


@dataclass(frozen=True)
class RowLayout:
    """What the kernel's shape depends on: the row geometry and how each tensor is reached."""

    x: Tensor  # what is normalized: the norm's input (the residual sum when there is a prologue)
    norm_axes: frozenset[int]
    order: tuple[int, ...]  # x's axes, outermost first: rows and columns are enumerated in this order
    rows: Extent  # a product of symbols in a dynamic graph
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
    def dynamic(self) -> bool:
        return not isinstance(self.rows, int)

    @property
    def vectors(self) -> int:
        """Vector accesses per row."""
        return -(-self.width // self.vec)


def memory_tensors(fused: FusedNode) -> list[Tensor]:
    """The tensors the kernel reaches through pointers."""
    return [t for t in (*fused.inputs, *fused.outputs) if not t.is_pass_by_value]


def normalized(fused: FusedNode) -> tuple[Tensor, frozenset[int]]:
    """The norm's input and the axes it normalizes over."""
    anchor = fused.anchor
    assert anchor is not None
    x = anchor.input("input")
    assert x is not None
    return x, frozenset(cast(NormOp, anchor.definition).checked(anchor)[1].axes)


def extents_refusal(fused: FusedNode) -> str | None:
    """Why the kernel cannot take ``fused``'s symbols: the normalized axes (the row's width, which
    sizes each thread's share of the row in registers) must be static; None when they are."""
    x, axes = normalized(fused)
    symbols = symbols_of(x.dim[axis] for axis in sorted(axes))
    if not symbols:
        return None
    return (
        f"normalizes over symbolic dims ({show_ranges(symbols)}); row_norm kernels take runtime extents in their "
        "rows only (the row's width sizes each thread's registers)"
    )


def analyze(fused: FusedNode) -> RowLayout:
    x, axes = normalized(fused)
    order = stride_order(x.dim, x.stride)
    width = math.prod(_static(x.dim[axis]) for axis in axes)
    rows = math.prod(x.dim[axis] for axis in range(len(x.dim)) if axis not in axes)
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
    raw = sum(raw_register_bytes(t, vec) for t in {t.id: t for t in loaded}.values() if t.id in packed)
    applied = [t for t in _apply_operands(fused) if t.id in packed]
    columns = [t for t in applied if t.dim != x.dim and _same_for_every_row(t, x, axes)]
    compute_bytes = 8 if compute_of(memory) == "double" else 4
    return RowLayout(
        x,
        axes,
        order,
        rows,
        width,
        packed,
        vec,
        compute_bytes,
        raw,
        sum(raw_register_bytes(t, vec) for t in applied),
        tuple(sorted(t.id for t in columns)),
        sum(compute_bytes - raw_register_bytes(t, vec) for t in columns),
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


def raw_register_bytes(t: Tensor, vec: int) -> float:
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
        extent = _static(t.dim[axis - shift]) if axis >= shift else 1
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
    return all(divides(s, vec) for a, (d, s) in enumerate(zip(t.dim, t.stride)) if d != 1 and a + shift not in axes)


def _static(extent: Extent) -> int:
    """A normalized axis's extent: static in every node codegen emits (see extents_refusal)."""
    assert isinstance(extent, int), f"a normalized axis is symbolic ({extent})"
    return extent
