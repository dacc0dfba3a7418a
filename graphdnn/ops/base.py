"""The contract every op definition fulfils, and the registry of op kinds.

An op kind is declared once, as a subclass of :class:`Op`: its input and output roles,
its attribute dataclass, its shape inference and its reference semantics. The graph
walks these hooks; nothing elsewhere branches on the op kind.
"""

from __future__ import annotations

import abc
import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from ..dtypes import DataType
from ..errors import AttributeValueError, DataTypeError, FeedError, ShapeError, UndeclaredDimsError
from ..symbolic import Extent, Sym, evaluate, show_values, symbols_of
from .attributes import Attributes, NoAttributes
from .registry import DEFINITIONS, lookup

if TYPE_CHECKING:
    from ..ir import Node, Tensor


class Category(enum.Enum):
    """What kind of computation an op is; fusion rules match on it."""

    POINTWISE = "pointwise"
    CONVOLUTION = "convolution"
    MATMUL = "matmul"
    NORMALIZATION = "normalization"
    REDUCTION = "reduction"
    POOLING = "pooling"
    DATA_MOVEMENT = "data_movement"
    ATTENTION = "attention"
    QUANTIZATION = "quantization"


@dataclass(frozen=True)
class Role:
    """A named input or output slot of an op.

    ``scalar`` roles take a one-element tensor (pass-by-value or not) or a Python number,
    which becomes a constant. ``variadic`` roles take a list of tensors.
    ``floating`` roles reject integer and boolean tensors. ``positive`` roles expect
    positive values (variances, logarithm arguments): random test inputs respect it.
    """

    name: str
    optional: bool = False
    scalar: bool = False
    variadic: bool = False
    floating: bool = False
    positive: bool = False


@dataclass(frozen=True)
class Inferred:
    """An output's inferred dims, and the layout order its default strides follow.

    ``order`` lists dims outermost first, as :func:`graphdnn.layout.packed_strides`
    takes it; None means row-major. ``data_type``, where the op fixes the output's type
    (attention statistics are float32), replaces the graph's default and refuses others;
    ``allowed`` widens that to a choice (a quantized output is fp8_e4m3 unless set to
    fp8_e5m2): ``data_type`` is then the default, and a type outside both is refused.
    """

    dim: tuple[Extent, ...]
    order: tuple[int, ...] | None = None
    data_type: DataType | None = None
    allowed: frozenset[DataType] = frozenset()


# Values the reference implementations receive: float64 arrays for tensor roles, a tuple
# of them for variadic roles, a Python float for scalar roles.
RefValue = Any


class Op(abc.ABC):
    """Definition of one op kind. Subclasses are registered with :func:`register`."""

    kind: ClassVar[str]
    category: ClassVar[Category]
    inputs: ClassVar[tuple[Role, ...]]
    outputs: ClassVar[tuple[Role, ...]]
    attributes: ClassVar[type[Attributes]] = NoAttributes
    # Outputs whose dims the user declares (set_dim) because inference cannot know them;
    # ``infer`` receives the declared dims and checks them.
    declared_outputs: ClassVar[frozenset[str]] = frozenset()
    # Input roles that read 4-bit tensors (graphdnn/packing.py); validation refuses them elsewhere.
    packed_inputs: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        """Check the node's inputs and attributes; return the dims of each output it has.

        Outputs absent from the result are not produced (e.g. a layernorm's statistics in
        inference). Raise with :func:`fail` on any inconsistency.
        """

    @abc.abstractmethod
    def reference(self, node: Node, x: Mapping[str, RefValue]) -> dict[str, np.ndarray]:
        """Compute every output in float64 from float64 inputs, in logical dims."""

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        """The output roles this node has, given its attributes and the inputs bound.

        By default all of them; ops with optional outputs (training statistics, running
        averages) override it.
        """
        return self.output_names

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        """The integers an input role accepts (sequence lengths lie in [0, S]), or None for any.

        Random test inputs (:mod:`graphdnn.random_inputs`) draw integer tensors from it.
        """
        return None

    def value_scale(self, node: Node, role: str) -> float | None:
        """The standard deviation random floating inputs of a role are drawn with, or None for 1.

        Random test inputs (:mod:`graphdnn.random_inputs`) use it where unit values would
        leave the op's useful domain (a recurrent layer's weights at 1 make its state chaotic:
        a rounding difference grows to O(1) over the steps).
        """
        return None

    @functools.cached_property
    def input_names(self) -> frozenset[str]:
        return frozenset(role.name for role in self.inputs)

    @functools.cached_property
    def output_names(self) -> frozenset[str]:
        return frozenset(role.name for role in self.outputs)

    def role(self, name: str) -> Role:
        for role in (*self.inputs, *self.outputs):
            if role.name == name:
                return role
        raise KeyError(name)


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: make ``cls.kind`` known to graphs and files (``registry.DEFINITIONS``)."""
    if cls.kind in DEFINITIONS:
        raise RuntimeError(f"op kind '{cls.kind}' is registered twice")
    DEFINITIONS[cls.kind] = cls()
    return cls


def get_op(kind: str, *, node: str | None = None, path: str | None = None) -> Op:
    op: Op = lookup(kind, node=node, path=path)
    return op


def op_kinds() -> tuple[str, ...]:
    return tuple(sorted(DEFINITIONS))


# Index tensors (gather rows, expert choices, top-k picks, pooling window positions).
INDEX_TYPES = frozenset({DataType.INT32, DataType.INT64})


# -- helpers for infer() ------------------------------------------------------------------
def fail(node: Node, message: str, *, role: str | None = None) -> NoReturn:
    """Raise a ShapeError located at ``node`` (and the tensor bound to ``role``)."""
    tensor = None
    if role is not None:
        bound = node.input(role) if any(r == role for r, _ in node.inputs) else None
        tensor = bound.name if bound is not None else None
    raise ShapeError(message, node=node.name, tensor=tensor)


def need_declared(node: Node, message: str) -> NoReturn:
    """Raise when an output's dims cannot be inferred and were not declared (set_dim)."""
    raise UndeclaredDimsError(message, node=node.name)


