"""Rendering chains and DAGs of elementwise nodes into CUDA statements.

Every family with an epilogue (and the elementwise family itself) uses this: the family
says how to load an operand at the current element; this module emits one statement per
node, rounding each value to its tensor's type as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from graphdnn.ir import Node, Tensor

from .cuda_types import rounded
from .pointwise import literal, render


class Values:
    """The compute-type value of each tensor at the current element, as C variables."""

    def __init__(self, compute: str, load: Callable[[Tensor], str]) -> None:
        self.compute = compute
        self._load = load
        self._names: dict[int, str] = {}
        self.statements: list[str] = []

    def define(self, tensor: Tensor, expression: str) -> str:
        name = f"v{tensor.id}"
        self.statements.append(f"const {self.compute} {name} = {expression};")
        self._names[tensor.id] = name
        return name

    def get(self, tensor: Tensor) -> str:
        if tensor.id in self._names:
            return self._names[tensor.id]
        if tensor.is_constant:
            assert tensor.value is not None
            return literal(rounded_constant(tensor), self.compute)
        return self.define(tensor, self._load(tensor))

    def has(self, tensor: Tensor) -> bool:
        return tensor.id in self._names


def rounded_constant(tensor: Tensor) -> float:
    """A constant scalar's value as its data type holds it (the reference rounds it too)."""
    import numpy as np

    return float(np.asarray(tensor.value, dtype=np.float64).astype(tensor.data_type.numpy))


def apply(nodes: Iterable[Node], values: Values) -> None:
    """Emit each node's output value into ``values``, in order."""
    for node in nodes:
        args = [values.get(tensor) for _, tensor in node.inputs]  # type: ignore[arg-type]
        out = node.outputs[0][1]
        expression = render(node.op, args, node.attributes, values.compute)
        values.define(out, rounded(out.data_type, expression, values.compute))
