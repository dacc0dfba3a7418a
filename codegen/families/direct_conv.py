"""Convolution gradients, direct (SIMT) kernels for any groups, stride, dilation, padding, rank.

Notation per spatial dim d: input extent X, output (loss) extent P, filter extent F,
stride s, dilation l, pre-padding a. Forward: y[p] += x[p*s + f*l - a] * w[f]. With
convolution_mode "convolution" the filter is flipped: tap f uses w[F-1-f].

- dgrad: one thread per dx element (in dx's memory order) gathers
  dx[i] = sum over f and k of dy[p] * w[f], p = (i + a - f*l) / s where that divides and
  0 <= p < P; k runs over the output channels of the element's group.
- wgrad: dw[k, c, f] = sum over (n, p) of dy[n, k, p] * x[n, group(k)*Cg + c, p*s + f*l - a],
  one dw element per thread group with the reduction pattern (direct_reduce) over N*P, or
  with NHWC data one per lane, the lanes along c then k.

Depthwise and small-group gradients in NHWC take runs of channels instead (direct_conv_runs,
wgrad_runs; wgrad_mma for 8-channel groups of 16-bit types).
"""

from __future__ import annotations

import dataclasses

from fusion_rules import FusedNode
from graphdnn.layout import stride_order
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset, offset_at
from ..kernel import FusedProgram
from ..pointwise import literal
from . import wgrad_mma
from .channel_runs import MMA_CANDIDATES
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
from .direct_conv_runs import emit_dgrad_runs, takes_dgrad_runs, takes_runs
from .direct_reduce import Sums, innermost_reduced, sums_kernels
from .wgrad_runs import emit_wgrad_runs


def _attributes(fused: FusedNode) -> ConvAttributes:
    attributes = anchor_of(fused).attributes
    assert isinstance(attributes, ConvAttributes)
    return attributes


def _tap(attributes: ConvAttributes, extent: int, tap: str) -> str:
    """The filter index that tap ``tap`` reads (flipped for true convolution)."""
    return f"{extent - 1} - {tap}" if attributes.convolution_mode is ConvMode.CONVOLUTION else tap


