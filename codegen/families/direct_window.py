"""Pooling, its backward, adaptive pooling and resampling: one output element per thread,
gathered from its input window (or, backward, from the windows that hold it).

Threads walk the output in memory order, so with NHWC data neighbouring threads read
neighbouring channels of the same window positions (coalesced), and with NCHW data
neighbouring positions of one channel. Backward gathers instead of scattering: no
atomics, and every dx element sums its windows in the same order on every run.
"""

from __future__ import annotations

import itertools
import math

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.pooling import (
    AdaptivePoolingAttributes,
    AdaptivePoolingMode,
    PoolingAttributes,
    PoolingMode,
    ResampleAttributes,
    ResampleMode,
)

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
    written,
)


def emit_pooling(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """Each thread loops over the part of its window inside the input (padding is never read).

    Max starts at -inf and keeps NaN once seen (as NumPy's max); every window holds at least
    one real element because the padding is smaller than the window. With its index output,
    max tracks where the first maximum is instead (the first NaN, if any). Averages divide
    the sum by the window size, or by the number of real elements (exclude padding).
    """
    node = anchor_of(fused)
    x, y, index = node.input("input"), node.output("y"), node.output("index")
    a = node.attributes
    assert x is not None and y is not None and isinstance(a, PoolingAttributes)
    compute, itype = compute_for(fused), loop_index_type([x, y], y.static_numel)
    params = KernelParams()
    source = params.tensor(x)
    out = params.tensor(y, writable=True) if written(fused, y) else None
    positions = params.tensor(index, writable=True) if index is not None and written(fused, index) else None

    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    axes = range(2, len(y.dim))
    for axis, w, s, pre in zip(axes, a.window, a.stride, a.pre_padding):
        body += _window_bounds(axis, f"c{axis}", w, s, pre, x.static_dim[axis], itype)
    if index is not None:
        body += _first_maximum(x, source, axes, compute, itype)
        result = "top"
        if positions is not None:
            # the row-major position in the window, padding counted, as the reference's index
            tap = " + ".join(
                f"(best{axis} - start{axis}){_times(math.prod(a.window[d + 1 :]))}" for d, axis in enumerate(axes)
            )
            body.append(
                f"{positions}[{offset(index, y.static_dim, 'c')}] = {store(index.data_type, f'({compute})({tap})')};"
            )
    else:
        body += _reduce_window(x, source, axes, a.mode is PoolingMode.MAX, compute, itype)
        result = {
            PoolingMode.MAX: "acc",
            PoolingMode.AVG_INCLUDE_PADDING: f"acc / {literal(math.prod(a.window), compute)}",
            PoolingMode.AVG_EXCLUDE_PADDING: f"acc / {_real_count(axes, compute)}",
        }[a.mode]
    if out is not None:
        body.append(f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, result)};")
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    pattern = "pooling_index" if index is not None else "pooling"
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, pattern, params, loop, (blocks_for(y.static_numel), 1, 1)),)
    )


def emit_adaptive_pooling(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """As pooling, with output i of an axis pooling inputs floor(i * in / out) up to
    ceil((i + 1) * in / out), in integers (never empty, never past the input)."""
    node = anchor_of(fused)
    x, y = node.input("input"), node.output("y")
    a = node.attributes
    assert x is not None and y is not None and isinstance(a, AdaptivePoolingAttributes)
    compute, itype = compute_for(fused), loop_index_type([x, y], y.static_numel)
    params = KernelParams()
    source, out = params.tensor(x), params.tensor(y, writable=True)

    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    axes = range(2, len(y.dim))
    for axis in axes:
        extent, size = x.static_dim[axis], y.static_dim[axis]
        body += [
            f"const {itype} lo{axis} = ({itype})((long long)c{axis} * {extent} / {size});",
            f"const {itype} hi{axis} = ({itype})(((long long)c{axis} * {extent} + {extent + size - 1}) / {size});",
        ]
    maximum = a.mode is AdaptivePoolingMode.MAX
    body += _reduce_window(x, source, axes, maximum, compute, itype)
    result = "acc" if maximum else f"acc / {_real_count(axes, compute)}"
    body.append(f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, result)};")
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, "adaptive_pooling", params, loop, (blocks_for(y.static_numel), 1, 1)),)
    )


