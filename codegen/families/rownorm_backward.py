"""Layer / RMS / adaptive layer norm backward in one pass over the rows; dscale and dbias from per-block
partial sums.
With the fusion rules (fusion_rules/rules/norm_backward.py), also the pointwise op making the grad
or the scale (the prologue) and the elementwise ops on dx (the epilogue).

With xhat = (x - mean) * inv_variance (RMS norm: x * inv_variance) and g = grad * scale, per row
of D elements:

    dx = inv_variance * (g - sum(g) / D - xhat * sum(g * xhat) / D)     (RMS norm: no sum(g) term)
    dscale = sum over the rows of grad * xhat,  dbias = sum over the rows of grad

Kernel 1 walks the rows as the row-norm family does (rownorm_layout.py, rownorm_rows.py: G
threads per row, R rows per block, 16-byte vectors of the packed tensors behind the runtime
``aligned`` flag). Each thread loads its share of grad and x once, keeps xhat and g in
registers, adds grad * xhat and grad to per-column accumulators (fp32), reduces the two row
sums over its group and stores dx. The grid is about as many blocks as the registers let run at
once (at most one per R rows; autotuning times the row-norm family's launch choices, grids of B
blocks per SM among them, whose blocks prefetch their next rows' raw vectors as soon as a row is
converted, as the forward's pipelined loop does), each block walking rows with a grid stride, so
the accumulators cover many rows. At the end the block's R groups are added through shared memory in group order
and stored as the block's row of the workspace ``norm_partials``, laid out
[block][parameter][D] in the compute type. A prologue is computed per element as the row is
loaded (so the sums see the grad it makes; the grad is stored there when it escapes, a residual
branch's gradient); the epilogue (the residual-add backward) runs on dx before its store.

Kernel 2 is the direct family's sums over axes (direct_reduce.py), as split-K's reduce kernel
is for GEMMs: per column, the blocks' partials added in block order, stored as dscale and dbias
in their type. No atomics anywhere: the same bits every run.

Adaptive layer norm (``adalayernorm_backward``) has a scale per sample ([B, 1, D], reached through
each row's offset as the forward reaches it): its dscale and dbias are per sample. Where each
sample's rows are consecutive (the batch axis outermost of the row axes), kernel 1's grid has a
row of blocks per sample (``blockIdx.y``), each block walking that sample's rows, and the partials
are laid out [sample][block][parameter][D]; kernel 2 sums each sample's blocks. Otherwise kernel 1
writes dx alone, and the direct family's parameter sums (direct_norm.py) add grad * xhat and grad
over each sample's rows, reading grad and x once more.

Rows too long for a group's registers (where the row-norm heuristic walks them in chunks) keep
the direct family's kernels (direct_norm.py): the parameter sums, the row sums and dx as
separate passes, for the norm alone (the rules fuse rows of at most MAX_FUSED_ROW elements).
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

from fusion_rules import FusedNode
from fusion_rules.rules.norm_backward import MAX_FUSED_ROW, per_column_parameters
from graphdnn.errors import GraphError, UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import EmitContext, KernelParams, indent
from ..cuda_types import store
from ..indexing import linear_index, offset
from ..kernel import FusedProgram, Kernel, Scratch
from .direct_common import written
from .direct_norm import emit_norm_backward, emit_parameter_sums
from .direct_reduce import Sums, sums_kernels
from .rownorm_launch import (
    MAX_BLOCKS_PER_SM,
    MAX_THREADS_PER_SM,
    REGISTERS_PER_SM,
    Config,
    configured,
    layout_candidates,
    registers,
)
from .rownorm_layout import RowLayout, analyze, normalized, raw_register_bytes
from .rownorm_rows import Operands, RowAccess

PARTIALS = "norm_partials"
COMBINE_BYTES = 32 * 1024  # the shared memory that adds a block's groups' sums, at most


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    anchor = fused.anchor
    assert anchor is not None
    rows, sums, layout = _rows_kernel_view(fused)
    config = configured(layout, ctx.tuning)
    if not per_column_parameters(anchor) and fused.nodes == (anchor,):
        return emit_norm_backward(fused, ctx)  # the rule declines to fuse around such a norm
    if not _fits(layout, config, len(sums)):
        if ctx.tuning:
            raise GraphError(
                f"row_norm_backward tuning {ctx.tuning}: rows of {layout.width} elements do not fit its "
                "registers, or its rows per block the shared memory that adds their sums"
            )
        if fused.nodes != (anchor,):
            raise UnsupportedError(
                f"fused node '{fused.name}': rows of {layout.width} elements do not fit the registers of the "
                f"one-pass kernel, which its prologue and epilogue need (the {fused.rule} rule takes rows of at "
                f"most {MAX_FUSED_ROW} elements)",
                node=anchor.name,
            )
        return emit_norm_backward(fused, ctx)
    kernel = _RowsKernel(rows, ctx, layout, config, sums)
    programs = [kernel.kernel(kernel.body())] if rows.outputs or sums else []
    if sample_rows(fused) is None:
        reduce, scratch = emit_parameter_sums(fused, ctx) if len(rows.outputs) < len(fused.outputs) else ((), ())
        return FusedProgram(fused.name, (*programs, *reduce), scratch)
    if not sums:
        return FusedProgram(fused.name, tuple(programs))
    reduce, split = sums_kernels(ctx, fused, kernel.parameter_sums(fused), kernel.compute)
    blocks = kernel.blocks * kernel.samples
    partials = Scratch(PARTIALS, blocks * len(sums) * layout.width * _element_bytes(layout, len(sums)))
    return FusedProgram(fused.name, (*programs, *reduce), (partials, *split))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, int]]:
    """The row-norm family's launch choices (rownorm_launch.py), sized by this kernel's register
    bytes, whose rows fit: each on its grid of ``blocks_per_sm`` blocks per SM where it sets one
    (resident grids of 8 to 32 warps per SM), else on the register estimate's."""
    _, sums, layout = _rows_kernel_view(fused)
    return [c.as_dict() for c in layout_candidates(layout, arch) if _fits(layout, c, len(sums))]


