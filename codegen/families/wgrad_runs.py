"""The weight gradient of depthwise and small-group convolutions in NHWC: a thread per run of
channels and its taps, walking a contiguous range of pixels.

dw[k, ci, f] sums dy[n, p, k] * x[n, p * s + f * l - a, group(k) * G + ci] over the pixels
(n, p). A thread keeps a run of VEC output channels k, one ci and its taps (all of them where
VEC x taps accumulators fit, else the taps of the last spatial dims: the others are split over
threads as *bands*). At each pixel it reads the run of dy once (one vector) and, per tap, the
image elements the run's groups read (one vector for depthwise, VEC / G elements otherwise),
and adds VEC products per tap. Its pixels are a contiguous range in (n, p...) order walked with
counters: no division per pixel (the first kernel over runs, direct_reduce's, divided (n, p)
out for every pixel, and re-read dy once per tap).

With the tuning choice ``whole_groups`` a thread takes every ci of its run's groups instead of
one: one image vector a tap feeds VEC x G products (G elements a tap feed VEC otherwise).
``prefetch`` loads the next pixel before this one's products; ``window`` copies, for a pixel
after another of its row, the image columns the previous one read at the taps they share.

A block holds SLOTS x WIDTH threads: WIDTH consecutive kept indices (ci innermost, then the run,
then the band: a warp reads consecutive channels) times SLOTS pixel ranges; blockIdx.y takes the
next WIDTH kept indices. At the end each block adds its slots' sums in slot order through shared
memory and writes one partial per dw element; a finalize kernel (direct_reduce's columns
layout) adds the blocks' partials in block order: results are reproducible run to run.
Where the runtime's ``aligned`` flag is 0 the vectors are read element by element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import coordinates, index_type, offset_at
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal
from .channel_runs import run_width
from .direct_common import THREADS, anchor_of, compute_for, declare, make_kernel
from .direct_reduce import Sums, sums_kernels

# Defaults, measured on an H200 (benchmarks/RESULTS.md, "depthwise and grouped wgrad"): a thread
# of several channels a group owns all of a 3x3 run's taps (72 sums: dy is read once for 72
# products), a depthwise thread a row of taps (24 sums: 4 blocks of 64 registers per SM).
MAX_ACCUMULATORS = 72  # per thread: VEC x owned taps, G > 1
DEPTHWISE_ACCUMULATORS = 56  # G = 1: a bf16 row of 3, 5 or 7 taps
FEW_ACCUMULATORS = 32  # at most this many: 4 blocks per SM, else 2
MAX_WIDTH = 32  # kept indices per block: more slots per block, fewer partials to finalize
MIN_PIXELS = 16  # fewest pixels per slot
PREFETCH = 0  # pixels loaded ahead of the products (0 or 1): 1 was slower everywhere (registers)
WINDOW = 0  # reuse the previous pixel's image columns where the walked dim's stride allows (0 or 1)
WHOLE_GROUPS = 0  # 1: a thread takes every ci of its run's groups (one image vector a tap) instead of one
CHOICES = frozenset({"owned_dims", "width", "blocks_per_sm", "prefetch", "window", "whole_groups"})
PARTIALS = "conv_wgrad_runs_partials"


@dataclass(frozen=True)
class Layout:
    """``owned`` trailing tap dims per thread; WIDTH kept indices times SLOTS ranges of
    ``pixels`` pixels per block; a grid of ``blocks`` x ``chunks``."""

    owned: int
    width: int
    slots: int
    chunks: int
    blocks: int
    pixels: int
    resident: int  # blocks per SM the registers must allow
    prefetch: int
    window: int
    cis: int  # input channels of the groups per thread: 1, or G (whole groups)
    kept: int  # kept indices: (band, run, ci) or (band, run)
    sums: int  # a thread's sums per output channel of its run: owned taps x cis


def layout(
    dy: Tensor, dw: Tensor, a: ConvAttributes, vec: int, arch: int, tuning: dict[str, object], node: str = ""
) -> Layout:
    """The default owns the most trailing tap dims whose accumulators fit MAX_ACCUMULATORS
    (DEPTHWISE_ACCUMULATORS for G = 1); ``node`` names the conv_wgrad in errors."""
    unknown = set(tuning) - CHOICES
    if unknown:
        raise UnsupportedError(
            f"conv_wgrad runs tuning {tuning}: unknown {sorted(unknown)} (choices {sorted(CHOICES)})", node=node
        )

    def _choice(tuning: dict[str, object], name: str, default: int, low: int, high: int) -> int:
        value = tuning.get(name, default)
        if not isinstance(value, int) or not low <= value <= high:
            raise UnsupportedError(
                f"conv_wgrad runs tuning {tuning}: {name} must be an integer in {low}..{high}", node=node
            )
        return value

    taps = dw.static_dim[2:]
    most = MAX_ACCUMULATORS if dw.static_dim[1] > 1 else DEPTHWISE_ACCUMULATORS
    cis = dw.static_dim[1] if _choice(tuning, "whole_groups", WHOLE_GROUPS, 0, 1) else 1
    fitting = max(d for d in range(len(taps) + 1) if vec * cis * math.prod(taps[len(taps) - d :]) <= most)
    owned = _choice(tuning, "owned_dims", fitting, 0, len(taps))
    sums = math.prod(taps[len(taps) - owned :]) * cis
    accumulators = vec * sums
    kept = math.prod(taps[: len(taps) - owned]) * (dw.static_dim[0] // vec) * dw.static_dim[1] // cis
    chunks = -(-kept // _choice(tuning, "width", MAX_WIDTH, 1, THREADS))
    width = -(-kept // chunks)
    slots = THREADS // width
    pixels = dy.static_dim[0] * math.prod(dy.static_dim[2:])
    wanted = -(-pixels // (MIN_PIXELS * slots))
    resident = _choice(tuning, "blocks_per_sm", 4 if accumulators <= FEW_ACCUMULATORS else 2, 1, 8)
    per_slot = -(-pixels // (max(1, min(wanted, sm_count(arch) * resident // chunks)) * slots))
    prefetch = _choice(tuning, "prefetch", PREFETCH, 0, 1)
    # A window needs the walked dim's taps owned and its stride a multiple of its dilation (the
    # next pixel's tap s is this one's tap s + stride / dilation).
    stride, dilation = a.stride[-1], a.dilation[-1]
    windows = owned >= 1 and stride % dilation == 0 and stride // dilation < taps[-1]
    window = _choice(tuning, "window", WINDOW if windows else 0, 0, 1 if windows else 0)
    blocks = -(-pixels // (per_slot * slots))
    return Layout(owned, width, slots, chunks, blocks, per_slot, resident, prefetch, window, cis, kept, sums)


def emit_wgrad_runs(
    fused: FusedNode, ctx: EmitContext, x: Tensor, dy: Tensor, dw: Tensor, a: ConvAttributes
) -> FusedProgram:
    compute = compute_for(fused)
    vec = run_width(x.data_type)
    plan = layout(dy, dw, a, vec, ctx.arch, dict(ctx.tuning), anchor_of(fused).name)
    values = plan.sums * vec * plan.kept  # a block's partials
    kernel = _sums(fused, ctx, x, dy, dw, a, plan, compute)
    finalize, _ = sums_kernels(ctx, fused, _totals(dw, a, plan, vec, compute), compute)
    bytes_ = plan.blocks * values * (8 if compute == "double" else 4)
    return FusedProgram(fused.name, (kernel, *finalize), (Scratch(PARTIALS, bytes_),))


def _sums(
    fused: FusedNode, ctx: EmitContext, x: Tensor, dy: Tensor, dw: Tensor, a: ConvAttributes, plan: Layout, compute: str
) -> Kernel:
    """Each thread's sums over its pixels, then the block's over its slots, to the partials."""
    element = cuda_type(x.data_type)
    vec, group, taps = run_width(x.data_type), dw.static_dim[1], dw.static_dim[2:]
    spatial, runs = len(taps), dw.static_dim[0] // vec
    bands, owned = range(spatial - plan.owned), range(spatial - plan.owned, spatial)
    kept, cis, owned_count = plan.kept, plan.cis, plan.sums // plan.cis
    pixels = dy.static_dim[0] * math.prod(dy.static_dim[2:])
    values = plan.blocks * plan.sums * vec * kept
    itype = index_type([x, dy, dw], values, plan.blocks * plan.slots * plan.pixels)
    params = KernelParams()
    names = declare(params, [x, dy])
    scratch = params.scratch(PARTIALS, compute)
    aligned = params.aligned_flag()
    zero = literal(0, compute)
    picks = vec // group * cis  # the image elements of the run's groups at ci (every G-th), or all
    reach = [f"h{d} + f{d} * {a.dilation[d]}" for d in range(spatial)]  # the image coordinate at tap f_d
    inside = []
    for d in range(spatial):
        inside += [f"{reach[d]} >= 0"] * (a.pre_padding[d] > 0)
        # The last tap of the last output reaches extent + post - 1: only padding can fall outside.
        inside += [f"{reach[d]} < {x.static_dim[2 + d]}"] * (a.post_padding[d] > 0)
    nothing = store(x.data_type, zero)  # an element outside the image
    tap = " + ".join(f"f{d} * {math.prod(taps[d + 1 :])}" for d in owned) or "0"  # among the owned taps

    def gather(to: str) -> list[str]:
        """The image's elements at a tap (``image``, in the image where ``inside``) into ``to``image[tap]."""
        if picks < vec:
            return [
                "#pragma unroll",
                f"for (int m = 0; m < {picks}; ++m) {to}image[{tap}].v[m] = inside ? image[m * {group}] : {nothing};",
            ]
        return [
            f"if (inside && {aligned}) {to}image[{tap}] = gd::load_vec<{element}, {vec}>(image);",
            "else {",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) {to}image[{tap}].v[j] = inside ? image[j] : {nothing};",
            "}",
        ]

    def over_taps(statements: list[str]) -> list[str]:
        for d in reversed(owned):
            statements = [
                "#pragma unroll",
                f"for (int f{d} = 0; f{d} < {taps[d]}; ++f{d}) {{",
                *("  " + line for line in statements),
                "}",
            ]
        return statements

    last = spatial - 1  # the walked dim: the counter c{2 + last} steps by one

    def fetch(to: str, window: str = "") -> list[str]:
        """The pixel at the counters' raw elements: dy's run into ``to``loss, the image's at each
        owned tap into ``to``image[tap]. ``window``: where it holds and the pixel follows this_ in its
        row, the taps whose columns this_ read (tap + shift there) are copied instead of loaded
        (in increasing tap order: in place where ``to`` is this_)."""
        losses = offset_at(dy, ["c0", f"run * {vec}", *(f"c{2 + d}" for d in range(spatial))])
        at_tap = [
            f"const bool inside = {' && '.join(inside) or 'true'};",
            f"const {element}* image = {names[x.id]} + ({offset_at(x, ['c0', f'run * {vec} + ci', *reach])});",
            *gather(to),
        ]
        if window:
            shift = a.stride[last] // a.dilation[last]
            at_tap = [
                f"if (f{last} < {taps[last] - shift} && {window}) {to}image[{tap}] = this_image[{tap} + {shift}];",
                "else {",
                *("  " + line for line in at_tap),
                "}",
            ]
        return [
            "{",
            *(f"  const {itype} h{d} = c{2 + d} * {a.stride[d]} - {a.pre_padding[d]};" for d in range(spatial)),
            f"  const {element}* losses = {names[dy.id]} + {losses};",
            f"  if ({aligned}) {to}loss = gd::load_vec<{element}, {vec}>(losses);",
            "  else {",
            "    #pragma unroll",
            f"    for (int j = 0; j < {vec}; ++j) {to}loss.v[j] = losses[j];",
            "  }",
            *("  " + line for line in over_taps(at_tap)),
            "}",
        ]

    raw = [f"gd::Vec<{element}, {vec}> {{0}}loss;", f"gd::Vec<{element}, {picks}> {{0}}image[{owned_count}];"]
    walked = [0, *range(2, len(dy.dim))]  # dy's axes in walking order: n, then p0, p1, ...
    advance = [f"if (++c{axis} == {dy.static_dim[axis]}) {{ c{axis} = 0;" for axis in reversed(walked[1:])]
    step = ["// the next pixel in (n, p...) order", " ".join(advance) + " ++c0;" + " }" * len(advance)]
    products = [
        f"{compute} loss[{vec}];",
        "#pragma unroll",
        f"for (int j = 0; j < {vec}; ++j) loss[j] = gd::element<{compute}>(this_loss, j);",
        *over_taps(
            [
                "#pragma unroll",
                f"for (int j = 0; j < {vec}; ++j) "
                f"acc[{tap}][j] += loss[j] * gd::element<{compute}>(this_image[{tap}], j / {group});",
            ]
            if cis == 1
            else [  # every ci of the run's groups: channel j / G * G + cc of the image vector
                "#pragma unroll",
                f"for (int cc = 0; cc < {cis}; ++cc) {{",
                "  #pragma unroll",
                f"  for (int j = 0; j < {vec}; ++j) acc[({tap}) * {cis} + cc][j] += "
                f"loss[j] * gd::element<{compute}>(this_image[{tap}], j / {group} * {group} + cc);",
                "}",
            ]
        ),
    ]
    if plan.prefetch:  # the next pixel's loads in flight during this one's products
        pixel = [
            *(line.format("this_") for line in raw),
            "this_loss = next_loss;",
            "#pragma unroll",
            f"for (int t = 0; t < {owned_count}; ++t) this_image[t] = next_image[t];",
            *step,
            "if (e + 1 < last) " + fetch("next_", f"c{2 + last} != 0" if plan.window else "")[0],
            *fetch("next_", f"c{2 + last} != 0" if plan.window else "")[1:],
            *products,
        ]
        ahead = [*(line.format("next_") for line in raw), *fetch("next_")]
    else:  # with a window this_ holds the previous pixel's elements, from the second on
        pixel = [*fetch("this_", f"e != first && c{2 + last} != 0" if plan.window else ""), *products, *step]
        ahead = [line.format("this_") for line in raw]
    first = coordinates("first", [dy.static_dim[axis] for axis in walked], range(len(walked)), "w", itype)
    body = [
        f"const int lane = threadIdx.x % {plan.width}, slot = threadIdx.x / {plan.width};",
        f"const int u = blockIdx.y * {plan.width} + lane;  // the kept index: (band, run, ci)",
        f"const int ci = u % {group // cis}, run = u / {group // cis} % {runs};",
        *coordinates(f"(u / {group // cis * runs})", taps[: len(bands)], bands, "f", "int"),
        f"{compute} acc[{plan.sums}][{vec}] = {{}};",
        f"const {itype} first = (({itype})blockIdx.x * {plan.slots} + slot) * {plan.pixels};",
        f"const {itype} last = first + {plan.pixels} < {pixels} ? first + {plan.pixels} : {pixels};",
        f"if (slot < {plan.slots} && u < {kept} && first < last) {{",
        *("  " + line for line in first),
        *(f"  {itype} c{axis} = w{i};" for i, axis in enumerate(walked)),
        *("  " + line for line in ahead),
        f"  for ({itype} e = first; e < last; ++e) {{",
        *("    " + line for line in pixel),
        "  }",
        "}",
        f"__shared__ {compute} red[{vec * plan.slots * plan.width}];  // [j][slot][lane]",
        "#pragma unroll",
        f"for (int t = 0; t < {plan.sums}; ++t) {{",
        "  __syncthreads();",
        f"  if (slot < {plan.slots}) {{",
        "    #pragma unroll",
        f"    for (int j = 0; j < {vec}; ++j) red[(j * {plan.slots} + slot) * {plan.width} + lane] = acc[t][j];",
        "  }",
        "  __syncthreads();",
        f"  for (int i = threadIdx.x; i < {vec * plan.width}; i += {THREADS}) {{",
        f"    const int j = i / {plan.width}, l = i % {plan.width}, o = blockIdx.y * {plan.width} + l;",
        f"    if (o >= {kept}) continue;",
        f"    {compute} total = {zero};",
        "    #pragma unroll",
        f"    for (int s = 0; s < {plan.slots}; ++s) total += red[(j * {plan.slots} + s) * {plan.width} + l];",
        f"    {scratch}[((({itype})blockIdx.x * {plan.sums} + t) * {vec} + j) * {kept} + o] = total;",
        "  }",
        "}",
    ]
    grid = (plan.blocks, plan.chunks, 1)
    return make_kernel(ctx, fused, "conv_wgrad_runs", params, body, grid, min_blocks=plan.resident)


