"""The gradients of depthwise and small-group convolutions in NHWC, over runs of channels.

With as many output channels as input channels in groups of G dividing a 16-byte run of
VEC channels (G = 1: depthwise), a run of channels of dy reads the same run of channels of
x and dx (the groups line up), so both gradients read 16 bytes at a time.

The weight gradient is wgrad_runs.py's.

The data gradient (2-d): dx[n, c, h] sums dy[n, k, p] * w[k, c - group(c) * G, tap] over the
taps and the G output channels k of c's group, p = (h + pad - tap * dilation) / stride where
that divides. A thread takes a run of VEC dx channels of one pixel; each block first stages
the filter in shared memory as [tap][kk][c] = w[group(c) * G + kk, c % G, tap], so that at a
tap the run reads one vector of dy and G vectors of the filter (direct_conv's one-element
kernel reads G elements of each per dx element).
"""

from __future__ import annotations

from collections.abc import Callable

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, load, store
from ..indexing import offset_at
from ..kernel import FusedProgram
from .channel_runs import lines_up, resident_grid, run_width, staged_filter, stages
from .direct_common import THREADS, compute_for, declare, first_thread, loop_index_type, make_kernel


def takes_runs(image: Tensor, loss: Tensor, filter: Tensor) -> bool:
    """channel_runs.lines_up, the loss (dy) of the image's type laid out like it."""
    return (
        lines_up(image, filter)
        and not loss.symbols
        and loss.data_type is image.data_type
        and loss.static_stride[1] == 1
        and all(s % run_width(loss.data_type) == 0 for axis, s in enumerate(loss.static_stride) if axis != 1)
    )


def takes_dgrad_runs(dy: Tensor, w: Tensor, dx: Tensor) -> bool:
    """takes_runs, 2-d, the filter of dx's type and small enough to stage."""
    return len(dx.dim) == 4 and takes_runs(dx, dy, w) and w.data_type is dx.data_type and stages(w)


def emit_dgrad_runs(
    fused: FusedNode, ctx: EmitContext, dy: Tensor, w: Tensor, dx: Tensor, a: ConvAttributes
) -> FusedProgram:
    params = KernelParams()
    names = declare(params, [dy, w])
    out = params.tensor(dx, writable=True)
    aligned = params.aligned_flag()
    compute = compute_for(fused)
    element = cuda_type(dy.data_type)
    vec = run_width(dy.data_type)
    n, channels, height, width = dx.static_dim
    group, taps_h, taps_w = w.static_dim[1:]
    runs = n * height * width * (channels // vec)
    blocks = resident_grid(runs, THREADS, ctx.arch)
    itype = loop_index_type([dy, w, dx], runs * vec)
    ys, ws = dy.static_stride, w.static_stride
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    tap_r, tap_s = (f"({taps_h - 1} - r)", f"({taps_w - 1} - s)") if flip else ("r", "s")

    def products(read: Callable[[str], str]) -> list[str]:
        """dx channel j of the run sums dy channel (j / G) * G + kk of the run times the staged
        filter's (tap, kk) vector at j."""
        at = f"(({tap_r} * {taps_w} + {tap_s}) * {group} + kk) * {channels} + cb * {vec}"
        return [
            "#pragma unroll",
            f"for (int kk = 0; kk < {group}; ++kk) {{",
            f"  const gd::Vec<{element}, {vec}> taps = gd::load_vec<{element}, {vec}>(filter + {at});",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) "
            f"acc[j] += {read(f'j / {group} * {group} + kk')} * gd::element<{compute}>(taps, j);",
            "}",
        ]

    def reach(axis: int, loop: str, coordinate: str, bound: int) -> list[str]:
        s, dilation, pre = a.stride[axis], a.dilation[axis], a.pre_padding[axis]
        return [
            f"const {itype} reach{loop} = {coordinate} + {pre} - {loop} * {dilation};  // p * stride",
            f"if (reach{loop} < 0{f' || reach{loop} % {s} != 0' if s > 1 else ''}) continue;",
            f"const {itype} p{loop} = reach{loop} / {s};",
            f"if (p{loop} >= {bound}) continue;",
        ]

    body = [
        *staged_filter(
            element,
            w.static_numel,
            f"c = i % {channels}, kk = i / {channels} % {group}, t = i / {channels * group}",
            f"{names[w.id]}[(c / {group} * {group} + kk) * {ws[0]} + c % {group} * {ws[1]} "
            f"+ t / {taps_w} * {ws[2]} + t % {taps_w} * {ws[3]}]",
            "  // [tap][kk][c]",
        ),
        f"for ({itype} e = {first_thread(itype)}; e < {runs}; e += ({itype})gridDim.x * blockDim.x) {{",
        f"  const {itype} cb = e % {channels // vec};  // the run of channels",
        f"  const {itype} pixel = e / {channels // vec};",
        f"  const {itype} c3 = pixel % {width};",
        f"  const {itype} c2 = pixel / {width} % {height};",
        f"  const {itype} c0 = pixel / {width * height};",
        f"  {compute} acc[{vec}] = {{}};",
        "  #pragma unroll",
        f"  for (int r = 0; r < {taps_h}; ++r) {{",
        *("    " + line for line in reach(0, "r", "c2", dy.static_dim[2])),
        "    #pragma unroll",
        f"    for (int s = 0; s < {taps_w}; ++s) {{",
        *("      " + line for line in reach(1, "s", "c3", dy.static_dim[3])),
        f"      const {element}* losses = {names[dy.id]} + c0 * {ys[0]} + pr * {ys[2]} + ps * {ys[3]} + cb * {vec};",
        f"      if ({aligned}) {{",
        f"        const gd::Vec<{element}, {vec}> loss = gd::load_vec<{element}, {vec}>(losses);",
        *("        " + line for line in products(lambda i: f"gd::element<{compute}>(loss, {i})")),
        "      } else {",
        *("        " + line for line in products(lambda i: load(dy.data_type, f"losses[{i}]", compute))),
        "      }",
        "    }",
        "  }",
        "  #pragma unroll",
        f"  for (int j = 0; j < {vec}; ++j) "
        f"{out}[{offset_at(dx, ['c0', f'cb * {vec} + j', 'c2', 'c3'])}] = {store(dx.data_type, 'acc[j]')};",
        "}",
    ]
    kernel = make_kernel(ctx, fused, "conv_dgrad_runs", params, body, (blocks, 1, 1))
    return FusedProgram(fused.name, (kernel,))