def emit_pooling_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """One thread per dx element sums dy over the windows that hold it, in window order.

    Along an axis, element i (at p = i + pre_padding in the padded input) lies in windows
    (p - w) / s + 1 to p / s (clamped to the output): at most ceil(w / s) of them. Averages
    add each window's dy divided as the forward divides; max adds dy where the window's first
    maximum is this element: the forward's index says where (an index outside the window
    sends dy nowhere), or the forward's loop and tie rule recompute it from x.
    """
    node = anchor_of(fused)
    dy, x, index, dx = node.input("dy"), node.input("x"), node.input("index"), node.output("dx")
    a = node.attributes
    assert dy is not None and dx is not None and isinstance(a, PoolingAttributes)
    compute, itype = compute_for(fused), loop_index_type([dy, dx], dx.static_numel)
    params = KernelParams()
    gradient = params.tensor(dy)
    # Averages never read x, nor max with the index.
    positions = params.tensor(index) if index is not None else None
    source = params.tensor(x) if a.mode is PoolingMode.MAX and index is None and x is not None else None
    out = params.tensor(dx, writable=True)

    body = coordinates("p", dx.static_dim, stride_order(dx.static_dim, dx.static_stride), "c", itype)
    axes = range(2, len(dx.dim))
    windows = []
    for axis, w, s, pre in zip(axes, a.window, a.stride, a.pre_padding):
        body += [
            f"const {itype} at{axis} = c{axis}{f' + {pre}' if pre else ''};",
            f"const {itype} first{axis} = at{axis} >= {w} ? (at{axis} - {w}) / {s} + 1 : 0;",
            f"const {itype} last{axis} = at{axis} / {s} < {dy.dim[axis] - 1} ? at{axis} / {s} : {dy.dim[axis] - 1};",
        ]
        windows.append(f"for ({itype} o{axis} = first{axis}; o{axis} <= last{axis}; ++o{axis})")
    term = read(dy, gradient, offset_at(dy, ["c0", "c1", *(f"o{axis}" for axis in axes)]), compute)
    inner: list[str] = []
    if a.mode is not PoolingMode.AVG_INCLUDE_PADDING:
        for axis, w, s, pre in zip(axes, a.window, a.stride, a.pre_padding):
            bounds = _window_bounds(axis, f"o{axis}", w, s, pre, dx.static_dim[axis], itype)
            inner += bounds[:1] if positions is not None else bounds  # the index needs the start only
    if positions is not None:
        assert index is not None
        size = math.prod(a.window)
        at = offset_at(index, ["c0", "c1", *(f"o{axis}" for axis in axes)])
        inner.append(f"const long long tap = (long long){positions}[{at}];")
        hit = " && ".join(
            f"start{axis} + tap{_over(math.prod(a.window[d + 1 :]))} % {w} == c{axis}"
            for d, (axis, w) in enumerate(zip(axes, a.window))
        )
        inner.append(f"if (tap >= 0 && tap < {size} && {hit}) acc += {term};")
        result = "acc"
    elif source is not None:
        assert x is not None
        inner += _first_maximum(x, source, axes, compute, itype)
        hit = " && ".join(f"best{axis} == c{axis}" for axis in axes)
        inner.append(f"if ({hit}) acc += {term};")
        result = "acc"
    elif a.mode is PoolingMode.AVG_EXCLUDE_PADDING:
        inner.append(f"acc += {term} / {_real_count(axes, compute)};")
        result = "acc"
    else:
        inner.append(f"acc += {term};")
        result = f"acc / {literal(math.prod(a.window), compute)}"
    body += [f"{compute} acc = {literal(0, compute)};", *windows, "{", *("  " + line for line in inner), "}"]
    body.append(f"{out}[{offset(dx, dx.static_dim, 'c')}] = {store(dx.data_type, result)};")
    loop = grid_stride("p", first_thread(itype), dx.static_numel, itype, body)
    return FusedProgram(
        fused.name,
        (
            make_kernel(
                ctx, fused, f"pooling_backward_{a.mode.value}", params, loop, (blocks_for(dx.static_numel), 1, 1)
            ),
        ),
    )


def _times(factor: int) -> str:
    return f" * {factor}" if factor != 1 else ""


def _over(divisor: int) -> str:
    return f" / {divisor}" if divisor != 1 else ""


def _window_bounds(axis: int, index: str, w: int, s: int, pre: int, extent: int, itype: str) -> list[str]:
    """lo{axis}, hi{axis}: the input range of window ``index`` along ``axis`` without its padding."""
    return [
        f"const {itype} start{axis} = {index}{_times(s)}{f' - {pre}' if pre else ''};",
        f"const {itype} lo{axis} = start{axis} > 0 ? start{axis} : 0;",
        f"const {itype} hi{axis} = start{axis} + {w} < {extent} ? start{axis} + {w} : {extent};",
    ]


def _real_count(axes: range, compute: str) -> str:
    """The number of input elements in the window lo..hi, as the compute type."""
    return f"({compute})({' * '.join(f'(hi{axis} - lo{axis})' for axis in axes)})"


def _reduce_window(x: Tensor, source: str, axes: range, maximum: bool, compute: str, itype: str) -> list[str]:
    """``acc``: the maximum (NaN kept once seen, as NumPy's max) or the sum of x over lo..hi."""
    init, update = (
        (literal(float("-inf"), compute), "acc = (v > acc || v != v) ? v : acc;")
        if maximum
        else (literal(0, compute), "acc += v;")
    )
    value = read(x, source, offset_at(x, ["c0", "c1", *(f"i{axis}" for axis in axes)]), compute)
    return [
        f"{compute} acc = {init};",
        *(f"for ({itype} i{axis} = lo{axis}; i{axis} < hi{axis}; ++i{axis})" for axis in axes),
        "{",
        f"  const {compute} v = {value};",
        f"  {update}",
        "}",
    ]


def _first_maximum(x: Tensor, source: str, axes: range, compute: str, itype: str) -> list[str]:
    """best{axis}: where the window lo..hi of x has its first maximum in the forward's loop
    order (a NaN counts as the maximum: the first NaN wins)."""
    value = read(x, source, offset_at(x, ["c0", "c1", *(f"i{axis}" for axis in axes)]), compute)
    take = " ".join(f"best{axis} = i{axis};" for axis in axes)
    return [
        f"{compute} top = {literal(float('-inf'), compute)};",
        *(f"{itype} best{axis} = -1;" for axis in axes),
        *(f"for ({itype} i{axis} = lo{axis}; i{axis} < hi{axis}; ++i{axis})" for axis in axes),
        "{",
        f"  const {compute} v = {value};",
        f"  if (best{axes[0]} < 0 || v > top || (v != v && top == top)) {{ top = v; {take} }}",
        "}",
    ]


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
