"""Dims and strides: packed-layout helpers and the checks every tensor must pass.

Dims are always in logical order (N, C, spatial... for convolution tensors; batch...,
rows, cols for matmul); the physical layout is given by strides, as in cuDNN. NHWC is
``stride = [H*W*C, 1, W*C, C]`` over dims ``[N, C, H, W]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import overload

from .errors import ShapeError, StrideError
from .symbolic import Extent, Sym, counterexample, lower, show, show_values, upper

# Bounds that keep every index computation inside int64 on the device and keep hostile
# inputs from asking for absurd sizes. 2**48 elements is 256 Ti elements.
MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**48


@overload
def numel(dim: Sequence[int]) -> int: ...
@overload
def numel(dim: Sequence[Extent]) -> Extent: ...
def numel(dim: Sequence[Extent]) -> Extent:
    return math.prod(dim)


@overload
def packed_strides(dim: Sequence[int], order: Sequence[int] | None = None) -> tuple[int, ...]: ...
@overload
def packed_strides(dim: Sequence[Extent], order: Sequence[int] | None = None) -> tuple[Extent, ...]: ...
def packed_strides(dim: Sequence[Extent], order: Sequence[int] | None = None) -> tuple[Extent, ...]:
    """Strides of a packed tensor whose dims are laid out ``order[0]`` outermost.

    ``order`` defaults to the logical order (row-major, i.e. NCHW for 4-D tensors).
    Symbolic dims give symbolic strides: the products of the dims inside.
    """
    rank = len(dim)
    order = list(range(rank)) if order is None else list(order)
    if sorted(order) != list(range(rank)):
        raise ShapeError(f"layout order {order} is not a permutation of {rank} dims")
    strides: list[Extent] = [0] * rank
    step: Extent = 1
    for axis in reversed(order):
        strides[axis] = step
        extent = dim[axis]
        step = step * (extent if isinstance(extent, Sym) else max(extent, 1))
    return tuple(strides)


def channels_last_order(rank: int) -> tuple[int, ...]:
    """The layout order of NHWC (rank 4), NDHWC (rank 5) or NWC (rank 3)."""
    if rank < 3:
        return tuple(range(rank))
    return (0, *range(2, rank), 1)


def nchw_strides(dim: Sequence[Extent]) -> tuple[Extent, ...]:
    """Packed channels-first strides (NCW, NCHW, NCDHW...)."""
    return packed_strides(dim)


def nhwc_strides(dim: Sequence[Extent]) -> tuple[Extent, ...]:
    """Packed channels-last strides (NWC, NHWC, NDHWC...) for logical dims [N, C, ...]."""
    return packed_strides(dim, channels_last_order(len(dim)))


def stride_order(dim: Sequence[Extent], stride: Sequence[Extent]) -> tuple[int, ...]:
    """The dims from outermost to innermost; ties (size-1 dims) keep logical order.

    Used to give an op's output the layout of its input, as cuDNN does. Symbolic strides
    are ordered by their largest values, then their smallest: the nesting they have over
    most of the range (a valid layout nests the same way at every value).
    """
    return tuple(sorted(range(len(dim)), key=lambda axis: (-upper(stride[axis]), -lower(stride[axis]), axis)))


def storage_extent(dim: Sequence[int], stride: Sequence[int]) -> int:
    """Elements spanned in memory from the first element to the last, inclusive."""
    return 1 + sum((d - 1) * s for d, s in zip(dim, stride, strict=True))


def largest_storage_extent(dim: Sequence[Extent], stride: Sequence[Extent]) -> int:
    """:func:`storage_extent` at the symbols' maxima, where it is largest over their range
    (products of symbols are monotone in each): what a buffer for every value must hold."""
    return storage_extent([upper(d) for d in dim], [upper(s) for s in stride])


def is_packed(dim: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the tensor covers its storage without gaps."""
    return storage_extent(dim, stride) == numel(dim)


