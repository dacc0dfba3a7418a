"""Depthwise and small-group convolutions in NHWC: as many output channels as input channels,
in groups of G = 1 (depthwise: the spatial filters of MobileNet, EfficientNet, ConvNeXt), 2, 4
or 8 channels (ResNeXt's grouped 3x3s), G dividing a 16-byte run of channels.

Such a layer has little reduction over channels (G per output), and the SIMT kernel's one
output element per thread reads the image two bytes at a time. (With 16-bit types and 8
channels a group the default is the tensor-core kernel instead, grouped_conv_mma.py: a run's
8 channels are an mma's n, its filter block-diagonal.) Here each thread takes a run of VEC output channels (16 bytes) of one output
pixel: their groups read exactly the same run of VEC image channels, so at each filter tap it
reads them as one vector (element by element where the runtime's ``aligned`` flag says a
pointer is not 16-byte aligned: the same mapping). Each block first stages the filter in
shared memory as [tap][ci][k], so that a tap's weights for a run are G vectors (a depthwise
filter over 48 KiB is read from memory an element at a time; a larger grouped one
takes the SIMT kernel), and then walks its share of the runs. A thread of a grouped layer
takes P = 4 consecutive output pixels of a row (tuning ``pixels``; depthwise: 1): each weight
vector it loads (and converts) feeds P x VEC products instead of VEC, which is what 8-channel
groups (64 products and 8 weight vectors a tap per pixel) are short of; its grid is then 2
blocks per SM (tuning ``blocks_per_sm``), as many as its registers allow, since each block
stages the filter (36 KiB for ResNeXt's 256-channel layer) before its first pixel. The fused epilogue runs per
channel, as the SIMT kernel's does. Threads run along the channels, then the pixels, so a
warp's reads and writes are contiguous.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.ops.conv import ConvMode

from ..context import EmitContext, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load
from ..indexing import loop_index_type
from ..kernel import Kernel
from ..pointwise import literal
from .channel_runs import (
    MAX_TILES,
    MMA_CANDIDATES,
    RESIDENT_BLOCKS,
    lines_up,
    mma_choices,
    resident_grid,
    run_width,
    staged_filter,
    stages,
)
from .gemm_epilogue import Epilogue
from .gemm_problem import Problem, declare
from .grouped_conv_mma import BLOCKS_PER_SM as MMA_BLOCKS
from .grouped_conv_mma import STAGES as MMA_STAGES
from .grouped_conv_mma import TILES as MMA_TILES
from .grouped_conv_mma import grouped_conv_mma_kernel, takes_mma

THREADS = 256
MAX_PIXELS = 8  # output pixels of a row per thread (tuning "pixels"): P x VEC accumulators
GROUPED_PIXELS, GROUPED_BLOCKS = 4, 2  # the default for G > 1 (about 110 registers: 2 blocks per SM)


def takes_grouped_conv(p: Problem) -> bool:
    """A static 2-d grouped convolution forward with C = K and G = C / groups channels a group
    dividing the vector, over an NHWC image whose channel runs read as 16-byte vectors: the
    image's and filter's type fp16, bf16 or fp32 (the same), C a multiple of the vector, the
    image's other strides too, the output's channels contiguous; a filter of several channels
    a group no larger than channel_runs.STAGED_BYTES."""
    x, w, y = p.a, p.b, p.out
    if p.node.op != "conv_fprop" or p.is_dynamic or len(y.dim) != 4 or x.data_type is not w.data_type:
        return False
    if not (lines_up(x, w) and y.static_stride[1] == 1):
        return False
    return w.static_dim[1] == 1 or stages(w)  # G x VEC element loads a tap: slower than the SIMT kernel (H200)


def choices(ctx: EmitContext, node: str, grouped: bool) -> tuple[int, int]:
    """The tuning's ``pixels`` (output pixels of a row per thread) and ``blocks_per_sm`` (the
    resident grid's blocks per SM, which the registers must allow; 0: channel_runs'
    RESIDENT_BLOCKS without a register cap). Untuned, a depthwise layer takes (1, 0) and a
    grouped one (GROUPED_PIXELS, GROUPED_BLOCKS): on an H200 those were 1.08-2.5x faster on
    ResNeXt's 4- and 8-channel groups and slower on MobileNet's depthwise layers."""
    default = (GROUPED_PIXELS, GROUPED_BLOCKS) if grouped else (1, 0)
    pixels, resident = ctx.tuning.get("pixels", default[0]), ctx.tuning.get("blocks_per_sm", default[1])
    if (
        set(ctx.tuning) - {"pixels", "blocks_per_sm", "mma"}
        or not isinstance(pixels, int)
        or not isinstance(resident, int)
        or not 1 <= pixels <= MAX_PIXELS
        or ("blocks_per_sm" in ctx.tuning and not 1 <= resident <= RESIDENT_BLOCKS)
    ):
        raise UnsupportedError(
            f"grouped convolution tuning {dict(ctx.tuning)}: the choices are 'pixels' (1..{MAX_PIXELS}) "
            f"and 'blocks_per_sm' (1..{RESIDENT_BLOCKS}), or 'mma': 1 with 'tiles' (1..{MAX_TILES}) and "
            f"'blocks_per_sm' (16-bit types)",
            node=node,
        )
    return pixels, resident


def candidates(p: Problem) -> list[dict[str, object]]:
    """Launch choices worth timing (autotuning) where the tensor cores take the layer: the
    kernel over runs (its defaults) and the tensor-core one at 2 and 1 tiles a warp."""
    return [dict(choice) for choice in MMA_CANDIDATES] if takes_mma(p) else []


def grouped_conv_kernel(fused: FusedNode, ctx: EmitContext, p: Problem) -> Kernel:
    group = p.b.static_dim[1]
    on_mma = mma_choices(
        dict(ctx.tuning),
        "grouped convolution",
        p.node.name,
        takes_mma(p),
        group == 8,
        (MMA_TILES, MMA_BLOCKS, MMA_STAGES),
    )
    if on_mma is not None:
        return grouped_conv_mma_kernel(fused, ctx, p, *on_mma)
    params, names = declare(fused, p)
    aligned = params.aligned_flag()
    x, w, y = p.a, p.b, p.out
    compute = compute_of([x, w, *fused.outputs])
    element = cuda_type(x.data_type)
    vec = run_width(x.data_type)
    pixels, resident = choices(ctx, p.node.name, w.static_dim[1] > 1)
    n, channels, out_h, out_w = y.static_dim
    tiles_w = -(-out_w // pixels)
    runs = n * out_h * tiles_w * (channels // vec)
    blocks = resident_grid(runs, THREADS, ctx.arch, resident or RESIDENT_BLOCKS)
    itype = loop_index_type([*fused.inputs, *fused.outputs], runs * vec * pixels, blocks * THREADS)
    a = p.attrs
    xs, ws = x.static_stride, w.static_stride
    group, taps_h, taps_w = w.static_dim[1:]
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    tap_r, tap_s = (f"({taps_h - 1} - r)", f"({taps_w - 1} - s)") if flip else ("r", "s")
    staged = stages(w)

    # Output channel j of the run sums its group's G image channels times its filter at the tap:
    # from the staged filter, a vector of the run's channels per ci (shared by the P pixels);
    # from the filter in memory, an element each.
    if staged:
        at = f"(({tap_r} * {taps_w} + {tap_s}) * {group} + ci) * {channels} + cb * {vec}"
        fetch = [
            f"  const gd::Vec<{element}, {vec}> taps = gd::load_vec<{element}, {vec}>(filter + {at});",
            f"  {compute} weight[{vec}];",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) weight[j] = gd::element<{compute}>(taps, j);",
        ]
    else:
        k_at = f"(cb * {vec} + j) * {ws[0]} + ci * {ws[1]} + {tap_r} * {ws[2]} + {tap_s} * {ws[3]}"
        fetch = [
            f"  {compute} weight[{vec}];",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) weight[j] = {load(w.data_type, f'{names[w.id]}[{k_at}]', compute)};",
        ]
    products = [
        "#pragma unroll",
        f"for (int ci = 0; ci < {group}; ++ci) {{",
        *fetch,
        "  #pragma unroll",
        f"  for (int i = 0; i < {pixels}; ++i) {{",
        "    #pragma unroll",
        f"    for (int j = 0; j < {vec}; ++j) acc[i][j] += image[i][j / {group} * {group} + ci] * weight[j];",
        "  }",
        "}",
    ]
    zero = literal(0, compute)
    gather = [
        f"{compute} image[{pixels}][{vec}];",
        "#pragma unroll",
        f"for (int i = 0; i < {pixels}; ++i) {{",
        f"  const {itype} q = (q0 + i) * {a.stride[1]} - {a.pre_padding[1]} + s * {a.dilation[1]};",
        f"  const bool inside = q >= 0 && q < {x.static_dim[3]}"
        + (f" && q0 + i < {out_w};" if out_w % pixels else ";"),
        f"  const {element}* at = {names[x.id]} + c0 * {xs[0]} + h * {xs[2]} + q * {xs[3]} + cb * {vec};",
        f"  if (inside && {aligned}) {{",
        f"    const gd::Vec<{element}, {vec}> v = gd::load_vec<{element}, {vec}>(at);",
        "    #pragma unroll",
        f"    for (int j = 0; j < {vec}; ++j) image[i][j] = gd::element<{compute}>(v, j);",
        "  } else {",
        "    #pragma unroll",
        f"    for (int j = 0; j < {vec}; ++j) image[i][j] = inside ? {load(x.data_type, 'at[j]', compute)} : {zero};",
        "  }",
        "}",
    ]

    stage = []
    if staged:  # the filter as [tap][ci][k]: a run's k contiguous
        indices = f"k = i % {channels}, ci = i / {channels} % {group}, t = i / {channels * group}"
        source = f"{names[w.id]}[k * {ws[0]} + ci * {ws[1]} + t / {taps_w} * {ws[2]} + t % {taps_w} * {ws[3]}]"
        stage = staged_filter(element, w.static_numel, indices, source)
    body = [
        *stage,
        f"const {itype} stride = ({itype})gridDim.x * blockDim.x;",
        f"for ({itype} e = ({itype})blockIdx.x * blockDim.x + threadIdx.x; e < {runs}; e += stride) {{",
        f"  const {itype} cb = e % {channels // vec};  // the run of channels",
        f"  const {itype} tile = e / {channels // vec};  // {pixels} pixels of a row",
        f"  const {itype} q0 = tile % {tiles_w} * {pixels};  // the first output column",
        f"  const {itype} c2 = tile / {tiles_w} % {out_h};",
        f"  const {itype} c0 = tile / {tiles_w * out_h};",
        f"  {compute} acc[{pixels}][{vec}] = {{}};",
        "  #pragma unroll",
        f"  for (int r = 0; r < {taps_h}; ++r) {{",
        f"    const {itype} h = c2 * {a.stride[0]} - {a.pre_padding[0]} + r * {a.dilation[0]};",
        f"    if (h < 0 || h >= {x.static_dim[2]}) continue;",
        "    #pragma unroll",
        f"    for (int s = 0; s < {taps_w}; ++s) {{",
        *("      " + line for line in gather),
        *("      " + line for line in products),
        "    }",
        "  }",
        "  #pragma unroll",
        f"  for (int i = 0; i < {pixels}; ++i) {{",
        f"    const {itype} c3 = q0 + i;",
        *([f"    if (c3 >= {out_w}) break;"] if out_w % pixels else []),
        "    #pragma unroll",
        f"    for (int j = 0; j < {vec}; ++j) {{",
        f"      const {itype} c1 = cb * {vec} + j;",
        *("      " + line for line in Epilogue(fused, p, names, compute).statements("acc[i][j]")),
        "    }",
        "  }",
        "}",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + ("_depthwise" if group == 1 else "_grouped"),
        params,
        THREADS,
        indent(body, 1),
        resident,
    )
    return Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))
