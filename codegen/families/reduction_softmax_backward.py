"""Softmax backward, with an elementwise epilogue on dx: dx = y * (dy - sum(dy * y)) along one
axis, on softmax's two mappings (reduction_softmax.py). One statistic, a sum: rows that fit in
registers read dy and y once; longer rows and column walks sum, then read both again to write.
"""

from __future__ import annotations

from fusion_rules import FusedNode

from ..context import EmitContext
from ..kernel import FusedProgram
from ..pointwise import literal
from .reduction_fragments import merge_lambda, type_bytes
from .reduction_softmax import AlongAxis, Emitted, column_moved, column_prelude, emit_along_axis, row_prelude, row_shape
from .reduction_walk import Walk


def emit_softmax_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    return emit_along_axis(fused, ctx, ("dy", "y"), _rows, _columns)


def _arrays(s: AlongAxis, subscript: str) -> tuple[str, str]:
    """The register arrays (``g`` + tensor id) that hold dy's and y's elements, subscripted."""
    dy, y = s.reads
    return f"g{dy.id}{subscript}", f"g{y.id}{subscript}"


def _rows(s: AlongAxis, kept: tuple[int, ...], order: tuple[int, ...]) -> Emitted:
    """A group of G threads per row: each sums dy * y over its part of the row, the group adds
    the sums, and each writes y * (dy - sum) from registers (held) or from a second read."""
    c, itype = s.compute, s.itype
    shape = row_shape(s)
    vec, group, slots = shape.vec, shape.group, shape.slots
    total = f"dot = gd::group_sum<{group}>(dot, {shape.red(c)});"
    moved = {s.axis: f"v * {vec} + e"}
    body = [*row_prelude(s, shape, kept, order), f"{c} dot = {literal(0, c)};"]
    if shape.held:
        dy, y = _arrays(s, "[slot][e]")
        guard = shape.guard(itype)
        body += [
            *(f"{c} g{t.id}[{slots}][{vec}];" for t in dict.fromkeys(s.reads)),
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard + s.load("g#[slot]", f"v * {vec}", vec)),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) dot += {dy} * {y};",
            "  }",
            "}",
            total,
            "#pragma unroll",
            f"for (int slot = 0; slot < {slots}; ++slot) {{",
            *("  " + line for line in guard),
            *("    " + line for line in s.write(f"{y} * ({dy} - dot)", vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    else:
        dy, y = _arrays(s, "[e]")
        walk = [
            f"for ({itype} v = lane; v < {shape.vectors}; v += {group}) {{",
            *(f"  {c} g{t.id}[{vec}];" for t in dict.fromkeys(s.reads)),
            *("  " + line for line in s.load("g#", f"v * {vec}", vec)),
        ]
        body += [
            "if (active) {",
            *("  " + line for line in walk),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) dot += {dy} * {y};",
            "  }",
            "}",
            total,
            "if (active) {",
            *("  " + line for line in walk),
            *("    " + line for line in s.write(f"{y} * ({dy} - dot)", vec, moved, f"v * {vec}")),
            "  }",
            "}",
        ]
    blocks = -(-shape.rows // shape.per_block)
    return body, shape.threads, shape.shared(c), blocks, "rows" if shape.held else "long_rows"


def _columns(s: AlongAxis, walk: Walk) -> Emitted:
    """The axis is not innermost: a thread owns VEC neighbouring rows, the TY threads of a block
    column split the axis, add their sums through shared memory, and read dy and y again to write."""
    c, itype, vec = s.compute, s.itype, walk.vec
    dy, y = _arrays(s, "[e]")
    walk_axis = [
        f"for ({itype} j = ty; j < {s.x.static_dim[s.axis]}; j += {walk.depth}) {{",
        *(f"  {c} g{t.id}[{vec}];" for t in dict.fromkeys(s.reads)),
        *("  " + line for line in s.load("g#", "j", vec)),
    ]
    body = [
        *column_prelude(s, walk),
        f"{c} dot[{vec}];",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) dot[e] = {literal(0, c)};",
        "if (active) {",
        *("  " + line for line in walk_axis),
        "#pragma unroll",
        f"    for (int e = 0; e < {vec}; ++e) dot[e] += {dy} * {y};",
        "  }",
        "}",
        f"gd::column_reduce<{walk.lanes}, {walk.depth}, {vec}>(dot, red, {merge_lambda('add', c)});",
        "if (active) {",
        *("  " + line for line in walk_axis),
        *("    " + line for line in s.write(f"{y} * ({dy} - dot[e])", vec, column_moved(s, walk), "j")),
        "  }",
        "}",
    ]
    return body, walk.threads, walk.threads * vec * type_bytes(c), walk.blocks, "columns"
