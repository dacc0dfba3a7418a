"""The reduction-walk kernels: the walk of reduction_walk.py with an accumulator (what each
element adds) and a finish (what happens to each output's merged values), and, when the walk is
split into chunks, the kernel combining them. Every combination happens in an order fixed by the
launch shape, so results are reproducible run to run (no atomics). The reductions
(reduction.py) and the batch-norm statistics (batchnorm_train.py) are written on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.errors import GraphError
from graphdnn.ir import Tensor

from .. import epilogue
from ..context import EmitContext, KernelParams, indent, kernel_source, operand_loader
from ..cuda_types import load, rounded, store
from ..indexing import coordinates, offset, row_major_index, run_offset
from ..kernel import Kernel, Scratch
from ..pointwise import literal
from .reduction_fragments import Names, aliases, declare, load_elements, merge_lambda, shared_buffer, type_bytes
from .reduction_walk import THREADS, Walk, innermost, pow2_ceil


@dataclass(frozen=True)
class Accumulator:
    """The values a walk keeps per output: ``width`` of ``c_type`` (``acc[slot * width + i]``),
    starting at ``identity``; ``fold(slot, x)`` gives the statements adding element value ``x`` to
    output slot ``slot``; partial values combine with the pointwise op ``merge``, in ``merged_type``
    when a second kernel combines chunks. ``shifted``: x's first element of each output is loaded
    into ``shift[slot]`` before the walk (the data shift of the batch-norm statistics)."""

    c_type: str
    width: int
    identity: float
    merge: str
    fold: Callable[[str, str], list[str]]
    merged_type: str
    shifted: bool = False


@dataclass(frozen=True)
class Finish:
    """What happens to an output's merged values: statements given the parameter names, the
    merged values, the output's coordinate prefix and its shift (``None`` unless shifted), plus the
    tensors they read and write and the scratch buffers (name, C type) they write."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    statements: Callable[[Names, list[str], str, str | None], list[str]]
    scratch: tuple[tuple[str, str], ...] = ()


def epilogue_operands(fused: FusedNode) -> tuple[Tensor, ...]:
    """The fused node's inputs that its epilogue reads."""
    read = {t.id for node in fused.epilogue for t in node.input_tensors()}
    return tuple(t for t in fused.inputs if t.id in read)


def epilogue_finish(
    fused: FusedNode, value: Tensor, compute: str, result: Callable[[list[str]], str], dims: Sequence[int]
) -> Finish:
    """``value`` (the anchor's output) = result(merged values) rounded to its type, then the
    epilogue, then every output of the fused node stored at the output's coordinates."""

    def statements(names: Names, merged: list[str], prefix: str, shift: str | None) -> list[str]:
        loader = operand_loader(names, dims, prefix, compute)
        values = epilogue.Values(compute, loader, lambda t: row_major_index(t, dims, prefix))
        values.define(value, rounded(value.data_type, result(merged), compute))
        epilogue.apply(fused.epilogue, values)
        stores = [
            f"{names[t.id]}[{offset(t, dims, prefix)}] = {store(t.data_type, values.get(t))};" for t in fused.outputs
        ]
        return values.statements + stores

    return Finish(epilogue_operands(fused), fused.outputs, statements)


def refuse_tuning(fused: FusedNode, ctx: EmitContext) -> None:
    """These families choose their launch shape from the layout alone: no autotuned choices."""
    if ctx.tuning:
        raise GraphError(
            f"fused node '{fused.name}': the {fused.family.value} family takes no launch choices, got {ctx.tuning}"
        )


def walk_kernels(
    ctx: EmitContext, fused: FusedNode, walk: Walk, acc: Accumulator, finish: Finish, pattern: str
) -> tuple[list[Kernel], list[Scratch]]:
    """The kernel walking the reduction and, when it is split, the kernel combining its chunks."""
    if walk.chunks == 1:
        return [_walk_kernel(ctx, fused, walk, acc, finish, pattern)], []
    partials = Scratch("partials", walk.chunks * acc.width * walk.outputs * type_bytes(acc.c_type))
    return [
        _walk_kernel(ctx, fused, walk, acc, None, pattern),
        _combine_kernel(ctx, fused, walk, acc, finish, pattern),
    ], [partials]


