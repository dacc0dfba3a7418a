"""Block-scaled fp8 GEMM written from primitives: ``block_scale_dequantize`` of A (1 x 128
blocks along K) and of B (128 blocks along K) feeding a ``matmul``, with float scales; or
the same with fp8_e8m0 scales and blocks of 32 (MXFP8, the OCP MX recipe).

The three nodes become one GEMM fused node whose anchor is a ``matmul`` the rule builds with
the fp8 operands and their scales bound (A_scale, B_scale: graphdnn/ops/block_scaled.py), so
that the warp-specialised engine multiplies fp8 on the tensor cores and applies the scales
per k block (codegen/families/gemm_ws_consumer.py, gemm_ws_mx.py); the dequantized fp32
(or 16-bit) operands never reach memory.

Numerics: the unfused graph rounds each dequantized element to its tensor's type, then sums
products; the kernel sums each block's fp8 products in fp32 (exact products, the tensor
cores' additions) and adds the block's sum times its two scales. The two agree to fp32
rounding; the rule takes float, half and bfloat16 intermediates (never double).

It fires only where that kernel runs: sm_90, rank-2 static operands, A k-contiguous and B
K-major (stored as Bᵀ row-major), both scales float with blocks of 128 or both fp8_e8m0 with
blocks of 32, K a whole number of blocks (and of 16, as the tensor cores read it). Each
near miss is logged with its reason; the nodes then run as written (on sm_80: the dequantize
kernels and the SIMT matmul, as per-tensor fp8 does there).
"""

from __future__ import annotations

import dataclasses

from graphdnn.dtypes import DataType
from graphdnn.ir import Node, Tensor
from graphdnn.ops.block_scaled import BLOCK, FP8, MX_BLOCK

from ..guards import fusable_types
from ..partition import Family
from ..pattern import Match, MatchContext, Miss, Pattern, anchored, link_reason, op
from ..rule import Rule, register_rule

MIN_ARCH = 90  # wgmma's fp8 forms


def rewrite(ctx: MatchContext, found: Match) -> Match | Miss:
    """The matched dequantize(A) → matmul, with B's dequantize found and both checked; the
    anchor the block-scaled matmul."""
    deq_a, matmul = found.bindings["deq_a"], found.bindings["matmul"]
    b = matmul.input("B")
    assert b is not None
    deq_b = ctx.graph.producer(b)
    names = tuple(n.name for n in (deq_a, matmul))
    if deq_b is None or deq_b.op != "block_scale_dequantize":
        return Miss(f"{matmul.name}'s B '{b.name}' is not written by a block_scale_dequantize", names)
    if deq_b.id in ctx.claimed:
        return Miss()
    names = tuple(n.name for n in (deq_a, deq_b, matmul))
    reason = link_reason(ctx, deq_b, b, {matmul.id}, escapes=False) or _reason(ctx, deq_a, deq_b, matmul)
    if reason is not None:
        return Miss(reason, names)
    members = (deq_a, deq_b, matmul)
    return anchored(
        {**found.bindings, "deq_b": deq_b}, members, _anchor(deq_a, deq_b, matmul), "equivalent block-scaled matmul"
    )


