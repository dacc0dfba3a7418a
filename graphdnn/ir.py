"""The frozen graph IR that validation produces and every later stage consumes.

A :class:`Graph` is immutable and fully resolved: every tensor has dims, strides and a
data type; nodes are in a topological order. Signature, JSON, fusion, codegen and the
reference backend read it; none of them can change it, so a plan built from it cannot
be disturbed by later edits to the :class:`~graphdnn.OperationGraphSpec` it came from.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from .dtypes import DataType
from .errors import FeedError, GraphError, UnsupportedError
from .layout import numel
from .ops.attributes import Attributes
from .ops.registry import lookup
from .symbolic import Extent, Sym, Symbol, symbols_of

Scalar = float | int | bool
FeedKey = Any  # a TensorSpec, an IR Tensor, a tensor name or a uid


@dataclass(frozen=True)
class Tensor:
    """A resolved tensor. ``id`` is its index in :attr:`Graph.tensors`."""

    id: int
    name: str
    dim: tuple[Extent, ...]
    stride: tuple[Extent, ...]
    data_type: DataType
    is_virtual: bool
    is_pass_by_value: bool = False
    value: Scalar | None = None
    uid: int | None = None

    @property
    def numel(self) -> Extent:
        return numel(self.dim)

    @cached_property
    def symbols(self) -> tuple[Symbol, ...]:
        """The symbols in its dims and strides; empty for a static tensor."""
        return symbols_of((*self.dim, *self.stride))

    # Lowering, kernels and the runtime work on static graphs only (gd.compile refuses a
    # dynamic one before lowering); they read dims through these, typed as integers.
    @property
    def static_dim(self) -> tuple[int, ...]:
        return self._static(self.dim)

    @property
    def static_stride(self) -> tuple[int, ...]:
        return self._static(self.stride)

    def static_axis(self, axis: int) -> int:
        """Dim ``axis``, for a stage that needs its value where other dims may be symbolic (an
        attention kernel's sequence length beside a symbolic batch)."""
        extent = self.dim[axis]
        if isinstance(extent, Sym):
            raise UnsupportedError(
                f"has a symbolic dim {axis} in {list(self.dim)}; this stage needs its value", tensor=self.name
            )
        return extent

    @property
    def static_numel(self) -> int:
        return math.prod(self.static_dim)

    def _static(self, values: tuple[Extent, ...]) -> tuple[int, ...]:
        if self.symbols:
            raise UnsupportedError(
                f"has symbolic dims {list(self.dim)}; this stage needs concrete extents", tensor=self.name
            )
        return cast(tuple[int, ...], values)

    @property
    def is_constant(self) -> bool:
        """A scalar whose value is part of the graph (and of its signature)."""
        return self.value is not None

    def __repr__(self) -> str:
        return f"Tensor({self.id}:{self.name!r} {list(self.dim)} {self.data_type.value})"


@dataclass(frozen=True)
class Node:
    """An op instance. Inputs and outputs are (role, tensor) pairs in the op's role order."""

    id: int
    name: str
    op: str
    inputs: tuple[tuple[str, Tensor | tuple[Tensor, ...]], ...]
    outputs: tuple[tuple[str, Tensor], ...]
    attributes: Attributes
    compute_data_type: DataType

    @property
    def definition(self) -> Any:
        """The :class:`graphdnn.ops.base.Op` of this node's kind (typed Any: see ops.registry)."""
        return lookup(self.op, node=self.name)

    def input(self, role: str) -> Tensor | None:
        """The tensor bound to a non-variadic input role, or None if the role is unbound."""
        for name, bound in self.inputs:
            if name == role:
                if isinstance(bound, tuple):
                    raise TypeError(f"role '{role}' is variadic; use inputs_of()")
                return bound
        return None

    def inputs_of(self, role: str) -> tuple[Tensor, ...]:
        """The tensors bound to a variadic role."""
        for name, bound in self.inputs:
            if name == role:
                return bound if isinstance(bound, tuple) else (bound,)
        return ()

    def output(self, role: str) -> Tensor | None:
        for name, tensor in self.outputs:
            if name == role:
                return tensor
        return None

    def input_tensors(self) -> Iterator[Tensor]:
        """Every input tensor, variadic ones flattened, in role order."""
        for _, bound in self.inputs:
            if isinstance(bound, tuple):
                yield from bound
            else:
                yield bound

    def output_tensors(self) -> Iterator[Tensor]:
        for _, tensor in self.outputs:
            yield tensor

    def __repr__(self) -> str:
        return f"Node({self.id}:{self.name!r} {self.op})"


@dataclass(frozen=True)
class Graph:
    """A validated operation graph."""

    name: str
    io_data_type: DataType
    intermediate_data_type: DataType
    compute_data_type: DataType
    tensors: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    _index: dict[str, Tensor] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {t.name: t for t in self.tensors})

    def tensor(self, name: str) -> Tensor:
        try:
            return self._index[name]
        except KeyError:
            raise GraphError(f"graph '{self.name}' has no tensor named '{name}'") from None

    @cached_property
    def _producers(self) -> dict[int, Node]:
        return {t.id: node for node in self.nodes for t in node.output_tensors()}

    @cached_property
    def _consumers(self) -> dict[int, tuple[Node, ...]]:
        readers: dict[int, list[Node]] = {}
        for node in self.nodes:
            for t in dict.fromkeys(node.input_tensors()):
                readers.setdefault(t.id, []).append(node)
        return {tid: tuple(nodes) for tid, nodes in readers.items()}

    def producer(self, tensor: Tensor) -> Node | None:
        return self._producers.get(tensor.id)

    def consumers(self, tensor: Tensor) -> tuple[Node, ...]:
        return self._consumers.get(tensor.id, ())

    @cached_property
    def inputs(self) -> tuple[Tensor, ...]:
        """Tensors the caller supplies: non-virtual, written by no node, not constants."""
        return tuple(t for t in self.tensors if t.id not in self._producers and not t.is_virtual and not t.is_constant)

    @cached_property
    def outputs(self) -> tuple[Tensor, ...]:
        """Non-virtual tensors that nodes write."""
        return tuple(t for t in self.tensors if t.id in self._producers and not t.is_virtual)

    @cached_property
    def constants(self) -> tuple[Tensor, ...]:
        """Tensors whose value is compiled into the graph (a scalar an op was given as a number)."""
        return tuple(t for t in self.tensors if t.is_constant)

    @cached_property
    def symbols(self) -> tuple[Symbol, ...]:
        """The symbols of its dynamic dims, by name; empty for a static graph (validation
        checks that each name has one range and is a whole dim of some input)."""
        return tuple(sorted({s for t in self.tensors for s in t.symbols}))

    @property
    def is_dynamic(self) -> bool:
        return bool(self.symbols)


def resolve_tensor(ir: Graph, key: FeedKey) -> Tensor:
    """Find the tensor a feed or variant-pack key names; FeedError if none."""
    if isinstance(key, str):
        return _lookup(ir, key)
    if isinstance(key, int) and not isinstance(key, bool):
        for t in ir.tensors:
            if t.uid == key:
                return t
        raise FeedError(f"no tensor of graph '{ir.name}' has uid {key}")
    name = getattr(key, "name", None)  # a TensorSpec or an IR Tensor
    if isinstance(name, str):
        return _lookup(ir, name)
    raise FeedError(f"cannot use {type(key).__name__} {key!r} as a tensor key; use a TensorSpec, a name or a uid")


def _lookup(ir: Graph, name: str) -> Tensor:
    try:
        return ir.tensor(name)
    except GraphError:
        raise FeedError(f"graph '{ir.name}' has no tensor named '{name}'", tensor=name) from None