def emit_dgrad(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    dy, w, dx = node.input("loss"), node.input("filter"), node.output("dx")
    assert dy is not None and w is not None and dx is not None
    a = _attributes(fused)
    if takes_dgrad_runs(dy, w, dx):
        return emit_dgrad_runs(fused, ctx, dy, w, dx, a)
    compute, itype = compute_for(fused), loop_index_type([dy, w, dx], dx.static_numel)
    params = KernelParams()
    names = declare(params, [dy, w])
    out = params.tensor(dx, writable=True)
    per_group = w.dim[1]  # input channels per group
    k_per_group = w.dim[0] // (dx.dim[1] // per_group)
    spatial = range(2, len(dx.dim))

    body = [
        *coordinates("i", dx.static_dim, stride_order(dx.static_dim, dx.static_stride), "c", itype),
        f"const {itype} group = c1 / {per_group};",
        f"const {itype} channel = c1 - group * {per_group};",
        f"{compute} acc = {literal(0, compute)};",
    ]
    depth = 0
    for axis, f, s, dilation, pre, p in zip(spatial, w.dim[2:], a.stride, a.dilation, a.pre_padding, dy.dim[2:]):
        pad = "  " * depth
        body += [
            f"{pad}for (int f{axis} = 0; f{axis} < {f}; ++f{axis}) {{",
            f"{pad}  const {itype} reach{axis} = c{axis} + {pre} - f{axis} * {dilation};  // p * stride",
            f"{pad}  if (reach{axis} < 0{f' || reach{axis} % {s} != 0' if s > 1 else ''}) continue;",
            f"{pad}  const {itype} p{axis} = reach{axis} / {s};",
            f"{pad}  if (p{axis} >= {p}) continue;",
        ]
        depth += 1
    pad = "  " * depth
    loss_at = offset_at(dy, ["c0", "k", *(f"p{axis}" for axis in spatial)])
    filter_at = offset_at(w, ["k", "channel", *(_tap(a, w.static_dim[axis], f"f{axis}") for axis in spatial)])
    body += [
        f"{pad}for ({itype} k = group * {k_per_group}; k < (group + 1) * {k_per_group}; ++k) {{",
        f"{pad}  acc += {read(dy, names[dy.id], loss_at, compute)} * {read(w, names[w.id], filter_at, compute)};",
        f"{pad}}}",
        *("  " * level + "}" for level in reversed(range(depth))),
        f"{out}[{offset(dx, dx.static_dim, 'c')}] = {store(dx.data_type, 'acc')};",
    ]
    loop = grid_stride("i", first_thread(itype), dx.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "conv_dgrad", params, loop, (blocks_for(dx.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_wgrad(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """The reduction space is (k, c, f..., n, p...): dw's axes are kept, (n, p...) reduced.

    The reduced axes follow dy's memory order; the layout is rows (threads along n, p...)
    unless dy's innermost axis is its channel, as in NHWC, where the lanes take
    consecutive dw elements (consecutive input channels of a KRSC filter) instead.
    """
    node = anchor_of(fused)
    x, dy, dw = node.input("image"), node.input("loss"), node.output("dw")
    assert x is not None and dy is not None and dw is not None
    a = _attributes(fused)
    if takes_runs(x, dy, dw):
        on_mma = wgrad_mma.choices(ctx, fused, x, dy, dw)
        if on_mma is not None:
            return wgrad_mma.emit_wgrad_mma(fused, ctx, x, dy, dw, a, *on_mma)
        runs_tuning = {key: value for key, value in ctx.tuning.items() if key != "mma"}
        return emit_wgrad_runs(fused, dataclasses.replace(ctx, tuning=runs_tuning), x, dy, dw, a)
    compute = compute_for(fused)
    rank = len(dw.dim)
    sample = rank  # the space axis of n; p_d is at rank + 1 + d
    dims = (*dw.static_dim, dy.static_dim[0], *dy.static_dim[2:])
    loss_axes = [sample if axis == 0 else rank + axis - 1 for axis in range(len(dy.dim))]  # dy axis -> space axis
    reduced = tuple(loss_axes[axis] for axis in stride_order(dy.dim, dy.stride) if axis != 1)
    rows = innermost_reduced(
        dy.static_dim, dy.static_stride, tuple(axis for axis in range(len(dy.static_dim)) if axis != 1)
    )
    per_group = dw.dim[1]
    k_per_group = dw.dim[0] // (x.dim[1] // per_group)

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        names = declare(params, [x, dy])
        statements = [f"const {itype} channel = (c0 / {k_per_group}) * {per_group} + c1;"]
        inside = []
        for d, (extent, s, dilation, pre, post) in enumerate(
            zip(x.dim[2:], a.stride, a.dilation, a.pre_padding, a.post_padding)
        ):
            tap = _tap(a, dw.static_dim[2 + d], f"c{2 + d}")
            statements.append(f"const {itype} i{d} = c{rank + 1 + d} * {s} + ({tap}) * {dilation} - {pre};")
            # The last tap of the last output reaches extent + post - 1: only padding can fall outside.
            inside += [f"i{d} >= 0"] * (pre > 0) + [f"i{d} < {extent}"] * (post > 0)
        image = read(
            x, names[x.id], offset_at(x, [f"c{sample}", "channel", *(f"i{d}" for d in range(len(x.dim) - 2))]), compute
        )
        if inside:
            image = f"({' && '.join(inside)} ? {image} : {literal(0, compute)})"
        loss = read(
            dy,
            names[dy.id],
            offset_at(dy, [f"c{sample}", "c0", *(f"c{rank + 1 + d}" for d in range(len(dy.dim) - 2))]),
            compute,
        )
        return statements, [f"{image} * {loss}"]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        return [
            f"{params.tensor(dw, writable=True)}[{offset(dw, dw.static_dim, 'c')}] = {store(dw.data_type, totals[0])};"
        ]

    # Lanes take consecutive kept elements where dy's channel is innermost (NHWC): the filter
    # taps outermost, then k, then c, so a warp reads runs of x's and dy's channels (for a
    # depthwise filter, c has one value: in dw's own order the lanes would take the taps, whose
    # x elements lie a channel count apart).
    kept = stride_order(dw.static_dim, dw.static_stride) if rows else (*range(2, rank), 0, 1)
    sums = Sums("conv_wgrad", dims, kept, reduced, rows, terms, finish)
    kernels, scratch = sums_kernels(ctx, fused, sums, compute)
    return FusedProgram(fused.name, kernels, scratch)


def wgrad_candidates(fused: FusedNode) -> list[dict[str, object]]:
    """Where a wgrad over runs can take the tensor cores: the kernel over runs and the tensor-core
    one at 2 and 1 tiles a warp; else none (one kernel, its defaults)."""
    node = anchor_of(fused)
    x, dy, dw = node.input("image"), node.input("loss"), node.output("dw")
    assert x is not None and dy is not None and dw is not None
    if not (takes_runs(x, dy, dw) and wgrad_mma.takes_wgrad_mma(fused, x, dy, dw)):
        return []
    return [dict(choice) for choice in MMA_CANDIDATES]