def _rows_kernel_view(fused: FusedNode) -> tuple[FusedNode, list[Tensor], RowLayout]:
    """(the fused node as kernel 1 sees it, the parameter sums it adds, its layout). Kernel 1
    writes dx, the epilogue's results and an escaping grad, not dscale and dbias."""
    anchor = fused.anchor
    assert anchor is not None
    side = [t for t in (anchor.output("dscale"), anchor.output("dbias")) if t is not None and written(fused, t)]
    sums = side if sample_rows(fused) is not None else []
    ids = {t.id for t in side}
    rows = dataclasses.replace(fused, outputs=tuple(t for t in fused.outputs if t.id not in ids))
    return rows, sums, backward_layout(rows, len(sums))


def sample_rows(fused: FusedNode) -> int | None:
    """The samples whose rows kernel 1 walks apart: adaptive layer norm's batch (a scale per
    sample), where each sample's rows are consecutive (the batch axis outermost of the row axes in
    memory order); None where they are not (the direct family then sums dscale and dbias); 1 for
    the other norms (and a batch of one)."""
    anchor = fused.anchor
    assert anchor is not None
    if anchor.op != "adalayernorm_backward":
        return 1
    x, axes = normalized(fused)
    rows = [axis for axis in stride_order(x.dim, x.stride) if axis not in axes and x.static_dim[axis] > 1]
    return x.static_dim[0] if not rows or rows[0] == 0 else None


def _element_bytes(layout: RowLayout, sums: int) -> int:
    """One value in the compute type."""
    return layout.compute_bytes // (2 + sums)


def _fits(layout: RowLayout, config: Config, sums: int) -> bool:
    """Whether a group holds its row in registers, and the block's groups' sums fit the shared memory."""
    combine = config.rows_per_block * layout.width * _element_bytes(layout, sums)
    return config.chunks(layout) == 1 and (config.rows_per_block == 1 or not sums or combine <= COMBINE_BYTES)


def backward_layout(fused: FusedNode, sums: int) -> RowLayout:
    """The row layout with this kernel's register bytes per element: xhat, g and one accumulator
    per parameter sum in the compute type, and the raw vectors of what it loads (grad or the
    prologue's operands, x, scale, the epilogue's operands)."""
    layout = analyze(fused)
    anchor = fused.anchor
    assert anchor is not None
    read = [anchor.input(role) for role in ("grad", "input", "scale")]
    read += [t for node in (fused.prologue, *fused.epilogue) if node is not None for t in node.input_tensors()]
    inputs = {t.id for t in fused.inputs}
    loaded = {t.id: t for t in read if t is not None and t.id in inputs}
    return dataclasses.replace(
        layout,
        compute_bytes=(2 + sums) * layout.compute_bytes,
        raw_bytes=sum(raw_register_bytes(t, layout.vec) for t in loaded.values() if t.id in layout.packed),
    )


