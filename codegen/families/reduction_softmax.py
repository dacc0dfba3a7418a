"""Softmax, with an elementwise epilogue on y: normalised along one axis with the reduction
walk's two mappings (reduction_walk.py), a max then a sum of exponentials. ROW rows of up to HELD
values per thread stay in registers (x is read once); longer rows keep an online (max, sum)
pair per thread and read x again to write y (that second read mostly hits L2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, operand_loader, pattern_name
from ..cuda_types import cuda_type, rounded, store
from ..indexing import coordinates, loop_index_type, offset
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

HELD = 16  # softmax values a thread holds in registers (16 at 1024 threads: 64 registers each)


@dataclass(frozen=True)
class _Softmax:
    """What the softmax kernels share: the tensors, names, dims and how each result is stored."""

    fused: FusedNode
    x: Tensor
    y: Tensor
    axis: int
    compute: str
    itype: str
    names: Names

    def write(self, value: str, vec: int, moved: dict[int, str], along: str) -> list[str]:
        """Statements computing ``value`` (of element e) for e < vec, the epilogue on it, and the
        stores of every output at its base + ``along`` steps of the softmax axis."""
        c, dims = self.compute, self.x.static_dim
        lines = [f"gd::Vec<{cuda_type(t.data_type)}, {vec}> r{t.id};" for t in self.fused.outputs]
        values = epilogue.Values(c, operand_loader(self.names, dims, "q", c))
        values.define(self.y, rounded(self.y.data_type, value, c))
        epilogue.apply(self.fused.epilogue, values)
        element = aliases(dims, "o", "q", self.itype, moved) + values.statements
        element += [f"r{t.id}.v[e] = {store(t.data_type, values.get(t))};" for t in self.fused.outputs]
        lines += ["#pragma unroll", f"for (int e = 0; e < {vec}; ++e) {{", *("  " + s for s in element), "}"]
        for t in self.fused.outputs:
            at = f"base{t.id} + {along} * {t.stride[self.axis]}"
            lines += store_elements(self.names[t.id], t, at, vec, f"r{t.id}")
        return lines

    def bases(self) -> list[str]:
        return [
            f"const {self.itype} base{t.id} = {offset(t, t.static_dim, 'o')};" for t in (self.x, *self.fused.outputs)
        ]


def emit_softmax(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    anchor = fused.anchor
    assert anchor is not None
    x, y = anchor.input("input"), anchor.output("y")
    assert x is not None and y is not None
    axis = anchor.attributes.axis % len(x.dim)  # type: ignore[attr-defined]
    kept = tuple(1 if a == axis else d for a, d in enumerate(x.static_dim))
    tensors = [*fused.inputs, *fused.outputs]
    compute = compute_of(tensors)
    params = KernelParams()
    names = declare(params, [x, *epilogue_operands(fused)], fused.outputs)
    params.aligned_flag()
    softmax = _Softmax(fused, x, y, axis, compute, loop_index_type(tensors, x.static_numel, MAX_GROUP * 16), names)
    order = stride_order(x.static_dim, x.static_stride)
    if innermost(x.static_dim, order) == axis:
        body, threads, shared, blocks, label = _softmax_rows(softmax, kept, order)
    else:
        body, threads, shared, blocks, label = _softmax_columns(
            softmax, plan_walk(x, kept, tensors, slot_bytes=type_bytes(compute), along=fused.outputs, split=False)
        )
    name, source = kernel_source(ctx, fused, f"{pattern_name(fused)}_{label}", params, threads, indent(body, 1))
    kernel = Kernel(name, source, (blocks, 1, 1), (threads, 1, 1), shared, tuple(params.bindings))
    return FusedProgram(fused.name, (kernel,))


def _softmax_rows(s: _Softmax, kept: tuple[int, ...], order: tuple[int, ...]) -> tuple[list[str], int, int, int, str]:
    """A group of G threads per row. Rows of up to G * HELD values stay in registers: load,
    group max, exponentials and group sum, scale and store. Longer rows: an online (max, sum)
    pass, then a second read of the row that writes y."""
    x, c, itype = s.x, s.compute, s.itype
    count = x.dim[s.axis]
    vec = axis_vector([x, *s.fused.outputs], s.axis)
    vectors = count // vec
    group = min(MAX_GROUP, pow2_ceil(-(-count // HELD)))
    slots = -(-vectors // group)
    held = slots * vec <= HELD
    if not held:
        group = min(MAX_GROUP, pow2_floor(vectors // MIN_STEPS))
    threads = max(group, THREADS)
    per_block = threads // group
    rows = x.numel // count
    red = "red" if group > 32 else f"({c}*)nullptr"
    step = vec * x.stride[s.axis]
    minus_inf, one = literal(-math.inf, c), literal(1, c)
    body = [shared_buffer(c)] if group > 32 else []
    body += [
        f"const int lane = threadIdx.x % {group};",
        f"const {itype} o = ({itype})blockIdx.x * {per_block} + threadIdx.x / {group};",
        f"const bool active = o < {rows};",
        f"const {itype} first = active ? o : 0;",
        *coordinates("first", kept, order, "o", itype),
        *s.bases(),
    ]
    moved = {s.axis: f"v * {vec} + e"}
    if held:
        guard = [f"const {itype} v = lane + slot * {group};", f"if (active && v < {vectors}) {{"]
        load_row = load_elements(s.names[x.id], x, f"base{x.id} + v * {step}", vec, c, "xs[slot]")
        exponentials = ["xs[slot][e] = exp(xs[slot][e] - m);", "sum += xs[slot][e];"]
        body += [
            f"{c} xs[{slots}][{vec}];",
            f"{c} m = {minus_inf};",
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard + load_row),
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
            f"const {c} inv = {one} / sum;",
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard),
            *("    " + line for line in s.write("xs[slot][e] * inv", vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    else:
        walk = [
            f"for ({itype} v = lane; v < {vectors}; v += {group}) {{",
            f"  {c} xs[{vec}];",
            *("  " + line for line in load_elements(s.names[x.id], x, f"base{x.id} + v * {step}", vec, c, "xs")),
        ]
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
            f"const {c} inv = {one} / sum;",
            "if (active) {",
            *("  " + line for line in walk),
            *("    " + line for line in s.write("exp(xs[e] - row_max) * inv", vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    shared = threads // 32 * type_bytes(c) if group > 32 else 0
    return body, threads, shared, -(-rows // per_block), "rows" if held else "long_rows"


def _softmax_columns(s: _Softmax, walk: Walk) -> tuple[list[str], int, int, int, str]:
    """The softmax axis is not innermost: a thread owns VEC neighbouring rows, the TY threads of
    a block column split the axis with an online (max, sum) pair each, merge them through shared
    memory, and read x again to write y."""
    x, c, itype, vec = s.x, s.compute, s.itype, walk.vec
    count = x.dim[s.axis]
    inner = innermost(walk.kept, walk.order)
    moved = {s.axis: "j", **({} if inner is None else {inner: f"o{inner} + e"})}
    one = literal(1, c)
    walk_axis = [
        f"for ({itype} j = ty; j < {count}; j += {walk.depth}) {{",
        f"  {c} xs[{vec}];",
        *(
            "  " + line
            for line in load_elements(s.names[x.id], x, f"base{x.id} + j * {x.stride[s.axis]}", vec, c, "xs")
        ),
    ]
    body = [
        shared_buffer(c),
        f"const int lane = threadIdx.x % {walk.lanes}, ty = threadIdx.x / {walk.lanes};",
        f"const {itype} o = (({itype})blockIdx.x * {walk.lanes} + lane) * {vec};",
        f"const bool active = o < {walk.outputs};",
        f"const {itype} first = active ? o : 0;",
        *coordinates("first", walk.kept, walk.order, "o", itype),
        *s.bases(),
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
        f"for (int e = 0; e < {vec}; ++e) inv[e] = {one} / sum[e];",
        "if (active) {",
        *("  " + line for line in walk_axis),
        *("    " + line for line in s.write("exp(xs[e] - top[e]) * inv[e]", vec, moved, "j")),
        "  }",
        "}",
    ]
    return body, walk.threads, walk.threads * vec * type_bytes(c), walk.blocks, "columns"
