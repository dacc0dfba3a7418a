"""The interface of a graph as a torch operator: its arguments, their order and names, its results.

An op's arguments are the graph's inputs, in the order of ``Graph.inputs`` (the order the
tensors were declared) or in an order the caller names; tensors become ``Tensor``
arguments and pass-by-value runtime scalars ``float`` (``int`` for integer types)
arguments. Each argument is named after its tensor, made a Python identifier (other
characters become ``_``; a keyword or ``self`` gets a trailing ``_``; a name taken by an
earlier argument gets ``_2``, ``_3``...), so that calls may pass them by keyword. The
results are the graph's outputs in the order of ``Graph.outputs``: one ``Tensor``, or a
tuple of them. Nothing here imports torch.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GraphError
from ..ir import Graph, Tensor
from ..plan import PlanBase


@dataclass(frozen=True)
class OpSchema:
    """A graph seen as an operator: ``schema`` is the torch schema string of its arguments and results."""

    graph: Graph
    inputs: tuple[Tensor, ...]  # the graph inputs, in argument order
    arguments: tuple[str, ...]  # the argument name of each input
    outputs: tuple[Tensor, ...]  # the graph outputs, in result order

    @property
    def schema(self) -> str:
        params = ", ".join(f"{_argument_type(t)} {name}" for t, name in zip(self.inputs, self.arguments))
        results = "Tensor" if len(self.outputs) == 1 else f"({', '.join('Tensor' for _ in self.outputs)})"
        return f"({params}) -> {results}"

    @property
    def tensor_inputs(self) -> tuple[int, ...]:
        """Positions of the tensor arguments (the others are scalars)."""
        return tuple(i for i, t in enumerate(self.inputs) if not t.is_pass_by_value)

    def __str__(self) -> str:
        lines = [f"graph '{self.graph.name}' as a torch op {self.schema}"]
        lines += [f"  {name}: {_describe(t)}" for t, name in zip(self.inputs, self.arguments)]
        lines += [f"  result {i}: {_describe(t)}" for i, t in enumerate(self.outputs)]
        return "\n".join(lines)


def graph_of(plan_or_graph: Any) -> Graph:
    """The validated graph of a plan (GPU or reference), an OperationGraphSpec or a Graph."""
    if isinstance(plan_or_graph, PlanBase):
        return plan_or_graph.graph
    if isinstance(plan_or_graph, Graph):
        return plan_or_graph
    validate = getattr(plan_or_graph, "validate", None)
    if validate is None:
        raise GraphError(
            f"expected a plan, an OperationGraphSpec or a validated Graph, got a {type(plan_or_graph).__name__}"
        )
    graph: Graph = validate()
    return graph


def op_schema(plan_or_graph: Any, inputs: Sequence[str] | None = None) -> OpSchema:
    """The operator interface of ``plan_or_graph``; ``inputs`` names every graph input once,
    in the order the op takes them (default: ``Graph.inputs``)."""
    graph = graph_of(plan_or_graph)
    ordered = graph.inputs if inputs is None else _ordered(graph, inputs)
    if not any(not t.is_pass_by_value for t in ordered):
        raise GraphError(
            f"graph '{graph.name}' has no tensor inputs; a torch op finds its device from its tensor arguments"
        )
    if not graph.outputs:
        raise GraphError(f"graph '{graph.name}' has no outputs; mark a result with set_output(True)")
    return OpSchema(graph, ordered, _argument_names(ordered), graph.outputs)


def _ordered(graph: Graph, names: Sequence[str]) -> tuple[Tensor, ...]:
    if isinstance(names, str):
        raise GraphError(f"inputs must be a list of tensor names, got the string {names!r}")
    by_name = {t.name: t for t in graph.inputs}
    declared = ", ".join(repr(t.name) for t in graph.inputs)
    for name in names:
        if name not in by_name:
            raise GraphError(f"inputs names {name!r}, which is not an input of graph '{graph.name}' ({declared})")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise GraphError(f"inputs names {repeated[0]!r} more than once")
    missing = [t.name for t in graph.inputs if t.name not in names]
    if missing:
        raise GraphError(f"inputs leaves out graph input {missing[0]!r}; name every input of ({declared}) once")
    return tuple(by_name[n] for n in names)


def _argument_names(tensors: Sequence[Tensor]) -> tuple[str, ...]:
    taken: set[str] = set()
    names = []
    for t in tensors:
        base = re.sub(r"\W", "_", t.name, flags=re.ASCII)
        if base[0].isdigit():
            base = f"_{base}"
        if keyword.iskeyword(base) or base == "self":  # self: CustomOpDef.__call__'s own first parameter
            base += "_"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        names.append(name)
    return tuple(names)


def _argument_type(t: Tensor) -> str:
    if not t.is_pass_by_value:
        return "Tensor"
    return "float" if t.data_type.is_floating else "int"


def _describe(t: Tensor) -> str:
    if t.is_pass_by_value:
        return f"'{t.name}' {_argument_type(t)} (pass-by-value {t.data_type.value})"
    return f"'{t.name}' {list(t.dim)} {t.data_type.value} stride {list(t.stride)}"
