"""Data movement: reshape, transpose, slice and concatenate, as strided copies.

Each op is one copy per region of its output: over an iteration space (the output, or for
concatenate each input in turn), every destination element takes one source element. Both
are *views* of the space (a base offset plus one stride per axis), except for a reshape of
a tensor that is not packed row-major, whose source element is found through its
row-major index.

A view copy walks the destination in memory order after merging the axes contiguous in
both views, so a reshape of a packed tensor, or a transpose that only relabels a layout
(NHWC data seen as [N, H, W, C]), is one run: a plain copy. When the innermost run is
contiguous in both views and every offset is a multiple of the vector width, threads move
16-byte vectors (if the runtime finds the pointers aligned; the same elements one by one
otherwise); a last partial vector goes element by element.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import numel, packed_strides, stride_order
from graphdnn.ops.shape import ConcatenateAttributes, SliceAttributes, TransposeAttributes

from ..context import EmitContext, KernelParams, compute_of
from ..cuda_types import cuda_type, store
from ..indexing import coordinates, linear_index, offset
from ..kernel import FusedProgram, Kernel
from .direct_common import anchor_of, blocks_for, first_thread, grid_stride, loop_index_type, make_kernel, read


@dataclass(frozen=True)
class View:
    """The element at coordinates c of the iteration space: base + sum of c[i] * strides[i]."""

    strides: tuple[int, ...]
    base: int = 0


@dataclass(frozen=True)
class Copy:
    src: Tensor
    dst: Tensor
    dims: tuple[int, ...]  # the iteration space
    dst_at: View
    src_at: View | None  # None: the source element with the same row-major index (reshape)


def emit_reshape(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    x, y = _operands(fused)
    # A packed row-major input is a view of the output's dims: its element offset is the row-major index.
    row_major = all(s == p for d, s, p in zip(x.dim, x.stride, packed_strides(x.dim)) if d > 1)
    source = View(packed_strides(y.static_dim)) if row_major else None
    return _program(ctx, fused, [Copy(x, y, y.static_dim, View(y.static_stride), source)])


def emit_transpose(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    x, y = _operands(fused)
    attributes = anchor_of(fused).attributes
    assert isinstance(attributes, TransposeAttributes)
    source = View(tuple(x.static_stride[axis] for axis in attributes.permutation))
    return _program(ctx, fused, [Copy(x, y, y.static_dim, View(y.static_stride), source)])


def emit_slice(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    x, y = _operands(fused)
    a = anchor_of(fused).attributes
    assert isinstance(a, SliceAttributes)
    strides = tuple(stride * step for stride, step in zip(x.static_stride, a.step))
    base = sum(start * stride for start, stride, extent in zip(a.start, x.static_stride, x.static_dim) if extent > 1)
    return _program(ctx, fused, [Copy(x, y, y.static_dim, View(y.static_stride), View(strides, base))])


def emit_concatenate(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """One copy per input, into its slot of the output."""
    node = anchor_of(fused)
    y = node.output("y")
    assert y is not None and isinstance(node.attributes, ConcatenateAttributes)
    axis = node.attributes.axis % len(y.dim)
    copies, start = [], 0
    for x in node.inputs_of("inputs"):
        copies.append(
            Copy(x, y, x.static_dim, View(y.static_stride, start * y.static_stride[axis]), View(x.static_stride))
        )
        start += x.dim[axis]
    return _program(ctx, fused, copies)


def _operands(fused: FusedNode) -> tuple[Tensor, Tensor]:
    node = anchor_of(fused)
    x, y = node.input("input"), node.output("y")
    assert x is not None and y is not None
    return x, y


def _program(ctx: EmitContext, fused: FusedNode, copies: list[Copy]) -> FusedProgram:
    if len(copies) == 1 and _in_place(copies[0]):
        return FusedProgram(fused.name, (), aliases=((copies[0].dst.id, copies[0].src.id),))
    return FusedProgram(fused.name, tuple(_copy_kernel(ctx, fused, c) for c in copies))


def _in_place(c: Copy) -> bool:
    """The copy leaves every element at the offset it had, between two intermediates of one
    type: the destination can be the source's memory, and there is nothing to launch (an
    attention output stored [B, S, H, D] seen as [B, S, H * D], a packed tensor reshaped)."""
    if c.src_at is None or not (c.src.is_virtual and c.dst.is_virtual) or c.src.data_type is not c.dst.data_type:
        return False
    runs = _merged(c.dims, c.dst_at, c.src_at)
    return c.dst_at.base == c.src_at.base == 0 and runs == [(numel(c.dims), 1, 1)]


def _copy_kernel(ctx: EmitContext, fused: FusedNode, c: Copy) -> Kernel:
    params = KernelParams()
    src, dst = params.tensor(c.src), params.tensor(c.dst, writable=True)
    count = numel(c.dims)
    itype = loop_index_type([c.src, c.dst], count)
    compute = compute_of([c.src, c.dst])
    raw = c.src.data_type is c.dst.data_type and not c.src.is_pass_by_value

    def move(dst_offset: str, src_offset: str) -> str:
        value = f"{src}[{src_offset}]" if raw else store(c.dst.data_type, read(c.src, src, src_offset, compute))
        return f"{dst}[{dst_offset}] = {value};"

    if c.src_at is None:
        body = grid_stride("p", first_thread(itype), count, itype, _relinearized(c, itype, move))
        return make_kernel(ctx, fused, "reshape", params, body, (blocks_for(count), 1, 1))

    runs = _merged(c.dims, c.dst_at, c.src_at)
    vec = _vector_width(c, c.src_at, runs)
    statements = coordinates("p", [extent for extent, _, _ in runs], range(len(runs)), "c", itype)
    element = [*statements, move(_at(runs, 1, c.dst_at.base, 1), _at(runs, 2, c.src_at.base, 1))]
    if vec == 1:
        body = grid_stride("p", first_thread(itype), count, itype, element)
    else:
        aligned = params.aligned_flag()
        vectors = count // vec
        extents = [extent for extent, _, _ in runs[:-1]] + [runs[-1][0] // vec]
        vector = [
            *coordinates("v", extents, range(len(runs)), "c", itype),
            *_move_vector(
                c, dst, src, vec, compute, _at(runs, 1, c.dst_at.base, vec), _at(runs, 2, c.src_at.base, vec)
            ),
        ]
        body = [
            f"{itype} tail = 0;",
            f"if ({aligned}) {{",
            *("  " + line for line in grid_stride("v", first_thread(itype), vectors, itype, vector)),
            f"  tail = {vectors * vec};",
            "}",
            *grid_stride("p", f"tail + {first_thread(itype)}", count, itype, element),
        ]
    return make_kernel(ctx, fused, f"copy_{len(runs)}d", params, body, (blocks_for(-(-count // vec)), 1, 1))


def _merged(dims: tuple[int, ...], dst: View, src: View) -> list[tuple[int, int, int]]:
    """(extent, dst stride, src stride) runs in the destination's memory order, outermost
    first: an axis merges into the next inner run when it is contiguous with it in both views."""
    order = sorted((axis for axis in range(len(dims)) if dims[axis] > 1), key=lambda axis: (-dst.strides[axis], axis))
    runs: list[tuple[int, int, int]] = []
    for axis in reversed(order):
        extent, dst_stride, src_stride = dims[axis], dst.strides[axis], src.strides[axis]
        if runs and dst_stride == runs[0][0] * runs[0][1] and src_stride == runs[0][0] * runs[0][2]:
            runs[0] = (runs[0][0] * extent, runs[0][1], runs[0][2])
        else:
            runs.insert(0, (extent, dst_stride, src_stride))
    return runs or [(1, 0, 0)]


def _vector_width(c: Copy, src_at: View, runs: list[tuple[int, int, int]]) -> int:
    """Elements per 16-byte vector when the copy can move whole vectors, else 1.

    The innermost run must be contiguous in both views and every vector must start at a
    multiple of the width in both (the runtime checks the pointers themselves); a
    multi-run copy also needs whole vectors per run, a single run ends with a partial one.
    """
    if c.src.is_pass_by_value:
        return 1
    vec = 16 // max(c.src.data_type.itemsize, c.dst.data_type.itemsize)
    extent, dst_inner, src_inner = runs[-1]
    starts = [c.dst_at.base, src_at.base, *(d for _, d, _ in runs[:-1]), *(s for _, _, s in runs[:-1])]
    if vec == 1 or dst_inner != 1 or src_inner != 1 or extent < vec or any(start % vec for start in starts):
        return 1
    return vec if len(runs) == 1 or extent % vec == 0 else 1


def _at(runs: list[tuple[int, int, int]], which: int, base: int, vec: int) -> str:
    """Offset of coordinates c{i} over the runs, in one view (which: 1 dst, 2 src); the
    innermost coordinate counts vectors of ``vec`` elements."""
    terms = [str(base)] if base else []
    for i, run in enumerate(runs):
        stride = run[which] * (vec if i == len(runs) - 1 else 1)
        if run[0] > 1:
            terms.append(f"c{i}" if stride == 1 else f"c{i} * {stride}")
    return " + ".join(terms) if terms else "0"


def _move_vector(c: Copy, dst: str, src: str, vec: int, compute: str, dst_offset: str, src_offset: str) -> list[str]:
    s_type, d_type = cuda_type(c.src.data_type), cuda_type(c.dst.data_type)
    load = f"gd::load_vec<{s_type}, {vec}>({src} + ({src_offset}))"
    if c.src.data_type is c.dst.data_type:
        return [f"gd::store_vec<{d_type}, {vec}>({dst} + ({dst_offset}), {load});"]
    return [
        f"const gd::Vec<{s_type}, {vec}> a = {load};",
        f"gd::Vec<{d_type}, {vec}> b;",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) b.v[e] = {store(c.dst.data_type, f'gd::to<{compute}>(a.v[e])')};",
        f"gd::store_vec<{d_type}, {vec}>({dst} + ({dst_offset}), b);",
    ]


def _relinearized(c: Copy, itype: str, move: Callable[[str, str], str]) -> list[str]:
    """A reshape element by element, the destination in memory order: its coordinates give
    the row-major index, which gives the source coordinates."""
    assert c.dst_at == View(c.dst.static_stride) and c.dims == c.dst.static_dim
    return [
        *coordinates("p", c.dims, stride_order(c.dims, c.dst.stride), "c", itype),
        f"const {itype} row_major = {linear_index(c.dims, range(len(c.dims)), 'c')};",
        *coordinates("row_major", c.src.static_dim, range(len(c.src.static_dim)), "x", itype),
        move(offset(c.dst, c.dims, "c"), offset(c.src, c.src.static_dim, "x")),
    ]
