"""GEMM family, Hopper engine: the TMA im2col producer of a convolution (gemm_ws.py, tuning
``"producer": "im2col"``), the alternative to the 128 gathering threads of gemm_loaders.py.

One thread copies each k tile with two TMA loads into the 128-byte-swizzled stages the wgmma
consumers read: the image's with ``cp.async.bulk.tensor.Nd...im2col`` through an im2col tensor
map (cuTensorMapEncodeIm2col: BK channels of each of the tile's 128 output pixels for one
filter tap, the copy stepping through the pixels by the convolution's strides and wrapping
rows and images itself), the filter's with a tiled map (BK channels of BN output channels at
that tap). The padding is the map's bounding box: taps that land outside the image read zeros.

k is walked tap by tap: k tile kt holds channels (kt % CTILES) * BK .. + BK - 1 of tap
kt / CTILES, in the image and the filter alike (the GEMM's order of k is free, as long as both
operands agree). Channels past C are out of both tensors and read as zeros, so C need not be a
multiple of BK (tiles past C multiply zeros).

What TMA cannot express is refused (:func:`refusal`): grouped convolutions, channels not
contiguous in 16-byte chunks, more than 3 spatial dims, strides over 8, padding or dilated
filters beyond the ranges of the im2col corners and offsets (narrower as the rank grows).

A dynamic graph's convolution (a symbolic batch N) takes it too: the image map's batch dim is
resolved from each call's N when the plan is bound (TensorMap.symbolic), so the copies wrap
into zeros past the call's last image.
"""

from __future__ import annotations

import math

from graphdnn.ir import Tensor
from graphdnn.ops.conv import ConvMode
from graphdnn.program import IM2COL_CORNERS, IM2COL_OFFSETS, Im2colWindow, TensorMap
from graphdnn.symbolic import Extent, symbols_of, upper

from ..context import KernelParams
from .gemm_problem import Problem, pixel_coordinates, tensor_core_layout

BLOCK_M = 128  # pixels per copy: the engine's tile rows


def refusal(p: Problem, bk: int) -> str | None:
    """Why the im2col producer cannot feed ``p`` with k tiles of ``bk`` channels, or None (for
    either tile width: the filter's box is as valid with 128 output channels as with 256)."""
    if not p.is_conv:
        return f"TMA im2col feeds a convolution's forward pass, not a {p.node.op}"
    if p.groups != 1:
        return f"a grouped convolution ({p.groups} groups) has no im2col map (a k tile would span groups)"
    if tensor_core_layout(p) is None:
        return (
            f"image '{p.a.name}' (strides {list(p.a.stride)}) and filter '{p.b.name}' (strides {list(p.b.stride)}) "
            "need contiguous channels and their other strides in 16-byte steps (NHWC)"
        )
    rank = len(p.a.dim)
    if rank not in IM2COL_CORNERS:
        return f"{rank - 2} spatial dims: im2col maps take 1 to 3"
    reach = [(f - 1) * d for f, d in zip(p.b.static_dim[2:], p.attrs.dilation)]
    if max(reach) > IM2COL_OFFSETS[rank]:
        return (
            f"a dilated filter spans {max(reach) + 1} pixels: im2col offsets of a {rank - 2}-d convolution "
            f"reach {IM2COL_OFFSETS[rank]} at most"
        )
    a_map, b_map = maps(p, bk, BLOCK_M)
    problems = [*(f"image map: {x}" for x in a_map.problems()), *(f"filter map: {x}" for x in b_map.problems())]
    return "the driver would refuse " + "; ".join(problems) if problems else None


