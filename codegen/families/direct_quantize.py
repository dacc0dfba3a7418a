"""block_scale_quantize and block_scale_dequantize.

Quantize: one warp per block of ``block_size`` elements (a 32-element MXFP8 block is one
element per lane, coalesced when the block axis is contiguous). The warp reduces the
block's largest magnitude (NaN kept), derives the scale exactly as the reference does (fp32
division, or the exponent arithmetic of an e8m0 power of two), then each lane divides its
elements in fp32, saturates to the element type's largest finite value (NaN stays NaN) and
stores them. Dequantize: one element per thread, less its block's zero point (int4 weights),
times its block's scale.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.quantize import (
    E8M0_EXPONENTS,
    LARGEST,
    BlockScaleDequantizeAttributes,
    BlockScaleQuantizeAttributes,
    block_axis,
)

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset_at
from ..kernel import FusedProgram
from ..pointwise import literal
from .direct_common import (
    THREADS,
    anchor_of,
    blocks_for,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    read,
    warp_stride,
)


def emit_quantize(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x, y, scale = node.input("X"), node.output("Y"), node.output("scale")
    a = node.attributes
    assert x is not None and y is not None and scale is not None and isinstance(a, BlockScaleQuantizeAttributes)
    axis = block_axis(node, len(x.static_dim))
    size = min(a.block_size, x.static_dim[axis])  # a block longer than the axis is the whole axis
    itype = loop_index_type([x, y, scale], scale.static_numel * 32)
    params = KernelParams()
    source, out, scales = params.tensor(x), params.tensor(y, writable=True), params.tensor(scale, writable=True)
    largest = literal(LARGEST[y.data_type], "float")

    def at(tensor: Tensor, along: str) -> str:
        return offset_at(tensor, [along if d == axis else f"c{d}" for d in range(len(x.static_dim))])

    element = f"(c{axis} * {size} + j)"
    # The last block of an axis the size does not divide is partial.
    bound = f"j < {size} && {element} < {x.static_dim[axis]}" if x.static_dim[axis] % size else f"j < {size}"
    body = [
        *coordinates("b", scale.static_dim, stride_order(scale.static_dim, scale.static_stride), "c", itype),
        "float amax = 0.0f;",
        f"for ({itype} j = lane; {bound}; j += 32) {{",
        f"  amax = gd::NanMax()(amax, fabsf({read(x, source, at(x, element), 'float')}));",
        "}",
        "amax = gd::lanes_reduce<32>(amax, gd::NanMax());",
        *_scale(scale.data_type, y.data_type, largest),
        f"if (lane == 0) {scales}[{at(scale, f'c{axis}')}] = {store(scale.data_type, 's')};",
        f"for ({itype} j = lane; {bound}; j += 32) {{",
        f"  float q = {read(x, source, at(x, element), 'float')} / s;",
        f"  q = q > {largest} ? {largest} : (q < -{largest} ? -{largest} : q);  // saturate; NaN stays NaN",
        f"  {out}[{at(y, element)}] = {store(y.data_type, 'q')};",
        "}",
    ]
    loop = warp_stride("b", scale.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "block_scale_quantize", params, loop, (blocks_for(scale.static_numel * 32), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def _scale(scale_type: DataType, element_type: DataType, largest: str) -> list[str]:
    """Statements computing the block's scale ``s`` from ``amax`` as the reference does."""
    if scale_type is DataType.FLOAT:
        return [f"float s = amax / {largest};", "if (s == 0.0f) s = 1.0f;  // all zeros, or amax below fp32's range"]
    # The smallest power of two s with amax / s <= largest: compare mantissas, no rounding.
    mantissa, exponent = math.frexp(LARGEST[element_type])
    low, high = E8M0_EXPONENTS
    return [
        "int e;",
        "const float m = frexpf(amax, &e);",
        f"int k = amax > 0.0f ? e - {exponent} + (m > {literal(mantissa, 'float')} ? 1 : 0) : {low};",
        f"k = k < {low} ? {low} : (k > {high} ? {high} : k);",
        "const float s = isfinite(amax) ? ldexpf(1.0f, k) : __int_as_float(0x7fffffff);",
    ]


def emit_dequantize(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x, scale, y = node.input("X"), node.input("scale"), node.output("Y")
    a = node.attributes
    assert x is not None and scale is not None and y is not None and isinstance(a, BlockScaleDequantizeAttributes)
    axis = block_axis(node, len(x.static_dim))
    compute = "double" if y.data_type is DataType.DOUBLE else "float"
    itype = loop_index_type([x, scale, y], y.static_numel)
    params = KernelParams()
    source, scales, out = params.tensor(x), params.tensor(scale), params.tensor(y, writable=True)
    block = [f"c{d}" if d != axis else f"c{d} / {a.block_size}" for d in range(len(x.static_dim))]
    value = f"{read(x, source, offset_at(x, [f'c{d}' for d in range(len(x.static_dim))]), compute)}"
    zero_point = node.input("zero_point")
    if zero_point is not None:
        value = f"({value} - {read(zero_point, params.tensor(zero_point), offset_at(zero_point, block), compute)})"
    body = [
        *coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype),
        f"const {compute} v = {value} * {read(scale, scales, offset_at(scale, block), compute)};",
        f"{out}[{offset_at(y, [f'c{d}' for d in range(len(y.static_dim))])}] = {store(y.data_type, 'v')};",
    ]
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    kernel = make_kernel(
        ctx, fused, "block_scale_dequantize", params, loop, (blocks_for(y.static_numel, THREADS), 1, 1)
    )
    return FusedProgram(fused.name, (kernel,))
