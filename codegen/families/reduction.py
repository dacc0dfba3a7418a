"""Reductions and softmax, with an elementwise epilogue on their output.

The mapping follows x's layout, so that neighbouring threads read neighbouring memory:

* ROW: x's innermost axis (in memory) is reduced. A group of G consecutive threads owns
  one output and walks its elements VEC at a time (one 16-byte load), then the group
  combines through warp shuffles (gd::group_reduce).
* COLUMN: x's innermost axis is kept. A thread owns VEC neighbouring outputs (one 16-byte
  load feeds them all); the TY threads of a block column split the reduced elements and
  combine through shared memory (gd::column_reduce).

When the outputs are too few to fill the GPU, the reduced elements are split into P chunks
(blockIdx.y): each block writes partial results to scratch and a second kernel combines
them in chunk order. Every combination happens in an order fixed by the launch shape, so
results are reproducible run to run (no atomics).

Softmax normalises along one axis with the same two mappings: a max, then a sum of
exponentials. ROW rows of up to HELD values per thread stay in registers (x is read once);
longer rows keep an online (max, sum) pair per thread and read x again to write y (that
second read mostly hits L2).

The batch-norm statistics (batchnorm_train.py) reuse the walk with their own accumulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fusion_rules import FusedNode
from graphdnn.errors import GraphError
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order
from graphdnn.ops.reduction import ReductionMode

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, operand_loader, pattern_name
from ..cuda_types import cuda_type, load, rounded, store
from ..indexing import coordinates, loop_index_type, merged_runs, offset, run_offset
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal, render

THREADS = 256  # threads of a block unless a group needs more
MAX_GROUP = 1024  # the most threads one output (or softmax row) gets
TARGET_BLOCKS = 1024  # enough blocks for several per SM on an A100 (108 SMs) or H100 (132 SMs)
MIN_SPLIT_BLOCKS = 256  # with fewer blocks than this, split the reduced elements over blockIdx.y
MIN_STEPS = 8  # loads per thread below which a finer split costs more than it gains
SHARED_BYTES = 48 * 1024  # shared memory a block may take without opting in to more
HELD = 16  # softmax values a thread holds in registers (16 at 1024 threads: 64 registers each)

Names = dict[int, str]


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _merge_lambda(op: str, c_type: str) -> str:
    """A C lambda combining two partial results with the pointwise op ``op`` (add, mul, min, max)."""
    return f"[](const {c_type} a, const {c_type} b) {{ return {render(op, ['a', 'b'], None, c_type)}; }}"


# -- what a walk accumulates ------------------------------------------------------------------
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


# -- how a walk covers the reduction ----------------------------------------------------------
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
    runs = tuple(merged_runs(x.dim, x.stride, reduced))
    inner = innermost(x.dim, order)
    outputs = math.prod(kept)
    count = x.numel // outputs
    # Loop indices pass their bound by up to a vector per thread of a block; partials' indices too.
    itype = loop_index_type([x, *tensors], x.numel, MAX_GROUP * 16, slot_bytes * outputs * TARGET_BLOCKS)
    if inner is not None and kept[inner] == 1:
        vec = _run_vector(x, kept, runs)
        vectors = count // vec
        # Few outputs: a block each, and split each output's elements over many blocks.
        widest = MAX_GROUP if outputs >= MIN_SPLIT_BLOCKS or not split else THREADS
        group = min(widest, _pow2_floor(vectors // MIN_STEPS))
        per_block = max(group, THREADS) // group
        chunk = _chunk(-(-outputs // per_block), vectors, group * MIN_STEPS) if split else vectors
        return Walk(x, kept, order, runs, True, vec, group, per_block, chunk, itype)
    vec = axis_vector([x, *along], inner)
    across = -(-outputs // vec)
    lanes = min(32, _pow2_ceil(across))
    depth = min(THREADS // lanes, _pow2_ceil(count))
    lanes = max(lanes, min(THREADS // depth, _pow2_ceil(across)))
    while depth > 1 and lanes * depth * vec * slot_bytes > SHARED_BYTES:
        depth //= 2
    chunk = _chunk(-(-across // lanes), count, depth * MIN_STEPS) if split else count
    return Walk(x, kept, order, runs, False, vec, lanes, depth, chunk, itype)


# -- code fragments ------------------------------------------------------------------------------
def load_elements(pointer: str, tensor: Tensor, at: str, vec: int, compute: str, into: str) -> list[str]:
    """Statements loading elements ``at`` .. ``at + vec - 1`` of ``tensor`` into ``into[0..vec)``
    (compute type): one 16-byte access when the launch's pointers are aligned."""
    if vec == 1:
        return [f"{into}[0] = {load(tensor.data_type, f'{pointer}[{at}]', compute)};"]
    t = cuda_type(tensor.data_type)
    return [
        "if (aligned) {",
        f"  const gd::Vec<{t}, {vec}> raw = gd::load_vec<{t}, {vec}>({pointer} + {at});",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {into}[e] = {load(tensor.data_type, 'raw.v[e]', compute)};",
        "} else {",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {into}[e] = {load(tensor.data_type, f'{pointer}[{at} + e]', compute)};",
        "}",
    ]


