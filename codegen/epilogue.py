"""Rendering chains and DAGs of elementwise nodes into CUDA statements.

Every family with an epilogue (and the elementwise family itself) uses this: the family
says how to load an operand at the current element; this module emits one statement per
node, rounding each value to its tensor's type as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from graphdnn.dtypes import round_to
from graphdnn.ir import Node, Tensor

from .cuda_types import load, rounded
from .indexing import along
from .kernel import param_name
from .pointwise import literal, render


class Values:
    """The compute-type value of each tensor at the current element, as C variables."""

    def __init__(self, compute: str, load: Callable[[Tensor], str], index: Callable[[Tensor], str]) -> None:
        """``load``: a tensor's value at the current element; ``index``: the current element's
        row-major index in a tensor's own dims (broadcast axes at 0), which rng draws from and
        gen_index reads its coordinate from (``indexing.along``)."""
        self.compute = compute
        self._load = load
        self._index = index
        self._names: dict[int, str] = {}
        self._exact: dict[int, str] = {}  # tensor id -> its value before rounding to the tensor's type
        self.statements: list[str] = []

    def define(self, tensor: Tensor, expression: str) -> str:
        name = f"v{tensor.id}"
        self.statements.append(f"const {self.compute} {name} = {expression};")
        self._names[tensor.id] = name
        return name

    def define_rounded(self, tensor: Tensor, expression: str) -> str:
        """Define ``tensor`` as ``expression`` rounded to its type, keeping the exact value for
        :meth:`stored`: rounding it for the store rounds once, not twice (rounding is idempotent),
        and the rounded value costs nothing when only the store uses it."""
        value = rounded(tensor.data_type, expression, self.compute)
        if value == expression:
            return self.define(tensor, expression)
        exact = f"exact{tensor.id}"
        self.statements.append(f"const {self.compute} {exact} = {expression};")
        self._exact[tensor.id] = exact
        return self.define(tensor, rounded(tensor.data_type, exact, self.compute))

    def stored(self, tensor: Tensor) -> str:
        """The value to convert (``cuda_types.store``) into ``tensor``'s own type: the exact value
        when it was defined rounded to that type, which stores the same element."""
        return self._exact.get(tensor.id) or self.get(tensor)

    def index(self, tensor: Tensor) -> str:
        return self._index(tensor)

    def get(self, tensor: Tensor) -> str:
        if tensor.id in self._names:
            return self._names[tensor.id]
        if tensor.is_constant:
            assert tensor.value is not None
            return literal(rounded_constant(tensor), self.compute)
        return self.define(tensor, self._load(tensor))


def rounded_constant(tensor: Tensor) -> float:
    """A constant scalar's value as its data type holds it (the reference rounds it too)."""
    assert tensor.value is not None
    return float(round_to(tensor.data_type, float(tensor.value)))


def apply(nodes: Iterable[Node], values: Values) -> None:
    """Emit each node's output value into ``values``, in order."""
    for node in nodes:
        out = node.outputs[0][1]
        assert isinstance(out, Tensor)
        if node.op == "rng":  # seed and offset as exact integers, and the element's own index
            args = [scalar_integer(tensor) for _, tensor in node.inputs] + [values.index(out)]  # type: ignore[arg-type]
        elif node.op == "gen_index":  # the element's coordinate along the axis; the input is not read
            args = [values.index(along(out, node.attributes.axis % len(out.dim)))]  # type: ignore[attr-defined]
        else:
            args = [values.get(tensor) for _, tensor in node.inputs]  # type: ignore[arg-type]
        expression = render(node.op, args, node.attributes, values.compute)
        values.define_rounded(out, expression)


def scalar_value(tensor: Tensor, name: str | None, compute: str) -> str:
    """The compute-type value of a one-element tensor: a constant's literal, a pass-by-value
    parameter ``name`` rounded to its type (as the reference rounds it), or element 0 of a
    device scalar ``name``."""
    if tensor.is_constant:
        return literal(rounded_constant(tensor), compute)
    if tensor.is_pass_by_value:
        return rounded(tensor.data_type, f"({compute}){name}", compute)
    return load(tensor.data_type, f"{name}[0]", compute)


def scalar_integer(tensor: Tensor) -> str:
    """A one-element tensor's value as a 64-bit unsigned integer, exact below 2^53 (rng's seed and
    offset): truncated, two's complement, as graphdnn.ops.random.as_uint64. Every kernel has the
    tensor as a parameter under ``param_name`` unless it is a constant."""
    value = scalar_value(tensor, None if tensor.is_constant else param_name(tensor), "double")
    return f"(unsigned long long)(long long)({value})"
