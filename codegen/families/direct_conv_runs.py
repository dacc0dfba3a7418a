"""The weight gradient of depthwise and small-group convolutions in NHWC, over runs of channels.

With as many output channels as input channels in groups of G dividing a 16-byte run of
VEC channels (G = 1: depthwise), dw[k, ci, taps] sums dy[n, p, k] * x[n, p * s + tap, group(k)
* G + ci] over (n, p). direct_conv's one-element sums read both tensors two bytes at a time
and find (n, p) by division for every product. Here each kept index is a run of VEC output
channels at one tap and ci: at each (n, p) a thread reads the run of dy as one vector and
the run's image channels (one vector for depthwise, VEC / G elements otherwise), and sums
VEC products; the reduction pattern (direct_reduce: lanes along ci, then the runs, the
block's warps over (n, p), splits added in a fixed order) is direct_conv's. Where the
runtime's ``aligned`` flag is 0 the same elements are read one by one.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.conv import ConvAttributes, ConvMode

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, load, store
from ..indexing import offset_at
from ..kernel import FusedProgram
from ..pointwise import literal
from .direct_common import compute_for, declare
from .direct_reduce import Sums, sums_kernels

VECTOR_BYTES = 16
MIN_SPLIT = 256  # fewest pixels per split (direct_reduce's own 4096 left a 576-channel layer 21 blocks)
TYPES = frozenset({DataType.HALF, DataType.BFLOAT16, DataType.FLOAT})


def takes_runs(x: Tensor, dy: Tensor, dw: Tensor) -> bool:
    """A static wgrad with K = C, G = C / groups dividing the run, x and dy of one type (fp16,
    bf16, fp32) with their channels contiguous, C and their other strides multiples of the run."""
    if any(t.symbols for t in (x, dy, dw)) or x.data_type is not dy.data_type or x.data_type not in TYPES:
        return False
    vec = VECTOR_BYTES // x.data_type.itemsize
    channels, group = x.static_dim[1], dw.static_dim[1]
    if not (dw.static_dim[0] == channels and channels > group and vec % group == 0 and channels % vec == 0):
        return False
    return all(
        t.static_stride[1] == 1 and all(s % vec == 0 for axis, s in enumerate(t.static_stride) if axis != 1)
        for t in (x, dy)
    )


def emit_wgrad_runs(
    fused: FusedNode, ctx: EmitContext, x: Tensor, dy: Tensor, dw: Tensor, a: ConvAttributes
) -> FusedProgram:
    """The space is (k run, ci, taps..., n, p...): the first axes kept, (n, p...) reduced."""
    compute = compute_for(fused)
    element = cuda_type(x.data_type)
    vec = VECTOR_BYTES // x.data_type.itemsize
    rank, group = len(dw.dim), dw.static_dim[1]
    sample = rank  # the space axis of n; p_d is at rank + 1 + d
    dims = (dw.static_dim[0] // vec, group, *dw.static_dim[2:], dy.static_dim[0], *dy.static_dim[2:])
    loss_axes = [sample if axis == 0 else rank + axis - 1 for axis in range(len(dy.dim))]  # dy axis -> space axis
    reduced = tuple(loss_axes[axis] for axis in stride_order(dy.dim, dy.stride) if axis != 1)
    spatial = range(len(x.dim) - 2)

    def tap(d: int) -> str:
        extent = dw.static_dim[2 + d]
        return f"({extent - 1} - c{2 + d})" if a.convolution_mode is ConvMode.CONVOLUTION else f"c{2 + d}"

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        names = declare(params, [x, dy])
        aligned = params.aligned_flag()
        statements, inside = [], []
        for d, (extent, s, dilation, pre, post) in enumerate(
            zip(x.dim[2:], a.stride, a.dilation, a.pre_padding, a.post_padding)
        ):
            statements.append(f"const {itype} i{d} = c{rank + 1 + d} * {s} + {tap(d)} * {dilation} - {pre};")
            # The last tap of the last output reaches extent + post - 1: only padding can fall outside.
            inside += [f"i{d} >= 0"] * (pre > 0) + [f"i{d} < {extent}"] * (post > 0)
        losses = offset_at(dy, [f"c{sample}", f"c0 * {vec}", *(f"c{rank + 1 + d}" for d in spatial)])
        image = offset_at(x, [f"c{sample}", f"c0 * {vec} + c1", *(f"i{d}" for d in spatial)])
        zero = literal(0, compute)
        # the image channels of the run's groups at ci: every G-th from the run's start + ci
        picks = vec // group
        statements += [
            f"const {element}* losses = {names[dy.id]} + {losses};",
            f"const {element}* image = {names[x.id]} + {image};",
            f"const bool inside = {' && '.join(inside) or 'true'};",
            f"{compute} loss[{vec}], pixel[{picks}];",
            f"if ({aligned}) {{",
            f"  const gd::Vec<{element}, {vec}> run = gd::load_vec<{element}, {vec}>(losses);",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) loss[j] = gd::element<{compute}>(run, j);",
            "} else {",
            "  #pragma unroll",
            f"  for (int j = 0; j < {vec}; ++j) loss[j] = {load(dy.data_type, 'losses[j]', compute)};",
            "}",
        ]
        if group == 1:
            statements += [
                f"if (inside && {aligned}) {{",
                f"  const gd::Vec<{element}, {vec}> run = gd::load_vec<{element}, {vec}>(image);",
                "  #pragma unroll",
                f"  for (int j = 0; j < {vec}; ++j) pixel[j] = gd::element<{compute}>(run, j);",
                "} else {",
                "  #pragma unroll",
                f"  for (int j = 0; j < {vec}; ++j) pixel[j] = inside ? {load(x.data_type, 'image[j]', compute)} : {zero};",
                "}",
            ]
        else:
            statements += [
                "#pragma unroll",
                f"for (int m = 0; m < {picks}; ++m) "
                f"pixel[m] = inside ? {load(x.data_type, f'image[m * {group}]', compute)} : {zero};",
            ]
        return statements, [f"loss[{j}] * pixel[{j // group}]" for j in range(vec)]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        out = params.tensor(dw, writable=True)
        return [
            f"{out}[{offset_at(dw, [f'c0 * {vec} + {j}', 'c1', *(f'c{2 + d}' for d in spatial)])}] = "
            f"{store(dw.data_type, total)};"
            for j, total in enumerate(totals)
        ]

    kept = (*range(2, rank), 0, 1)  # lanes along ci, then the runs: a warp reads runs of channels
    # Few kept runs (162 for a 144-channel 3x3): split the pixels finely enough to fill the GPU.
    sums = Sums("conv_wgrad_runs", dims, kept, reduced, False, terms, finish, min_split=MIN_SPLIT)
    kernels, scratch = sums_kernels(ctx, fused, sums, compute)
    return FusedProgram(fused.name, kernels, scratch)