def store_elements(pointer: str, tensor: Tensor, at: str, vec: int, values: str) -> list[str]:
    """Statements storing the gd::Vec ``values`` at elements ``at`` .. ``at + vec - 1``."""
    if vec == 1:
        return [f"{pointer}[{at}] = {values}.v[0];"]
    t = cuda_type(tensor.data_type)
    return [
        f"if (aligned) gd::store_vec<{t}, {vec}>({pointer} + {at}, {values});",
        "else",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {pointer}[{at} + e] = {values}.v[e];",
    ]


def aliases(dims: Sequence[int], source: str, target: str, itype: str, moved: dict[int, str]) -> list[str]:
    """Coordinates ``{target}{axis}`` equal to ``{source}{axis}``, except the axes in ``moved``."""
    return [f"const {itype} {target}{axis} = {moved.get(axis, f'{source}{axis}')};" for axis in range(len(dims))]


def shared_buffer(c_type: str) -> str:
    return (
        "extern __shared__ __align__(16) unsigned char gd_shared[];\n"
        f"{c_type}* red = reinterpret_cast<{c_type}*>(gd_shared);"
    )


def declare(params: KernelParams, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Names:
    """Parameters for ``inputs`` then ``outputs`` (each tensor once); their names by tensor id."""
    names: Names = {}
    for t in inputs:
        if t.id not in names:
            names[t.id] = params.tensor(t)
    for t in outputs:
        names[t.id] = params.tensor(t, writable=True)
    return names


# -- the walk and the chunk combination ------------------------------------------------------
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
    body = [f"const auto merge = {_merge_lambda(acc.merge, acc.c_type)};"]
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
        f"const {itype} base = {offset(x, x.dim, 'o')};",
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
    lanes = min(32, _pow2_ceil(walk.outputs))
    depth = THREADS // lanes
    body = [
        shared_buffer(merged),
        f"const auto merge = {_merge_lambda(acc.merge, merged)};",
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
        first = f"{names[x.id]}[{offset(x, x.dim, 'o')}]"
        body.append(f"  const {merged} shift = {load(x.data_type, first, merged)};")
        shift = "shift"
    body += ["  " + s for s in finish.statements(names, [f"acc[{i}]" for i in range(width)], "o", shift)]
    body.append("}")
    threads = lanes * depth
    name, source = kernel_source(ctx, fused, f"{pattern}_combine", params, threads, indent(body, 1))
    shared = threads * width * type_bytes(merged)
    grid = (-(-walk.outputs // lanes), 1, 1)
    return Kernel(name, source, grid, (threads, 1, 1), shared, tuple(params.bindings))


def type_bytes(c_type: str) -> int:
    """Bytes of a compute type (float or double)."""
    return 8 if c_type == "double" else 4


# -- reductions ----------------------------------------------------------------------------------
def _same(x: str, compute: str) -> str:
    return x


def _unchanged(merged: str, count: int, compute: str) -> str:
    return merged


@dataclass(frozen=True)
class Mode:
    """A reduction mode: each element contributes ``element(x)``; contributions merge with the
    pointwise op ``merge`` starting from ``identity``; the output is ``result(merged, count)``."""

    merge: str
    identity: float
    element: Callable[[str, str], str] = _same
    result: Callable[[str, int, str], str] = _unchanged


MODES: dict[ReductionMode, Mode] = {
    ReductionMode.ADD: Mode("add", 0.0),
    ReductionMode.AVG: Mode("add", 0.0, result=lambda a, n, c: render("div", [a, literal(n, c)], None, c)),
    ReductionMode.NORM1: Mode("add", 0.0, element=lambda x, c: render("abs", [x], None, c)),
    ReductionMode.NORM2: Mode(
        "add",
        0.0,
        element=lambda x, c: render("mul", [x, x], None, c),
        result=lambda a, n, c: render("sqrt", [a], None, c),
    ),
    ReductionMode.MUL: Mode("mul", 1.0),
    ReductionMode.MUL_NO_ZEROS: Mode(
        "mul", 1.0, element=lambda x, c: f"({x} == {literal(0, c)} ? {literal(1, c)} : {x})"
    ),
    ReductionMode.MIN: Mode("min", math.inf),
    ReductionMode.MAX: Mode("max", -math.inf),
    ReductionMode.AMAX: Mode("max", -math.inf, element=lambda x, c: render("abs", [x], None, c)),
}


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
        values = epilogue.Values(compute, operand_loader(names, dims, prefix, compute))
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


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    refuse_tuning(fused, ctx)
    anchor = fused.anchor
    assert anchor is not None
    if anchor.op == "softmax":
        return _emit_softmax(fused, ctx)
    x, y = anchor.input("input"), anchor.output("y")
    assert x is not None and y is not None
    mode = MODES[anchor.attributes.mode]  # type: ignore[attr-defined]
    compute = compute_of([*fused.inputs, *fused.outputs])
    walk = plan_walk(x, y.dim, [*fused.inputs, *fused.outputs], slot_bytes=type_bytes(compute))
    acc = Accumulator(
        compute,
        1,
        mode.identity,
        mode.merge,
        lambda slot, v: [f"acc[{slot}] = merge(acc[{slot}], {mode.element(v, compute)});"],
        compute,
    )
    finish = epilogue_finish(fused, y, compute, lambda merged: mode.result(merged[0], walk.count, compute), y.dim)
    kernels, scratch = walk_kernels(ctx, fused, walk, acc, finish, pattern_name(fused))
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))


# -- softmax -------------------------------------------------------------------------------------
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
        c, dims = self.compute, self.x.dim
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
        return [f"const {self.itype} base{t.id} = {offset(t, t.dim, 'o')};" for t in (self.x, *self.fused.outputs)]


def _emit_softmax(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    anchor = fused.anchor
    assert anchor is not None
    x, y = anchor.input("input"), anchor.output("y")
    assert x is not None and y is not None
    axis = anchor.attributes.axis % len(x.dim)  # type: ignore[attr-defined]
    kept = tuple(1 if a == axis else d for a, d in enumerate(x.dim))
    tensors = [*fused.inputs, *fused.outputs]
    compute = compute_of(tensors)
    params = KernelParams()
    names = declare(params, [x, *epilogue_operands(fused)], fused.outputs)
    params.aligned_flag()
    softmax = _Softmax(fused, x, y, axis, compute, loop_index_type(tensors, x.numel, MAX_GROUP * 16), names)
    order = stride_order(x.dim, x.stride)
    if innermost(x.dim, order) == axis:
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
    group = min(MAX_GROUP, _pow2_ceil(-(-count // HELD)))
    slots = -(-vectors // group)
    held = slots * vec <= HELD
    if not held:
        group = min(MAX_GROUP, _pow2_floor(vectors // MIN_STEPS))
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
        f"gd::column_reduce<{walk.lanes}, {walk.depth}, {vec}>(sum, red, {_merge_lambda('add', c)});",
        "#pragma unroll",
        f"for (int e = 0; e < {vec}; ++e) inv[e] = {one} / sum[e];",
        "if (active) {",
        *("  " + line for line in walk_axis),
        *("    " + line for line in s.write("exp(xs[e] - top[e]) * inv[e]", vec, moved, "j")),
        "  }",
        "}",
    ]
    return body, walk.threads, walk.threads * vec * type_bytes(c), walk.blocks, "columns"
