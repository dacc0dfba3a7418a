"""Dims and strides: packed-layout helpers and the checks every tensor must pass.

Dims are always in logical order (N, C, spatial... for convolution tensors; batch...,
rows, cols for matmul); the physical layout is given by strides, as in cuDNN. NHWC is
``stride = [H*W*C, 1, W*C, C]`` over dims ``[N, C, H, W]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .errors import ShapeError, StrideError

# Bounds that keep every index computation inside int64 on the device and keep hostile
# inputs from asking for absurd sizes. 2**48 elements is 256 Ti elements.
MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**48


def numel(dim: Sequence[int]) -> int:
    return math.prod(dim)


def packed_strides(dim: Sequence[int], order: Sequence[int] | None = None) -> tuple[int, ...]:
    """Strides of a packed tensor whose dims are laid out ``order[0]`` outermost.

    ``order`` defaults to the logical order (row-major, i.e. NCHW for 4-D tensors).
    """
    rank = len(dim)
    order = list(range(rank)) if order is None else list(order)
    if sorted(order) != list(range(rank)):
        raise ShapeError(f"layout order {order} is not a permutation of {rank} dims")
    strides = [0] * rank
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(dim[axis], 1)
    return tuple(strides)


def channels_last_order(rank: int) -> tuple[int, ...]:
    """The layout order of NHWC (rank 4), NDHWC (rank 5) or NWC (rank 3)."""
    if rank < 3:
        return tuple(range(rank))
    return (0, *range(2, rank), 1)


def nchw_strides(dim: Sequence[int]) -> tuple[int, ...]:
    """Packed channels-first strides (NCW, NCHW, NCDHW...)."""
    return packed_strides(dim)


def nhwc_strides(dim: Sequence[int]) -> tuple[int, ...]:
    """Packed channels-last strides (NWC, NHWC, NDHWC...) for logical dims [N, C, ...]."""
    return packed_strides(dim, channels_last_order(len(dim)))


def stride_order(dim: Sequence[int], stride: Sequence[int]) -> tuple[int, ...]:
    """The dims from outermost to innermost; ties (size-1 dims) keep logical order.

    Used to give an op's output the layout of its input, as cuDNN does.
    """
    return tuple(sorted(range(len(dim)), key=lambda axis: (-stride[axis], axis)))


def storage_extent(dim: Sequence[int], stride: Sequence[int]) -> int:
    """Elements spanned in memory from the first element to the last, inclusive."""
    return 1 + sum((d - 1) * s for d, s in zip(dim, stride, strict=True))


def is_packed(dim: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the tensor covers its storage without gaps."""
    return storage_extent(dim, stride) == numel(dim)


def check_extent(dim: Sequence[int], stride: Sequence[int]) -> None:
    """Raise StrideError unless the storage extent (elements from the first to the last, gaps
    included) is at most MAX_ELEMENTS, so that byte offsets (at most 8 bytes an element) stay
    below 2**51 and device index arithmetic in int64."""
    extent = storage_extent(dim, stride)
    if extent > MAX_ELEMENTS:
        raise StrideError(
            f"strides {list(stride)} make dims {list(dim)} span {extent} elements of memory, over {MAX_ELEMENTS}"
        )


def check_dims(dim: Sequence[int]) -> None:
    """Raise ShapeError unless ``dim`` is a valid list of extents."""
    if not 1 <= len(dim) <= MAX_RANK:
        raise ShapeError(f"rank {len(dim)} is outside 1..{MAX_RANK}")
    for axis, extent in enumerate(dim):
        if isinstance(extent, bool) or not isinstance(extent, int):
            raise ShapeError(f"dim[{axis}] is {extent!r}, not an integer")
        if not 1 <= extent <= MAX_DIM:
            raise ShapeError(f"dim[{axis}] = {extent} is outside 1..{MAX_DIM}")
    if numel(dim) > MAX_ELEMENTS:
        raise ShapeError(f"dims {list(dim)} hold {numel(dim)} elements, over {MAX_ELEMENTS}")


def check_strides(dim: Sequence[int], stride: Sequence[int], *, read_only: bool = False) -> None:
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


def overlap_reason(dim: Sequence[int], stride: Sequence[int]) -> str | None:
    """Why ``stride`` may map two elements of ``dim`` to one offset; None when each dim steps
    past everything inside it (sorted by stride), which proves every offset distinct."""
    spanning = sorted((s, d, axis) for axis, (d, s) in enumerate(zip(dim, stride)) if d > 1)
    reach = 1  # every element below this offset may already be taken
    for step, extent, axis in spanning:
        if step < reach:
            return f"dim {axis} (extent {extent}) steps {step} but the dims inside it span {reach}"
        reach = step * extent
    return None
