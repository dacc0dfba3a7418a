"""Reductions: ``reduction`` (declared output dims, as in cuDNN), ``softmax``, ``log_softmax``,
``softmax_backward``, ``argmax`` / ``argmin`` and ``genstats``.

A reduction's output has the input's rank; each output dim equals the input's or is 1,
and the axes reduced are those where the output is 1 and the input is not. The output
dims are the whole specification: no attribute repeats the axes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..errors import AttributeValueError
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, check_axis, fail, need_declared, register
from .shape import known_dims

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


class ReductionMode(enum.Enum):
    ADD = "add"
    MUL = "mul"
    MIN = "min"
    MAX = "max"
    AMAX = "amax"  # max |x|
    AVG = "avg"
    NORM1 = "norm1"  # sum |x|
    NORM2 = "norm2"  # sqrt(sum x^2)
    MUL_NO_ZEROS = "mul_no_zeros"  # product of the non-zero elements; 1 if there are none


@dataclasses.dataclass(frozen=True)
class ReductionAttributes(Attributes):
    mode: ReductionMode


@dataclasses.dataclass(frozen=True)
class SoftmaxAttributes(Attributes):
    axis: int = -1


# mode -> f(x, axes), keeping the reduced axes as size 1
_REDUCE: dict[ReductionMode, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    ReductionMode.ADD: lambda x, axes: np.sum(x, axis=axes, keepdims=True),
    ReductionMode.MUL: lambda x, axes: np.prod(x, axis=axes, keepdims=True),
    ReductionMode.MIN: lambda x, axes: np.min(x, axis=axes, keepdims=True),
    ReductionMode.MAX: lambda x, axes: np.max(x, axis=axes, keepdims=True),
    ReductionMode.AMAX: lambda x, axes: np.max(np.abs(x), axis=axes, keepdims=True),
    ReductionMode.AVG: lambda x, axes: np.mean(x, axis=axes, keepdims=True),
    ReductionMode.NORM1: lambda x, axes: np.sum(np.abs(x), axis=axes, keepdims=True),
    ReductionMode.NORM2: lambda x, axes: np.sqrt(np.sum(np.square(x), axis=axes, keepdims=True)),
    ReductionMode.MUL_NO_ZEROS: lambda x, axes: np.prod(np.where(x == 0, 1.0, x), axis=axes, keepdims=True),
}


@register
class Reduction(Op):
    kind = "reduction"
    category = Category.REDUCTION
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = ReductionAttributes
    declared_outputs = frozenset({"y"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        y = declared.get("y")
        if y is None:
            need_declared(node, "the output dims of a reduction cannot be inferred: pass axes= or call set_dim on y")
        expected = f"expected rank {len(x.dim)} with each dim equal to input {list(x.dim)}'s or 1"
        if len(y) != len(x.dim):
            fail(node, f"y has dims {list(y)}, {expected}")
        for axis, (out, extent) in enumerate(zip(y, x.dim)):
            if out not in (1, extent):
                fail(node, f"y has dims {list(y)}: dim {axis} is {out}, {expected}")
        return {"y": Inferred(tuple(y), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        y_dim = node.output("y").dim  # type: ignore[union-attr]
        axes = tuple(axis for axis, (out, extent) in enumerate(zip(y_dim, value.shape)) if out == 1 != extent)
        return {"y": _REDUCE[node.attributes.mode](value, axes)}  # type: ignore[attr-defined]


@register
class Softmax(Op):
    kind = "softmax"
    category = Category.REDUCTION
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = SoftmaxAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        check_axis(node, node.attributes.axis, len(x.dim))  # type: ignore[attr-defined]
        return {"y": Inferred(x.dim, stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        axis = node.attributes.axis  # type: ignore[attr-defined]
        # Subtracting the max keeps exp() <= 1: no overflow, and the result is unchanged.
        e = np.exp(value - np.max(value, axis=axis, keepdims=True))
        return {"y": e / np.sum(e, axis=axis, keepdims=True)}


@register
class LogSoftmax(Softmax):
    kind = "log_softmax"

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        axis = node.attributes.axis  # type: ignore[attr-defined]
        shifted = value - np.max(value, axis=axis, keepdims=True)
        return {"y": shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))}


@register
class SoftmaxBackward(Op):
    """The gradient through ``softmax`` from its output: dx = y * (dy - sum(dy * y)) along axis."""

    kind = "softmax_backward"
    category = Category.REDUCTION
    inputs = (Role("dy"), Role("y"))
    outputs = (Role("dx"),)
    attributes = SoftmaxAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dy, y = node.input("dy"), node.input("y")
        assert dy is not None and y is not None
        if dy.dim != y.dim:
            fail(node, f"dy has dims {list(dy.dim)} and y {list(y.dim)}; they must be equal", role="y")
        check_axis(node, node.attributes.axis, len(y.dim))  # type: ignore[attr-defined]
        return {"dx": Inferred(dy.dim, stride_order(dy.dim, dy.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        dy, y = x["dy"], x["y"]
        axis = node.attributes.axis  # type: ignore[attr-defined]
        return {"dx": y * (dy - np.sum(dy * y, axis=axis, keepdims=True))}


class IndexType(enum.Enum):
    """The integer types an index output may take."""

    INT32 = "int32"
    INT64 = "int64"


@dataclasses.dataclass(frozen=True)
class ArgReductionAttributes(Attributes):
    axis: int = -1
    index_data_type: IndexType = IndexType.INT64


class _ArgReduction(Op):
    """The index along ``axis`` of the largest (argmax) or smallest (argmin) element, the first
    one on ties and the first NaN where there is one (as NumPy and PyTorch); ``axis`` kept as 1."""

    category = Category.REDUCTION
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = ArgReductionAttributes
    find: Callable[..., Any]

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        attributes: ArgReductionAttributes = node.attributes  # type: ignore[assignment]
        axis = check_axis(node, attributes.axis, len(x.dim))
        if attributes.index_data_type is IndexType.INT32 and x.dim[axis] > 2**31:
            fail(node, f"axis {axis} has {x.dim[axis]} elements: its indices need index_data_type int64", role="input")
        dims = tuple(1 if a == axis else d for a, d in enumerate(x.dim))
        index_type = DataType(attributes.index_data_type.value)
        return {"y": Inferred(dims, stride_order(x.dim, x.stride), data_type=index_type)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        axis = node.attributes.axis  # type: ignore[attr-defined]
        return {"y": type(self).find(x["input"], axis=axis, keepdims=True).astype(np.float64)}


@register
class ArgMax(_ArgReduction):
    kind = "argmax"
    find = staticmethod(np.argmax)


@register
class ArgMin(_ArgReduction):
    kind = "argmin"
    find = staticmethod(np.argmin)


@register
class Genstats(Op):
    """Per-channel (dim 1) sum and sum of squares, as cuDNN's genstats feeds batchnorm."""

    kind = "genstats"
    category = Category.REDUCTION
    inputs = (Role("input"),)
    outputs = (Role("sum"), Role("sq_sum"))

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        if len(x.dim) < 2:
            fail(node, f"input has dims {list(x.dim)}; genstats needs rank >= 2 with channels at dim 1", role="input")
        stats = Inferred(
            tuple(extent if axis == 1 else 1 for axis, extent in enumerate(x.dim)), stride_order(x.dim, x.stride)
        )
        return {"sum": stats, "sq_sum": stats}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        value = x["input"]
        axes = tuple(axis for axis in range(value.ndim) if axis != 1)
        return {
            "sum": np.sum(value, axis=axes, keepdims=True),
            "sq_sum": np.sum(np.square(value), axis=axes, keepdims=True),
        }


