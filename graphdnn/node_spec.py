"""``NodeSpec``: an op added to a graph under construction, before validation resolves it."""

from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DataType
from .ops.attributes import Attributes
from .ops.base import Op, get_op
from .tensor import TensorSpec


@dataclass(frozen=True)
class NodeSpec:
    """An op added to a graph under construction."""

    name: str
    op: str
    inputs: dict[str, TensorSpec | tuple[TensorSpec, ...]]
    outputs: dict[str, TensorSpec]
    attributes: Attributes
    compute_data_type: DataType

    @property
    def definition(self) -> Op:
        return get_op(self.op)

    def input_tensors(self) -> list[TensorSpec]:
        """Every input tensor, variadic ones flattened."""
        out: list[TensorSpec] = []
        for bound in self.inputs.values():
            out.extend(bound if isinstance(bound, tuple) else (bound,))
        return out
