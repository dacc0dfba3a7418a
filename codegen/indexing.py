"""Index arithmetic with compile-time dims and strides, and runtime ones for symbols.

Kernels iterate over logical coordinates of an output; operands broadcast against it
(right-aligned, size-1 dims repeat). Offsets are sums of coordinate * stride over the
dims an operand really has, so a broadcast operand simply skips the others.

A static dim or stride is written as its number. A symbolic one (a dynamic graph's) is
written as the product of its coefficient and the kernel's EXTENT parameters
(:func:`c_extent`); index types are chosen for the symbols' maxima, where every extent
is largest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from graphdnn.ir import Tensor
from graphdnn.layout import largest_storage_extent, packed_strides
from graphdnn.symbolic import Extent, Sym, Symbol, upper

EXTENT_PREFIX = "dyn_"  # an EXTENT parameter is dyn_<symbol name> (renumbered dyn0, dyn1... in the source)


def extent_name(symbol: Symbol) -> str:
    return f"{EXTENT_PREFIX}{symbol.name}"


def c_extent(value: Extent) -> str:
    """A dim or stride as a C expression: the number, or the product of the symbols' EXTENT
    parameters (long long) and the coefficient, parenthesized."""
    if not isinstance(value, Sym):
        return str(value)
    factors = [extent_name(s) for s in value.factors]
    return f"({' * '.join([*([str(value.coefficient)] if value.coefficient != 1 else []), *factors])})"


def divides(value: Extent, n: int) -> bool:
    """Whether ``n`` divides ``value`` at every value of its symbols."""
    return (value.coefficient if isinstance(value, Sym) else value) % n == 0


def index_type(tensors: Sequence[Tensor], *extra_extents: int) -> str:
    """32-bit indexing when every offset fits (over the whole range of a dynamic graph's
    symbols), else 64-bit (slower divisions)."""
    largest = max(
        [largest_storage_extent(t.dim, t.stride) for t in tensors]
        + [upper(t.numel) for t in tensors]
        + list(extra_extents)
    )
    return "int" if largest < 2**31 - 1 else "long long"


def loop_index_type(tensors: Sequence[Tensor], count: int, grid_threads: int, *extents: int) -> str:
    """int or long long for a grid-stride loop over ``count``: the index passes ``count`` by
    up to ``grid_threads`` (all threads of the grid) before the loop test stops it."""
    return index_type(tensors, count + grid_threads, *extents)


def coordinates(linear: str, dims: Sequence[Extent], order: Sequence[int], prefix: str, itype: str) -> list[str]:
    """Statements splitting ``linear`` (an index over ``dims`` laid out ``order[0]``
    outermost) into coordinate variables ``{prefix}{axis}``; size-1 axes become 0."""
    statements = []
    rest = linear
    inner = list(order)[::-1]
    for position, axis in enumerate(inner):
        extent = dims[axis]
        name = f"{prefix}{axis}"
        # A symbolic extent in the index type: a 32-bit division where the index is 32-bit.
        divisor = f"({itype}){c_extent(extent)}" if isinstance(extent, Sym) else str(extent)
        if extent == 1:
            statements.append(f"const {itype} {name} = 0;")
        elif position == len(inner) - 1:
            statements.append(f"const {itype} {name} = {rest};")
        else:
            statements.append(f"const {itype} {name} = {rest} % {divisor};")
        if extent != 1 and position < len(inner) - 1:
            statements.append(f"const {itype} {prefix}r{axis} = {rest} / {divisor};")
            rest = f"{prefix}r{axis}"
    return statements


def offset(tensor: Tensor, out_dims: Sequence[Extent], prefix: str) -> str:
    """The element offset in ``tensor`` of the output coordinates ``{prefix}{axis}``."""
    shift = len(out_dims) - len(tensor.dim)
    terms = []
    for axis, (extent, stride) in enumerate(zip(tensor.dim, tensor.stride)):
        if extent == 1 or stride == 0:
            continue
        coordinate = f"{prefix}{axis + shift}"
        terms.append(coordinate if stride == 1 else f"{coordinate} * {c_extent(stride)}")
    return " + ".join(terms) if terms else "0"


def row_major(tensor: Tensor) -> Tensor:
    """``tensor`` with packed row-major strides: its ``offset`` is the element's row-major index."""
    return dataclasses.replace(tensor, stride=packed_strides(tensor.dim))


