"""The weight gradient of small-group convolutions on the tensor cores (16-bit NHWC, 2-d).

A run of 8 channels (16 bytes) holds 8 / G whole groups; its part of dw is, per tap, the
8 x 8 product dw[tap][ci][k] = sum over pixels of x[pixel at tap][ci] * dy[pixel][k], of which
the entries with ci and k in the same group are kept (all of them for G = 8). As an mma.sync
m16n8k16: M = a pair of taps x 8 ci, N = the run's 8 k, K = 16 output pixels.

The block stages each step's im2col tile and dy's chunks of the same pixels
(grouped_mma_tiles.py: the grid, the staging); a warp reads its run's fragments with
``ldmatrix .trans``, which turns the tile's [pixel][channel] rows into the [channel][pixel]
element pairs the mma's A rows (image) and B columns (dy) hold along K, and keeps its sums
(lane (g, t): taps 2u and 2u + 1 at channel g, output channels 2t and 2t + 1) over every step.
At the end the block adds its slots' sums in slot order through shared memory and writes one
partial per (run, tap, ci, k); a finalize kernel (direct_reduce's) adds the blocks' partials in
block order and writes the kept entries: results are reproducible run to run.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import store
from ..indexing import index_type, offset_at
from ..kernel import FusedProgram, Kernel, Scratch
from . import grouped_mma_tiles as staging
from .channel_runs import mma_choices
from .direct_common import anchor_of, compute_for, declare
from .direct_reduce import Sums, sums_kernels
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .grouped_mma_tiles import RUN, THREADS, TILE, Blocks
from .tensor_core import mma_fragments

TILES, BLOCKS_PER_SM, STAGES = 2, 4, 1  # defaults
PARTIALS = "conv_wgrad_mma_partials"


def takes_wgrad_mma(fused: FusedNode, x: Tensor, dy: Tensor, dw: Tensor) -> bool:
    """A 2-d filter over 16-bit runs of 8 channels, fp32 sums, a step of one tile a warp in
    shared memory (wgrad_runs' layout otherwise)."""
    return (
        staging.takes_mma_types(x, len(dw.dim))
        and compute_for(fused) == "float"
        and _blocks(x, dy, dw, 1, BLOCKS_PER_SM, 1, 90) is not None
    )


def _blocks(x: Tensor, dy: Tensor, dw: Tensor, tiles: int, per_sm: int, stages: int, arch: int) -> Blocks | None:
    pixels = dy.static_dim[0] * math.prod(dy.static_dim[2:])
    return staging.blocks_of(
        x.static_dim[1], math.prod(dw.static_dim[2:]), pixels, tiles, per_sm, stages, arch, extra_rows=1
    )


def choices(ctx: EmitContext, fused: FusedNode, x: Tensor, dy: Tensor, dw: Tensor) -> tuple[int, int, int] | None:
    """(``tiles``, ``blocks_per_sm``, ``stages``) where the tuning says ``mma``: 1 or, untuned, for 8
    channels a group (16-bit types); None for wgrad_runs' kernel (which takes the other choices)."""
    takes = takes_wgrad_mma(fused, x, dy, dw)
    name = anchor_of(fused).name
    return mma_choices(
        dict(ctx.tuning), "conv_wgrad", name, takes, dw.static_dim[1] == 8, (TILES, BLOCKS_PER_SM, STAGES)
    )


def emit_wgrad_mma(
    fused: FusedNode,
    ctx: EmitContext,
    x: Tensor,
    dy: Tensor,
    dw: Tensor,
    a: ConvAttributes,
    tiles: int,
    per_sm: int,
    stages: int,
) -> FusedProgram:
    b = staging.fitting(
        lambda t: _blocks(x, dy, dw, t, per_sm, stages, ctx.arch), tiles, stages, ctx.tuning, "conv_wgrad",
        anchor_of(fused).name,
    )  # fmt: skip
    taps = math.prod(dw.static_dim[2:])
    kernel = _sums(fused, ctx, x, dy, dw, a, b)
    finalize, _ = sums_kernels(ctx, fused, _totals(dw, a, b.blocks), "float")
    bytes_ = b.blocks * b.runs * taps * RUN * RUN * 4
    return FusedProgram(fused.name, (kernel, *finalize), (Scratch(PARTIALS, bytes_),))


def _sums(
    fused: FusedNode, ctx: EmitContext, x: Tensor, dy: Tensor, dw: Tensor, a: ConvAttributes, b: Blocks
) -> Kernel:
    taps_w = dw.static_dim[3]
    taps = math.prod(dw.static_dim[2:])
    pairs = b.taps // 2
    params = KernelParams()
    names = declare(params, [x, dy])
    partials = params.scratch(PARTIALS, "float")
    aligned = params.aligned_flag()
    itype = index_type([x, dy], b.steps * b.blocks * b.pixels * x.static_dim[1], b.blocks * b.runs * taps * 64)
    # ldmatrix .trans: lanes 8m .. 8m + 7 give the rows of matrix m: dy's at pixels 8 (m % 2) ..
    # (b0, b1); the image's at tap 2u + m % 2, pixels 8 (m / 2) .. (A's registers in order).
    products = [
        "#pragma unroll",
        f"for (int i = 0; i < {b.tiles}; ++i) {{",
        f"  const int first_px = (lead + i * {b.slots}) * {TILE};",
        "  unsigned loss[4];",
        f"  ldmatrix_x4_trans({staging.matrix_row(b, 'first_px + lane / 8 % 2 * 8 + lane % 8', str(b.taps))}, "
        "loss[0], loss[1], loss[2], loss[3]);",
        "  const int px = first_px + lane / 16 * 8 + lane % 8;",
        "  #pragma unroll",
        f"  for (int u = 0; u < {pairs}; ++u) {{",
        "    unsigned frag[4];",
        f"    ldmatrix_x4_trans({staging.matrix_row(b, 'px', '2 * u + lane / 8 % 2')}, frag[0], frag[1], frag[2], frag[3]);",
        "    mma_16816(acc[u], frag, loss[0], loss[1]);",
        "  }",
        "}",
    ]
    out = (dy.static_dim[0], dy.static_dim[2], dy.static_dim[3])
    body = [
        *staging.warp_roles(b),
        "const int lead = live ? slot : 0;  // the warp's first tile of a step (idle warps read tile 0)",
        f"float acc[{pairs}][4] = {{}};",
        *staging.declare_tile(b, taps),
        *staging.steps(
            b,
            itype,
            lambda first, buffer: staging.copies(
                b, x, names[x.id], a, out, taps_w, taps, itype, aligned, first, buffer, loss=(dy, names[dy.id])
            ),
            products,
        ),
        "__syncthreads();  // the last step's reads of the tile, which now holds the block's sums",
        "float* const red = reinterpret_cast<float*>(tile);  // [warp][register][lane]",
        "#pragma unroll",
        f"for (int u = 0; u < {pairs}; ++u) {{",
        "  __syncthreads();",
        "  #pragma unroll",
        "  for (int e = 0; e < 4; ++e) red[(warp * 4 + e) * 32 + lane] = acc[u][e];",
        "  __syncthreads();",
        f"  for (int i = threadIdx.x; i < {b.width * 128}; i += {THREADS}) {{",
        f"    const int l = i % 32, e = i / 32 % 4, w = i / 128, r = blockIdx.y * {b.width} + w;",
        "    const int tap = 2 * u + e / 2, ci = l / 4, k = 2 * (l % 4) + e % 2;",
        f"    if (r >= {b.runs} || tap >= {taps}) continue;",
        "    float total = 0.0f;",
        "    #pragma unroll",
        f"    for (int s = 0; s < {b.slots}; ++s) total += red[((s * {b.width} + w) * 4 + e) * 32 + l];",
        f"    {partials}[((({itype})blockIdx.x * {b.runs} + r) * {taps} + tap) * 64 + ci * 8 + k] = total;",
        "  }",
        "}",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        "conv_wgrad_mma",
        params,
        THREADS,
        indent(body, 1),
        device_functions=ASYNC_COPY_PRELUDE + mma_fragments(x.data_type),
    )
    return Kernel(name, source, (b.blocks, b.chunks, 1), (THREADS, 1, 1), 0, tuple(params.bindings))


def _totals(dw: Tensor, a: ConvAttributes, blocks: int) -> Sums:
    """The partials as a sum over (block, run, tap, ci x 8 + k): the blocks reduced; the
    entries whose ci and k share a group are dw's."""
    runs, group, taps_h, taps_w = dw.static_dim[0] // RUN, *dw.static_dim[1:]
    dims = (blocks, runs, taps_h * taps_w, RUN * RUN)

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        partials = params.scratch(PARTIALS, "float")
        return [], [f"{partials}[((c0 * {runs} + c1) * {dims[2]} + c2) * 64 + c3]"]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        flip = a.convolution_mode is ConvMode.CONVOLUTION
        r, s = f"c2 / {taps_w}", f"c2 % {taps_w}"
        if flip:
            r, s = f"({taps_h - 1} - {r})", f"({taps_w - 1} - {s})"
        at = offset_at(dw, ["c1 * 8 + c3 % 8", f"c3 / 8 % {group}", r, s])
        return [
            f"if (c3 / 8 / {group} == c3 % 8 / {group}) "
            f"{params.tensor(dw, writable=True)}[{at}] = {store(dw.data_type, totals[0])};"
        ]

    return Sums("conv_wgrad_mma_total", dims, (1, 2, 3), (0,), False, terms, finish, min_split=blocks + 1)
