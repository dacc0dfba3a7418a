"""A dynamic graph at execution: its symbols' values read from the caller's arrays, and
the static graph those values make.

Validation proved every constraint of a dynamic graph over the whole range of its
symbols, so substituting values in range gives a valid static graph: the reference
backend runs that graph, which is by construction the graph a user would have built
with those extents (up to the strides of dims whose value is 1, which any stride fits). Each symbol is a whole dim of some graph input (validation checks
it), so reading the inputs' shapes finds every value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import FeedError
from .ir import FeedKey, Graph, Node, Tensor, resolve_tensor
from .symbolic import Sym, Symbol, evaluate


def symbol_values(ir: Graph, shapes: Mapping[int, tuple[int, ...]]) -> dict[str, int]:
    """Each symbol's value from the concrete ``shapes`` (by tensor id) of inputs that hold
    it as a whole dim; FeedError naming the tensor, the symbol and its range when a value
    is out of range, disagrees with another tensor's, or cannot be read at all."""
    values: dict[str, tuple[int, str]] = {}
    for t in ir.tensors:
        shape = shapes.get(t.id)
        if shape is None or not t.symbols:
            continue
        if len(shape) != len(t.dim):
            raise FeedError(f"has {len(shape)} dims {list(shape)}, the graph declares {list(t.dim)}", tensor=t.name)
        for axis, (extent, value) in enumerate(zip(t.dim, shape, strict=True)):
            if not isinstance(extent, Sym) or extent.coefficient != 1 or len(extent.factors) != 1:
                continue  # static dims and products are checked against the static graph
            s = extent.factors[0]
            if not s.min <= value <= s.max:
                raise FeedError(
                    f"dim {axis} is {value}, outside the range {s.min}..{s.max} of symbol '{s.name}' "
                    f"(dims {list(t.dim)})",
                    tensor=t.name,
                )
            first = values.setdefault(s.name, (value, f"dim {axis} of '{t.name}'"))
            if first[0] != value:
                raise FeedError(
                    f"dim {axis} is {value}, but symbol '{s.name}' is {first[0]} from {first[1]}; "
                    f"every dim '{s.name}' takes one value in a call",
                    tensor=t.name,
                )
    unread = [s for s in ir.symbols if s.name not in values]
    if unread:
        s = unread[0]
        holders = [t.name for t in ir.inputs if Sym.of(s) in t.dim]
        raise FeedError(
            f"no array given holds symbol '{s.name}' ({s.min}..{s.max}) as a dim, so its value is unknown; "
            f"give an array for {' or '.join(repr(n) for n in holders)}"
        )
    return {name: value for name, (value, _) in values.items()}


def symbol_source(ir: Graph, symbol: Symbol) -> tuple[int, int]:
    """(tensor id, axis) of the first input that holds ``symbol`` as a whole dim: where a
    GPU plan reads the symbol's value in each call (validation proved there is one)."""
    whole = Sym.of(symbol)
    for t in ir.inputs:
        for axis, extent in enumerate(t.dim):
            if extent == whole:
                return t.id, axis
    raise AssertionError(f"no input of graph '{ir.name}' holds symbol '{symbol.name}' as a dim")


def feed_shapes(ir: Graph, feeds: Mapping[FeedKey, Any]) -> dict[int, tuple[int, ...]]:
    """The shapes of the arrays in ``feeds`` (or a variant pack), by tensor id."""
    shapes = {}
    for key, value in feeds.items():
        shape = getattr(value, "shape", None)
        if shape is not None:
            shapes[resolve_tensor(ir, key).id] = tuple(int(n) for n in shape)
    return shapes


def specialize(ir: Graph, values: Mapping[str, int]) -> Graph:
    """The static graph of ``ir`` with each symbol replaced by ``values[name]``: same
    names, ids, uids and node order; a static ``ir`` is returned as it is."""
    if not ir.is_dynamic:
        return ir
    tensors = tuple(concrete_tensor(t, values) for t in ir.tensors)

    def bound(b: Tensor | tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
        return tuple(tensors[t.id] for t in b) if isinstance(b, tuple) else tensors[b.id]

    nodes = tuple(
        Node(
            id=node.id,
            name=node.name,
            op=node.op,
            inputs=tuple((role, bound(b)) for role, b in node.inputs),
            outputs=tuple((role, tensors[t.id]) for role, t in node.outputs),
            attributes=node.attributes,
            compute_data_type=node.compute_data_type,
        )
        for node in ir.nodes
    )
    return Graph(
        name=ir.name,
        io_data_type=ir.io_data_type,
        intermediate_data_type=ir.intermediate_data_type,
        compute_data_type=ir.compute_data_type,
        tensors=tensors,
        nodes=nodes,
    )


def specialize_for(ir: Graph, feeds: Mapping[FeedKey, Any]) -> Graph:
    """The static graph for the arrays in ``feeds``: :func:`symbol_values` then :func:`specialize`."""
    if not ir.is_dynamic:
        return ir
    return specialize(ir, symbol_values(ir, feed_shapes(ir, feeds)))


def concrete_tensor(t: Tensor, values: Mapping[str, int]) -> Tensor:
    """``t`` with each symbol replaced by ``values[name]`` (itself when static)."""
    if not t.symbols:
        return t
    return Tensor(
        id=t.id,
        name=t.name,
        dim=tuple(evaluate(d, values) for d in t.dim),
        stride=tuple(evaluate(s, values) for s in t.stride),
        data_type=t.data_type,
        is_virtual=t.is_virtual,
        is_pass_by_value=t.is_pass_by_value,
        value=t.value,
        uid=t.uid,
    )
