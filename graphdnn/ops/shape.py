"""Data movement: reshape, transpose, slice and concatenate, on logical (row-major) order.

These ops move elements without arithmetic. Their semantics are NumPy's on the logical
array (``np.reshape``, ``np.transpose``, basic slicing, ``np.concatenate``), whatever the
inputs' strides; outputs are packed row-major.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttributeValueError, ShapeError
from ..layout import numel
from ..symbolic import Extent, Sym
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, check_axis, fail, fail_attribute, need_declared, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class TransposeAttributes(Attributes):
    permutation: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SliceAttributes(Attributes):
    """Normalised bounds, one per input dim: ``start <= stop <= dim``, ``step >= 1``."""

    start: tuple[int, ...]
    stop: tuple[int, ...]
    step: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ConcatenateAttributes(Attributes):
    axis: int


def _input(node: Node) -> tuple[Extent, ...]:
    x = node.input("input")
    assert x is not None
    return x.dim


@register
class Reshape(Op):
    """Same elements in the same logical row-major order, under the declared dims."""

    kind = "reshape"
    category = Category.DATA_MOVEMENT
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    declared_outputs = frozenset({"y"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dim = _input(node)
        y = declared.get("y")
        if y is None:
            need_declared(node, "the output dims of a reshape cannot be inferred: pass shape= or call set_dim on y")
        if numel(y) != numel(dim):
            fail(node, f"y has dims {list(y)} ({numel(y)} elements), but input {list(dim)} has {numel(dim)} elements")
        return {"y": Inferred(tuple(y))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": np.reshape(x["input"], node.output("y").dim)}  # type: ignore[union-attr]


@register
class Transpose(Op):
    """y.dim[i] = input.dim[permutation[i]], as ``np.transpose``."""

    kind = "transpose"
    category = Category.DATA_MOVEMENT
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = TransposeAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dim = _input(node)
        permutation = node.attributes.permutation  # type: ignore[attr-defined]
        if sorted(permutation) != list(range(len(dim))):
            fail_attribute(
                node,
                f"permutation {list(permutation)} is not a permutation of 0..{len(dim) - 1} (input rank {len(dim)})",
            )
        return {"y": Inferred(tuple(dim[axis] for axis in permutation))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": np.transpose(x["input"], node.attributes.permutation)}  # type: ignore[attr-defined]


@register
class Slice(Op):
    """input[start:stop:step] in every dim; steps are positive."""

    kind = "slice"
    category = Category.DATA_MOVEMENT
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = SliceAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dim = _input(node)
        a: SliceAttributes = node.attributes  # type: ignore[assignment]
        for name in ("start", "stop", "step"):
            if len(getattr(a, name)) != len(dim):
                fail_attribute(node, f"{name} has {len(getattr(a, name))} values for an input of rank {len(dim)}")
        if any(s < 1 for s in a.step):
            fail_attribute(node, f"step {list(a.step)} must be >= 1 in every dim")
        out = []
        for axis, (extent, start, stop, step) in enumerate(zip(dim, a.start, a.stop, a.step)):
            shown = f"slice {start}:{stop}:{step} of dim {axis}"
            if not 0 <= start <= stop <= extent:
                fail(node, f"{shown} needs 0 <= start <= stop <= {extent} (input {list(dim)})", role="input")
            if start == stop:
                fail(node, f"{shown} is empty (input {list(dim)})", role="input")
            out.append(-(-(stop - start) // step))
        return {"y": Inferred(tuple(out))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: SliceAttributes = node.attributes  # type: ignore[assignment]
        return {"y": x["input"][tuple(map(slice, a.start, a.stop, a.step))]}


@register
class Concatenate(Op):
    """Join inputs of equal rank along ``axis``; every other dim must agree."""

    kind = "concatenate"
    category = Category.DATA_MOVEMENT
    inputs = (Role("inputs", variadic=True),)
    outputs = (Role("y"),)
    attributes = ConcatenateAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        tensors = node.inputs_of("inputs")
        first = tensors[0].dim
        for index, t in enumerate(tensors[1:], start=1):
            if len(t.dim) != len(first):
                fail(
                    node, f"inputs[{index}] '{t.name}' has rank {len(t.dim)} {list(t.dim)}, inputs[0] rank {len(first)}"
                )
        axis = check_axis(node, node.attributes.axis, len(first))  # type: ignore[attr-defined]
        for index, t in enumerate(tensors[1:], start=1):
            if any(d != f for i, (d, f) in enumerate(zip(t.dim, first)) if i != axis):
                expected = ["*" if i == axis else f for i, f in enumerate(first)]
                shown = ", ".join(map(str, expected))
                fail(
                    node,
                    f"inputs[{index}] '{t.name}' has dims {list(t.dim)}, expected [{shown}] (as inputs[0] but on axis {axis})",
                )
        out = list(first)
        out[axis] = sum(t.dim[axis] for t in tensors)
        return {"y": Inferred(tuple(out))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": np.concatenate(x["inputs"], axis=node.attributes.axis)}  # type: ignore[attr-defined]


# -- builder helpers ----------------------------------------------------------------------
def known_dims(t: TensorSpec, what: str, node: str | None) -> tuple[Extent, ...]:
    """``t``'s dims, which a builder argument (``what``) is resolved against; they must be set now."""
    if t.dim is None:
        raise ShapeError(
            f"{what} needs the dims of '{t.name}' when the node is added, but they are not set yet", node=node
        )
    return t.dim


