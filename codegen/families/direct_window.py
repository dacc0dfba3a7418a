"""Pooling and resampling: one output element per thread, gathered from its input window.

Threads walk the output in memory order, so with NHWC data neighbouring threads read
neighbouring channels of the same window positions (coalesced), and with NCHW data
neighbouring positions of one channel.
"""

from __future__ import annotations

import itertools
import math

from fusion_rules import FusedNode
from graphdnn.layout import stride_order
from graphdnn.ops.pooling import PoolingAttributes, PoolingMode, ResampleAttributes, ResampleMode

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset, offset_at
from ..kernel import FusedProgram
from ..pointwise import literal
from .direct_common import (
    anchor_of,
    blocks_for,
    compute_for,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    read,
)


def emit_pooling(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """Each thread loops over the part of its window inside the input (padding is never read).

    Max starts at -inf and keeps NaN once seen (as NumPy's max); every window holds at least
    one real element because the padding is smaller than the window. Averages divide the
    sum by the window size, or by the number of real elements (exclude padding).
    """
    node = anchor_of(fused)
    x, y = node.input("input"), node.output("y")
    a = node.attributes
    assert x is not None and y is not None and isinstance(a, PoolingAttributes)
    compute, itype = compute_for(fused), loop_index_type([x, y], y.static_numel)
    params = KernelParams()
    source, out = params.tensor(x), params.tensor(y, writable=True)

    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    loops, counts = [], []
    for d, (w, s, pre) in enumerate(zip(a.window, a.stride, a.pre_padding)):
        axis = d + 2
        body += [
            f"const {itype} start{axis} = c{axis}{f' * {s}' if s > 1 else ''}{f' - {pre}' if pre else ''};",
            f"const {itype} lo{axis} = start{axis} > 0 ? start{axis} : 0;",
            f"const {itype} hi{axis} = start{axis} + {w} < {x.dim[axis]} ? start{axis} + {w} : {x.dim[axis]};",
        ]
        loops.append(f"for ({itype} i{axis} = lo{axis}; i{axis} < hi{axis}; ++i{axis})")
        counts.append(f"(hi{axis} - lo{axis})")
    value = read(x, source, offset_at(x, ["c0", "c1", *(f"i{d + 2}" for d in range(len(a.window)))]), compute)
    if a.mode is PoolingMode.MAX:
        init, update = literal(float("-inf"), compute), "acc = (v > acc || v != v) ? v : acc;"
        result = "acc"
    else:
        init, update = literal(0, compute), "acc += v;"
        divisor = (
            literal(math.prod(a.window), compute)
            if a.mode is PoolingMode.AVG_INCLUDE_PADDING
            else f"({compute})({' * '.join(counts)})"
        )
        result = f"acc / {divisor}"
    body += [
        f"{compute} acc = {init};",
        *loops,
        "{",
        f"  const {compute} v = {value};",
        f"  {update}",
        "}",
        f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, result)};",
    ]
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, "pooling", params, loop, (blocks_for(y.static_numel), 1, 1)),)
    )


def emit_resample(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """Nearest: src = floor(dst * in / out) in integers. Linear: the source coordinate in
    double exactly as the reference computes it (a float coordinate would be off by up to
    extent * 6e-8, visible in the interpolation weight at large sizes), then a blend of
    the 2^d neighbours with the product of the per-axis weights."""
    node = anchor_of(fused)
    x, y = node.input("input"), node.output("y")
    a = node.attributes
    assert x is not None and y is not None and isinstance(a, ResampleAttributes)
    compute, itype = compute_for(fused), loop_index_type([x, y], y.static_numel)
    params = KernelParams()
    source, out = params.tensor(x), params.tensor(y, writable=True)

    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    axes = range(2, len(y.dim))
    if a.mode is ResampleMode.NEAREST:
        body += [
            f"const {itype} i{axis} = ({itype})((long long)c{axis} * {x.dim[axis]} / {y.dim[axis]});" for axis in axes
        ]
        result = read(x, source, offset_at(x, ["c0", "c1", *(f"i{axis}" for axis in axes)]), compute)
    else:
        for axis in axes:
            body += _linear_source(axis, x.static_dim[axis], y.static_dim[axis], a.align_corners, compute, itype)
        corners = []
        for picks in itertools.product(("lo", "hi"), repeat=len(axes)):
            weights = " * ".join(
                f"w{axis}" if pick == "hi" else f"({literal(1, compute)} - w{axis})" for axis, pick in zip(axes, picks)
            )
            at = offset_at(x, ["c0", "c1", *(f"{pick}{axis}" for axis, pick in zip(axes, picks))])
            corners.append(f"{weights} * {read(x, source, at, compute)}")
        result = " + ".join(corners)
    body.append(f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, result)};")
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, "resample", params, loop, (blocks_for(y.static_numel), 1, 1)),)
    )


def _linear_source(axis: int, extent: int, out: int, align_corners: bool, compute: str, itype: str) -> list[str]:
    """lo, hi (the neighbours, clamped to the input) and w (the weight of hi) along one axis."""
    if align_corners:
        src = f"(double)c{axis} * {float((extent - 1) / (out - 1))!r}" if out > 1 else "0.0"
    else:
        src = f"fmax(((double)c{axis} + 0.5) * {float(extent / out)!r} - 0.5, 0.0)"
    return [
        f"const double src{axis} = {src};",
        f"const {itype} floor{axis} = ({itype})src{axis};  // src >= 0: truncation is floor",
        f"const {itype} lo{axis} = floor{axis} < {extent - 1} ? floor{axis} : {extent - 1};",
        f"const {itype} hi{axis} = lo{axis} + 1 < {extent - 1} ? lo{axis} + 1 : {extent - 1};",
        f"const {compute} w{axis} = ({compute})(src{axis} - (double)floor{axis});",
    ]
