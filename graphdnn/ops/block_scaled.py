"""Block-scaled fp8 matmul operands (DeepSeek-V3's recipe): what ``matmul``'s optional
``A_scale`` and ``B_scale`` mean, checked and applied here.

A [M, K] (fp8) has one fp32 scale per row and 128 consecutive k (``A_scale`` [M, K/128]);
B [K, N] (fp8) one per 128 k and either 128 columns (``B_scale`` [K/128, ceil(N/128)], the
128 x 128 weight blocks) or one column (``B_scale`` [K/128, N]: what ``block_scale_quantize``
along K gives). C = (A * A_scale per block) @ (B * B_scale per block). K is a whole number of
blocks: the tensor-core kernel promotes one block's fp32 partial sums at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..errors import DataTypeError
from .base import fail

if TYPE_CHECKING:
    from ..ir import Node, Tensor

BLOCK = 128  # k elements per scale block (and B's columns per block in the 128 x 128 form)
FP8 = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})


def b_scale_columns(n: int) -> tuple[int, ...]:
    """The column extents a B_scale may have: one per 128 columns, or one per column (the same
    when N is 1)."""
    return tuple(sorted({-(-n // BLOCK), n}))


def per_column(b_scale: Tensor, n: int) -> bool:
    """Whether ``b_scale`` holds one scale per column (128 x 1 blocks) rather than per 128."""
    return b_scale.dim[1] == n


def check_block_scales(node: Node) -> None:
    """Nothing without scales; else both bound, fp8 operands of rank 2, float scales of the
    block dims above and K a multiple of 128 (a ShapeError or DataTypeError naming the node)."""
    a, b = node.input("A"), node.input("B")
    a_scale, b_scale = node.input("A_scale"), node.input("B_scale")
    if a_scale is None and b_scale is None:
        return
    assert a is not None and b is not None
    if a_scale is None or b_scale is None:
        missing = "A_scale" if a_scale is None else "B_scale"
        fail(node, f"a block-scaled matmul binds both A_scale and B_scale; {missing} is unbound")
    for role, t in (("A", a), ("B", b), ("A_scale", a_scale), ("B_scale", b_scale)):
        if len(t.dim) != 2:
            fail(node, f"{role} has dims {list(t.dim)}; a block-scaled matmul takes rank-2 tensors", role=role)
        wanted = FP8 if role in ("A", "B") else frozenset({DataType.FLOAT})
        if t.data_type.is_set and t.data_type not in wanted:
            raise DataTypeError(
                f"{role} '{t.name}' is {t.data_type.value}; a block-scaled matmul takes "
                + ("fp8_e4m3 or fp8_e5m2 operands" if role in ("A", "B") else "float scales"),
                node=node.name,
                tensor=t.name,
            )
    if a.symbols or b.symbols:
        fail(node, f"A {list(a.dim)} and B {list(b.dim)}: a block-scaled matmul takes static dims")
    m, k, n = a.dim[0], a.dim[1], b.dim[1]
    if not isinstance(k, int) or k % BLOCK:
        fail(node, f"K = {k} is not a multiple of {BLOCK}: a block-scaled matmul takes whole 128-element k blocks")
    if tuple(a_scale.dim) != (m, k // BLOCK):
        fail(
            node, f"A_scale has dims {list(a_scale.dim)}, expected [{m}, {k // BLOCK}] (1 x 128 blocks)", role="A_scale"
        )
    columns = b_scale_columns(n) if isinstance(n, int) else ()
    if b_scale.dim[0] != k // BLOCK or b_scale.dim[1] not in columns:
        shapes = " or ".join(f"[{k // BLOCK}, {c}]" for c in columns)
        fail(
            node,
            f"B_scale has dims {list(b_scale.dim)}, expected {shapes} (128 x 128 or 128 x 1 blocks)",
            role="B_scale",
        )


def scaled_operands(x: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B (float64, as the reference widens them), each times its block scales if bound."""
    a, b = x["A"], x["B"]
    if x.get("A_scale") is None:
        return a, b
    k, n = b.shape
    a_scale, b_scale = x["A_scale"], x["B_scale"]
    columns = 1 if b_scale.shape[1] == n else BLOCK
    a_blocks = np.repeat(a_scale, BLOCK, axis=1)[:, :k]
    b_blocks = np.repeat(np.repeat(b_scale, BLOCK, axis=0), columns, axis=1)[:k, :n]
    return a * a_blocks, b * b_blocks
