"""Row normalization: layernorm / rmsnorm, optionally after a residual add, with an epilogue.

Threads. A group of G consecutive threads (a power of two) owns a row, R rows per block.
A thread holds its share of the row in registers: V vectors of VEC elements (compile-time
counts), its vector k covering columns (k*G + lane)*VEC ..., so a warp's accesses are
consecutive 16-byte chunks. Every load of the row is issued before any is used; the mean,
then the centered variance (RMS: the mean square) come from the registers, summed over
the group with gd::group_sum (fp32 accumulation); y and the epilogue are then computed
from the same registers and stored.

Paths. The vector path (16-byte accesses) needs every full-size tensor packed along the
row, D and the row strides multiples of VEC (rownorm_layout.py) and the runtime ``aligned``
flag; the scalar path (the same mapping with VEC = 1, still coalesced) takes every other
case.

Long rows. A row that does not fit the register budget (e.g. 65536 elements) is walked in
chunks of G*V*VEC elements, three times: for the mean, for the centered variance, and to
apply. The re-reads come from L2 (one row is at most a few hundred KB and only a few rows
per SM are in flight), the numerics stay those of the register path, and no shared-memory
limit applies, whatever the row length and type.

Resident grids (``blocks_per_sm`` B > 0). The grid is at most B blocks per SM of the target,
resident together (``__launch_bounds__`` caps the registers to fit B), each walking rows R at
a time. Where some block walks two row groups or more and the row fits in registers, the rows
are pipelined: as soon as a row's raw vectors are converted, the thread issues the loads of
its next row into the same register buffer, so they are in flight through this row's
reductions, normalization and stores (DRAM is kept busy through every block's compute phases
instead of relying on other blocks to be loading meanwhile), and where the registers allow,
the packed per-column operands (the scale, the bias) are loaded and converted once per thread
and held across rows. The main path is pipelined (the vector path; the element path when the
layout has no vectors); the misaligned-pointer fallback and chunked rows walk the same grid
without prefetching. Where every block has one row group, B only makes the grid one wave.

Dynamic rows (a dynamic graph's batch or sequence): ROWS and the row strides are products
of EXTENT arguments, the grid is ceil(rows / R) blocks computed at launch (capped at B per
SM for a resident grid), and the row loop is never pipelined (rownorm_launch.py).

Launch choices come from ``ctx.tuning`` when the runtime autotuned them over
:func:`candidates`, else from the heuristic (rownorm_launch.py); the layout analysis is in
rownorm_layout.py. Dynamic rows without a tuning take a variant per size bucket
(codegen/buckets.py): the heuristic's choice for the rows of each bucket, as a static plan
of those rows would make it (wider groups for few rows).
"""

from __future__ import annotations

import dataclasses

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.symbolic import Sym

from .. import epilogue
from ..buckets import variants
from ..context import EmitContext, indent
from ..indexing import c_extent
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal
from .norm_statistics import epsilon, normalize, write_statistics
from .rownorm_launch import Config, candidates, configured, heuristic
from .rownorm_layout import analyze, extents_refusal
from .rownorm_rows import Operands, RowAccess

__all__ = ["candidates", "emit", "extents_refusal"]


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    layout = analyze(fused)

    def kernel(config: Config) -> Kernel:
        row_kernel = _RowKernel(fused, ctx, layout, config)
        return row_kernel.kernel(row_kernel.body())

    if isinstance(layout.rows, Sym) and not ctx.tuning:  # a variant per size bucket (codegen.buckets)
        choose = lambda rows: heuristic(dataclasses.replace(layout, rows=rows))  # noqa: E731
        return FusedProgram(fused.name, variants(layout.rows, choose, kernel))
    return FusedProgram(fused.name, (kernel(configured(layout, ctx.tuning)),))


