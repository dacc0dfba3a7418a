"""The depthwise and small-group forward on the tensor cores (16-bit operands, 2-d, NHWC).

A run of 8 channels (16 bytes) holds 8 / G whole groups (G = 1, 2, 4 or 8 channels a group),
and the run's output channels are the same 8: its part of the convolution is the GEMM
y[pixels, 8] = im2col[pixels, taps x 8] x W[taps x 8, 8], W block-diagonal in each tap (a
group's outputs read only its inputs; one block for G = 8, the zeros of the others cost only
tensor-core cycles). As mma.sync m16n8k16 tiles: 16 output pixels by the run's 8 output
channels, k = a pair of taps x 8 channels. A warp keeps one run's filter as B fragments in
registers, loaded once (lane (g, t): channels 2t, 2t + 1 of taps 2u and 2u + 1 for output
channel g), and takes its tiles' A fragments from the block's im2col tile with ldmatrix
(grouped_mma_tiles.py: the grid, the staging). The accumulators (pixels g, g + 8; channels
2t, 2t + 1) go through the fused epilogue.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.ops.conv import ConvMode

from ..context import EmitContext, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..indexing import index_type
from ..kernel import Kernel
from .gemm_epilogue import Epilogue
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .gemm_problem import Problem, declare
from .grouped_mma_tiles import (
    THREADS,
    TILE,
    Blocks,
    blocks_of,
    copies,
    declare_tile,
    fitting,
    matrix_row,
    steps,
    takes_mma_types,
    warp_roles,
)
from .tensor_core import mma_fragments

TILES, BLOCKS_PER_SM, STAGES = 2, 4, 1  # defaults


def takes_mma(p: Problem) -> bool:
    """16-bit operands whose run is 8 channels (the mma's n), a step of one tile a warp in shared memory."""
    return takes_mma_types(p.a, len(p.out.dim)) and _blocks(p, 1, BLOCKS_PER_SM, 1, 90) is not None


def _blocks(p: Problem, tiles: int, per_sm: int, stages: int, arch: int) -> Blocks | None:
    n, channels, out_h, out_w = p.out.static_dim
    return blocks_of(channels, math.prod(p.b.static_dim[2:]), n * out_h * out_w, tiles, per_sm, stages, arch)


def grouped_conv_mma_kernel(
    fused: FusedNode, ctx: EmitContext, p: Problem, tiles: int, per_sm: int, stages: int
) -> Kernel:
    params, names = declare(fused, p)
    aligned = params.aligned_flag()
    x, w, y = p.a, p.b, p.out
    element = cuda_type(x.data_type)
    n, channels, out_h, out_w = y.static_dim
    group, taps_h, taps_w = w.static_dim[1:]
    taps = taps_h * taps_w
    b = fitting(
        lambda t: _blocks(p, t, per_sm, stages, ctx.arch), tiles, stages, ctx.tuning, "grouped convolution", p.node.name
    )
    tiles = b.tiles
    pixels = n * out_h * out_w
    itype = index_type([*fused.inputs, *fused.outputs], b.steps * b.blocks * b.pixels * channels)
    a = p.attrs
    ws = w.static_stride
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    tap_r, tap_s = (
        (f"({taps_h - 1} - tap / {taps_w})", f"({taps_w - 1} - tap % {taps_w})")
        if flip
        else (
            f"tap / {taps_w}",
            f"tap % {taps_w}",
        )
    )
    pairs = b.taps // 2

    # The lane's B fragments: bw[u][j] packs the filter at tap 2u + j, channels 2t and 2t + 1,
    # output channel g of the warp's run: zero across groups and past the last tap.
    weights = [
        f"unsigned bw[{pairs}][2];",
        "#pragma unroll",
        f"for (int f = 0; f < {b.taps}; ++f) {{",
        f"  gd::Vec<{element}, 2> pair;",
        "  #pragma unroll",
        "  for (int e = 0; e < 2; ++e) {",
        "    const int tap = f, ci = 2 * t + e;",
        f"    pair.v[e] = live && tap < {taps} && ci / {group} == g / {group} ? "
        f"{names[w.id]}[(run * 8 + g) * {ws[0]} + ci % {group} * {ws[1]} + {tap_r} * {ws[2]} + {tap_s} * {ws[3]}] "
        f": {element}(0.0f);",
        "  }",
        "  bw[f / 2][f % 2] = *reinterpret_cast<const unsigned*>(pair.v);",
        "}",
    ]
    # ldmatrix: lanes 8m .. 8m + 7 give the rows of matrix m = (tap 2u + m / 2, pixels 8 (m % 2) ..).
    products = [
        f"float acc[{tiles}][4] = {{}};",
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        f"  const int px = (lead + i * {b.slots}) * {TILE} + lane / 8 % 2 * 8 + lane % 8;",
        "  #pragma unroll",
        f"  for (int u = 0; u < {pairs}; ++u) {{",
        "    unsigned frag[4];",
        f"    ldmatrix_x4({matrix_row(b, 'px', '2 * u + lane / 16')}, frag[0], frag[1], frag[2], frag[3]);",
        "    mma_16816(acc[i], frag, bw[u][0], bw[u][1]);",
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
        f"    const {itype} m = first + (lead + i * {b.slots}) * {TILE} + g + 8 * (e / 2);",
        f"    if (!live || m >= {pixels}) continue;",
        f"    const {itype} c3 = m % {out_w}, c2 = m / {out_w} % {out_h}, c0 = m / {out_w * out_h};",
        "    const int c1 = run * 8 + 2 * t + e % 2;",
        *("    " + line for line in epilogue),
        "  }",
        "}",
    ]
    body = [
        *warp_roles(b),
        "const int lead = live ? slot : 0;  // the warp's first tile of a step (idle warps read tile 0)",
        *weights,
        *declare_tile(b, taps),
        *steps(
            b,
            itype,
            lambda first, buffer: copies(
                b, x, names[x.id], a, (n, out_h, out_w), taps_w, taps, itype, aligned, first, buffer
            ),
            products + stores,
        ),
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_grouped_mma",
        params,
        THREADS,
        indent(body, 1),
        device_functions=ASYNC_COPY_PRELUDE + mma_fragments(x.data_type),
    )
    return Kernel(name, source, (b.blocks, b.chunks, 1), (THREADS, 1, 1), 0, tuple(params.bindings))
