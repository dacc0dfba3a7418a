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
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import numpy as np

from ..dtypes import DataType
from ..errors import AttributeValueError, ShapeError, UndeclaredDimsError
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
    (attention statistics are float32), replaces the graph's default and refuses others.
    """

    dim: tuple[int, ...]
    order: tuple[int, ...] | None = None
    data_type: DataType | None = None


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

    @abc.abstractmethod
    def infer(self, node: Node, declared: Mapping[str, tuple[int, ...] | None]) -> dict[str, Inferred]:
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


def broadcast_dims(node: Node, tensors: Sequence[tuple[str, Tensor]]) -> tuple[int, ...]:
    """NumPy-style broadcast (right-aligned, size-1 stretches) of the given roles' dims."""
    first = tensors[0][1].dim
    if all(tensor.dim == first for _, tensor in tensors):
        return first  # the usual case: nothing to stretch
    rank = max(len(t.dim) for _, t in tensors)
    out = [1] * rank
    for role, tensor in tensors:
        padded = (1,) * (rank - len(tensor.dim)) + tensor.dim
        for axis, extent in enumerate(padded):
            if extent == out[axis] or extent == 1:
                continue
            if out[axis] == 1:
                out[axis] = extent
                continue
            shapes = ", ".join(f"{r} {list(t.dim)}" for r, t in tensors)
            fail(node, f"cannot broadcast {shapes}: dim {axis} is {out[axis]} and {extent}", role=role)
    return tuple(out)


def same_dims(node: Node, role: str, tensor: Tensor, expected: Sequence[int], what: str) -> None:
    if tuple(tensor.dim) != tuple(expected):
        fail(node, f"{role} has dims {list(tensor.dim)}, expected {list(expected)} ({what})", role=role)


def check_axis(node: Node, axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis, or fail."""
    if not -rank <= axis < rank:
        fail_attribute(node, f"{what} {axis} is out of range for rank {rank}")
    return axis % rank