def k_tiles(p: Problem, bk: int) -> int:
    """k tiles of the im2col walk: each filter tap's channels in tiles of ``bk``."""
    return math.prod(p.b.static_dim[2:]) * -(-p.channels // bk)


def maps(p: Problem, bk: int, bn: int) -> tuple[TensorMap, TensorMap]:
    """The image's im2col map and the filter's tiled map (dims: channels, the spatial dims
    innermost first, then images / output channels), their sizes at the symbols' maxima."""
    (image, _), (filt, _) = _maps(p, bk, bn)
    return image, filt


def _maps(p: Problem, bk: int, bn: int) -> tuple[tuple[TensorMap, tuple[Extent, ...]], ...]:
    """``maps``, each with its sizes as extents where a symbolic batch makes them depend on the
    call (``_tensor_map``)."""
    attrs = p.attrs
    spatial = range(len(p.a.dim) - 1, 1, -1)  # the spatial axes, innermost first
    filt = p.b.static_dim
    window = Im2colWindow(
        lower=tuple(-attrs.pre_padding[a - 2] for a in spatial),
        # the last position of the window's first tap: the far padding less the dilated filter's reach
        upper=tuple(attrs.post_padding[a - 2] - (filt[a] - 1) * attrs.dilation[a - 2] for a in spatial),
        strides=tuple(attrs.stride[a - 2] for a in spatial),
    )
    image = _tensor_map(p.a, (bk, BLOCK_M), window)
    return image, _tensor_map(p.b, (bk, *(1 for _ in spatial), bn), None)


def _tensor_map(t: Tensor, box: tuple[int, ...], window: Im2colWindow | None) -> tuple[TensorMap, tuple[Extent, ...]]:
    """``t``'s map, channels innermost; a dim of extent 1 gets the packed stride (any multiple of
    16 bytes would do: only coordinate 0 of it is ever inside the tensor). With a symbolic batch
    (the image of a dynamic graph), also its dims then byte strides as extents, the batch dim
    resolved at each call (its stride is static: a packed layout's outermost stride holds no N)."""
    axes = [1, *range(len(t.dim) - 1, 1, -1), 0]
    size = t.data_type.itemsize
    dims = [t.dim[a] for a in axes]
    strides: list[int] = []
    packed = upper(dims[0]) * size
    for axis, extent in zip(axes[1:], dims[1:]):
        strides.append(upper(t.stride[axis]) * size if extent != 1 else packed)
        packed = strides[-1] * upper(extent)
    tensor_map = TensorMap(size, tuple(upper(d) for d in dims), tuple(strides), box, 128, window)
    return tensor_map, ((*dims, *strides) if symbols_of(dims) else ())


def declare_maps(params: KernelParams, p: Problem, bk: int, bn: int) -> tuple[str, str]:
    """The two maps as kernel parameters (declared first: no padding before them); their names."""
    (a_map, a_sizes), (b_map, b_sizes) = _maps(p, bk, bn)
    return params.tensor_map(p.a, a_map, a_sizes), params.tensor_map(p.b, b_map, b_sizes)


def tile_origin(p: Problem, itype: str) -> list[str]:
    """For a tile starting at output pixel ``m0``: the image coordinates ``x<axis>`` (innermost
    first) of its window's first tap, where the im2col copies of the tile start."""
    attrs = p.attrs
    lines = pixel_coordinates(p, "m0", itype)  # c0: image, c2..: output position
    coords = [f"(int)c{a} * {attrs.stride[a - 2]} - {attrs.pre_padding[a - 2]}" for a in range(len(p.a.dim) - 1, 1, -1)]
    return [*lines, f"const int x_origin[{len(coords) + 1}] = {{{', '.join([*coords, '(int)c0'])}}};"]


def loads(p: Problem, a_map: str, b_map: str) -> list[str]:
    """k tile ``kt``'s two copies into ``stage``, completing on mbarrier ``bar``."""
    filt = p.b.static_dim[2:]
    flip = p.attrs.convolution_mode is ConvMode.CONVOLUTION
    lines = [
        "const int tap = kt / CTILES, channel = kt % CTILES * BK;",
        *(f"const int f{i} = tap{''.join(f' / {f}' for f in filt[i + 1 :])} % {filt[i]};" for i in range(len(filt))),
    ]
    inner_first = list(reversed(range(len(filt))))
    offsets = [f"(unsigned short)(f{i} * {p.attrs.dilation[i]})" for i in inner_first]
    taps = [f"{filt[i] - 1} - f{i}" if flip else f"f{i}" for i in inner_first]  # the filter's own tap
    image = ["channel", *(f"x_origin[{j}]" for j in range(len(filt) + 1))]
    return [
        *lines,
        f"tma_load_im2col(a_tiles + stage * A_STAGE, &{a_map}, bar, {', '.join([*image, *offsets])});",
        f"tma_load(b_tiles + stage * B_STAGE, &{b_map}, bar, {', '.join(['channel', *taps, 'n0'])});",
    ]


def prelude(p: Problem) -> str:
    """``tma_load_im2col``: the copy of an im2col box at tensor coordinates x0.. (innermost first)
    with the tap's offsets o0.. (16-bit, innermost first)."""
    rank = len(p.a.dim)
    coords = ", ".join(f"int x{i}" for i in range(rank))
    offsets = ", ".join(f"unsigned short o{i}" for i in range(rank - 2))
    tensor = ", ".join(f"%{i + 3}" for i in range(rank))
    taps = ", ".join(f"%{i + 3 + rank}" for i in range(rank - 2))
    inputs = ", ".join([*(f'"r"(x{i})' for i in range(rank)), *(f'"h"(o{i})' for i in range(rank - 2))])
    return f"""
// The im2col box of `map` whose first pixel is at x0.. (innermost first), shifted by the filter
// tap's offsets o0.., into shared memory at `dst`, completing bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_load_im2col(unsigned dst, const gd::TensorMapArg* map, unsigned bar, {coords}, {offsets}) {{
  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {{{tensor}}}], [%2], {{{taps}}};\\n"
               ::"r"(dst), "l"(map), "r"(bar), {inputs}
               : "memory");
}}
"""