def check_extent(dim: Sequence[Extent], stride: Sequence[Extent]) -> None:
    """Raise StrideError unless the storage extent (elements from the first to the last, gaps
    included) is at most MAX_ELEMENTS, so that byte offsets (at most 8 bytes an element) stay
    below 2**51 and device index arithmetic in int64. Symbolic dims and strides are checked
    at their maxima, where the extent is largest."""
    extent = largest_storage_extent(dim, stride)
    if extent > MAX_ELEMENTS:
        at = "" if all(map(_is_int, (*dim, *stride))) else " at the symbols' maxima"
        raise StrideError(
            f"strides {list(stride)} make dims {show(dim)} span {extent} elements of memory{at}, over {MAX_ELEMENTS}"
        )


def _is_int(value: Extent) -> bool:
    return not isinstance(value, Sym)


def check_dims(dim: Sequence[Extent]) -> None:
    """Raise ShapeError unless ``dim`` is a valid list of extents, over the whole range of its symbols."""
    if not 1 <= len(dim) <= MAX_RANK:
        raise ShapeError(f"rank {len(dim)} is outside 1..{MAX_RANK}")
    for axis, extent in enumerate(dim):
        if isinstance(extent, Sym):
            if upper(extent) > MAX_DIM:
                raise ShapeError(f"dim[{axis}] = {extent} reaches {upper(extent)} in {show(dim)}, over {MAX_DIM}")
            continue
        if isinstance(extent, bool) or not isinstance(extent, int):
            raise ShapeError(f"dim[{axis}] is {extent!r}, not an integer")
        if not 1 <= extent <= MAX_DIM:
            raise ShapeError(f"dim[{axis}] = {extent} is outside 1..{MAX_DIM}")
    count = upper(numel(dim))
    if count > MAX_ELEMENTS:
        at = "" if all(map(_is_int, dim)) else " at the symbols' maxima"
        raise ShapeError(f"dims {show(dim)} hold {count} elements{at}, over {MAX_ELEMENTS}")


def check_strides(dim: Sequence[Extent], stride: Sequence[Extent], *, read_only: bool = False) -> None:
    """Raise StrideError unless ``stride`` maps ``dim`` to distinct, non-negative offsets.

    Accepted layouts are the permutations of a packed layout, with gaps allowed (a
    slice of a bigger tensor). Size-1 dims may carry any non-negative stride. A
    ``read_only`` tensor (a graph input) may also map several elements to one offset: a
    broadcast view (stride 0), or strides that overlap, as the cuDNN frontend's samples
    use; kernels index it with its strides as given. Written tensors may not.
    """
    if len(stride) != len(dim):
        raise StrideError(f"{len(stride)} strides for {len(dim)} dims")
    for axis, step in enumerate(stride):
        if isinstance(step, Sym):
            if upper(step) > MAX_ELEMENTS:
                raise StrideError(f"stride[{axis}] = {step} reaches {upper(step)}, over {MAX_ELEMENTS}")
            continue
        if isinstance(step, bool) or not isinstance(step, int):
            raise StrideError(f"stride[{axis}] is {step!r}, not an integer")
        if step < 0:
            raise StrideError(f"stride[{axis}] = {step} is negative")
        if step > MAX_ELEMENTS:
            raise StrideError(f"stride[{axis}] = {step} is over {MAX_ELEMENTS}")
    reason = None if read_only else overlap_reason(dim, stride)
    if reason is not None:
        raise StrideError(
            f"strides {list(stride)} overlap for dims {list(dim)}: {reason}; only a graph input may map several "
            "elements to one address, a tensor the graph writes may not"
        )


def overlap_reason(dim: Sequence[Extent], stride: Sequence[Extent]) -> str | None:
    """Why ``stride`` may map two elements of ``dim`` to one offset; None when each dim steps
    past everything inside it (sorted by stride), which proves every offset distinct.

    With symbols the proof must hold at every value in range: each step is compared with
    the span inside it exactly (:func:`graphdnn.symbolic.counterexample`), and a failure
    names the values of the symbols where the dims overlap.
    """
    spanning = sorted(
        (upper(s), lower(s), upper(d), axis) for axis, (d, s) in enumerate(zip(dim, stride)) if upper(d) > 1
    )
    reach: Extent = 1  # every element below this offset may already be taken
    for *_, axis in spanning:
        step, extent = stride[axis], dim[axis]
        values = counterexample(step, reach)
        if values is not None:
            when = f" when {show_values(values)}" if values else ""
            return f"dim {axis} (extent {extent}) steps {step} but the dims inside it span {reach}{when}"
        reach = step * extent
    return None
