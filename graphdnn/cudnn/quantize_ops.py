"""The frontend's block-scaled quantization calls on graphdnn's ``block_scale_quantize`` /
``block_scale_dequantize`` (graphdnn/ops/quantize.py).

``block_scale_quantize`` maps one to one. ``block_scale_dequantize`` takes the frontend's
``block_size`` list, one size per trailing dim of the input (``[1, 32]``: blocks of 32
along the last dim; ``[128, 1]``: along the one before); graphdnn blocks along one axis,
so the list must have at most one size above 1. A dequantize feeding a matmul is then
graphdnn's ordinary graph, which the ``block_scaled_matmul`` fusion rule turns into one
fp8 GEMM where it applies (fusion_rules/rules/block_scaled.py).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..errors import AttributeValueError, UnsupportedError
from ..tensor import TensorSpec
from .ops_base import OpsBase, compute_type


def dequantize_blocks(node: str, input: TensorSpec, block_size: Any) -> tuple[int | None, int]:
    """graphdnn's (axis, block_size) for the frontend's per-dim ``block_size`` list."""
    if isinstance(block_size, int) or not isinstance(block_size, Sequence):
        raise AttributeValueError(
            f"block_scale_dequantize block_size={block_size!r}: the frontend takes a list, one block size per "
            "trailing dim of the input (e.g. [1, 32])",
            node=node,
        )
    sizes = [int(size) for size in block_size]
    rank = len(input.dim) if input.dim is not None else len(sizes)
    if not sizes or len(sizes) > rank or min(sizes) < 1:
        raise AttributeValueError(
            f"block_scale_dequantize block_size={sizes}: give 1 to {rank} sizes >= 1, one per trailing dim of "
            f"'{input.name}'",
            node=node,
        )
    blocked = [(rank - len(sizes) + i, size) for i, size in enumerate(sizes) if size > 1]
    if len(blocked) > 1:
        raise UnsupportedError(
            f"block_scale_dequantize block_size={sizes} has blocks over {len(blocked)} dims (2-D blocks, such as "
            "128 x 128 weight blocks): graphdnn's block_scale_dequantize scales blocks along one dim; give one "
            "size above 1 (e.g. [1, 128] or [128, 1]); for 128 x 128 weight blocks of a matmul's B, graphdnn's own "
            "matmul(A, B, A_scale=, B_scale=) takes them",
            node=node,
        )
    return blocked[0] if blocked else (None, 1)


class QuantizeOps(OpsBase):
    """Block-scaled quantization methods of :class:`~graphdnn.cudnn.pygraph`, mixed in."""

    def block_scale_quantize(
        self,
        input: TensorSpec,
        block_size: int,
        axis: int | None = None,
        transpose: bool = False,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[TensorSpec]:
        """[Y, scale] (``<node>::Y``, ``<node>::scale``): one scale per ``block_size`` elements
        along ``axis`` (the last when None). Y is fp8_e4m3 and scale float unless set with
        ``set_data_type`` (FP8_E5M2; FP8_E8M0 scales for MXFP8)."""
        try:
            size = operator.index(block_size)  # an int, or a NumPy integer
        except TypeError:
            raise AttributeValueError(
                f"block_scale_quantize block_size={block_size!r}: the frontend takes one int", node=name or None
            ) from None
        node = self._node(name)
        y, scale = self._spec.block_scale_quantize(input, size, axis, transpose, compute_type(compute_data_type), node)
        return self._label(node, [y, scale], ["Y", "scale"])  # type: ignore[return-value]

    def block_scale_dequantize(
        self,
        input: TensorSpec,
        descale: TensorSpec,
        block_size: Sequence[int],
        is_negative_scale: bool = False,
        compute_data_type: Any = None,
        name: str = "",
    ) -> TensorSpec:
        """Y = input * its block's ``descale`` (``<node>::Y``). ``block_size`` has one size per
        trailing dim, at most one above 1; ``is_negative_scale`` changes nothing (graphdnn
        multiplies by the scale whatever its sign)."""
        node = self._node(name)
        axis, size = dequantize_blocks(node, input, block_size)
        y = self._spec.block_scale_dequantize(input, descale, size, axis, compute_type(compute_data_type), node)
        return self._one(node, y)
