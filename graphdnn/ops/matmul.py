"""Matrix multiplication: C = A @ B over broadcast batch dims.

A is ``[..., M, K]``, B ``[..., K, N]``; the batch dims (all but the last two) broadcast
NumPy-style, right-aligned, so the ranks may differ. C is ``[..., M, N]``, row-major.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..symbolic import Extent
from .base import Category, Inferred, Op, Role, broadcast, fail, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@register
class Matmul(Op):
    kind = "matmul"
    category = Category.MATMUL
    inputs = (Role("A"), Role("B"))
    outputs = (Role("C"),)

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
        return {"C": Inferred((*batch, a.dim[-2], b.dim[-1]))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The operands arrive widened to float64 (reference.py): fp8 and int8 products are
        exact, fp8 sums at least as accurate as fp32 accumulation, int8 sums exact integers
        (below 2^53), as cuDNN's int32 accumulator; C is then rounded to its own type."""
        return {"C": np.matmul(x["A"], x["B"])}


class MatmulMethods:
    _add_node: Callable[..., list[Any]]

    def matmul(
        self, A: TensorSpec, B: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """C = A @ B, batched over the leading dims with NumPy broadcasting."""
        return self._add_node("matmul", {"A": A, "B": B}, name=name, compute_data_type=compute_data_type)[0]
