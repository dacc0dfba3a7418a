"""The reduction pattern of the direct family: sums over some axes of an iteration space.

genstats, the backward norms and conv_wgrad each need, for every index of the *kept*
axes, a few sums of terms over the *reduced* axes. A :class:`Sums` states the space, the
two sets of axes (each in memory order, outermost first), the terms and what to do with
the totals; :func:`sums_kernels` lays the threads out by which axis is innermost in memory:

- rows (the innermost axis is reduced: NCHW per-channel sums, a layer norm's rows): a group
  of GROUP consecutive threads per kept index walks its reduced elements in memory order
  (coalesced), then ``gd::group_sum``;
- columns (the innermost axis is kept: NHWC per-channel sums, a layer norm's dscale): the
  32 lanes of a warp take 32 consecutive kept indices (coalesced) and the block's 8 warps
  split the reduced elements; ``gd::column_reduce`` adds the 8 partial sums.

Accumulation is in the compute type (fp32, or double). When there are too few kept indices
to fill the GPU, each one's reduced elements are split over ``blockIdx.y``: the splits'
totals go to scratch and a finalize kernel adds them in a fixed order, so results are
reproducible run to run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusion_rules import FusedNode

from ..context import EmitContext, KernelParams
from ..indexing import coordinates
from ..kernel import Kernel, Scratch
from .direct_common import THREADS, blocks_for, first_thread, grid_stride, loop_index_type, make_kernel, tensors_of

COLUMNS, COLUMN_ROWS = 32, THREADS // 32  # the columns layout: kept indices per block x reduced lanes
TARGET_BLOCKS = 2 * 132  # two waves of an H100's SMs: enough blocks to hide latency
MIN_SPLIT = 4096  # fewest reduced elements worth a split of their own

# Statements at the coordinates c{axis} of one element (every axis defined; indices of the
# given C type), and the expressions of the terms to sum there.
Terms = Callable[[KernelParams, str], tuple[list[str], list[str]]]
# Statements storing the totals (C variables) of kept index ``o``, whose coordinates
# c{axis} over the kept axes are defined.
Finish = Callable[[KernelParams, list[str]], list[str]]


@dataclass(frozen=True)
class Sums:
    name: str  # names the kernels and the scratch buffer
    dims: tuple[int, ...]  # the iteration space
    kept: tuple[int, ...]  # kept axes, outermost first
    reduced: tuple[int, ...]  # reduced axes, outermost first
    rows: bool  # the innermost axis in memory is reduced
    terms: Terms
    finish: Finish
    min_split: int = MIN_SPLIT  # fewest reduced elements per split

    @property
    def kept_count(self) -> int:
        return math.prod(self.dims[axis] for axis in self.kept)

    @property
    def reduced_count(self) -> int:
        return math.prod(self.dims[axis] for axis in self.reduced)


def innermost_reduced(dims: tuple[int, ...], strides: tuple[int, ...], reduced: tuple[int, ...]) -> bool:
    """Whether the smallest-stride axis (of extent > 1) is among ``reduced``: the rows layout."""
    spanning = [axis for axis in range(len(dims)) if dims[axis] > 1]
    return not spanning or min(spanning, key=lambda axis: (strides[axis], -axis)) in reduced


def sums_kernels(
    ctx: EmitContext, fused: FusedNode, sums: Sums, compute: str
) -> tuple[tuple[Kernel, ...], tuple[Scratch, ...]]:
    """The reduce kernel, and when the reduction is split, the finalize kernel and its scratch."""
    kept, reduced = sums.kept_count, sums.reduced_count
    group = min(THREADS, 1 << max(reduced - 1, 0).bit_length())  # a power of 2 >= reduced elements, <= THREADS
    per_block = THREADS // group if sums.rows else COLUMNS
    blocks = -(-kept // per_block)
    splits = max(1, min(-(-TARGET_BLOCKS // blocks), reduced // sums.min_split))
    chunk = -(-reduced // splits)
    splits = -(-reduced // chunk)
    count = len(sums.terms(KernelParams(), "long long")[1])
    partials = f"{sums.name}_partials"
    # The reduced index overshoots by up to a block, the finalize loop's by up to a grid.
    itype = loop_index_type(tensors_of(fused), kept, splits * count * kept, reduced + THREADS)

    params = KernelParams()
    statements, terms = sums.terms(params, itype)
    scratch = params.scratch(partials, compute) if splits > 1 else None
    if scratch is None:
        store = sums.finish(params, [f"total{k}" for k in range(count)])
    else:
        store = [f"{scratch}[((({itype})blockIdx.y * {count} + {k}) * {kept}) + o] = total{k};" for k in range(count)]

    lanes = group if sums.rows else COLUMN_ROWS
    walk = [
        *(f"{compute} acc{k} = 0;" for k in range(count)),
        f"if (o < {kept}) {{",
        *("  " + line for line in coordinates("o", sums.dims, sums.kept, "c", itype)),
        f"  const {itype} begin = " + ("0;" if splits == 1 else f"({itype})blockIdx.y * {chunk};"),
        f"  const {itype} end = "
        + (f"{reduced};" if splits == 1 else f"begin + {chunk} < {reduced} ? begin + {chunk} : {reduced};"),
        f"  for ({itype} r = begin + lane; r < end; r += {lanes}) {{",
        *("    " + line for line in coordinates("r", sums.dims, sums.reduced, "c", itype)),
        *("    " + line for line in statements),
        *(f"    acc{k} += {term};" for k, term in enumerate(terms)),
        "  }",
        "}",
    ]
    finish = [
        f"if (lane == 0 && o < {kept}) {{",
        *("  " + line for line in coordinates("o", sums.dims, sums.kept, "c", itype)),
        *("  " + line for line in store),
        "}",
    ]
    if sums.rows:
        body = [
            f"const {itype} o = ({itype})blockIdx.x * {per_block} + threadIdx.x / {group};",
            f"const int lane = threadIdx.x % {group};",
            *walk,
            f"__shared__ {compute} red[{THREADS // 32}];",
            *(f"const {compute} total{k} = gd::group_sum<{group}>(acc{k}, red);" for k in range(count)),
            *finish,
        ]
    else:
        body = [
            f"const {itype} o = ({itype})blockIdx.x * {COLUMNS} + threadIdx.x % {COLUMNS};",
            f"const int lane = threadIdx.x / {COLUMNS};",
            *walk,
            f"__shared__ {compute} red[{THREADS * count}];",
            f"{compute} totals[{count}] = {{{', '.join(f'acc{k}' for k in range(count))}}};",
            f"gd::column_reduce<{COLUMNS}, {COLUMN_ROWS}>(totals, red, []({compute} a, {compute} b) {{ return a + b; }});",
            *(f"const {compute} total{k} = totals[{k}];" for k in range(count)),
            *finish,
        ]
    kernels = [make_kernel(ctx, fused, f"{sums.name}_sums", params, body, (blocks, splits, 1))]
    if scratch is None:
        return tuple(kernels), ()
    kernels.append(_finalize(ctx, fused, sums, compute, itype, splits, count, partials))
    return tuple(kernels), (Scratch(partials, splits * count * kept * (8 if compute == "double" else 4)),)


def _finalize(
    ctx: EmitContext, fused: FusedNode, sums: Sums, compute: str, itype: str, splits: int, count: int, partials: str
) -> Kernel:
    """One thread per kept index adds the splits' totals, in split order, then finishes."""
    kept = sums.kept_count
    params = KernelParams()
    scratch = params.scratch(partials, compute)
    body = [
        *(f"{compute} total{k} = 0;" for k in range(count)),
        f"for (int s = 0; s < {splits}; ++s) {{",
        *(f"  total{k} += {scratch}[((({itype})s * {count} + {k}) * {kept}) + o];" for k in range(count)),
        "}",
        *coordinates("o", sums.dims, sums.kept, "c", itype),
        *sums.finish(params, [f"total{k}" for k in range(count)]),
    ]
    loop = grid_stride("o", first_thread(itype), kept, itype, body)
    return make_kernel(ctx, fused, f"{sums.name}_finalize", params, loop, (blocks_for(kept), 1, 1))