def _walk_kernel(
    ctx: EmitContext, fused: FusedNode, walk: Walk, acc: Accumulator, finish: Finish | None, pattern: str
) -> Kernel:
    params = KernelParams()
    x, itype, vec, width = walk.x, walk.itype, walk.vec, acc.width
    names = declare(params, [x, *(finish.inputs if finish else ())], finish.outputs if finish else ())
    for scratch, c_type in finish.scratch if finish else (("partials", acc.c_type),):
        params.scratch(scratch, c_type)
    params.aligned_flag()
    slots = 1 if walk.rows else vec
    body = [f"const auto merge = {merge_lambda(acc.merge, acc.c_type)};"]
    if walk.rows:
        body += [
            f"const int lane = threadIdx.x % {walk.lanes};",
            f"const {itype} o = ({itype})blockIdx.x * {walk.depth} + threadIdx.x / {walk.lanes};",
        ]
        step, per_thread = "v", f"v * {vec}"
    else:
        body += [
            f"const int lane = threadIdx.x % {walk.lanes}, ty = threadIdx.x / {walk.lanes};",
            f"const {itype} o = (({itype})blockIdx.x * {walk.lanes} + lane) * {vec};",
        ]
        step, per_thread = "j", "j"
    body += [
        f"const bool active = o < {walk.outputs};",
        f"const {itype} first = active ? o : 0;",
        *coordinates("first", walk.kept, walk.order, "o", itype),
        f"const {itype} base = {offset(x, x.static_dim, 'o')};",
        f"{acc.c_type} acc[{slots * width}];",
        "#pragma unroll",
        f"for (int i = 0; i < {slots * width}; ++i) acc[i] = {literal(acc.identity, acc.c_type)};",
    ]
    if acc.shifted:
        body += [f"{acc.c_type} shift[{slots}] = {{}};", "if (active) {"]
        body += ["  " + s for s in load_elements(names[x.id], x, "base", slots, acc.c_type, "shift")] + ["}"]
    begin = f"({itype})blockIdx.y * {walk.chunk}" if walk.chunks > 1 else "0"
    end = (
        f"{begin} + {walk.chunk} < {walk.steps} ? {begin} + {walk.chunk} : {walk.steps}"
        if walk.chunks > 1
        else str(walk.steps)
    )
    walk_offsets, at = run_offset(per_thread, walk.runs, "r", itype)
    fold = acc.fold("0" if walk.rows else "e", "xs[e]")
    stride = walk.lanes if walk.rows else walk.depth
    first_step = "lane" if walk.rows else "ty"
    body += [
        "if (active) {",
        f"  const {itype} end = {end};",
        "#pragma unroll 4  // several independent loads in flight per thread",
        f"  for ({itype} {step} = {begin} + {first_step}; {step} < end; {step} += {stride}) {{",
        *("    " + s for s in walk_offsets),
        f"    const {itype} at = base + {at};",
        f"    {acc.c_type} xs[{vec}];",
        *("    " + s for s in load_elements(names[x.id], x, "at", vec, acc.c_type, "xs")),
        "#pragma unroll",
        f"    for (int e = 0; e < {vec}; ++e) {{",
        *("      " + s for s in fold),
        "    }",
        "  }",
        "}",
    ]
    shared = 0
    if walk.rows:
        if walk.lanes > 32:
            body.insert(0, shared_buffer(acc.c_type))
            shared = walk.threads // 32 * type_bytes(acc.c_type)
        scratch = "red" if walk.lanes > 32 else f"({acc.c_type}*)nullptr"
        body += [f"acc[{i}] = gd::group_reduce<{walk.lanes}>(acc[{i}], {scratch}, merge);" for i in range(width)]
        body.append("if (active && lane == 0) {")
    else:
        body.insert(0, shared_buffer(acc.c_type))
        shared = walk.threads * slots * width * type_bytes(acc.c_type)
        body += [f"gd::column_reduce<{walk.lanes}, {walk.depth}, {slots * width}>(acc, red, merge);"]
        body.append("if (active && ty == 0) {")
    if finish is None:
        body += [
            f"  partials[(({itype})blockIdx.y * {width} + {i}) * {walk.outputs} + o + {slot}] = acc[{slot * width + i}];"
            for slot in range(slots)
            for i in range(width)
        ]
    elif walk.rows:
        body += ["  " + s for s in finish.statements(names, [f"acc[{i}]" for i in range(width)], "o", "shift[0]")]
    else:
        inner = innermost(walk.kept, walk.order)
        for slot in range(slots):
            moved = {} if inner is None else {inner: f"o{inner} + {slot}"}
            values = [f"acc[{slot * width + i}]" for i in range(width)]
            statements = finish.statements(names, values, "q", f"shift[{slot}]")
            body += ["  {", *("    " + s for s in aliases(walk.kept, "o", "q", itype, moved) + statements), "  }"]
    body.append("}")
    label = f"{pattern}_{'rows' if walk.rows else 'columns'}{'_partial' if finish is None else ''}"
    name, source = kernel_source(ctx, fused, label, params, walk.threads, indent(body, 1))
    grid = (walk.blocks, walk.chunks, 1)
    return Kernel(name, source, grid, (walk.threads, 1, 1), shared, tuple(params.bindings))


