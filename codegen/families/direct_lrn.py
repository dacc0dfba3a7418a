"""Local response normalisation and its backward: one output element per thread, which
reads the channel window around it (at most 16 channels, cuDNN's bound, so no tiling).

Threads walk the output in memory order, as pooling's do: with NHWC data neighbouring
threads read neighbouring channels (coalesced, and their windows overlap in L1).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.lrn import LrnAttributes, window

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset, offset_at
from ..kernel import FusedProgram
from ..pointwise import literal
from .direct_common import (
    anchor_of,
    blocks_for,
    compute_for,
    declare,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    read,
)


def emit_lrn(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """y = x * s^-beta, s summed over the element's window as the reference sums it."""
    node = anchor_of(fused)
    x, y = node.input("input"), node.output("y")
    a = node.attributes
    assert x is not None and y is not None and isinstance(a, LrnAttributes)
    compute, itype = compute_for(fused), loop_index_type([x, y], y.static_numel)
    params = KernelParams()
    source, out = params.tensor(x), params.tensor(y, writable=True)

    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    body += _base("s", "c1", x, source, a, compute, itype)
    centre = read(x, source, _at(x, "c1"), compute)
    result = f"{centre} * {_power('s', -a.lrn_beta, compute)}"
    body.append(f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, result)};")
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    return FusedProgram(fused.name, (make_kernel(ctx, fused, "lrn", params, loop, (blocks_for(y.static_numel), 1, 1)),))


def emit_lrn_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """dx_i = dy_i * s_i^-beta - 2 alpha beta / n * x_i * (sum of dy_c x_c s_c^-beta / s_c over
    the channels c whose window holds i): each s_c summed afresh (at most 16 x 16 loads, from
    L1), never as a running sum whose cancellation would drift."""
    node = anchor_of(fused)
    dy, x, dx = node.input("dy"), node.input("x"), node.output("dx")
    a = node.attributes
    assert dy is not None and x is not None and dx is not None and isinstance(a, LrnAttributes)
    compute, itype = compute_for(fused), loop_index_type([dy, x, dx], dx.static_numel)
    params = KernelParams()
    names = declare(params, [dy, x])  # dy may be x itself
    gradient, source, out = names[dy.id], names[x.id], params.tensor(dx, writable=True)
    behind, ahead = window(a.lrn_n)
    channels = x.static_dim[1]

    body = coordinates("p", dx.static_dim, stride_order(dx.static_dim, dx.static_stride), "c", itype)
    inner = _base("s", "w", x, source, a, compute, itype)
    inner += [
        f"const {compute} power = {_power('s', -a.lrn_beta, compute)};",
        "if (w == c1) own = power;",
        f"acc += {read(dy, gradient, _at(dy, 'w'), compute)} * {read(x, source, _at(x, 'w'), compute)} * power / s;",
    ]
    scale = literal(2.0 * a.lrn_alpha * a.lrn_beta / a.lrn_n, compute)
    body += [
        f"{compute} acc = {literal(0, compute)};",
        f"{compute} own = {literal(0, compute)};",
        f"const {itype} first = c1 >= {ahead} ? c1 - {ahead} : 0;",
        f"const {itype} last = c1 + {behind} < {channels - 1} ? c1 + {behind} : {channels - 1};",
        f"for ({itype} w = first; w <= last; ++w) {{",
        *("  " + line for line in inner),
        "}",
        f"const {compute} result = {read(dy, gradient, _at(dy, 'c1'), compute)} * own - "
        f"{scale} * {read(x, source, _at(x, 'c1'), compute)} * acc;",
        f"{out}[{offset(dx, dx.static_dim, 'c')}] = {store(dx.data_type, 'result')};",
    ]
    loop = grid_stride("p", first_thread(itype), dx.static_numel, itype, body)
    return FusedProgram(
        fused.name, (make_kernel(ctx, fused, "lrn_backward", params, loop, (blocks_for(dx.static_numel), 1, 1)),)
    )


def _at(tensor: Tensor, channel: str) -> str:
    """The offset in ``tensor`` of the element at this thread's coordinates, on channel ``channel``."""
    return offset_at(tensor, ["c0", channel, *(f"c{axis}" for axis in range(2, len(tensor.dim)))])


def _power(base: str, exponent: float, compute: str) -> str:
    return f"{'powf' if compute == 'float' else 'pow'}({base}, {literal(exponent, compute)})"


def _base(name: str, channel: str, x: Tensor, source: str, a: LrnAttributes, compute: str, itype: str) -> list[str]:
    """``name`` = k + alpha / n * (sum of x^2 over the window of ``channel``, clipped to the channels)."""
    behind, ahead = window(a.lrn_n)
    channels = x.static_dim[1]
    value = read(x, source, _at(x, "j"), compute)
    return [
        f"const {itype} lo_{name} = {channel} >= {behind} ? {channel} - {behind} : 0;",
        f"const {itype} hi_{name} = {channel} + {ahead} < {channels - 1} ? {channel} + {ahead} : {channels - 1};",
        f"{compute} sum_{name} = {literal(0, compute)};",
        f"for ({itype} j = lo_{name}; j <= hi_{name}; ++j) {{",
        f"  const {compute} v = {value};",
        f"  sum_{name} += v * v;",
        "}",
        f"const {compute} {name} = {literal(a.lrn_k, compute)} + {literal(a.lrn_alpha / a.lrn_n, compute)} * sum_{name};",
    ]
