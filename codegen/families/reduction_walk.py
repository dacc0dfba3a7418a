"""How a reduction's kernels cover it (the walk), chosen from x's layout so that neighbouring
threads read neighbouring memory:

* ROW: x's innermost axis (in memory) is reduced. A group of G consecutive threads owns
  one output and walks its elements VEC at a time (one 16-byte load), then the group
  combines through warp shuffles (gd::group_reduce).
* COLUMN: x's innermost axis is kept. A thread owns VEC neighbouring outputs (one 16-byte
  load feeds them all); the TY threads of a block column split the reduced elements and
  combine through shared memory (gd::column_reduce).

When the outputs are too few to fill the GPU, the reduced elements are split into P chunks
(blockIdx.y), combined by a second kernel (reduction_kernels.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from graphdnn.ir import Tensor
from graphdnn.layout import stride_order

from ..indexing import loop_index_type, merged_runs

THREADS = 256  # threads of a block unless a group needs more
MAX_GROUP = 1024  # the most threads one output (or softmax row) gets
TARGET_BLOCKS = 1024  # enough blocks for several per SM on an A100 (108 SMs) or H100 (132 SMs)
MIN_SPLIT_BLOCKS = 256  # with fewer blocks than this, split the reduced elements over blockIdx.y
MIN_STEPS = 8  # loads per thread below which a finer split costs more than it gains
SHARED_BYTES = 48 * 1024  # shared memory a block may take without opting in to more


def pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


@dataclass(frozen=True)
class Walk:
    """How kernels cover the reduction of ``x`` to dims ``kept`` (the reduced axes set to 1).

    Outputs are numbered in x's memory order of the kept axes; ``runs`` are the reduced axes
    as merged (extent, stride) runs. ROW (``rows``): ``lanes`` threads per output, ``depth``
    outputs per block. COLUMN: ``lanes`` threads across outputs (VEC each), ``depth`` threads
    down the reduced elements. ``chunk`` reduced elements (ROW: vectors) per blockIdx.y.
    """

    x: Tensor
    kept: tuple[int, ...]
    order: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]
    rows: bool
    vec: int
    lanes: int
    depth: int
    chunk: int
    itype: str = field(default="int")

    @property
    def outputs(self) -> int:
        return math.prod(self.kept)

    @property
    def count(self) -> int:
        return self.x.numel // self.outputs

    @property
    def steps(self) -> int:
        """What one chunk divides: vectors of an output (ROW), reduced elements (COLUMN)."""
        return self.count // self.vec if self.rows else self.count

    @property
    def chunks(self) -> int:
        return -(-self.steps // self.chunk)

    @property
    def threads(self) -> int:
        return self.lanes * self.depth

    @property
    def blocks(self) -> int:
        per_block = self.depth if self.rows else self.lanes * self.vec
        return -(-self.outputs // per_block)


def innermost(dims: Sequence[int], order: Sequence[int]) -> int | None:
    """The axis with the smallest stride among those of extent > 1 (None for one element)."""
    spanning = [axis for axis in order if dims[axis] > 1]
    return spanning[-1] if spanning else None


def widest_vector(tensors: Sequence[Tensor], fits: Callable[[int], bool]) -> int:
    """The most elements that move as one 16-, 8- or 4-byte access in every tensor (at least 2)
    for which ``fits(vec)`` holds; 1 when none does."""
    itemsize = max(t.data_type.itemsize for t in tensors)
    for width in (16, 8, 4):
        vec = width // itemsize
        if vec >= 2 and fits(vec):
            return vec
    return 1


def axis_vector(tensors: Sequence[Tensor], axis: int | None) -> int:
    """Elements of ``axis`` that move as one access in every tensor: each has stride 1 there,
    the extent is a multiple of the vector, and so is every other stride (vectors stay aligned)."""
    if axis is None:
        return 1

    def fits(vec: int) -> bool:
        return all(
            t.stride[axis] == 1
            and t.dim[axis] % vec == 0
            and all(s % vec == 0 for a, (d, s) in enumerate(zip(t.dim, t.stride)) if d > 1 and a != axis)
            for t in tensors
        )

    return widest_vector(tensors, fits)


def _run_vector(x: Tensor, kept: Sequence[int], runs: Sequence[tuple[int, int]]) -> int:
    """As axis_vector, for the innermost reduced run (which may merge several axes)."""
    extent, stride = runs[-1]
    strides = [s for _, s in runs[:-1]] + [s for d, k, s in zip(x.dim, kept, x.stride) if d > 1 and k > 1]

    def fits(vec: int) -> bool:
        return stride == 1 and extent % vec == 0 and all(s % vec == 0 for s in strides)

    return widest_vector([x], fits)


def _chunk(blocks: int, steps: int, per_chunk_min: int) -> int:
    """Steps per chunk: all of them when the outputs alone give enough blocks, else split so
    that about TARGET_BLOCKS blocks run, each thread still making MIN_STEPS loads or more."""
    if blocks >= MIN_SPLIT_BLOCKS or steps <= per_chunk_min:
        return max(steps, 1)
    chunks = min(-(-TARGET_BLOCKS // blocks), steps // per_chunk_min)
    return -(-steps // max(chunks, 1))


def plan_walk(
    x: Tensor,
    kept: tuple[int, ...],
    tensors: Sequence[Tensor],
    *,
    slot_bytes: int,
    along: Sequence[Tensor] = (),
    split: bool = True,
) -> Walk:
    """The walk of x's reduction to ``kept``; ``tensors``: every tensor of the kernels (for the
    index type); ``slot_bytes``: what a thread accumulates per output (COLUMN walks combine it
    in shared memory); ``along``: tensors a COLUMN walk also accesses by vectors of x's
    innermost axis."""
    order = stride_order(x.dim, x.stride)
    reduced = [axis for axis in order if kept[axis] == 1]
    runs = tuple(merged_runs(x.static_dim, x.static_stride, reduced))
    inner = innermost(x.static_dim, order)
    outputs = math.prod(kept)
    count = x.numel // outputs
    # Loop indices pass their bound by up to a vector per thread of a block; partials' indices too.
    itype = loop_index_type([x, *tensors], x.static_numel, MAX_GROUP * 16, slot_bytes * outputs * TARGET_BLOCKS)
    if inner is not None and kept[inner] == 1:
        vec = _run_vector(x, kept, runs)
        vectors = count // vec
        # Few outputs: a block each, and split each output's elements over many blocks.
        widest = MAX_GROUP if outputs >= MIN_SPLIT_BLOCKS or not split else THREADS
        group = min(widest, pow2_floor(vectors // MIN_STEPS))
        per_block = max(group, THREADS) // group
        chunk = _chunk(-(-outputs // per_block), vectors, group * MIN_STEPS) if split else vectors
        return Walk(x, kept, order, runs, True, vec, group, per_block, chunk, itype)
    vec = axis_vector([x, *along], inner)
    across = -(-outputs // vec)
    lanes = min(32, pow2_ceil(across))
    depth = min(THREADS // lanes, pow2_ceil(count))
    lanes = max(lanes, min(THREADS // depth, pow2_ceil(across)))
    while depth > 1 and lanes * depth * vec * slot_bytes > SHARED_BYTES:
        depth //= 2
    chunk = _chunk(-(-across // lanes), count, depth * MIN_STEPS) if split else count
    return Walk(x, kept, order, runs, False, vec, lanes, depth, chunk, itype)