def _totals(dw: Tensor, a: ConvAttributes, plan: Layout, vec: int, compute: str) -> Sums:
    """The partials as a sum over (block, (owned tap, cc), j, kept index): the block reduced."""
    group, taps = dw.static_dim[1], dw.static_dim[2:]
    spatial, runs = len(taps), dw.static_dim[0] // vec
    bands = taps[: spatial - plan.owned]
    owned = taps[spatial - plan.owned :]
    kept, cis = plan.kept, plan.cis
    dims = (plan.blocks, plan.sums, vec, kept)

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        partials = params.scratch(PARTIALS, compute)
        return [], [f"{partials}[((c0 * {dims[1]} + c1) * {vec} + c2) * {kept} + c3]"]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        flip = a.convolution_mode is ConvMode.CONVOLUTION
        index = [f"({extent - 1} - f{d})" if flip else f"f{d}" for d, extent in enumerate(taps)]
        return [
            f"const long long ci = c3 % {group // cis} + c1 % {cis}, run = c3 / {group // cis} % {runs};",
            *coordinates(f"(c3 / {group // cis * runs})", bands, range(len(bands)), "f", "long long"),
            *coordinates(f"(c1 / {cis})", owned, range(len(owned)), "g", "long long"),
            *(f"const long long f{len(bands) + d} = g{d};" for d in range(len(owned))),
            f"{params.tensor(dw, writable=True)}[{offset_at(dw, [f'run * {vec} + c2', 'ci', *index])}] = "
            f"{store(dw.data_type, totals[0])};",
        ]

    # One split: the blocks' partials are few enough for one pass (min_split above them).
    return Sums("conv_wgrad_runs_total", dims, (1, 2, 3), (0,), False, terms, finish, min_split=plan.blocks + 1)
