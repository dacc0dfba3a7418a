"""Weight-only 4-bit and 8-bit GEMM written from primitives: ``block_scale_dequantize`` of a
weight W [K, N] (int4 or fp4_e2m1, int4 with or without group zero points, symmetric int8 or
fp8_e4m3; group scales of 32, 64 or 128 along K, or one scale per column: a block of K or more)
feeding a ``matmul`` as B, with 16-bit activations A [..., M, K]: what LLM inference runs at
small batch.

The two nodes become one GEMM fused node whose anchor is a ``matmul`` the rule builds with the
weight W as B, the scales as ``B_scale`` and any zero points as ``B_zero_point``
(graphdnn/ops/weight_only.py), so that the kernel (codegen/families/gemm_weight_only.py) reads
the packed weights once and dequantizes them in registers: the dequantized weight never reaches
memory, and the problem stays bound by the weights' bytes (a quarter of a 16-bit GEMM's for
4-bit weights, a half for 8-bit ones).

Numerics: the unfused graph rounds each dequantized weight to its tensor's type, which the
rule asks to be A's; the kernel rounds it to A's type too (the 16-bit tensor-core operand),
then sums products in fp32.

It fires for at most 16 rows of A (tokens; one tensor-core row tile) whose batch dims fold
into the rows, on sm_80 and newer (mma.sync). More rows are a compute-bound GEMM: the
dequantize and the matmul then run as written (the dequantize kernel, then the tensor-core
GEMM engine), as every near miss does, logged with its reason.
"""

from __future__ import annotations

import dataclasses

from graphdnn.dtypes import DataType
from graphdnn.ir import Node, Tensor
from graphdnn.ops.block_scaled import FP8
from graphdnn.ops.quantize import block_axis
from graphdnn.ops.weight_only import ACTIVATION_TYPES, BYTE_WEIGHTS, GROUPS, SCALE_TYPES, rows_of

from ..guards import fusable_types
from ..partition import Family
from ..pattern import Match, MatchContext, Miss, Pattern, anchored, link_reason, op
from ..rule import Rule, register_rule

MIN_ARCH = 80  # mma.sync m16n8k16 with bf16
MAX_ROWS = 16  # one m16n8k16 row tile


def rewrite(ctx: MatchContext, found: Match) -> Match | Miss:
    """The matched dequantize(W) → matmul(A, ·), checked; the anchor the weight-only matmul."""
    deq, matmul = found.bindings["deq"], found.bindings["matmul"]
    w = deq.input("X")
    assert w is not None
    if _block_scaled(ctx, w, matmul):
        return Miss()
    names = (deq.name, matmul.name)
    if not (w.data_type.is_packed or w.data_type in BYTE_WEIGHTS):
        return Miss(
            f"{deq.name} dequantizes {w.data_type.value} weights; the weight-only GEMM takes int4, fp4_e2m1, int8 "
            "and fp8_e4m3",
            names,
        )
    reason = _reason(ctx, deq, matmul)
    if reason is not None:
        return Miss(reason, names)
    return anchored(found.bindings, (deq, matmul), _anchor(deq, matmul), "equivalent weight-only matmul")


def _block_scaled(ctx: MatchContext, w: Tensor, matmul: Node) -> bool:
    """fp8 weights times a dequantized A: the block_scaled_matmul rule's (fp8 x fp8)."""
    a = matmul.input("A")
    assert a is not None
    source = ctx.graph.producer(a)
    return w.data_type in FP8 and source is not None and source.op == "block_scale_dequantize"


def _reason(ctx: MatchContext, deq: Node, matmul: Node) -> str | None:
    """Why the weight-only kernel cannot take these nodes, or None."""
    w, scale, y = deq.input("X"), deq.input("scale"), deq.output("Y")
    a = matmul.input("A")
    assert w is not None and scale is not None and y is not None and a is not None
    if ctx.arch < MIN_ARCH:
        return f"{matmul.name}: the weight-only GEMM needs sm_{MIN_ARCH} (mma.sync), the target is sm_{ctx.arch}"
    attrs = deq.attributes
    axis = block_axis(deq, len(w.dim))
    block = attrs.block_size  # type: ignore[attr-defined]
    if len(w.dim) != 2 or axis != 0 or not (block in GROUPS or (isinstance(w.dim[0], int) and block >= w.dim[0])):
        return (
            f"{deq.name} has blocks of {block} along axis {axis} of {list(w.dim)}; the weight-only GEMM "
            f"takes a rank-2 weight with groups of {', '.join(map(str, GROUPS))} along K (axis 0), or one per "
            "column (a block of K or more)"
        )
    if a.data_type not in ACTIVATION_TYPES or y.data_type is not a.data_type:
        return (
            f"{matmul.name} multiplies {a.data_type.value} A by {y.data_type.value} dequantized weights; the "
            "weight-only GEMM takes half or bfloat16 A and weights dequantized to A's type"
        )
    if scale.data_type not in SCALE_TYPES:
        return f"{deq.name} has {scale.data_type.value} scales; the weight-only GEMM takes float, half or bfloat16"
    out = matmul.output("C")
    assert out is not None
    folded, c_rows = rows_of(a), rows_of(out)
    if folded is None or c_rows is None:
        return (
            f"{matmul.name}: A {list(a.dim)} (strides {list(a.stride)}) or C '{out.name}' has batch dims that do not "
            "fold into its rows; the weight-only GEMM takes static rows of equal stride"
        )
    rows = folded[0]
    if rows > MAX_ROWS:
        return (
            f"{matmul.name} has {rows} rows (tokens); the weight-only GEMM serves up to {MAX_ROWS}: the dequantize "
            "and the tensor-core GEMM run as written"
        )
    return link_reason(ctx, deq, y, {matmul.id}, escapes=False)


def _anchor(deq: Node, matmul: Node) -> Node:
    a, w, scale, zero_point = matmul.input("A"), deq.input("X"), deq.input("scale"), deq.input("zero_point")
    assert a is not None and w is not None and scale is not None
    inputs = (("A", a), ("B", w), ("B_scale", scale), *((("B_zero_point", zero_point),) if zero_point else ()))
    return dataclasses.replace(
        matmul, name=f"{matmul.name}.weight_only", inputs=inputs, compute_data_type=DataType.FLOAT
    )


WEIGHT_ONLY_MATMUL = register_rule(
    Rule(
        name="weight_only_matmul",
        pattern=Pattern(
            (
                op("block_scale_dequantize", bind="deq"),
                op("matmul", bind="matmul", via=["B"], where=(fusable_types,)),
            )
        ),
        family=Family.GEMM,
        priority=39,  # before matmul_epilogue, which would take the matmul alone
        rewrite=rewrite,
        description=(
            "block_scale_dequantize(W int4 / fp4_e2m1 / int8 / fp8_e4m3, groups of 32 / 64 / 128 along K or per column) → "
            "matmul(A half / bfloat16, ·) for up to 16 rows of A, as one weight-only GEMM dequantizing the weights "
            "in registers"
        ),
    )
)