def row_major_index(tensor: Tensor, out_dims: Sequence[Extent], prefix: str) -> str:
    """The row-major index, in ``tensor``'s own dims, of its element at the output coordinates
    ``{prefix}{axis}`` (broadcast axes at 0): what rng draws its element from."""
    return offset(row_major(tensor), out_dims, prefix)


def along(tensor: Tensor, axis: int) -> Tensor:
    """``tensor`` with every dim but ``axis`` made 1: the row-major index of an element in it, as
    ``Values.index`` gives it, is the element's coordinate along ``axis`` (what gen_index holds)."""
    return dataclasses.replace(tensor, dim=tuple(d if a == axis else 1 for a, d in enumerate(tensor.dim)))


def is_full(tensor: Tensor, out_dims: Sequence[Extent]) -> bool:
    return tuple(tensor.dim) == tuple(out_dims)


def merged_runs(dims: Sequence[int], strides: Sequence[int], axes: Sequence[int]) -> list[tuple[int, int]]:
    """(extent, stride) of ``axes`` (outermost first, size-1 axes dropped), with each axis merged
    into the next inner one where they are contiguous (stride = inner extent * inner stride):
    packed NCHW's H and W become one run of H*W elements, so walks divide by fewer extents."""
    runs: list[tuple[int, int]] = []
    for axis in reversed([a for a in axes if dims[a] > 1]):
        extent, stride = dims[axis], strides[axis]
        if runs and runs[0][0] * runs[0][1] == stride:
            runs[0] = (runs[0][0] * extent, runs[0][1])
        else:
            runs.insert(0, (extent, stride))
    return runs


def run_offset(linear: str, runs: Sequence[tuple[int, int]], prefix: str, itype: str) -> tuple[list[str], str]:
    """Statements splitting ``linear`` (an index over ``runs``, outermost first) into coordinates
    ``{prefix}{i}``, and the element offset they address."""
    statements = coordinates(linear, [extent for extent, _ in runs], range(len(runs)), prefix, itype)
    terms = [f"{prefix}{i}" if stride == 1 else f"{prefix}{i} * {stride}" for i, (_, stride) in enumerate(runs)]
    return statements, " + ".join(terms) if terms else "0"


def linear_index(dims: Sequence[Extent], order: Sequence[int], prefix: str) -> str:
    """The inverse of :func:`coordinates`: the index, over the axes ``order`` of ``dims``
    (outermost first), of the coordinates ``{prefix}{axis}``."""
    terms: list[str] = []
    step: Extent = 1
    for axis in reversed(order):
        if dims[axis] != 1:
            terms.insert(0, f"{prefix}{axis}" if step == 1 else f"{prefix}{axis} * {c_extent(step)}")
        step *= dims[axis]
    return " + ".join(terms) if terms else "0"


def offset_at(tensor: Tensor, coordinate: Sequence[str]) -> str:
    """The element offset in ``tensor`` of the given coordinate expressions, one per dim."""
    terms = []
    for extent, stride, value in zip(tensor.dim, tensor.stride, coordinate, strict=True):
        if extent == 1 or stride == 0:
            continue
        value = value if value.isidentifier() else f"({value})"
        terms.append(value if stride == 1 else f"{value} * {c_extent(stride)}")
    return " + ".join(terms) if terms else "0"


def restricted(tensor: Tensor, axes: Collection[int], out_rank: int) -> Tensor:
    """``tensor`` seen along the output axes ``axes`` only (its other dims set to extent 1):
    ``offset`` of the result is the part of the tensor's offset those axes contribute."""
    shift = out_rank - len(tensor.dim)
    dims = tuple(extent if axis + shift in axes else 1 for axis, extent in enumerate(tensor.dim))
    return dataclasses.replace(tensor, dim=dims)