SliceLike = slice | tuple[int | None, ...]


def _slice_attributes(input: TensorSpec, slices: Sequence[SliceLike], node: str | None) -> dict[str, list[int]]:
    """Normalise Python slices against the input dims (``slice.indices``); missing trailing dims are whole."""
    dim = known_dims(input, "slice", node)
    if len(slices) > len(dim):
        raise AttributeValueError(f"{len(slices)} slices for input '{input.name}' of rank {len(dim)}", node=node)
    bounds: dict[str, list[int]] = {"start": [], "stop": [], "step": []}
    for axis, extent in enumerate(dim):
        if isinstance(extent, Sym):
            raise AttributeValueError(
                f"slice cannot cut dim {axis} of input '{input.name}': it is symbolic ({extent}) and slice bounds are "
                "integers; reshape or slice a static dim",
                node=node,
            )
        start, stop, step = _normalised(slices[axis] if axis < len(slices) else slice(None), axis, extent, node)
        bounds["start"].append(start)
        bounds["stop"].append(max(stop, start))  # an empty slice is reported by validation
        bounds["step"].append(step)
    return bounds


def _normalised(item: SliceLike, axis: int, extent: int, node: str | None) -> tuple[int, int, int]:
    try:
        s = item if isinstance(item, slice) else slice(*item)
        if s.step is not None and s.step < 1:
            raise AttributeValueError(f"slice {axis} has step {s.step}; only steps >= 1 are supported", node=node)
        return s.indices(extent)
    except TypeError:
        raise AttributeValueError(
            f"slice {axis} is {item!r}; give a slice or (start, stop[, step]) of integers", node=node
        ) from None


class ShapeMethods:
    _add_node: Callable[..., list[Any]]

    def reshape(
        self,
        input: TensorSpec,
        shape: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """The same elements in row-major order under ``shape`` (or dims given later by set_dim)."""
        declared = None if shape is None else {"y": shape}
        return self._add_node(
            "reshape", {"input": input}, name=name, compute_data_type=compute_data_type, declared=declared
        )[0]

    def transpose(
        self, input: TensorSpec, permutation: Sequence[int], compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """Reorder the dims: output dim i is input dim ``permutation[i]``."""
        return self._add_node(
            "transpose", {"input": input}, {"permutation": permutation}, name=name, compute_data_type=compute_data_type
        )[0]

    def slice(
        self, input: TensorSpec, slices: Sequence[SliceLike], compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """input[slices]: one Python slice or (start, stop[, step]) per leading dim, positive steps."""
        attrs = _slice_attributes(input, slices, name)
        return self._add_node("slice", {"input": input}, attrs, name=name, compute_data_type=compute_data_type)[0]

    def concatenate(
        self, inputs: Sequence[TensorSpec], axis: int, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """Join ``inputs`` along ``axis`` (negative allowed); the other dims must agree."""
        return self._add_node(
            "concatenate", {"inputs": inputs}, {"axis": axis}, name=name, compute_data_type=compute_data_type
        )[0]
