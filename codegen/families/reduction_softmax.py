"""Softmax and log-softmax, with an elementwise epilogue on y: normalised along one axis with the
reduction walk's two mappings (reduction_walk.py), a max then a sum of exponentials. ROW rows of
up to HELD values per thread stay in registers (x is read once); longer rows keep an online
(max, sum) pair per thread and read x again to write y (that second read mostly hits L2).

``emit_along_axis`` and the preludes are what every op normalised along one axis shares
(softmax_backward too, reduction_softmax_backward.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, operand_loader, pattern_name
from ..cuda_types import cuda_type, rounded, store
from ..indexing import coordinates, loop_index_type, offset, row_major_index
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal
from .reduction_fragments import (
    Names,
    aliases,
    declare,
    load_elements,
    merge_lambda,
    shared_buffer,
    store_elements,
    type_bytes,
)
from .reduction_kernels import epilogue_operands
from .reduction_walk import (
    MAX_GROUP,
    MIN_STEPS,
    THREADS,
    Walk,
    axis_vector,
    innermost,
    plan_walk,
    pow2_ceil,
    pow2_floor,
)

HELD = 16  # values a thread holds in registers (16 at 1024 threads: 64 registers each)


@dataclass(frozen=True)
class AlongAxis:
    """What the kernels of an op along one axis share: the tensors read at every element
    (``reads``, all of the first one's dims), the anchor's output ``y``, names and index type."""

    fused: FusedNode
    reads: tuple[Tensor, ...]
    y: Tensor
    axis: int
    compute: str
    itype: str
    names: Names

    @property
    def x(self) -> Tensor:
        return self.reads[0]

    def load(self, into: str, at: str, vec: int) -> list[str]:
        """Load the ``vec`` elements ``at`` steps along the axis from each read tensor's base into
        ``into`` with ``#`` replaced by the tensor's id (``xs#[slot]``)."""
        lines = []
        for t in self.reads:
            pointer, target = self.names[t.id], into.replace("#", str(t.id))
            lines += load_elements(
                pointer, t, f"base{t.id} + {at} * {t.static_stride[self.axis]}", vec, self.compute, target
            )
        return lines

    def write(self, value: str, vec: int, moved: dict[int, str], along: str) -> list[str]:
        """Statements computing ``value`` (of element e) for e < vec, the epilogue on it, and the
        stores of every output at its base + ``along`` steps of the axis."""
        c, dims = self.compute, self.x.static_dim
        lines = [f"gd::Vec<{cuda_type(t.data_type)}, {vec}> r{t.id};" for t in self.fused.outputs]
        values = epilogue.Values(c, operand_loader(self.names, dims, "q", c), lambda t: row_major_index(t, dims, "q"))
        values.define(self.y, rounded(self.y.data_type, value, c))
        epilogue.apply(self.fused.epilogue, values)
        element = aliases(dims, "o", "q", self.itype, moved) + values.statements
        element += [f"r{t.id}.v[e] = {store(t.data_type, values.get(t))};" for t in self.fused.outputs]
        lines += ["#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{", *("  " + s for s in element), "}"]
        for t in self.fused.outputs:
            at = f"base{t.id} + {along} * {t.static_stride[self.axis]}"
            lines += store_elements(self.names[t.id], t, at, vec, f"r{t.id}")
        return lines

    def bases(self) -> list[str]:
        tensors = (*self.reads, *self.fused.outputs)
        return [f"const {self.itype} base{t.id} = {offset(t, t.static_dim, 'o')};" for t in tensors]


@dataclass(frozen=True)
class RowShape:
    """``group`` threads per row, ``per_block`` rows a block; rows of ``vectors`` vectors of
    ``vec`` elements, ``slots`` vectors a thread, kept in registers when ``held``."""

    vec: int
    vectors: int
    group: int
    slots: int
    held: bool
    rows: int

    @property
    def threads(self) -> int:
        return max(self.group, THREADS)

    @property
    def per_block(self) -> int:
        return self.threads // self.group

    def red(self, compute: str) -> str:
        """The group reductions' scratch: shared memory once a group spans several warps."""
        return "red" if self.group > 32 else f"({compute}*)nullptr"

    def shared(self, compute: str) -> int:
        return self.threads // 32 * type_bytes(compute) if self.group > 32 else 0

    def guard(self, itype: str) -> list[str]:
        """A held slot's vector index ``v`` and the test, opening a brace, that it exists in the row."""
        return [f"const {itype} v = lane + slot * {self.group};", f"if (active && v < {self.vectors}) {{"]


def row_shape(s: AlongAxis) -> RowShape:
    """Rows whose values (every read tensor's) fit HELD registers a thread stay in registers;
    longer ones get a group of threads that each load at least MIN_STEPS vectors."""
    count = s.x.static_dim[s.axis]
    vec = axis_vector([*s.reads, *s.fused.outputs], s.axis)
    vectors = count // vec
    per_thread = HELD // len(s.reads)
    group = min(MAX_GROUP, pow2_ceil(-(-count // per_thread)))
    slots = -(-vectors // group)
    held = slots * vec <= per_thread
    if not held:
        group = min(MAX_GROUP, pow2_floor(vectors // MIN_STEPS))
    return RowShape(vec, vectors, group, slots, held, s.x.static_numel // count)


def row_prelude(s: AlongAxis, shape: RowShape, kept: tuple[int, ...], order: tuple[int, ...]) -> list[str]:
    """Each thread's row ``o`` (``active`` when it exists), its lane, coordinates and bases."""
    itype = s.itype
    return [
        *([shared_buffer(s.compute)] if shape.group > 32 else []),
        f"const int lane = threadIdx.x % {shape.group};",
        f"const {itype} o = ({itype})blockIdx.x * {shape.per_block} + threadIdx.x / {shape.group};",
        f"const bool active = o < {shape.rows};",
        f"const {itype} first = active ? o : 0;",
        *coordinates("first", kept, order, "o", itype),
        *s.bases(),
    ]


def column_prelude(s: AlongAxis, walk: Walk) -> list[str]:
    """Each thread's VEC neighbouring rows from ``o`` (``active`` when they exist), its lane and
    its depth ``ty`` along the axis, coordinates and bases."""
    itype = s.itype
    return [
        shared_buffer(s.compute),
        f"const int lane = threadIdx.x % {walk.lanes}, ty = threadIdx.x / {walk.lanes};",
        f"const {itype} o = (({itype})blockIdx.x * {walk.lanes} + lane) * {walk.vec};",
        f"const bool active = o < {walk.outputs};",
        f"const {itype} first = active ? o : 0;",
        *coordinates("first", walk.kept, walk.order, "o", itype),
        *s.bases(),
    ]


def column_moved(s: AlongAxis, walk: Walk) -> dict[int, str]:
    """Coordinates of element e at step ``j`` along the axis, in a column walk."""
    inner = innermost(walk.kept, walk.order)
    return {s.axis: "j", **({} if inner is None else {inner: f"o{inner} + e"})}


Emitted = tuple[list[str], int, int, int, str]  # body, threads, shared bytes, blocks, label


def emit_along_axis(
    fused: FusedNode,
    ctx: EmitContext,
    reads: tuple[str, ...],
    rows: Callable[[AlongAxis, tuple[int, ...], tuple[int, ...]], Emitted],
    columns: Callable[[AlongAxis, Walk], Emitted],
) -> FusedProgram:
    """One kernel for an anchor that reads the roles ``reads`` (of equal dims) and normalises
    along its ``axis`` attribute: ``rows`` when the axis is innermost in memory, else ``columns``."""
    anchor = fused.anchor
    assert anchor is not None
    bound = [anchor.input(role) for role in reads]
    tensors_read = tuple(t for t in bound if t is not None)
    y = anchor.outputs[0][1]
    assert len(tensors_read) == len(reads) and isinstance(y, Tensor)
    x = tensors_read[0]
    axis = anchor.attributes.axis % len(x.static_dim)  # type: ignore[attr-defined]
    kept = tuple(1 if a == axis else d for a, d in enumerate(x.static_dim))
    tensors = [*fused.inputs, *fused.outputs]
    compute = compute_of(tensors)
    params = KernelParams()
    names = declare(params, [*tensors_read, *epilogue_operands(fused)], fused.outputs)
    params.aligned_flag()
    itype = loop_index_type(tensors, x.static_numel, MAX_GROUP * 16)
    s = AlongAxis(fused, tensors_read, y, axis, compute, itype, names)
    order = stride_order(x.static_dim, x.static_stride)
    if innermost(x.static_dim, order) == axis:
        body, threads, shared, blocks, label = rows(s, kept, order)
    else:
        along = [*tensors_read[1:], *fused.outputs]
        walk = plan_walk(x, kept, tensors, slot_bytes=type_bytes(compute), along=along, split=False)
        body, threads, shared, blocks, label = columns(s, walk)
    name, source = kernel_source(ctx, fused, f"{pattern_name(fused)}_{label}", params, threads, indent(body, 1))
    kernel = Kernel(name, source, (blocks, 1, 1), (threads, 1, 1), shared, tuple(params.bindings))
    return FusedProgram(fused.name, (kernel,))


def emit_softmax(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """softmax, or log_softmax: the same statistics, y = (x - max) - log(sum) instead of a quotient."""
    return emit_along_axis(fused, ctx, ("input",), _softmax_rows, _softmax_columns)


def _is_log(s: AlongAxis) -> bool:
    assert s.fused.anchor is not None
    return s.fused.anchor.op == "log_softmax"


def _softmax_rows(s: AlongAxis, kept: tuple[int, ...], order: tuple[int, ...]) -> Emitted:
    """A group of G threads per row. Rows of up to G * HELD values stay in registers: load,
    group max, exponentials and group sum, scale and store. Longer rows: an online (max, sum)
    pass, then a second read of the row that writes y."""
    c, itype, log = s.compute, s.itype, _is_log(s)
    shape = row_shape(s)
    vec, group, slots = shape.vec, shape.group, shape.slots
    red = shape.red(c)
    minus_inf, one = literal(-math.inf, c), literal(1, c)
    # softmax: y = e^(x - max) / sum; log_softmax: y = (x - max) - log(sum)
    finish = f"const {c} lse = log(sum);" if log else f"const {c} inv = {one} / sum;"
    body = row_prelude(s, shape, kept, order)
    moved = {s.axis: f"v * {vec} + e"}
    if shape.held:
        guard = shape.guard(itype)
        # softmax keeps the exponentials in place of x; log_softmax keeps x - max
        exponentials = (
            ["xs[slot][e] -= m;", "sum += exp(xs[slot][e]);"]
            if log
            else ["xs[slot][e] = exp(xs[slot][e] - m);", "sum += xs[slot][e];"]
        )
        value = "xs[slot][e] - lse" if log else "xs[slot][e] * inv"
        body += [
            f"{c} xs[{slots}][{vec}];",
            f"{c} m = {minus_inf};",
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard + s.load("xs[slot]", f"v * {vec}", vec)),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) m = max(m, xs[slot][e]);",
            "  }",
            "}",
            f"m = gd::group_max<{group}>(m, {red});",
            f"{c} sum = 0;",
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) {{",
            *("      " + line for line in exponentials),
            "    }",
            "  }",
            "}",
            f"sum = gd::group_sum<{group}>(sum, {red});",
            finish,
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard),
            *("    " + line for line in s.write(value, vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    else:
        walk = [
            f"for ({itype} v = lane; v < {shape.vectors}; v += {group}) {{",
            f"  {c} xs[{vec}];",
            *("  " + line for line in s.load("xs", f"v * {vec}", vec)),
        ]
        value = "(xs[e] - row_max) - lse" if log else "exp(xs[e] - row_max) * inv"
        body += [
            f"{c} m = {minus_inf}, sum = 0;",
            "if (active) {",
            *("  " + line for line in walk),
            f"    {c} top = m;",
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) top = max(top, xs[e]);",
            f"    sum *= m == top ? {one} : exp(m - top);  // rescale to the new maximum",
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) sum += exp(xs[e] - top);",
            "    m = top;",
            "  }",
            "}",
            f"const {c} row_max = gd::group_max<{group}>(m, {red});",
            f"sum = gd::group_sum<{group}>(sum * (m == row_max ? {one} : exp(m - row_max)), {red});",
            finish,
            "if (active) {",
            *("  " + line for line in walk),
            *("    " + line for line in s.write(value, vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    blocks = -(-shape.rows // shape.per_block)
    return body, shape.threads, shape.shared(c), blocks, "rows" if shape.held else "long_rows"


def _softmax_columns(s: AlongAxis, walk: Walk) -> Emitted:
    """The softmax axis is not innermost: a thread owns VEC neighbouring rows, the TY threads of
    a block column split the axis with an online (max, sum) pair each, merge them through shared
    memory, and read x again to write y."""
    c, itype, vec, log = s.compute, s.itype, walk.vec, _is_log(s)
    count = s.x.static_dim[s.axis]
    one = literal(1, c)
    walk_axis = [
        f"for ({itype} j = ty; j < {count}; j += {walk.depth}) {{",
        f"  {c} xs[{vec}];",
        *("  " + line for line in s.load("xs", "j", vec)),
    ]
    # inv: 1 / sum for softmax, log(sum) for log_softmax
    finish = "inv[e] = log(sum[e]);" if log else f"inv[e] = {one} / sum[e];"
    value = "(xs[e] - top[e]) - inv[e]" if log else "exp(xs[e] - top[e]) * inv[e]"
    body = [
        *column_prelude(s, walk),
        f"{c} m[{vec}], sum[{vec}], top[{vec}], inv[{vec}];",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) m[e] = {literal(-math.inf, c)}, sum[e] = 0;",
        "if (active) {",
        *("  " + line for line in walk_axis),
        "#pragma unroll",
        f"    for (int e = 0; e < {vec}; ++e) {{",
        f"      const {c} next = max(m[e], xs[e]);",
        f"      sum[e] = sum[e] * (m[e] == next ? {one} : exp(m[e] - next)) + exp(xs[e] - next);",
        "      m[e] = next;",
        "    }",
        "  }",
        "}",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) top[e] = m[e];",
        f"gd::column_reduce<{walk.lanes}, {walk.depth}, {vec}>(top, red, [](const {c} a, const {c} b) {{ return max(a, b); }});",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) sum[e] *= m[e] == top[e] ? {one} : exp(m[e] - top[e]);",
        f"gd::column_reduce<{walk.lanes}, {walk.depth}, {vec}>(sum, red, {merge_lambda('add', c)});",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) {finish}",
        "if (active) {",
        *("  " + line for line in walk_axis),
        *("    " + line for line in s.write(value, vec, column_moved(s, walk), "j")),
        "  }",
        "}",
    ]
    return body, walk.threads, walk.threads * vec * type_bytes(c), walk.blocks, "columns"