def _reduced_dims(input: TensorSpec, axes: Sequence[int], node: str | None) -> tuple[Extent, ...]:
    """The input's dims with ``axes`` (negative allowed) set to 1."""
    dim = known_dims(input, "reduction axes=", node)
    out: list[Extent] = list(dim)
    for axis in axes:
        if isinstance(axis, bool) or not hasattr(axis, "__index__") or not -len(dim) <= axis < len(dim):
            raise AttributeValueError(
                f"reduction axis {axis!r} is out of range for input '{input.name}' of rank {len(dim)}", node=node
            )
        out[axis] = 1
    return tuple(out)


class ReductionMethods:
    _add_node: Callable[..., list[Any]]

    def reduction(
        self,
        input: TensorSpec,
        mode: Any,
        axes: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Reduce ``input`` over ``axes`` (kept as size 1), or over the dims later given by set_dim."""
        declared = None if axes is None else {"y": _reduced_dims(input, axes, name)}
        return self._add_node(
            "reduction",
            {"input": input},
            {"mode": mode},
            name=name,
            compute_data_type=compute_data_type,
            declared=declared,
        )[0]

    def softmax(
        self, input: TensorSpec, axis: int = -1, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """exp(x) / sum(exp(x)) along ``axis``."""
        return self._add_node(
            "softmax", {"input": input}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]

    def log_softmax(
        self, input: TensorSpec, axis: int = -1, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """x - log(sum(exp(x))) along ``axis``, without forming exp(x)."""
        return self._add_node(
            "log_softmax", {"input": input}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]

    def softmax_backward(
        self, dy: TensorSpec, y: TensorSpec, axis: int = -1, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """The gradient through ``softmax(x, axis)`` given its output ``y`` and the gradient ``dy`` at y."""
        return self._add_node(
            "softmax_backward", {"dy": dy, "y": y}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]

    def argmax(
        self,
        input: TensorSpec,
        axis: int = -1,
        index_data_type: Any = "int64",
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """The first index of the maximum along ``axis`` (kept as 1), as int64 or int32."""
        attributes = {"axis": axis, "index_data_type": index_data_type}
        return self._add_node("argmax", {"input": input}, attributes, name=name, compute_data_type=compute_data_type)[0]

    def argmin(
        self,
        input: TensorSpec,
        axis: int = -1,
        index_data_type: Any = "int64",
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """The first index of the minimum along ``axis`` (kept as 1), as int64 or int32."""
        attributes = {"axis": axis, "index_data_type": index_data_type}
        return self._add_node("argmin", {"input": input}, attributes, name=name, compute_data_type=compute_data_type)[0]

    def genstats(self, input: TensorSpec, compute_data_type: Any = None, name: str | None = None) -> list[TensorSpec]:
        """[sum, sq_sum] per channel, dims [1, C, 1, ...]: the statistics a batchnorm needs."""
        return self._add_node("genstats", {"input": input}, name=name, compute_data_type=compute_data_type)
