"""Index arithmetic with compile-time dims and strides.

Kernels iterate over logical coordinates of an output; operands broadcast against it
(right-aligned, size-1 dims repeat). Offsets are sums of coordinate * stride over the
dims an operand really has, so a broadcast operand simply skips the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphdnn.ir import Tensor
from graphdnn.layout import storage_extent


def index_type(tensors: Sequence[Tensor], *extra_extents: int) -> str:
    """32-bit indexing when every offset fits, else 64-bit (slower divisions)."""
    largest = max([storage_extent(t.dim, t.stride) for t in tensors] + [t.numel for t in tensors] + list(extra_extents))
    return "int" if largest < 2**31 - 1 else "long long"


def coordinates(linear: str, dims: Sequence[int], order: Sequence[int], prefix: str, itype: str) -> list[str]:
    """Statements splitting ``linear`` (an index over ``dims`` laid out ``order[0]``
    outermost) into coordinate variables ``{prefix}{axis}``; size-1 axes become 0."""
    statements = []
    rest = linear
    inner = list(order)[::-1]
    for position, axis in enumerate(inner):
        extent = dims[axis]
        name = f"{prefix}{axis}"
        if extent == 1:
            statements.append(f"const {itype} {name} = 0;")
        elif position == len(inner) - 1:
            statements.append(f"const {itype} {name} = {rest};")
        else:
            statements.append(f"const {itype} {name} = {rest} % {extent};")
        if extent != 1 and position < len(inner) - 1:
            statements.append(f"const {itype} {prefix}r{axis} = {rest} / {extent};")
            rest = f"{prefix}r{axis}"
    return statements


def offset(tensor: Tensor, out_dims: Sequence[int], prefix: str) -> str:
    """The element offset in ``tensor`` of the output coordinates ``{prefix}{axis}``."""
    shift = len(out_dims) - len(tensor.dim)
    terms = []
    for axis, (extent, stride) in enumerate(zip(tensor.dim, tensor.stride)):
        if extent == 1 or stride == 0:
            continue
        coordinate = f"{prefix}{axis + shift}"
        terms.append(coordinate if stride == 1 else f"{coordinate} * {stride}")
    return " + ".join(terms) if terms else "0"


def is_full(tensor: Tensor, out_dims: Sequence[int]) -> bool:
    return tuple(tensor.dim) == tuple(out_dims)