def resident_blocks(layout: RowLayout, config: Config, sms: int) -> int:
    """Blocks that run at once by the register estimate (at least one per SM), but no more than
    there are groups of rows: the fewer blocks, the fewer partial rows kernel 2 adds."""
    per_thread = math.ceil(registers(layout, config.vectors_per_thread))
    per_sm = min(
        MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // config.threads, REGISTERS_PER_SM // (per_thread * config.threads)
    )
    return min(config.groups(layout), max(1, per_sm) * sms)


class _RowsKernel(RowAccess):
    """Kernel 1: dx row by row, and the block's partial sums of dscale and dbias."""

    def __init__(self, fused: FusedNode, ctx: EmitContext, layout: RowLayout, config: Config, sums: list[Tensor]):
        super().__init__(fused, ctx, layout, config)
        anchor = self.anchor
        self.grad, self.scale, self.mean, self.inv = (
            anchor.input(role) for role in ("grad", "scale", "mean", "inv_variance")
        )
        self.dx = anchor.output("dx")
        # The prologue's value (the grad), written in the load pass when it escapes.
        self.escaping = [
            t for t in fused.outputs if fused.prologue is not None and t in fused.prologue.output_tensors()
        ]
        dscale = anchor.output("dscale")
        # What each accumulator sums: grad * xhat for dscale, grad for dbias.
        self.terms = ["grad * xh" if dscale is not None and t.id == dscale.id else "grad" for t in sums]
        self.sums = sums
        if not config.blocks_per_sm:  # (else RowAccess's grid: blocks_per_sm per SM)
            self.blocks = resident_blocks(layout, config, self.sms)
        self.partials = self.params.scratch(PARTIALS, self.compute) if sums else ""
        # Adaptive layer norm: a row of blocks per sample (blockIdx.y), each walking its sample's rows.
        self.samples = sample_rows(fused) or 1
        self.walked = cast(int, layout.rows) // self.samples  # the rows a row of blocks walks
        if self.samples > 1:
            self.whole_groups = self.walked % config.rows_per_block == 0
            self.blocks = max(1, min(-(-self.walked // config.rows_per_block), self.blocks // self.samples))

    def this_row(self, first: str) -> list[str]:
        """As RowAccess's, ``first`` counting this sample's rows when a row of blocks walks each sample."""
        if self.samples == 1:
            return super().this_row(first)
        return [
            f"const {self.itype} local = {first} + threadIdx.x / GROUP;  // the row in this block's sample",
            *([] if self.whole_groups else ["const bool active = local < ROWS;"]),
            f"const {self.itype} row = ({self.itype})blockIdx.y * ROWS + local;",
            *self.row_prelude(),
        ]

    def kernel(self, body: list[str]) -> Kernel:
        kernel = super().kernel(body)
        return kernel if self.samples == 1 else dataclasses.replace(kernel, grid=(kernel.grid[0], self.samples, 1))

    def element(self, slot: str, width: int) -> str:
        return f"{slot}[k * {width} + e]"

    def load_pass(self, width: int) -> tuple[dict[int, Tensor], list[str]]:
        """(the packed tensors read as raw vectors in{id}[k], the statements that fill xhat[] and
        g[] from them: grad computed by the prologue when there is one, and stored when written;
        the accumulators take them in)."""
        assert self.grad is not None and self.scale is not None and self.inv is not None
        c = self.compute
        operands = Operands(self, "in{id}[k]", width)
        values = epilogue.Values(c, operands, operands.index)
        if self.fused.prologue is not None:
            epilogue.apply([self.fused.prologue], values)
        grad, x, scale = values.get(self.grad), values.get(self.x), values.get(self.scale)
        centered = f"({x} - mean)" if self.mean is not None else x
        each = [
            *values.statements,
            f"const {c} grad = {grad};",
            f"const {c} xh = {centered} * inv;",
            *(f"{self.element(f'acc{p}', width)} += {term};" for p, term in enumerate(self.terms)),
            f"{self.element('xhat', width)} = xh;",
            f"{self.element('g', width)} = grad * {scale};",
        ]
        declare, stores, after = self.stores([(t, values.stored(t)) for t in self.escaping], width, operands)
        each = [*(self.column_coordinates() if operands.columns else []), *each, *stores]
        zero = self.element_loop(width, [f"{self.element('xhat', width)} = 0;", f"{self.element('g', width)} = 0;"])
        return operands.vectors, self.slot_loop(width, [*declare, *self.element_loop(width, each), *after], zero)

    def dx_pass(self, width: int) -> list[str]:
        """dx from xhat[], g[] and the row's means, then the epilogue; what is written, stored."""
        if len(self.fused.outputs) == len(self.escaping):
            return []
        assert self.dx is not None
        g, xhat = self.element("g", width), self.element("xhat", width)
        centered = f"{g} - mean_g" if self.mean is not None else g
        operands = Operands(self, "a{id}", width)
        values = epilogue.Values(self.compute, operands, operands.index)
        values.define_rounded(self.dx, f"inv * ({centered} - {xhat} * mean_gx)")
        epilogue.apply(self.fused.epilogue, values)
        outputs = [(t, values.stored(t)) for t in self.fused.outputs if t not in self.escaping]
        declare, each, after = self.stores(outputs, width, operands)
        each = [*(self.column_coordinates() if operands.columns else []), *values.statements, *each]
        loads = self.vector_loads(operands.vectors, width, "a{id}", declare=True)
        return self.slot_loop(width, [*loads, *declare, *self.element_loop(width, each), *after])

    def per_row(self, width: int, prefetch: list[str] | None = None) -> list[str]:
        """The row's dx and its terms added to the accumulators. ``prefetch``: the raw vectors
        are loaded already, and these statements (the next row's loads) follow their conversion."""
        c = self.compute
        active = "active" if self.walked % self.config.rows_per_block else "true"
        statistics = Operands(self, "", width)
        lines = [*self.this_row("first")]
        for name, t in (("mean", self.mean), ("inv", self.inv)):
            if t is not None:
                value = statistics(t)
                lines.append(f"const {c} {name} = {value if active == 'true' else f'{active} ? {value} : 0'};")
        raw, convert = self.load_pass(width)
        loads = [*self.raw_vectors(raw, width), *self.raw_loads(raw, width)] if prefetch is None else []
        lines += [
            f"{c} xhat[{self.slots}], g[{self.slots}];  // this thread's elements of the row",
            *loads,
            *convert,
            *(prefetch or []),
            f"{c} sum_gx = 0, sum_g = 0;",
            "#pragma unroll",
            f"for (int i = 0; i < {self.slots}; ++i) {{",
            "  sum_gx += g[i] * xhat[i];",
            "  sum_g += g[i];",
            "}",
            f"const {c} mean_gx = {self.reduce('sum_gx')};",
        ]
        if self.mean is not None:
            lines.append(f"const {c} mean_g = {self.reduce('sum_g')};")
        return [*lines, *self.dx_pass(width)]

    def store_partials(self, width: int) -> list[str]:
        """The block's sums of each parameter (its groups' added in group order) into its row of the partials."""
        count = len(self.sums)
        block = "blockIdx.x" if self.samples == 1 else "(blockIdx.y * gridDim.x + blockIdx.x)"
        row = f"{self.partials}[((size_t){block} * {count} + {{p}}) * WIDTH + {{column}}]"
        if self.config.rows_per_block == 1:
            each = [f"{row.format(p=p, column='j + e')} = {self.element(f'acc{p}', width)};" for p in range(count)]
            return self.slot_loop(width, self.element_loop(width, each), rows=False)
        lines = []
        for p in range(count):
            share = [f"combine[(threadIdx.x / GROUP) * WIDTH + j + e] = {self.element(f'acc{p}', width)};"]
            lines += [
                "__syncthreads();  // combine[] is no longer read",
                *self.slot_loop(width, self.element_loop(width, share), rows=False),
                "__syncthreads();",
                f"for (int column = threadIdx.x; column < WIDTH; column += {self.config.threads}) {{",
                f"  {self.compute} total = 0;",
                "  for (int group = 0; group < ROWS_PER_BLOCK; ++group) total += combine[group * WIDTH + column];",
                f"  {row.format(p=p, column='column')} = total;",
                "}",
            ]
        return lines

    def walk_rows(self, width: int, pipelined: bool = False) -> list[str]:
        partials = self.store_partials(width) if self.sums else []
        if not pipelined:
            return [*self.walk(self.per_row(width)), *partials]
        # As the row-norm family's pipelined loop: the next rows' loads are issued as soon as this
        # row is converted, and are in flight through its reductions and dx. Uniform over the block.
        raw, _ = self.load_pass(width)
        step = f"({self.itype})gridDim.x * ROWS_PER_BLOCK"
        prefetch = [
            f"if (first + {step} < ROWS) {{  // the next rows' loads, in flight through this row's work",
            *indent([*self.this_row(f"(first + {step})"), *self.raw_loads(raw, width)], 1).splitlines(),
            "}",
        ]
        first = [*self.this_row(f"({self.itype})blockIdx.x * ROWS_PER_BLOCK"), *self.raw_loads(raw, width)]
        return [
            *self.raw_vectors(raw, width),
            "{  // the first rows' loads",
            *indent(first, 1).splitlines(),
            "}",
            *self.walk(self.per_row(width, prefetch)),
            *partials,
        ]

    def body(self) -> list[str]:
        config, layout, c = self.config, self.layout, self.compute
        lines = [
            f"constexpr {self.itype} ROWS = {self.walked}, WIDTH = {layout.width};",
            f"constexpr int GROUP = {config.threads_per_row}, ROWS_PER_BLOCK = {config.rows_per_block};",
            "const int lane = threadIdx.x % GROUP;  // this thread's place in its row's group",
            f"const {self.itype} chunk = 0;  // the row is held whole",
        ]
        if config.threads_per_row > 32:
            lines.append(f"__shared__ {c} red[{config.threads // 32}];  // group_sum's per-warp partials")
        if self.sums and config.rows_per_block > 1:
            lines.append(f"__shared__ {c} combine[{config.rows_per_block * layout.width}];  // [group][column]")
        for p in range(len(self.sums)):
            lines += [
                f"{c} acc{p}[{self.slots}];  // this thread's columns of {self.terms[p]}, over its rows",
                "#pragma unroll",
                f"for (int i = 0; i < {self.slots}; ++i) acc{p}[i] = 0;",
            ]
        # The main path (vectors, or elements when the layout has none) is pipelined when chosen.
        pipelined = config.pipelined(layout, self.sms)
        if layout.vec == 1:
            return [*lines, *self.walk_rows(1, pipelined)]
        return [
            *lines,
            f"if ({self.aligned}) {{  // {layout.vec}-element vector accesses",
            *[f"  {line}" for line in self.walk_rows(layout.vec, pipelined)],
            "} else {  // a pointer is not aligned for vectors: element accesses, the same mapping",
            *[f"  {line}" for line in self.walk_rows(1)],
            "}",
        ]

    def parameter_sums(self, fused: FusedNode) -> Sums:
        """Kernel 2: over the space [columns..., blocks] (the columns on x's normalized axes, in its
        memory order; the blocks last; adaptive layer norm: and the sample on axis 0), each
        column's partials summed over the blocks."""
        x, layout, count, compute = self.x, self.layout, len(self.sums), self.compute
        rank = len(x.static_dim)
        dims = (*(x.static_dim[a] if a in layout.norm_axes else 1 for a in range(rank)), self.blocks)
        columns = tuple(a for a in layout.order if a in layout.norm_axes)
        column = linear_index(dims, columns, "c")
        block = f"c{rank}"
        if self.samples > 1:  # the sample axis (0, not normalized) is kept too
            dims = (self.samples, *dims[1:])
            columns = (0, *columns)
            block = f"(c0 * {self.blocks} + c{rank})"

        def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
            partials = params.scratch(PARTIALS, f"const {compute}")
            at = f"{partials}[((size_t){block} * {count} + {{p}}) * {layout.width} + {column}]"
            return [], [at.format(p=p) for p in range(count)]

        def finish(params: KernelParams, totals: list[str]) -> list[str]:
            return [
                f"{params.tensor(t, writable=True)}[{offset(t, x.static_dim, 'c')}] = {store(t.data_type, total)};"
                for t, total in zip(self.sums, totals)
            ]

        assert fused.anchor is not None
        return Sums(f"{fused.anchor.op}_params", dims, columns, (rank,), False, terms, finish)
