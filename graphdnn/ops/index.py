"""``gen_index``: each element's index along one axis (the cuDNN frontend's GEN_INDEX pointwise mode).

The output has the input's dims and layout; element ``(i0, ..., in)`` holds ``i_axis``. The input's
values are never read, only its dims, so gen_index is a pointwise op of the element's coordinate:
it joins elementwise kernels and epilogues, where it costs one integer of the coordinates the
kernel already has. Causal masks (``cmp_ge(gen_index(s, 2), gen_index(s, 3))``) and rotary
position embeddings are built from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..layout import stride_order
from ..symbolic import Extent, upper
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, check_axis, fail, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec

# Kernels compute an index in their compute type, float unless a tensor is double: float holds
# every integer up to 2^24 exactly, so longer axes are refused rather than rounded.
EXACT_INDEX = 2**24
# int32 by default (what the frontend's samples set), int64, or a float type (positions for RoPE).
INDEX_TYPES = frozenset({DataType.INT64, DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16})


@dataclasses.dataclass(frozen=True)
class GenIndexAttributes(Attributes):
    axis: int


@register
class GenIndex(Op):
    """The index along ``axis`` of every element of the input's dims."""

    kind = "gen_index"
    category = Category.POINTWISE  # a function of the element's coordinate: it fuses like one
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = GenIndexAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        axis = check_axis(node, node.attributes.axis, len(x.dim))  # type: ignore[attr-defined]
        if upper(x.dim[axis]) > EXACT_INDEX:
            fail(
                node,
                f"axis {axis} has up to {upper(x.dim[axis])} elements; gen_index's kernels compute indexes "
                f"in float, exact up to {EXACT_INDEX}",
                role="input",
            )
        order = stride_order(x.dim, x.stride)
        return {"y": Inferred(x.dim, order, data_type=DataType.INT32, allowed=INDEX_TYPES)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        dims = node.output("y").static_dim  # type: ignore[union-attr]
        axis = node.attributes.axis % len(dims)  # type: ignore[attr-defined]
        shape = [1] * len(dims)
        shape[axis] = dims[axis]
        index = np.arange(dims[axis], dtype=np.float64).reshape(shape)
        return {"y": np.broadcast_to(index, dims)}


class IndexMethods:
    _add_node: Callable[..., list[Any]]

    def gen_index(
        self, input: TensorSpec, axis: int, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """The index along ``axis`` (negative counts from the end) of each element of ``input``'s
        dims, int32 unless set to int64 or a float type; ``input``'s values are not read."""
        return self._add_node(
            "gen_index", {"input": input}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]