def _reason(ctx: MatchContext, deq_a: Node, deq_b: Node, matmul: Node) -> str | None:
    """Why the block-scaled kernel cannot take these nodes, or None."""
    if ctx.arch < MIN_ARCH:
        return (
            f"{matmul.name} multiplies block-scaled fp8 operands: the block-scaled GEMM needs sm_90's fp8 "
            f"tensor cores (wgmma), the target is sm_{ctx.arch}; the dequantizes and the matmul run as written"
        )
    guarded = fusable_types(ctx, deq_b)
    if guarded is not None:
        return guarded
    scale_a, scale_b = deq_a.input("scale"), deq_b.input("scale")
    assert scale_a is not None and scale_b is not None
    if scale_a.data_type is not scale_b.data_type:
        return (
            f"{deq_a.name} has {scale_a.data_type.value} scales and {deq_b.name} {scale_b.data_type.value} ones; "
            "the block-scaled GEMM takes both float or both fp8_e8m0"
        )
    mx = scale_a.data_type is DataType.FP8_E8M0
    block, shape = (MX_BLOCK, "32") if mx else (BLOCK, "128")
    for node, axis in ((deq_a, 1), (deq_b, 0)):
        x, scale = node.input("X"), node.input("scale")
        assert x is not None and scale is not None
        if len(x.dim) != 2 or x.symbols:
            return f"{node.name} dequantizes dims {list(x.dim)}; the block-scaled GEMM takes static rank-2 operands"
        attrs = node.attributes
        given = attrs.axis % 2 if attrs.axis is not None else 1  # type: ignore[attr-defined]
        if given != axis or attrs.block_size != block:  # type: ignore[attr-defined]
            side = f"A along its last axis (1 x {shape})" if axis == 1 else f"B along its first axis, K ({shape} x 1)"
            recipe = " with fp8_e8m0 scales (MXFP8)" if mx else " with float scales"
            return (
                f"{node.name} has blocks of {attrs.block_size} along axis {given}; the block-scaled GEMM "  # type: ignore[attr-defined]
                f"takes blocks of {block} of {side}{recipe}"
            )
        if x.data_type not in FP8 or scale.data_type not in (DataType.FLOAT, DataType.FP8_E8M0):
            return (
                f"{node.name} dequantizes {x.data_type.value} with {scale.data_type.value} scales; the "
                "block-scaled GEMM takes fp8_e4m3 / fp8_e5m2 values and float or fp8_e8m0 scales"
            )
    a, b = deq_a.input("X"), deq_b.input("X")
    assert a is not None and b is not None
    if a.dim[1] % block:
        return (
            f"{matmul.name} has K = {a.dim[1]}, not a multiple of {block}: the block-scaled GEMM takes whole k blocks"
        )
    return _layout_reason(a, b)


def _layout_reason(a: Tensor, b: Tensor) -> str | None:
    """The engine reads both fp8 operands K-major with 16-byte aligned rows (TMA)."""
    if a.stride[1] != 1 or a.stride[0] % 16:
        return f"A '{a.name}' has strides {list(a.stride)}; the block-scaled GEMM reads it k-contiguous in 16-byte rows"
    if b.stride[0] != 1 or b.stride[1] % 16:
        return (
            f"B '{b.name}' has strides {list(b.stride)}; the block-scaled GEMM reads it K-major (Bᵀ stored "
            "row-major, strides [1, K], K a multiple of 16)"
        )
    return None


def _anchor(deq_a: Node, deq_b: Node, matmul: Node) -> Node:
    def role(node: Node, name: str) -> Tensor:
        tensor = node.input(name)
        assert tensor is not None
        return tensor

    inputs = (
        ("A", role(deq_a, "X")),
        ("B", role(deq_b, "X")),
        ("A_scale", role(deq_a, "scale")),
        ("B_scale", role(deq_b, "scale")),
    )
    return dataclasses.replace(
        matmul, name=f"{matmul.name}.block_scaled", inputs=inputs, compute_data_type=DataType.FLOAT
    )


BLOCK_SCALED_MATMUL = register_rule(
    Rule(
        name="block_scaled_matmul",
        pattern=Pattern(
            (
                op("block_scale_dequantize", bind="deq_a", where=(fusable_types,)),
                op("matmul", bind="matmul", via=["A"], where=(fusable_types,)),
            )
        ),
        family=Family.GEMM,
        priority=39,  # before matmul_epilogue, which would take the matmul alone
        rewrite=rewrite,
        description=(
            "block_scale_dequantize(A, 1 x 128 blocks) and block_scale_dequantize(B, 128 blocks along K) → "
            "matmul (float scales; or blocks of 32 with fp8_e8m0 scales, MXFP8), as one block-scaled fp8 GEMM "
            "on sm_90 (scales applied per k block to fp32 partial sums)"
        ),
    )
)
