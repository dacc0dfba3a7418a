"""argmax / argmin along one axis, with an elementwise epilogue on the index: the reduction walk's
mapping (reduction_walk.py, never split) with a (value, index) pair per thread, combined by
gd::ArgBest, a total order (NaN first, then the larger or smaller value, then the smaller index),
so the group and column reductions give the reference's first index whatever their order.
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType

from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name
from ..indexing import coordinates, offset
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal
from .reduction_fragments import Names, aliases, declare, load_elements, shared_buffer
from .reduction_kernels import Finish, epilogue_finish, epilogue_operands
from .reduction_walk import Walk, innermost, plan_walk

PAIR_BYTES = 16  # a gd::Arg<float> or gd::Arg<double>: the value, padding, a 64-bit index
EXACT_FLOAT_INDEX = 2**24  # indices a float holds exactly, for the epilogue's compute type


def emit_arg_reduction(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    anchor = fused.anchor
    assert anchor is not None
    x, y = anchor.input("input"), anchor.output("y")
    assert x is not None and y is not None
    axis = anchor.attributes.axis % len(x.static_dim)  # type: ignore[attr-defined]
    count = x.static_dim[axis]
    # Values compare in a type that holds every input value exactly (ties stay ties).
    exact = "double" if x.data_type in (DataType.DOUBLE, DataType.INT32, DataType.INT64) else "float"
    tensors = [*fused.inputs, *fused.outputs]
    compute = "double" if count > EXACT_FLOAT_INDEX else compute_of(tensors)
    walk = plan_walk(x, y.static_dim, tensors, slot_bytes=PAIR_BYTES, split=False)
    params = KernelParams()
    finish = epilogue_finish(fused, y, compute, lambda merged: f"({compute}){merged[0]}.index", y.static_dim)
    names = declare(params, [x, *epilogue_operands(fused)], fused.outputs)
    params.aligned_flag()
    pair = f"gd::Arg<{exact}>"
    extreme = literal(-math.inf if anchor.op == "argmax" else math.inf, exact)
    shared_scratch = not walk.rows or walk.lanes > 32  # the rows of a warp combine through shuffles alone
    body = [
        *([shared_buffer(pair)] if shared_scratch else []),
        f"const gd::ArgBest<{'true' if anchor.op == 'argmax' else 'false'}> best;",
        *_thread(walk),
        f"const bool active = o < {walk.outputs};",
        f"const {walk.itype} first = active ? o : 0;",
        *coordinates("first", walk.kept, walk.order, "o", walk.itype),
        f"const {walk.itype} base = {offset(x, x.static_dim, 'o')};",
        # loses to every element: an infinity as far from the best as can be, the last index
        f"{pair} acc[{1 if walk.rows else walk.vec}];",
        "#pragma unroll",
        f"for (auto& a : acc) a = {{{extreme}, 0x7fffffffffffffffLL}};",
    ]
    at = f"base + v * {walk.vec * x.static_stride[axis]}" if walk.rows else f"base + j * {x.static_stride[axis]}"
    load = load_elements(names[x.id], x, at, walk.vec, exact, "xs")
    if walk.rows:
        body += [
            "if (active) {",
            f"  for ({walk.itype} v = lane; v < {count // walk.vec}; v += {walk.lanes}) {{",
            f"    {exact} xs[{walk.vec}];",
            *("    " + s for s in load),
            "#pragma unroll",
            f"    for (int e = 0; e < {walk.vec}; ++e) acc[0] = best(acc[0], {pair}{{xs[e], v * {walk.vec} + e}});",
            "  }",
            "}",
            f"acc[0] = gd::group_reduce<{walk.lanes}>(acc[0], {'red' if shared_scratch else f'({pair}*)nullptr'}, best);",
            "if (active && lane == 0) {",
            *("  " + s for s in finish.statements(names, ["acc[0]"], "o", None)),
            "}",
        ]
        shared = walk.threads // 32 * PAIR_BYTES if shared_scratch else 0
    else:
        body += [
            "if (active) {",
            f"  for ({walk.itype} j = ty; j < {count}; j += {walk.depth}) {{",
            f"    {exact} xs[{walk.vec}];",
            *("    " + s for s in load),
            "#pragma unroll",
            f"    for (int e = 0; e < {walk.vec}; ++e) acc[e] = best(acc[e], {pair}{{xs[e], j}});",
            "  }",
            "}",
            f"gd::column_reduce<{walk.lanes}, {walk.depth}, {walk.vec}>(acc, red, best);",
            "if (active && ty == 0) {",
            *("  " + s for s in _column_finish(walk, finish, names)),
            "}",
        ]
        shared = walk.threads * walk.vec * PAIR_BYTES
    label = f"{pattern_name(fused)}_{'rows' if walk.rows else 'columns'}"
    name, source = kernel_source(ctx, fused, label, params, walk.threads, indent(body, 1))
    kernel = Kernel(name, source, (walk.blocks, 1, 1), (walk.threads, 1, 1), shared, tuple(params.bindings))
    return FusedProgram(fused.name, (kernel,))


def _thread(walk: Walk) -> list[str]:
    """The thread's first output ``o`` and its place: ``lane`` in its row's group (ROW), or
    ``lane`` across outputs and ``ty`` down the axis (COLUMN)."""
    itype = walk.itype
    if walk.rows:
        return [
            f"const int lane = threadIdx.x % {walk.lanes};",
            f"const {itype} o = ({itype})blockIdx.x * {walk.depth} + threadIdx.x / {walk.lanes};",
        ]
    return [
        f"const int lane = threadIdx.x % {walk.lanes}, ty = threadIdx.x / {walk.lanes};",
        f"const {itype} o = (({itype})blockIdx.x * {walk.lanes} + lane) * {walk.vec};",
    ]


def _column_finish(walk: Walk, finish: Finish, names: Names) -> list[str]:
    """The finish of each of the thread's VEC neighbouring outputs, at its own coordinates."""
    inner = innermost(walk.kept, walk.order)
    lines = []
    for slot in range(walk.vec):
        moved = {} if inner is None else {inner: f"o{inner} + {slot}"}
        at = aliases(walk.kept, "o", "q", walk.itype, moved) + finish.statements(names, [f"acc[{slot}]"], "q", None)
        lines += ["{", *("  " + line for line in at), "}"]
    return lines
