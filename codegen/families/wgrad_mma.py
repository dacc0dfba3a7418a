"""The weight gradient of small-group convolutions on the tensor cores (16-bit NHWC, 2-d).

A run of 8 channels (16 bytes) holds 8 / G whole groups; its part of dw is, per tap, the
8 x 8 product dw[tap][ci][k] = sum over pixels of x[pixel at tap][ci] * dy[pixel][k], of which
the entries with ci and k in the same group are kept (all of them for G = 8). As an mma.sync
m16n8k16: M = 2 taps x 8 ci, N = the run's 8 k, K = 16 output pixels.

A warp keeps one run and walks a contiguous range of 16-pixel tiles. Lane (g, t) (g = lane / 4,
t = lane % 4) loads word t (channels 2t, 2t + 1) of pixels g and g + 8 of the tile, of dy and of
the image at each tap: an 8 x 8 matrix [pixel][channel] in fragment layout per half tile, which
one ``movmatrix`` transposes into [channel][pixel], the layout of the mma's A rows (image) and
B columns (dy), whose pairs of elements run along K (pixels). A 3x3 filter takes 5 mmas a tile
(taps in pairs, the tenth tap zero).

A block's 8 warps take 8 consecutive runs (fewer runs: several warps a run, *slots*, each its
own range); at the end it adds its slots' sums in slot order through shared memory and writes
one partial per (run, tap, ci, k); a finalize kernel (direct_reduce's) adds the blocks'
partials in block order and writes the kept entries: results are reproducible run to run.
Every warp of a block walks the same number of tiles (pixels past the last are zeros), as the
CPU emulation's mma and movmatrix stand-ins need. Where the runtime's ``aligned`` flag is 0
the words are read element by element.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import cuda_type, store
from ..indexing import index_type, offset_at
from ..kernel import FusedProgram, Kernel, Scratch
from .attention_decode_mma import TRANSPOSE
from .channel_runs import mma_choices, run_width
from .direct_common import THREADS, anchor_of, compute_for, declare
from .direct_reduce import Sums, sums_kernels
from .tensor_core import TENSOR_CORE_TYPES, mma_fragments

WARPS = THREADS // 32
TILE = 16  # output pixels of an mma tile (its K)
RUN = 8  # channels of a run: the mma's n
TILES, BLOCKS_PER_SM = 2, 2  # defaults
PARTIALS = "conv_wgrad_mma_partials"


def takes_wgrad_mma(fused: FusedNode, x: Tensor, dw: Tensor) -> bool:
    """A 2-d filter over 16-bit runs of 8 channels, fp32 sums (wgrad_runs' layout otherwise)."""
    return (
        len(dw.dim) == 4
        and x.data_type in TENSOR_CORE_TYPES
        and run_width(x.data_type) == RUN
        and compute_for(fused) == "float"
    )


def choices(ctx: EmitContext, fused: FusedNode, x: Tensor, dw: Tensor) -> tuple[int, int] | None:
    """(``tiles``, ``blocks_per_sm``) where the tuning says ``mma``: 1 or, untuned, for 8
    channels a group (16-bit types); None for wgrad_runs' kernel (which takes the other choices)."""
    takes = takes_wgrad_mma(fused, x, dw)
    name = anchor_of(fused).name
    return mma_choices(dict(ctx.tuning), "conv_wgrad", name, takes, dw.static_dim[1] == 8, (TILES, BLOCKS_PER_SM))


def emit_wgrad_mma(
    fused: FusedNode, ctx: EmitContext, x: Tensor, dy: Tensor, dw: Tensor, a: ConvAttributes, tiles: int, per_sm: int
) -> FusedProgram:
    runs = dw.static_dim[0] // RUN
    taps = math.prod(dw.static_dim[2:])
    width = min(WARPS, runs)  # runs a block
    slots = WARPS // width
    chunks = -(-runs // width)
    pixels = dy.static_dim[0] * math.prod(dy.static_dim[2:])
    tiles_total = -(-pixels // TILE)
    blocks = max(1, min(sm_count(ctx.arch) * per_sm // chunks, -(-tiles_total // (slots * tiles))))
    per_slot = -(-tiles_total // (blocks * slots * tiles)) * tiles  # tiles a warp walks
    blocks = -(-tiles_total // (per_slot * slots))
    kernel = _sums(fused, ctx, x, dy, dw, a, (blocks, chunks), width, slots, per_slot, tiles)
    finalize, _ = sums_kernels(ctx, fused, _totals(dw, a, blocks), "float")
    bytes_ = blocks * runs * taps * RUN * RUN * 4
    return FusedProgram(fused.name, (kernel, *finalize), (Scratch(PARTIALS, bytes_),))


def _sums(
    fused: FusedNode,
    ctx: EmitContext,
    x: Tensor,
    dy: Tensor,
    dw: Tensor,
    a: ConvAttributes,
    grid: tuple[int, int],
    width: int,
    slots: int,
    per_slot: int,
    tiles: int,
) -> Kernel:
    element = cuda_type(x.data_type)
    runs = x.static_dim[1] // RUN
    out_h, out_w = dy.static_dim[2:]
    taps_h, taps_w = dw.static_dim[2:]
    taps = taps_h * taps_w
    pairs = -(-taps // 2)
    pixels = dy.static_dim[0] * out_h * out_w
    params = KernelParams()
    names = declare(params, [x, dy])
    partials = params.scratch(PARTIALS, "float")
    aligned = params.aligned_flag()
    itype = index_type([x, dy], grid[0] * slots * per_slot * TILE, grid[0] * runs * taps * RUN * RUN)

    def word(to: str, at: str, inside: str) -> list[str]:
        """Channels 2t, 2t + 1 at ``at`` into ``to`` (0 outside)."""
        return [
            f"if ({inside} && {aligned}) {to} = *reinterpret_cast<const unsigned*>({at});",
            "else {",
            f"  gd::Vec<{element}, 2> pair;",
            f"  pair.v[0] = {inside} ? ({at})[0] : {element}(0.0f);",
            f"  pair.v[1] = {inside} ? ({at})[1] : {element}(0.0f);",
            f"  {to} = *reinterpret_cast<const unsigned*>(pair.v);",
            "}",
        ]

    image_at = offset_at(x, ["n", "run * 8 + 2 * t", "hi", "wi"])

    def at_tap(tap: int) -> list[str]:
        r, s = tap // taps_w, tap % taps_w
        return [
            "{",
            f"  const {itype} hi = h0 + {r * a.dilation[0]}, wi = w0 + {s * a.dilation[1]};",
            *(
                "  " + line
                for line in word(
                    f"image[i][half][{tap}]",
                    f"{names[x.id]} + ({image_at})",
                    f"(ok && hi >= 0 && hi < {x.static_dim[2]} && wi >= 0 && wi < {x.static_dim[3]})",
                )
            ),
            "}",
        ]

    loads = [
        f"unsigned loss[{tiles}][2], image[{tiles}][2][{2 * pairs}];",
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        "  #pragma unroll",
        "  for (int half = 0; half < 2; ++half) {",
        f"    const {itype} m = first + (it + i) * {TILE} + 8 * half + g;",
        f"    const bool ok = live && m < {pixels};",
        f"    const {itype} q = m % {out_w}, p = m / {out_w} % {out_h}, n = m / {out_w * out_h};",
        f"    const {itype} h0 = p * {a.stride[0]} - {a.pre_padding[0]}, w0 = q * {a.stride[1]} - {a.pre_padding[1]};",
        *(
            "    " + line
            for line in word(
                "loss[i][half]", f"{names[dy.id]} + ({offset_at(dy, ['n', 'run * 8 + 2 * t', 'p', 'q'])})", "ok"
            )
        ),
        *("    " + line for tap in range(taps) for line in at_tap(tap)),
        *(f"    image[i][half][{taps}] = 0;" for _ in range(taps % 2)),
        "  }",
        "}",
    ]
    products = [
        "#pragma unroll",
        f"for (int i = 0; i < {tiles}; ++i) {{",
        "  #pragma unroll",
        "  for (int half = 0; half < 2; ++half) {",
        "    loss[i][half] = transpose8x8(loss[i][half]);",
        "    #pragma unroll",
        f"    for (int f = 0; f < {taps}; ++f) image[i][half][f] = transpose8x8(image[i][half][f]);",
        "  }",
        "  #pragma unroll",
        f"  for (int u = 0; u < {pairs}; ++u) {{",
        "    const unsigned frag[4] = {image[i][0][2 * u], image[i][0][2 * u + 1], image[i][1][2 * u], "
        "image[i][1][2 * u + 1]};",
        "    mma_16816(acc[u], frag, loss[i][0], loss[i][1]);",
        "  }",
        "}",
    ]
    values = pairs * 4
    body = [
        "const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = threadIdx.x / 32;",
        f"const int slot = warp / {width}, run = blockIdx.y * {width} + warp % {width};",
        f"const bool live = slot < {slots} && run < {runs};",
        f"const {itype} first = (({itype})blockIdx.x * {slots} + slot) * {per_slot * TILE};",
        f"float acc[{pairs}][4] = {{}};",
        "#pragma unroll 1",
        f"for (int it = 0; it < {per_slot}; it += {tiles}) {{",
        *("  " + line for line in loads),
        *("  " + line for line in products),
        "}",
        f"__shared__ float red[{WARPS}][{values}][32];  // [warp][(pair, register)][lane]",
        "#pragma unroll",
        f"for (int v = 0; v < {values}; ++v) red[warp][v][lane] = acc[v / 4][v % 4];",
        "__syncthreads();",
        f"for (int e = threadIdx.x; e < {width * values * 32}; e += {THREADS}) {{",
        f"  const int l = e % 32, v = e / 32 % {values}, w = e / {32 * values}, r = blockIdx.y * {width} + w;",
        "  const int tap = 2 * (v / 4) + v % 4 / 2, ci = l / 4, k = 2 * (l % 4) + v % 2;",
        f"  if (r >= {runs} || tap >= {taps}) continue;",
        "  float total = 0.0f;",
        "  #pragma unroll",
        f"  for (int s = 0; s < {slots}; ++s) total += red[s * {width} + w][v][l];",
        f"  {partials}[((({itype})blockIdx.x * {runs} + r) * {taps} + tap) * 64 + ci * 8 + k] = total;",
        "}",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        "conv_wgrad_mma",
        params,
        THREADS,
        indent(body, 1),
        device_functions=mma_fragments(x.data_type) + TRANSPOSE,
    )
    return Kernel(name, source, (grid[0], grid[1], 1), (THREADS, 1, 1), 0, tuple(params.bindings))


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
