"""Block-scaled fp8 matmul operands: what ``matmul``'s optional ``A_scale`` and ``B_scale``
mean, checked and applied here. Two recipes, told apart by the scales' data type.

DeepSeek-V3's (float scales):
A [M, K] (fp8) has one fp32 scale per row and 128 consecutive k (``A_scale`` [M, K/128]);
B [K, N] (fp8) one per 128 k and either 128 columns (``B_scale`` [K/128, ceil(N/128)], the
128 x 128 weight blocks) or one column (``B_scale`` [K/128, N]: what ``block_scale_quantize``
along K gives). C = (A * A_scale per block) @ (B * B_scale per block). K is a whole number of
blocks: the tensor-core kernel promotes one block's fp32 partial sums at a time.

MXFP8 (the OCP MX recipe, fp8_e8m0 scales): one scale per 32 consecutive k for both operands,
A_scale [M, K/32] and B_scale [K/32, N], K a multiple of 32. An e8m0 scale is a byte e
meaning 2^(e - 127), and e = 255 NaN (``e8m0_value``): a NaN scale makes its block's
products, and so the outputs that sum them, NaN.
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
MX_BLOCK = 32  # k elements per fp8_e8m0 scale (OCP MX)
FP8 = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})
SCALE_TYPES = frozenset({DataType.FLOAT, DataType.FP8_E8M0})


def e8m0_value(bits: np.ndarray) -> np.ndarray:
    """The float64 value of fp8_e8m0 bytes e (uint8, or an fp8_e8m0 array read by its bits):
    2^(e - 127), NaN for e = 255 (OCP MX 1.0, 5.4.1). The reference receives e8m0 scales
    widened by ml_dtypes, which agrees with this for all 256 bytes (tests)."""
    raw = np.asarray(bits)
    assert raw.dtype.itemsize == 1, f"e8m0 scales are bytes, not {raw.dtype}"
    e = raw.view(np.uint8).astype(np.int64)
    return np.where(e == 255, np.nan, np.ldexp(1.0, e - 127))


def k_block(scale: Tensor) -> int:
    """k elements per scale block: 32 for fp8_e8m0 scales (MXFP8), else 128."""
    return MX_BLOCK if scale.data_type is DataType.FP8_E8M0 else BLOCK


def b_scale_columns(n: int) -> tuple[int, ...]:
    """The column extents a B_scale may have: one per 128 columns, or one per column (the same
    when N is 1)."""
    return tuple(sorted({-(-n // BLOCK), n}))


def per_column(b_scale: Tensor, n: int) -> bool:
    """Whether ``b_scale`` holds one scale per column (128 x 1 blocks) rather than per 128."""
    return b_scale.dim[1] == n


def check_block_scales(node: Node) -> None:
    """Nothing without scales; else both bound, fp8 operands of rank 2, float or fp8_e8m0
    scales (both the same) of the block dims above and K a whole number of blocks (a ShapeError
    or DataTypeError naming the node)."""
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
        wanted = FP8 if role in ("A", "B") else SCALE_TYPES
        if t.data_type.is_set and t.data_type not in wanted:
            raise DataTypeError(
                f"{role} '{t.name}' is {t.data_type.value}; a block-scaled matmul takes "
                + ("fp8_e4m3 or fp8_e5m2 operands" if role in ("A", "B") else "float or fp8_e8m0 scales"),
                node=node.name,
                tensor=t.name,
            )
    if a_scale.data_type.is_set and b_scale.data_type.is_set and a_scale.data_type is not b_scale.data_type:
        raise DataTypeError(
            f"A_scale '{a_scale.name}' is {a_scale.data_type.value} and B_scale '{b_scale.name}' "
            f"{b_scale.data_type.value}; a block-scaled matmul takes both float (1 x 128 blocks) or both "
            "fp8_e8m0 (MXFP8, 32-element blocks)",
            node=node.name,
            tensor=b_scale.name,
        )
    if a.symbols or b.symbols:
        fail(node, f"A {list(a.dim)} and B {list(b.dim)}: a block-scaled matmul takes static dims")
    m, k, n = a.dim[0], a.dim[1], b.dim[1]
    block = k_block(a_scale)
    recipe = "MXFP8, fp8_e8m0 scales" if block == MX_BLOCK else "float scales"
    if not isinstance(k, int) or k % block:
        fail(
            node,
            f"K = {k} is not a multiple of {block}: a block-scaled matmul takes whole {block}-element k blocks "
            f"({recipe})",
        )
    if tuple(a_scale.dim) != (m, k // block):
        fail(
            node,
            f"A_scale has dims {list(a_scale.dim)}, expected [{m}, {k // block}] (1 x {block} blocks)",
            role="A_scale",
        )
    if block == MX_BLOCK:
        if tuple(b_scale.dim) != (k // block, n):
            fail(
                node,
                f"B_scale has dims {list(b_scale.dim)}, expected [{k // block}, {n}] (32 x 1 blocks, {recipe})",
                role="B_scale",
            )
        return
    columns = b_scale_columns(n) if isinstance(n, int) else ()
    if b_scale.dim[0] != k // BLOCK or b_scale.dim[1] not in columns:
        shapes = " or ".join(f"[{k // BLOCK}, {c}]" for c in columns)
        fail(
            node,
            f"B_scale has dims {list(b_scale.dim)}, expected {shapes} (128 x 128 or 128 x 1 blocks)",
            role="B_scale",
        )


def scaled_operands(x: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B (float64, as the reference widens them), each times its block scales if bound
    (e8m0 scales arrive widened to 2^(e - 127) or NaN, as ``e8m0_value`` states)."""
    a, b = x["A"], x["B"]
    if x.get("A_scale") is None:
        return a, b
    k, n = b.shape
    a_scale, b_scale = x["A_scale"], x["B_scale"]
    block = -(-k // a_scale.shape[1])  # 128, or 32 for MXFP8: K is a whole number of blocks
    columns = 1 if b_scale.shape[1] == n else BLOCK
    a_blocks = np.repeat(a_scale, block, axis=1)[:, :k]
    b_blocks = np.repeat(np.repeat(b_scale, block, axis=0), columns, axis=1)[:k, :n]
    return a * a_blocks, b * b_blocks
