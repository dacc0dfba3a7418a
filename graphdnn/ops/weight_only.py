"""Weight-only quantized matmul operands: what ``matmul`` means with a 4-bit B and ``B_scale``,
or an 8-bit B (int8, fp8_e4m3), ``B_scale`` and an A that is not 8-bit.

C = A @ (B * B_scale per group), A fp16 or bf16 [..., M, K], B int4 or fp4_e2m1 [K, N] in
either layout (packed along N or along K: graphdnn/packing.py) or int8 (symmetric) or
fp8_e4m3 [K, N], one scale per ``group`` k (32, 64 or 128) per column: ``B_scale``
[ceil(K / group), N], float, half or bfloat16 (the last group of a K the group does not
divide is partial); or one scale per column, ``B_scale`` [1, N] (per-channel: one group
covers K). An 8-bit B without ``B_scale``
is an ordinary matmul of its values, and with an 8-bit A or an ``A_scale`` the int8 GEMM or
the block-scaled fp8 GEMM (block_scaled.py), as before. An int4 B may be asymmetric: an
optional ``B_zero_point`` of B_scale's dims (float, half or bfloat16, any value: AWQ's and
GPTQ's unsigned codes and zeros are the signed ones plus 8) gives B's values as
(B - B_zero_point) * B_scale.

The dequantized weight (with its zero point subtracted, in float64) is rounded to A's type, as the 16-bit tensor-core operand the kernel
multiplies (and as ``block_scale_dequantize`` to A's type then a matmul compute it), then the
product is summed in float64 here, in fp32 on the GPU. The group is read off the scale's
extent: ceil(K / g) differs between 32, 64 and 128 unless K <= 64, where one group covers K,
as a per-channel [1, N] does.
This is the anchor the ``weight_only_matmul`` fusion rule builds from
``matmul(A, block_scale_dequantize(W, scale, g, axis=0))`` (fusion_rules/rules/weight_only.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType, round_to
from ..errors import DataTypeError
from .base import fail

if TYPE_CHECKING:
    from ..ir import Node, Tensor

GROUPS = (32, 64, 128)
ACTIVATION_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})
BYTE_WEIGHTS = frozenset({DataType.INT8, DataType.FP8_E4M3})  # weight-only with B_scale alone and A not 8-bit
EIGHT_BIT = frozenset({DataType.INT8, DataType.FP8_E4M3, DataType.FP8_E5M2})
SCALE_TYPES = frozenset({DataType.FLOAT, DataType.HALF, DataType.BFLOAT16})


def is_weight_only(node: Node) -> bool:
    """A matmul whose B is a 4-bit tensor, or an 8-bit B with B_scale bound, no A_scale and A
    not 8-bit (else the int8 or block-scaled fp8 GEMM, whose scales come in pairs); an A not
    16-bit is then refused by check_weight_only."""
    a, b = node.input("A"), node.input("B")
    if a is None or b is None:
        return False
    return b.data_type.is_packed or (
        b.data_type in BYTE_WEIGHTS
        and a.data_type not in EIGHT_BIT
        and node.input("B_scale") is not None
        and node.input("A_scale") is None
    )


def group_of(k: int, groups: int) -> int | None:
    """The group size with ceil(k / g) == groups: k itself for one group (per-channel scales),
    else the g in GROUPS (the smallest where several agree: they then mean the same groups),
    or None."""
    if groups == 1:
        return max(k, 1)
    return next((g for g in GROUPS if -(-k // g) == groups), None)


def check_weight_only(node: Node) -> None:
    """A 16-bit A, a static rank-2 B with float/half/bfloat16 ``B_scale`` of [ceil(K / g), N]
    for a group g in GROUPS or [1, N], and no A_scale (a ShapeError or DataTypeError naming the
    node)."""
    a, b, scale = node.input("A"), node.input("B"), node.input("B_scale")
    assert a is not None and b is not None
    if node.input("A_scale") is not None:
        fail(node, f"B '{b.name}' is {b.data_type.value}: a weight-only matmul scales B only; A_scale is bound")
    if scale is None:
        fail(node, f"B '{b.name}' is {b.data_type.value}: a weight-only matmul needs B_scale (its group scales)")
    for role, t, allowed in (("A", a, ACTIVATION_TYPES), ("B_scale", scale, SCALE_TYPES)):
        if t.data_type.is_set and t.data_type not in allowed:
            raise DataTypeError(
                f"{role} '{t.name}' is {t.data_type.value}; a weight-only matmul of {b.data_type.value} weights takes "
                + ("half or bfloat16 activations" if role == "A" else "float, half or bfloat16 group scales"),
                node=node.name,
                tensor=t.name,
            )
    if len(b.dim) != 2 or b.symbols or a.symbols:
        fail(node, f"A {list(a.dim)} and B {list(b.dim)}: a weight-only matmul takes static dims and a rank-2 B")
    k, n = b.static_dim
    groups = scale.dim[0] if len(scale.dim) == 2 and scale.dim[1] == n else None
    if not isinstance(groups, int) or group_of(k, groups) is None:
        shapes = " or ".join(sorted({f"[{-(-k // g)}, {n}]" for g in GROUPS}))
        fail(
            node,
            f"B_scale has dims {list(scale.dim)}, expected {shapes}: one scale per group of 32, 64 or 128 k per column "
            f"(or [1, {n}]: one per column)",
            role="B_scale",
        )
    zero_point = node.input("B_zero_point")
    if zero_point is not None:
        _check_zero_point(node, b, scale, zero_point)


def _check_zero_point(node: Node, b: Tensor, scale: Tensor, zero_point: Tensor) -> None:
    if b.data_type is not DataType.INT4:
        fail(
            node,
            f"B_zero_point '{zero_point.name}' is bound but B '{b.name}' is {b.data_type.value}: zero points "
            "are for int4 weights (int8 and fp8 weights are symmetric)",
            role="B_zero_point",
        )
    if zero_point.data_type.is_set and zero_point.data_type not in SCALE_TYPES:
        raise DataTypeError(
            f"B_zero_point '{zero_point.name}' is {zero_point.data_type.value}; a weight-only matmul takes float, "
            "half or bfloat16 zero points",
            node=node.name,
            tensor=zero_point.name,
        )
    if tuple(zero_point.dim) != tuple(scale.dim):
        fail(
            node,
            f"B_zero_point has dims {list(zero_point.dim)}, expected B_scale's {list(scale.dim)}: one zero point "
            "per group per column",
            role="B_zero_point",
        )


def group_scales(node: Node) -> tuple[Tensor, int]:
    """B_scale and the group size of a checked weight-only matmul."""
    b, scale = node.input("B"), node.input("B_scale")
    assert b is not None and scale is not None
    group = group_of(b.static_dim[0], scale.static_dim[0])
    assert group is not None, f"{node.name}: unchecked weight-only matmul"
    return scale, group


def weight_only_operands(node: Node, x: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A, and B less its zero points times its group scales, rounded to A's type (the module's
    numerics)."""
    a, b, scale = x["A"], x["B"], x["B_scale"]
    group = group_of(b.shape[0], scale.shape[0])
    assert group is not None
    a_type = node.input("A")
    assert a_type is not None
    if "B_zero_point" in x:
        b = b - np.repeat(x["B_zero_point"], group, axis=0)[: b.shape[0]]
    return a, round_to(a_type.data_type, b * np.repeat(scale, group, axis=0)[: b.shape[0]])


def rows_of(t: Tensor) -> tuple[int, int] | None:
    """(rows, row stride) of A or C [..., rows, cols] seen as one matrix: the dims before the
    last fold into rows when each non-unit one's stride is the next non-unit one's times its
    extent; None when they do not (or are symbolic)."""
    if t.symbols:
        return None
    runs = [(d, s) for d, s in zip(t.static_dim[:-1], t.static_stride[:-1]) if d > 1]
    if any(outer[1] != inner[1] * inner[0] for outer, inner in itertools.pairwise(runs)):
        return None
    return math.prod(d for d, _ in runs), runs[-1][1] if runs else 0
