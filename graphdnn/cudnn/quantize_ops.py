"""The frontend's block-scaled quantization calls on graphdnn's ``block_scale_quantize`` /
``block_scale_dequantize`` (graphdnn/ops/quantize.py).

``block_scale_quantize`` maps one to one. ``block_scale_dequantize`` takes the frontend's
``block_size`` list, one size per trailing dim of the input (``[1, 32]``: blocks of 32
along the last dim; ``[128, 1]``: along the one before), and becomes graphdnn's dequantize
(one block axis) when its output is first read; ``[128, 128]`` blocks only as a matmul's B,
which becomes graphdnn's block-scaled matmul (cudnn/deferred.py). A one-axis dequantize
feeding a matmul is graphdnn's ordinary graph, which the ``block_scaled_matmul`` fusion
rule turns into one fp8 GEMM where it applies (fusion_rules/rules/block_scaled.py).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..errors import AttributeValueError
from ..ops.quantize import scale_dims
from ..tensor import TensorSpec
from .deferred import Pending
from .ops_base import OpsBase, compute_type


def dequantize_blocks(node: str, input: TensorSpec, block_size: Any) -> tuple[tuple[int, ...], int | None, int]:
    """The frontend's per-dim ``block_size`` list, checked, and graphdnn's (axis, block_size)
    for it where at most one size exceeds 1 (else (None, 0): 2-D blocks, cudnn/deferred.py)."""
    if isinstance(block_size, int) or not isinstance(block_size, Sequence):
        raise AttributeValueError(
            f"block_scale_dequantize block_size={block_size!r}: the frontend takes a list, one block size per "
            "trailing dim of the input (e.g. [1, 32])",
            node=node,
        )
    sizes = tuple(int(size) for size in block_size)
    rank = len(input.dim) if input.dim is not None else len(sizes)
    if not sizes or len(sizes) > rank or min(sizes) < 1:
        raise AttributeValueError(
            f"block_scale_dequantize block_size={list(sizes)}: give 1 to {rank} sizes >= 1, one per trailing dim "
            f"of '{input.name}'",
            node=node,
        )
    blocked = [(rank - len(sizes) + i, size) for i, size in enumerate(sizes) if size > 1]
    if len(blocked) > 1:
        return sizes, None, 0
    axis, size = blocked[0] if blocked else (None, 1)
    return sizes, axis, size


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
        sizes, axis, size = dequantize_blocks(node, input, block_size)
        if axis is not None and input.dim is not None and all(isinstance(d, int) for d in input.dim):
            # F8_128x4 tiles (cudnn/reordering.py) are read as the blocks of the input, whether the
            # frontend's dims were those or padded ones
            descale = self._spec.untiled(descale, scale_dims(tuple(input.dim), axis, size))  # type: ignore[arg-type]
        pending = Pending(node, input, descale, sizes, axis, size, compute_type(compute_data_type))
        if pending.held:
            return self._spec.defer_dequantize(pending)
        y = self._spec.block_scale_dequantize(input, descale, size, axis, pending.compute_data_type, node)
        return self._one(node, y)
