"""Matrix multiplication: C = A @ B over broadcast batch dims.

A is ``[..., M, K]``, B ``[..., K, N]``; the batch dims (all but the last two) broadcast
NumPy-style, right-aligned, so the ranks may differ. C is ``[..., M, N]``, row-major.

Block-scaled fp8 (block_scaled.py): with ``A_scale`` and ``B_scale`` bound, C = (A * A_scale
per 1 x 128 block) @ (B * B_scale per 128 x 128 or 128 x 1 block) with float scales
(DeepSeek-V3's recipe), or per 1 x 32 and 32 x 1 blocks with fp8_e8m0 scales (MXFP8).

Weight-only (weight_only.py): with a 4-bit B (int4, fp4_e2m1) and ``B_scale`` bound, or an
8-bit B (int8, fp8_e4m3), ``B_scale`` alone and A not 8-bit, C = A @ (B * B_scale per group
of 32, 64 or 128 k, or per column), A fp16 or bf16; an int4 B may have a ``B_zero_point`` per
group: C = A @ ((B - B_zero_point) * B_scale). An int8 B with an int8 A is the int8 GEMM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..symbolic import Extent
from .base import Category, Inferred, Op, Role, broadcast, fail, register
from .block_scaled import check_block_scales, scaled_operands
from .weight_only import check_weight_only, is_weight_only, weight_only_operands

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@register
class Matmul(Op):
    kind = "matmul"
    category = Category.MATMUL
    inputs = (
        Role("A"),
        Role("B"),
        Role("A_scale", optional=True, positive=True),
        Role("B_scale", optional=True, positive=True),
        Role("B_zero_point", optional=True),
    )
    outputs = (Role("C"),)
    packed_inputs = frozenset({"B"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        a, b = node.input("A"), node.input("B")
        assert a is not None and b is not None
        for role, t in (("A", a), ("B", b)):
            if len(t.dim) < 2:
                fail(node, f"{role} has dims {list(t.dim)}; matmul needs rank >= 2 ([..., rows, cols])", role=role)
        if a.dim[-1] != b.dim[-2]:
            fail(
                node,
                f"A {list(a.dim)} has K = {a.dim[-1]} columns but B {list(b.dim)} has K = {b.dim[-2]} rows",
                role="B",
            )
        batch, mismatch = broadcast([a.dim[:-2], b.dim[:-2]])
        if mismatch is not None:
            fail(
                node,
                f"batch dims {list(a.dim[:-2])} of A {list(a.dim)} and {list(b.dim[:-2])} of B {list(b.dim)} "
                "do not broadcast (each pair, right-aligned, must be equal or contain a 1; a symbolic dim only equals itself)",
                role="B",
            )
        if is_weight_only(node):
            check_weight_only(node)
        elif (zero_point := node.input("B_zero_point")) is not None:
            fail(
                node,
                f"B_zero_point '{zero_point.name}' is bound but B '{b.name}' is {b.data_type.value}: zero points "
                "belong to an int4 B (a weight-only matmul)",
                role="B_zero_point",
            )
        else:
            check_block_scales(node)
        return {"C": Inferred((*batch, a.dim[-2], b.dim[-1]))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        """A weight-only int8 B spans -128..127 (the int8 GEMM's operands keep the default
        range, whose sums stay small)."""
        b = node.input("B")
        weight_only_int8 = role == "B" and b is not None and b.data_type is DataType.INT8 and is_weight_only(node)
        return (-128, 127) if weight_only_int8 else None

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The operands arrive widened to float64 (reference.py): fp8 and int8 products are
        exact, fp8 sums at least as accurate as fp32 accumulation, int8 sums exact integers
        (below 2^53), as cuDNN's int32 accumulator; C is then rounded to its own type."""
        if is_weight_only(node):
            return {"C": np.matmul(*weight_only_operands(node, x))}
        return {"C": np.matmul(*scaled_operands(x))}


class MatmulMethods:
    _add_node: Callable[..., list[Any]]

    def matmul(
        self,
        A: TensorSpec,
        B: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
        A_scale: TensorSpec | None = None,
        B_scale: TensorSpec | None = None,
        B_zero_point: TensorSpec | None = None,
    ) -> TensorSpec:
        """C = A @ B, batched over the leading dims with NumPy broadcasting; with ``A_scale`` and
        ``B_scale``, block-scaled fp8 operands; with ``B_scale`` alone, a 4-bit or 8-bit B with its
        group or per-column scales (and, for int4, optional group zero points: docs/ops.md)."""
        inputs = {"A": A, "B": B, "A_scale": A_scale, "B_scale": B_scale, "B_zero_point": B_zero_point}
        return self._add_node("matmul", inputs, name=name, compute_data_type=compute_data_type)[0]
