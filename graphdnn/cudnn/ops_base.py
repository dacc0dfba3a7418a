"""What the frontend's op methods share: the builder, output naming, the compute type and the
packing of ragged attention sides."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dtypes import as_data_type
from ..tensor import TensorSpec
from .ragged import PendingOutput, Side, pack_side
from .spec import LenientSpec

MaybeTensor = TensorSpec | None


def compute_type(value: Any) -> Any:
    """The frontend's compute type for graphdnn: NOT_SET and non-floating types (a BOOLEAN
    compute type for logical ops, say) become the graph's default, since graphdnn computes
    every op in floating point and rounds to the output's type."""
    data_type = as_data_type(value, what="compute_data_type")
    return data_type if data_type.is_set and data_type.is_floating else None


class OpsBase:
    """The helpers of the op methods of :class:`~graphdnn.cudnn.pygraph`; ``_spec`` is the builder."""

    _spec: LenientSpec
    _ragged_outputs: list[PendingOutput]  # outputs of ragged attention sides, packed at build
    _ragged_inputs: set[TensorSpec]  # inputs packed by an attention node

    def _ragged(self, node: str, sides: Sequence[Sequence[tuple[str, MaybeTensor]]]) -> list[Side | None]:
        """Each side's packing (Q's, K's), its inputs packed in place (cudnn/ragged.py)."""
        packed = [pack_side(self._spec, node, side[0][0], side) for side in sides]
        for side, packing in zip(sides, packed, strict=True):
            if packing is not None:
                self._ragged_inputs.update(t for _, t in side if t is not None)
        return packed

    def _pack_later(self, side: Side | None, outputs: Sequence[tuple[str, MaybeTensor]]) -> None:
        if side is not None:
            self._ragged_outputs += [PendingOutput(side, role, t) for role, t in outputs if t is not None]

    def _node(self, name: str) -> str:
        return name or str(self._spec.node_count)

    def _label(self, node: str, outputs: Sequence[MaybeTensor], ports: Sequence[str]) -> list[MaybeTensor]:
        for tensor, port in zip(outputs, ports, strict=True):
            if tensor is not None:
                tensor.set_name(f"{node}::{port}")
        return list(outputs)

    def _one(self, node: str, output: TensorSpec, port: str = "Y") -> TensorSpec:
        self._label(node, [output], [port])
        return output
