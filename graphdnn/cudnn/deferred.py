"""Dequantizes added when their output is first read, so that 2-D blocks can reach a matmul.

The frontend writes DeepSeek-V3's fp8 GEMM as ``block_scale_dequantize`` of A with
``[1, 128]`` blocks and of B with ``[128, 128]`` blocks, then ``matmul``. graphdnn's
dequantize blocks along one dim, but its ``matmul`` takes exactly these scales
(``A_scale`` / ``B_scale``, graphdnn/ops/block_scaled.py). So the compat layer holds such
dequantizes back (a :class:`Pending`) until a node reads their output: a matmul reading a
2-D-block B and a ``[1, 128]`` A becomes one block-scaled matmul (:func:`absorbed`); any
other reader gets the dequantize node first. A 2-D-block dequantize read any other way is
refused, naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UnsupportedError
from ..ops.block_scaled import BLOCK
from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class Pending:
    """A frontend ``block_scale_dequantize`` call not yet added as a node."""

    node: str
    x: TensorSpec
    scale: TensorSpec
    block_size: tuple[int, ...]  # the frontend's, one per trailing dim of x
    axis: int | None  # graphdnn's blocking when at most one size exceeds 1
    size: int
    compute_data_type: Any

    @property
    def two_dimensional(self) -> bool:
        return sum(b > 1 for b in self.block_size) > 1

    @property
    def held(self) -> bool:
        """Whether to hold it back: 2-D blocks, or an A that a 2-D B may join (rank 2, [1, 128]);
        any other dequantize is added at once, checked as graphdnn checks it."""
        rank_2 = self.x.dim is not None and len(self.x.dim) == 2
        return self.two_dimensional or (rank_2 and (self.axis, self.size) == (1, BLOCK))

    def node_arguments(self) -> dict[str, Any]:
        """graphdnn's block_scale_dequantize node; 2-D blocks have none (UnsupportedError)."""
        if self.two_dimensional:
            raise UnsupportedError(
                f"block_scale_dequantize block_size={list(self.block_size)} has blocks over 2 dims: graphdnn "
                f"takes 2-D blocks only as B ({BLOCK} x {BLOCK}, rank 2) of a matmul whose A is dequantized "
                f"with [1, {BLOCK}] blocks (graphdnn's matmul A_scale / B_scale); elsewhere give one size above 1 "
                f"(e.g. [1, {BLOCK}] or [{BLOCK}, 1])",
                node=self.node,
            )
        return {
            "inputs": {"X": self.x, "scale": self.scale},
            "attributes": {"block_size": self.size, "axis": self.axis},
            "name": self.node,
            "compute_data_type": self.compute_data_type,
        }


def absorbed(a: Pending | None, b: Pending | None) -> dict[str, TensorSpec] | None:
    """The inputs of the block-scaled matmul that dequantizes ``a`` and ``b`` stand for, or
    None where B has no 2-D blocks (its dequantize is then added as written)."""
    if b is None or not b.two_dimensional:
        return None
    if b.block_size[-2:] != (BLOCK, BLOCK) or b.x.dim is None or len(b.x.dim) != 2:
        return None  # node_arguments refuses it, naming the node
    a_ok = a is not None and a.x.dim is not None and len(a.x.dim) == 2 and (a.axis, a.size) == (1, BLOCK)
    if a is None or not a_ok:
        raise UnsupportedError(
            f"block_scale_dequantize with [{BLOCK}, {BLOCK}] blocks is B of a matmul whose A is not a rank-2 "
            f"block_scale_dequantize with [1, {BLOCK}] blocks: graphdnn's block-scaled matmul takes that pair only",
            node=b.node,
        )
    return {"A": a.x, "B": b.x, "A_scale": a.scale, "B_scale": b.scale}