class _RowKernel(RowAccess):
    """The passes over the row, its statistics, and the walk over the rows of the grid."""

    # -- passes --------------------------------------------------------------------------------
    def load_values(self, width: int, write_sum: bool) -> tuple[dict[int, Tensor], list[str]]:
        """(the packed tensors read as raw vectors in{id}[k], the statements that fill x[] from
        them: the rounded residual sum with a prologue, which is also stored when written)."""
        operands = Operands(self, "in{id}[k]", width)
        values = epilogue.Values(self.compute, operands, operands.index)
        if self.fused.prologue is not None:
            epilogue.apply([self.fused.prologue], values)
        value = values.get(self.x)
        element = [*values.statements, f"x[k * {width} + e] = {value};"]
        declare, each, after = self.stores([(self.x, values.stored(self.x))] if write_sum else [], width, operands)
        element = [*(self.column_coordinates() if operands.columns else []), *element, *each]
        zero = self.element_loop(width, [f"x[k * {width} + e] = 0;"])
        return operands.vectors, self.slot_loop(width, [*declare, *self.element_loop(width, element), *after], zero)

    def load_pass(self, width: int, write_sum: bool, prefetched: bool = False) -> list[str]:
        """x[] <- this thread's elements of the row (the rounded residual sum with a prologue);
        ``prefetched``: the raw vectors are already loaded (the pipelined loop)."""
        raw, convert = self.load_values(width, write_sum)
        if prefetched:
            return convert
        return [*self.raw_vectors(raw, width), *self.raw_loads(raw, width), *convert]

    def apply_pass(self, width: int) -> list[str]:
        """y and the epilogue from x[], stored."""
        operands = Operands(self, "a{id}", width)
        values = epilogue.Values(self.compute, operands, operands.index)
        values.define(self.x, f"x[k * {width} + e]")
        normalize(self.fused, values)
        outputs = [(t, values.stored(t)) for t in self.results]
        declare, each, after = self.stores(outputs, width, operands)
        element = [*(self.column_coordinates() if operands.columns else []), *values.statements, *each]
        loads = self.vector_loads(operands.vectors, width, "a{id}", declare=True)
        return self.slot_loop(width, [*loads, *declare, *self.element_loop(width, element), *after])

    # -- statistics ----------------------------------------------------------------------------
    def squares(self, width: int) -> list[str]:
        """squares += this thread's (x - mean)^2 (RMS norm: x^2) over the elements it holds."""
        if not self.centered:
            return ["#pragma unroll", f"for (int i = 0; i < {self.slots}; ++i) squares += x[i] * x[i];"]
        step = [f"const {self.compute} d = x[k * {width} + e] - mean;", "squares += d * d;"]
        return self.slot_loop(width, self.element_loop(width, step), rows=False)

    def chunked(self, body: list[str]) -> list[str]:
        """``body`` for each chunk of the row (once, with chunk = 0, when the row fits in registers)."""
        if self.chunks == 1:
            return [f"const {self.itype} chunk = 0;", *body]
        return [
            "#pragma unroll 1",
            f"for (int c = 0; c < {self.chunks}; ++c) {{",
            f"  const {self.itype} chunk = ({self.itype})c * {self.config.threads_per_row * self.slots};",
            *indent(body, 1).splitlines(),
            "}",
        ]

    def statistics(self, width: int, prefetch: list[str] | None = None) -> list[str]:
        """mean and rstd of the row; the first pass also loads it (and writes the sum).
        ``prefetch``: the pipelined loop's raw vectors are loaded, and these statements (the next
        row's loads) follow the first pass's conversion."""
        c = self.compute
        sqrt = "sqrtf" if c == "float" else "sqrt"
        rstd = f"const {c} rstd = {literal(1, c)} / {sqrt}({self.reduce('squares')} + eps);"
        loaded = [*self.load_pass(width, self.writes_sum, prefetch is not None), *(prefetch or [])]
        if not self.centered:
            return [f"{c} squares = 0;", *self.chunked([*loaded, *self.squares(width)]), rstd]
        sums = ["#pragma unroll", f"for (int i = 0; i < {self.slots}; ++i) sum += x[i];"]
        lines = [f"{c} sum = 0;", *self.chunked([*loaded, *sums])]
        lines += [f"const {c} mean = {self.reduce('sum')};", f"{c} squares = 0;"]
        if self.chunks == 1:  # the row is still in registers
            lines += self.squares(width)
        else:
            lines += self.chunked([*self.load_pass(width, False), *self.squares(width)])
        return [*lines, rstd]

    def store_statistics(self) -> list[str]:
        """The row's mean and rstd stored by its group's first thread."""
        active = "" if self.whole_groups else "active && "
        return write_statistics(self.anchor, self.names, self.row_offset, f"{active}lane == 0")

    # -- walking the rows ------------------------------------------------------------------------
    def row_loop(self, width: int) -> list[str]:
        """Every row of this block's groups, the row's elements held width at a time."""
        per_row = [
            *self.this_row("first"),
            f"{self.compute} x[{self.slots}];  // this thread's elements of the row",
            *self.statistics(width),
            *self.store_statistics(),
        ]
        if self.chunks == 1:
            per_row += self.apply_pass(width)
        else:
            per_row += self.chunked([*self.load_pass(width, False), *self.apply_pass(width)])
        return self.walk(per_row)

    def pipelined_row_loop(self, width: int) -> list[str]:
        """The row loop with this thread's next row prefetched into in{id}[] (and the per-column
        operands held in col{id}[] where they fit): the loads of row i + 1 are issued as soon as
        row i is converted to x[], and complete while row i is reduced, normalized and stored."""
        held = self.held_columns(width)
        raw, _ = self.load_values(width, self.writes_sum)
        step = f"({self.itype})gridDim.x * ROWS_PER_BLOCK"
        # Uniform over the block: every thread reaches the group_sum barriers the same times.
        prefetch = [
            f"if (first + {step} < ROWS) {{  // the next rows' loads, in flight through this row's work",
            *indent([*self.this_row(f"(first + {step})"), *self.raw_loads(raw, width)], 1).splitlines(),
            "}",
        ]
        per_row = [
            *self.this_row("first"),
            f"{self.compute} x[{self.slots}];  // this thread's elements of the row",
            *self.statistics(width, prefetch),
            *self.store_statistics(),
            *self.apply_pass(width),
        ]
        first_loads = [*self.this_row(f"({self.itype})blockIdx.x * ROWS_PER_BLOCK"), *self.raw_loads(raw, width)]
        return [
            *held,
            *self.raw_vectors(raw, width),
            "{  // the first rows' loads",
            f"  const {self.itype} chunk = 0;",
            *indent(first_loads, 1).splitlines(),
            "}",
            *self.walk(per_row),
        ]

    def held_columns(self, width: int) -> list[str]:
        """col{id}[] <- the per-column operands at this thread's columns, converted once for every
        row (where they fit); the passes written after this read them from there."""
        if not self.config.holds_columns(self.layout, self.sms):
            return []
        self.held = {t.id: t for t in self.fused.inputs if t.id in self.layout.columns}
        lines = [f"{self.compute} col{t.id}[{self.slots}];  // the same for every row" for t in self.held.values()]
        load = self.vector_loads(self.held, width, "a{id}", declare=True)
        convert = [
            line
            for t in self.held.values()
            for line in (
                f"col{t.id}[k * {width} + e] = gd::element<{self.compute}>(a{t.id}, e);",
                f"gd::hold(col{t.id}[k * {width} + e]);  // converted once, not in every row",
            )
        ]
        zero = self.element_loop(width, [f"col{t.id}[k * {width} + e] = 0;" for t in self.held.values()])
        body = self.slot_loop(width, [*load, *self.element_loop(width, convert)], zero, rows=False)
        return [*lines, "{", f"  const {self.itype} chunk = 0;", *indent(body, 1).splitlines(), "}"]

    def body(self) -> list[str]:
        g, layout = self.config.threads_per_row, self.layout
        if isinstance(layout.rows, int):
            extents = [f"constexpr {self.itype} ROWS = {layout.rows}, WIDTH = {layout.width};"]
        else:  # rows of a dynamic graph: the EXTENT arguments' product
            extents = [
                f"const {self.itype} ROWS = {c_extent(layout.rows)};",
                f"constexpr {self.itype} WIDTH = {layout.width};",
            ]
        lines = [
            *extents,
            f"constexpr int GROUP = {g}, ROWS_PER_BLOCK = {self.config.rows_per_block};",
            "const int lane = threadIdx.x % GROUP;  // this thread's place in its row's group",
            f"const {self.compute} eps = {epsilon(self.anchor, self.names, self.compute)};",
        ]
        if g > 32:
            lines.append(
                f"__shared__ {self.compute} red[{self.config.threads // 32}];  // group_sum's per-warp partials"
            )
        # The main path (vectors, or elements when the layout has none) is pipelined when chosen;
        # the element path behind the vector path is the plain row loop.
        pipelined = self.config.pipelined(layout, self.sms)
        main = self.pipelined_row_loop(layout.vec) if pipelined else self.row_loop(layout.vec)
        if layout.vec == 1:
            return lines + main
        self.held = {}
        return [
            *lines,
            f"if ({self.aligned}) {{  // {layout.vec}-element vector accesses",
            *indent(main, 1).splitlines(),
            "} else {  // a pointer is not aligned for vectors: element accesses, the same mapping",
            *indent(self.row_loop(1), 1).splitlines(),
            "}",
        ]