def fail_attribute(node: Node, message: str) -> NoReturn:
    raise AttributeValueError(message, node=node.name)


def broadcast_dims(node: Node, tensors: Sequence[tuple[str, Tensor]]) -> tuple[Extent, ...]:
    """NumPy-style broadcast (right-aligned, size-1 stretches) of the given roles' dims."""
    first = tensors[0][1].dim
    if all(tensor.dim == first for _, tensor in tensors):
        return first  # the usual case: nothing to stretch
    out, mismatch = broadcast([t.dim for _, t in tensors])
    if mismatch is not None:
        index, axis = mismatch
        role, tensor = tensors[index]
        extent = ((1,) * (len(out) - len(tensor.dim)) + tensor.dim)[axis]
        shapes = ", ".join(f"{r} {list(t.dim)}" for r, t in tensors)
        fail(
            node,
            f"cannot broadcast {shapes}: dim {axis} is {out[axis]} and {extent}{_where(out[axis], extent)}",
            role=role,
        )
    return out


def broadcast(shapes: Sequence[tuple[Extent, ...]]) -> tuple[tuple[Extent, ...], tuple[int, int] | None]:
    """NumPy's broadcast of ``shapes`` (right-aligned, size-1 stretches), and where it fails:
    (shape index, axis) of the first dim that fits neither 1 nor the others, else None.

    A symbolic dim matches only an equal dim or 1: its value is unknown, so it can neither
    be assumed to equal another dim nor to be 1 and stretch.
    """
    rank = max(len(s) for s in shapes)
    out: list[Extent] = [1] * rank
    for index, shape in enumerate(shapes):
        padded = (1,) * (rank - len(shape)) + tuple(shape)
        for axis, extent in enumerate(padded):
            if extent == out[axis] or extent == 1:
                continue
            if out[axis] != 1:
                return tuple(out), (index, axis)
            out[axis] = extent
    return tuple(out), None


def _where(a: Extent, b: Extent) -> str:
    """For symbolic dims that fail to broadcast: the rule, and values of the symbols where they differ."""
    if not isinstance(a, Sym) and not isinstance(b, Sym):
        return ""
    corners = [{s.name: pick(s) for s in symbols_of((a, b))} for pick in (attrgetter("max"), attrgetter("min"))]
    values = next((c for c in corners if evaluate(a, c) != evaluate(b, c)), corners[0])
    return f" (a symbolic dim broadcasts only against 1 or an equal dim; these differ at {show_values(values)})"


def same_dims(node: Node, role: str, tensor: Tensor, expected: Sequence[Extent], what: str) -> None:
    if tuple(tensor.dim) != tuple(expected):
        fail(node, f"{role} has dims {list(tensor.dim)}, expected {list(expected)} ({what})", role=role)


def check_axis(node: Node, axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis, or fail."""
    if not -rank <= axis < rank:
        fail_attribute(node, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def index_tensor(node: Node, role: str) -> Tensor:
    """The tensor bound to ``role``, or a DataTypeError unless it holds int32 or int64 indices."""
    tensor = node.input(role)
    assert tensor is not None
    if tensor.data_type.is_set and tensor.data_type not in INDEX_TYPES:
        raise DataTypeError(
            f"{role} '{tensor.name}' is {tensor.data_type.value}; {node.op} takes int32 or int64 indices",
            node=node.name,
            tensor=tensor.name,
        )
    return tensor


def indices_in_range(node: Node, role: str, values: np.ndarray, extent: int, what: str) -> np.ndarray:
    """``values`` as integers, or a FeedError naming the first one outside [0, extent)."""
    bad = np.flatnonzero((values < 0) | (values >= extent))
    if bad.size:
        tensor = node.input(role)
        assert tensor is not None
        raise FeedError(
            f"{role} '{tensor.name}' holds {int(values.flat[bad[0]])} at flat position {int(bad[0])}; "
            f"{what} must be in [0, {extent})",
            node=node.name,
            tensor=tensor.name,
        )
    return values.astype(np.int64)