def _combine_kernel(
    ctx: EmitContext, fused: FusedNode, walk: Walk, acc: Accumulator, finish: Finish, pattern: str
) -> Kernel:
    """Thread (tx, ty) merges chunks ty, ty + TY, ... of output tx in ``merged_type``; the TY
    threads of a column then merge down the column: a fixed order."""
    params = KernelParams()
    x, itype, width, merged = walk.x, walk.itype, acc.width, acc.merged_type
    names = declare(params, [*([x] if acc.shifted else []), *finish.inputs], finish.outputs)
    params.scratch("partials", f"const {acc.c_type}")
    for scratch, c_type in finish.scratch:
        params.scratch(scratch, c_type)
    params.aligned_flag()
    lanes = min(32, pow2_ceil(walk.outputs))
    depth = THREADS // lanes
    body = [
        shared_buffer(merged),
        f"const auto merge = {merge_lambda(acc.merge, merged)};",
        f"const int lane = threadIdx.x % {lanes}, ty = threadIdx.x / {lanes};",
        f"const {itype} o = ({itype})blockIdx.x * {lanes} + lane;",
        f"const bool active = o < {walk.outputs};",
        f"{merged} acc[{width}];",
        "#pragma unroll",
        f"for (int i = 0; i < {width}; ++i) acc[i] = {literal(acc.identity, merged)};",
        "if (active) {",
        f"  for (int p = ty; p < {walk.chunks}; p += {depth}) {{",
        "#pragma unroll",
        f"    for (int i = 0; i < {width}; ++i) acc[i] = merge(acc[i], ({merged})partials[(({itype})p * {width} + i) * {walk.outputs} + o]);",
        "  }",
        "}",
        f"gd::column_reduce<{lanes}, {depth}, {width}>(acc, red, merge);",
        "if (active && ty == 0) {",
        *("  " + s for s in coordinates("o", walk.kept, walk.order, "o", itype)),
    ]
    shift = None
    if acc.shifted:
        first = f"{names[x.id]}[{offset(x, x.static_dim, 'o')}]"
        body.append(f"  const {merged} shift = {load(x.data_type, first, merged)};")
        shift = "shift"
    body += ["  " + s for s in finish.statements(names, [f"acc[{i}]" for i in range(width)], "o", shift)]
    body.append("}")
    threads = lanes * depth
    name, source = kernel_source(ctx, fused, f"{pattern}_combine", params, threads, indent(body, 1))
    shared = threads * width * type_bytes(merged)
    grid = (-(-walk.outputs // lanes), 1, 1)
    return Kernel(name, source, grid, (threads, 1, 1), shared, tuple(params.bindings))
