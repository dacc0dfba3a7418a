"""The depthwise and small-group forward on the tensor cores (16-bit operands, 2-d, NHWC).

A run of 8 channels (16 bytes) holds 8 / G whole groups (G = 1, 2, 4 or 8 channels a group),
and the run's output channels are the same 8: its part of the convolution is the GEMM
y[pixels, 8] = im2col[pixels, taps x 8] x W[taps x 8, 8], W block-diagonal in each tap (a
group's outputs read only its inputs; one block for G = 8, the zeros of the others cost only
tensor-core cycles). One warp keeps one run: its filter as mma.sync m16n8k16 B fragments in
registers, loaded once, and it walks tiles of 16 output pixels (``tiles`` of them a step).

Each k16 step takes 4 channels of 4 taps: lane (g, t) of a warp (g = lane / 4, t = lane % 4)
loads, for output pixels g and g + 8 of the tile, the run's 16-byte vector at tap 4Q + t
(zeros outside the image and past the last tap); its words 0-1 are its A registers of step
(Q, 0), words 2-3 those of step (Q, 1): A's columns 2t, 2t + 1, 2t + 8, 2t + 9 are channels
4h .. 4h + 3 of tap 4Q + t, and the lane's B registers hold the filter at the same
(tap, channel) rows for output channel g. A 3x3 filter takes 3 tap quads (6 steps).
The accumulators (rows g, g + 8; channels 2t, 2t + 1) go through the fused epilogue.

The grid is resident: its warps are a multiple of the runs, so that warp w keeps run
w % runs for every tile it takes. Every warp of a block takes the same number of steps (a
tile past the last pixel loads and stores nothing), as the CPU emulation's mma stand-in needs.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.ops.conv import ConvMode

from ..context import EmitContext, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..indexing import index_type
from ..kernel import Kernel
from .channel_runs import run_width
from .gemm_epilogue import Epilogue
from .gemm_problem import Problem, declare
from .tensor_core import TENSOR_CORE_TYPES, mma_fragments

THREADS = 256
WARPS = THREADS // 32
TILE = 16  # output pixels of an mma tile
QUAD = 4  # taps of a k16 step pair (a lane each)
TILES, BLOCKS_PER_SM = 2, 4  # defaults


def takes_mma(p: Problem) -> bool:
    """16-bit operands whose run is 8 channels (the mma's n)."""
    return p.a.data_type in TENSOR_CORE_TYPES and run_width(p.a.data_type) == 8


def grouped_conv_mma_kernel(fused: FusedNode, ctx: EmitContext, p: Problem, tiles: int, per_sm: int) -> Kernel:
    params, names = declare(fused, p)
    aligned = params.aligned_flag()
    x, w, y = p.a, p.b, p.out
    element = cuda_type(x.data_type)
    n, channels, out_h, out_w = y.static_dim
    group, taps_h, taps_w = w.static_dim[1:]
    taps = taps_h * taps_w
    quads = -(-taps // QUAD)
    runs = channels // 8
    pixels = n * out_h * out_w
    steps_total = -(-pixels // (TILE * tiles))  # warp steps of `tiles` tiles
    unit = runs // math.gcd(runs, WARPS)  # blocks whose warps are a multiple of the runs
    wanted = max(unit, sm_count(ctx.arch) * per_sm // unit * unit)
    blocks = min(wanted, -(-steps_total * runs // (WARPS * unit)) * unit)
    stride = blocks * WARPS // runs  # warps per run: the tile steps each run's warps share
    iterations = -(-steps_total // stride)
    itype = index_type([*fused.inputs, *fused.outputs], iterations * stride * tiles * TILE * channels)
    a = p.attrs
    xs, ws = x.static_stride, w.static_stride
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    tap_r, tap_s = (f"({taps_h - 1} - tr)", f"({taps_w - 1} - ts)") if flip else ("tr", "ts")
    zero = "0.0f"

    # The lane's B fragments: b[Q][h][j] packs filter rows (tap 4Q + t, channel 4h + 2j, +1) of
    # output channel g, zero across groups and past the last tap.
    weights = [
        f"unsigned b[{quads}][2][2];",
        "#pragma unroll",
        f"for (int qd = 0; qd < {quads}; ++qd) {{",
        f"  const int tap = qd * {QUAD} + t, tr = tap / {taps_w}, ts = tap % {taps_w};",
        "  #pragma unroll",
        "  for (int h = 0; h < 4; ++h) {",
        f"    gd::Vec<{element}, 2> pair;",
        "    #pragma unroll",
        "    for (int e = 0; e < 2; ++e) {",
        "      const int ci = 2 * h + e;",
        f"      pair.v[e] = tap < {taps} && ci / {group} == g / {group} ? "
        f"{names[w.id]}[(run * 8 + g) * {ws[0]} + ci % {group} * {ws[1]} + {tap_r} * {ws[2]} + {tap_s} * {ws[3]}] "
        f": {element}({zero});",
        "    }",
        "    b[qd][h / 2][h % 2] = *reinterpret_cast<const unsigned*>(pair.v);",
        "  }",
        "}",
    ]
    # Per tile row: the pixel's coordinates, then its run's vector at the lane's tap of each quad.
    loads = [
        f"unsigned image[{tiles}][2][{quads}][4];",
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        "  #pragma unroll",
        "  for (int half = 0; half < 2; ++half) {",
        f"    const {itype} m = (step * {tiles} + i) * {TILE} + g + 8 * half;",
        f"    const {itype} q = m % {out_w}, pq = m / {out_w};",
        f"    const {itype} h0 = pq % {out_h} * {a.stride[0]} - {a.pre_padding[0]};",
        f"    const {itype} w0 = q * {a.stride[1]} - {a.pre_padding[1]};",
        f"    const {element}* pixel = {names[x.id]} + pq / {out_h} * {xs[0]} + run * 8;",
        "    #pragma unroll",
        f"    for (int qd = 0; qd < {quads}; ++qd) {{",
        f"      const {itype} hi = h0 + tap_r[qd] * {a.dilation[0]}, wi = w0 + tap_s[qd] * {a.dilation[1]};",
        f"      const bool inside = m < {pixels} && tap_ok[qd] && hi >= 0 && hi < {x.static_dim[2]} "
        f"&& wi >= 0 && wi < {x.static_dim[3]};",
        f"      gd::Vec<{element}, 8> v;",
        f"      const {element}* at = pixel + hi * {xs[2]} + wi * {xs[3]};",
        f"      if (inside && {aligned}) v = gd::load_vec<{element}, 8>(at);",
        "      else {",
        "        #pragma unroll",
        f"        for (int j = 0; j < 8; ++j) v.v[j] = inside ? at[j] : {element}({zero});",
        "      }",
        "      #pragma unroll",
        "      for (int j = 0; j < 4; ++j) image[i][half][qd][j] = reinterpret_cast<const unsigned*>(v.v)[j];",
        "    }",
        "  }",
        "}",
    ]
    products = [
        f"float acc[{tiles}][4] = {{}};",
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        "  #pragma unroll",
        f"  for (int qd = 0; qd < {quads}; ++qd) {{",
        "    #pragma unroll",
        "    for (int h = 0; h < 2; ++h) {",
        "      const unsigned frag[4] = {image[i][0][qd][2 * h], image[i][1][qd][2 * h], "
        "image[i][0][qd][2 * h + 1], image[i][1][qd][2 * h + 1]};",
        "      mma_16816(acc[i], frag, b[qd][h][0], b[qd][h][1]);",
        "    }",
        "  }",
        "}",
    ]
    compute = compute_of([x, w, *fused.outputs])
    epilogue = Epilogue(fused, p, names, compute).statements(f"({compute})acc[i][e]")
    stores = [
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        "  #pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        f"    const {itype} m = (step * {tiles} + i) * {TILE} + g + 8 * (e / 2);",
        f"    if (m >= {pixels}) continue;",
        f"    const {itype} c3 = m % {out_w}, c2 = m / {out_w} % {out_h}, c0 = m / {out_w * out_h};",
        f"    const {itype} c1 = run * 8 + 2 * t + e % 2;",
        *("    " + line for line in epilogue),
        "  }",
        "}",
    ]
    body = [
        "const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;",
        f"const int warp = blockIdx.x * {WARPS} + threadIdx.x / 32;",
        f"const int run = warp % {runs};  // the warp's 8 channels",
        *weights,
        f"int tap_r[{quads}], tap_s[{quads}];",
        f"bool tap_ok[{quads}];",
        "#pragma unroll",
        f"for (int qd = 0; qd < {quads}; ++qd) {{",
        f"  const int tap = qd * {QUAD} + t;",
        f"  tap_ok[qd] = tap < {taps};",
        f"  tap_r[qd] = tap / {taps_w};",
        f"  tap_s[qd] = tap % {taps_w};",
        "}",
        "#pragma unroll 1",
        f"for (int it = 0; it < {iterations}; ++it) {{",
        f"  const {itype} step = ({itype})it * {stride} + warp / {runs};  // the warp's tiles",
        *("  " + line for line in loads),
        *("  " + line for line in products),
        *("  " + line for line in stores),
        "}",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_grouped_mma",
        params,
        THREADS,
        indent(body, 1),
        device_functions=mma_fragments(x.data_type),
    )
    return Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))
