"""Per-channel statistics (genstats) and the backward norms, on the reduction pattern.

The backward norms have families of their own (rownorm_backward.py, batchnorm_backward.py);
layer and RMS norm backward of rows too long for registers fall back to these kernels.

genstats: the sum and the sum of squares over every axis but the channel axis (1).

Backward norms (graphdnn/ops/norm_backward.py), with xhat = (x - mean) * inv_variance
(x * inv_variance for RMS norm) and g = grad * scale:

    dx     = inv_variance * (g - sum(g) / n - xhat * sum(g * xhat) / n)   over each set of n elements
    dscale = sum(grad * xhat), dbias = sum(grad)                          over the axes scale broadcasts on

(RMS norm has no sum(g) term.) Group norm's sets are instance norm's on the view of every tensor
with the channel axis split into (groups, C/groups): :func:`grouped` (a view through strides, any
layout). Kernels, in order: the parameter sums (dscale, dbias); the
set sums into scratch; dx, one element per thread, from the set sums. When the sets are
exactly the groups the scale broadcasts over (batch norm: one set per channel), scale is
one value per set, so sum(g) = scale * sum(grad) and sum(g * xhat) = scale * sum(grad * xhat):
the parameter sums also serve dx and the set sums are skipped.

Instance and group norm: a set (a sample's group) and a parameter's group (a channel over the
samples) share the spatial axes. One pass over grad and x sums grad * xhat and grad per *cell*
(sample and channel, over the spatial axes); the parameter sums then add the cells over the
samples, and the set sums add scale * cell over the set's channels (scale is one value per cell),
both small kernels over the cells; dx reads grad and x once more. These are the fallback:
where a tile of sets fits a block's registers, norm_backward_sets.py does it in one pass and
takes only the parameter sums from here (:meth:`NormBackward.cell_parameter_sums`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import is_packed, stride_order
from graphdnn.ops.norms import NormOp

from ..context import EmitContext, KernelParams, indent, operand_loader
from ..cuda_types import cuda_type, store
from ..indexing import coordinates, linear_index, offset
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal
from .direct_common import (
    anchor_of,
    blocks_for,
    compute_for,
    declare,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    tensors_of,
    written,
)
from .direct_reduce import Sums, Terms, innermost_reduced, sums_kernels

SET_SUMS = "set_sums"  # scratch: [sum(g * xhat), sum(g)] per set, in the compute type
CELL_SUMS = "cell_sums"  # scratch: [sum(grad * xhat), sum(grad)] per cell (instance and group norm)


def emit_genstats(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    x = node.input("input")
    assert x is not None
    compute = compute_for(fused)
    reduced = tuple(axis for axis in stride_order(x.dim, x.stride) if axis != 1)

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        value = operand_loader({x.id: params.tensor(x)}, x.static_dim, "c", compute)(x)
        return [f"const {compute} v = {value};"], ["v", "v * v"]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        stores = []
        for role, total in (("sum", totals[0]), ("sq_sum", totals[1])):
            t = node.output(role)
            if t is not None and written(fused, t):
                stores.append(
                    f"{params.tensor(t, writable=True)}[{offset(t, x.static_dim, 'c')}] = {store(t.data_type, total)};"
                )
        return stores

    sums = Sums(
        "genstats",
        x.static_dim,
        (1,),
        reduced,
        innermost_reduced(x.static_dim, x.static_stride, reduced),
        terms,
        finish,
    )
    kernels, scratch = sums_kernels(ctx, fused, sums, compute)
    return FusedProgram(fused.name, kernels, scratch)


def emit_norm_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    b = NormBackward.of(fused)
    kernels: list[Kernel] = []
    scratch: list[Scratch] = []
    for sums in b.reductions():
        programs, buffers = sums_kernels(ctx, fused, sums, b.compute)
        kernels += programs
        scratch += buffers
    if written(fused, b.dx):
        kernels.append(b.dx_kernel(ctx))
        element = 8 if b.compute == "double" else 4
        scratch.append(Scratch(SET_SUMS, 2 * b.set_count * element))
        if b.by_cells:
            scratch.append(Scratch(CELL_SUMS, 2 * math.prod(b.cell_dims) * element))
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))


def grouped(t: Tensor | None, groups: int) -> Tensor:
    """``t`` ([N, C, *spatial] or broadcast) viewed with its channel axis split into (groups,
    C/groups), the same memory: a per-channel axis of C becomes (groups, C/groups), a per-group
    axis of ``groups`` (the statistics) becomes (groups, 1), an axis of 1 stays broadcast."""
    assert t is not None
    dim, stride = t.static_dim, t.static_stride
    channels = dim[1]
    if channels == 1:
        split = ((1, stride[1]), (1, stride[1]))
    elif channels == groups:  # one value per group (or one channel per group)
        split = ((groups, stride[1]), (1, stride[1]))
    else:
        inner = channels // groups
        split = ((groups, stride[1] * inner), (inner, stride[1]))
    return dataclasses.replace(
        t,
        dim=(dim[0], split[0][0], split[1][0], *dim[2:]),
        stride=(stride[0], split[0][1], split[1][1], *stride[2:]),
    )


def emit_parameter_sums(fused: FusedNode, ctx: EmitContext) -> tuple[tuple[Kernel, ...], tuple[Scratch, ...]]:
    """dscale and dbias of a backward norm alone (the kernels of a family that makes dx its own way)."""
    b = NormBackward.of(fused)
    return sums_kernels(ctx, fused, b.parameter_sums(feeds_dx=False), b.compute)


@dataclass(frozen=True)
class NormBackward:
    """A backward norm node: its tensors, its sets and the axes its scale broadcasts over."""

    fused: FusedNode
    x: Tensor
    grad: Tensor
    scale: Tensor
    mean: Tensor | None  # None for RMS norm
    inv: Tensor
    dx: Tensor
    dscale: Tensor
    dbias: Tensor | None
    set_axes: tuple[int, ...]  # the axes each set spans
    broadcast: tuple[int, ...]  # the axes dscale and dbias sum over
    compute: str

    @classmethod
    def of(cls, fused: FusedNode) -> NormBackward:
        node = anchor_of(fused)
        op = node.definition
        assert isinstance(op, NormOp)
        x, grouping = op.checked(node)
        grad, scale, mean, inv = (node.input(role) for role in ("grad", "scale", "mean", "inv_variance"))
        dx, dscale, dbias = (node.output(role) for role in ("dx", "dscale", "dbias"))
        assert grad is not None and scale is not None and inv is not None and dx is not None and dscale is not None
        if grouping.view != x.dim:  # group norm: every tensor on the view of its sets
            groups = grouping.view[1]
            assert isinstance(groups, int)
            x, grad, scale, mean, inv, dx, dscale = (
                grouped(t, groups) for t in (x, grad, scale, mean, inv, dx, dscale)
            )
            dbias = grouped(dbias, groups) if dbias is not None else None
        rank = len(x.dim)
        scale_dims = (1,) * (rank - len(scale.dim)) + scale.dim
        broadcast = tuple(axis for axis in range(rank) if scale_dims[axis] == 1)
        compute = compute_for(fused)
        return cls(fused, x, grad, scale, mean, inv, dx, dscale, dbias, grouping.axes, broadcast, compute)

    @property
    def order(self) -> tuple[int, ...]:
        return stride_order(self.x.dim, self.x.stride)

    @property
    def shared(self) -> bool:
        """Whether the sets are the scale's broadcast groups (size-1 axes aside)."""
        spanning = [{axis for axis in axes if self.x.dim[axis] > 1} for axes in (self.set_axes, self.broadcast)]
        return spanning[0] == spanning[1]

    @property
    def set_kept(self) -> tuple[int, ...]:
        """The axes that index the sets (in memory order), as the set sums are stored."""
        axes = self.broadcast if self.shared else self.set_axes
        return tuple(axis for axis in self.order if axis not in axes)

    @property
    def set_count(self) -> int:
        return math.prod(self.x.static_dim[axis] for axis in self.set_kept)

    @property
    def cell_axes(self) -> tuple[int, ...]:
        """The spanning axes that the sets and the parameters' groups share, in memory order."""
        shared = set(self.set_axes) & set(self.broadcast)
        return tuple(axis for axis in self.order if axis in shared and self.x.static_dim[axis] > 1)

    @property
    def by_cells(self) -> bool:
        """Whether the sums go through the cell sums: sets and parameters share axes, and dx is
        written from centred statistics."""
        return bool(self.cell_axes) and self.mean is not None and not self.shared and written(self.fused, self.dx)

    @property
    def cell_dims(self) -> tuple[int, ...]:
        """The space of the cells: x's dims with the cell axes set to 1."""
        return tuple(1 if axis in self.cell_axes else extent for axis, extent in enumerate(self.x.static_dim))

    def parameter_sums(self, feeds_dx: bool) -> Sums:
        """dscale and dbias (and, when ``feeds_dx``, the same totals into the set sums)."""
        targets = (self.dscale, self.dbias)
        return self._sums("params", self.broadcast, ["grad * xhat", "grad"], targets, SET_SUMS if feeds_dx else None)

    def cell_parameter_sums(self) -> Sums:
        """dscale and dbias from the cell sums (in scratch CELL_SUMS: [term][cell])."""
        return self._from_cells("params", self.broadcast, False, (self.dscale, self.dbias), None)

    def reductions(self) -> list[Sums]:
        """The parameter sums (dscale, dbias; in the shared case also dx's), then the set sums;
        where the sets and the parameters share axes, the cell sums first, and both from them."""
        sums = []
        feeds_dx = self.shared and written(self.fused, self.dx)
        params = written(self.fused, self.dscale) or written(self.fused, self.dbias)
        if self.by_cells:
            cells = self._sums("cells", self.cell_axes, ["grad * xhat", "grad"], (), CELL_SUMS)
            from_cells = [self._from_cells("sets", self.set_axes, True, (), SET_SUMS)]
            if params:
                from_cells.insert(0, self.cell_parameter_sums())
            return [cells, *from_cells]
        if params or feeds_dx:
            sums.append(self.parameter_sums(feeds_dx))
        if written(self.fused, self.dx) and not self.shared:
            terms = ["g * xhat", "g"] if self.mean is not None else ["g * xhat"]
            sums.append(self._sums("sets", self.set_axes, terms, (), SET_SUMS))
        return sums

    def _values(self, params: KernelParams, with_g: bool, given: dict[int, str] | None = None) -> list[str]:
        """grad, inv, xhat (and g) at the coordinates c{axis} of x; a tensor in ``given`` (by id)
        is read as the expression there."""
        names = declare(params, [self.grad, self.x, self.mean, self.inv] + ([self.scale] if with_g else []))
        load = operand_loader(names, self.x.static_dim, "c", self.compute)

        def at(t: Tensor) -> str:
            return (given or {}).get(t.id) or load(t)

        centered = f"{at(self.x)} - {at(self.mean)}" if self.mean is not None else at(self.x)
        statements = [
            f"const {self.compute} grad = {at(self.grad)};",
            f"const {self.compute} inv = {at(self.inv)};",
            f"const {self.compute} xhat = ({centered}) * inv;",
        ]
        if with_g:
            statements += [f"const {self.compute} scale = {at(self.scale)};", f"const {self.compute} g = grad * scale;"]
        return statements

    def _sums(
        self,
        kind: str,
        axes: tuple[int, ...],
        terms: list[str],
        targets: tuple[Tensor | None, ...],
        scratch: str | None,
        dims: tuple[int, ...] | None = None,
        values: Terms | None = None,
    ) -> Sums:
        """Sums of ``terms`` over ``axes`` of ``dims`` (x's), stored to ``targets`` (one per term,
        where written) and to ``scratch`` ([term][kept index]) when given; the terms read what
        ``values`` defines (grad, xhat, and g for the set sums)."""
        dims = dims or self.x.static_dim
        reduced = tuple(axis for axis in self.order if axis in axes)
        kept = tuple(axis for axis in self.order if axis not in axes)
        count = math.prod(dims[axis] for axis in kept)

        def finish(params: KernelParams, totals: list[str]) -> list[str]:
            stores = []
            for t, total in zip(targets, totals):
                if t is not None and written(self.fused, t):
                    target = params.tensor(t, writable=True)
                    stores.append(f"{target}[{offset(t, dims, 'c')}] = {store(t.data_type, total)};")
            if scratch is not None:
                sums = params.scratch(scratch, self.compute)
                stores += [f"{sums}[{f'{k * count} + ' if k else ''}o] = {total};" for k, total in enumerate(totals)]
            return stores

        return Sums(
            f"{anchor_of(self.fused).op}_{kind}",
            dims,
            kept,
            reduced,
            innermost_reduced(dims, self.x.static_stride, reduced),
            values or (lambda params, itype: (self._values(params, with_g=kind == "sets"), terms)),
            finish,
        )

    def _from_cells(
        self,
        kind: str,
        axes: tuple[int, ...],
        scaled: bool,
        targets: tuple[Tensor | None, ...],
        scratch: str | None,
    ) -> Sums:
        """Sums over ``axes`` of the cell sums (times the cell's scale when ``scaled``: sum(g * xhat)
        and sum(g) of a set), on the space of the cells (x's dims, the cell axes set to 1)."""
        cells = self.cell_dims
        cell_count = math.prod(cells)
        c = self.compute

        def values(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
            sums = params.scratch(CELL_SUMS, f"const {c}")
            order = tuple(axis for axis in self.order if axis not in self.cell_axes)
            statements = [f"const {itype} q = {linear_index(cells, order, 'c')};"]
            factor = ""
            if scaled:
                at = operand_loader(declare(params, [self.scale]), cells, "c", c)
                statements.append(f"const {c} scale = {at(self.scale)};")
                factor = "scale * "
            return statements, [f"{factor}{sums}[q]", f"{factor}{sums}[{cell_count} + q]"]

        return self._sums(kind, axes, [], targets, scratch, cells, values)

    def vector_width(self) -> int:
        """Elements of dx a thread of the cells' dx kernel moves at once: 16 bytes where grad, x
        and dx share one packed layout (the flat index in dx's memory order is then each one's
        offset) and it divides the element count, else 1."""
        tensors = (self.grad, self.x, self.dx)
        width = 16 // max(t.data_type.itemsize for t in tensors)
        same = all(t.static_stride == self.dx.static_stride for t in tensors)
        dense = is_packed(self.dx.static_dim, self.dx.static_stride)
        return width if self.cell_axes and same and dense and self.x.static_numel % width == 0 else 1

    def dx_kernel(self, ctx: EmitContext) -> Kernel:
        """One thread per element of dx (in its memory order), from the set sums; where
        :meth:`vector_width` allows, one per 16 bytes of dx (with aligned pointers)."""
        x = self.x
        itype = loop_index_type(tensors_of(self.fused), x.static_numel)
        params = KernelParams()
        scalar = self._dx_values(params, itype, {})
        loop = grid_stride("p", first_thread(itype), x.static_numel, itype, scalar)
        width = self.vector_width()
        if width > 1:
            loop = [
                f"if ({params.aligned_flag()}) {{  // {width}-element vector accesses",
                *indent(self._dx_vectors(params, itype, width), 1).splitlines(),
                "} else {",
                *indent(loop, 1).splitlines(),
                "}",
            ]
        return make_kernel(
            ctx, self.fused, f"{anchor_of(self.fused).op}_dx", params, loop, (blocks_for(x.static_numel), 1, 1)
        )

    def _dx_vectors(self, params: KernelParams, itype: str, width: int) -> list[str]:
        """The grid-stride loop over ``width``-element vectors of grad, x and dx (flat index p)."""
        names = declare(params, [self.grad, self.x])
        read = {t.id: t for t in (self.grad, self.x)}  # one vector where grad is x itself
        vectors = {i: f"v{i}" for i in read}
        loads = [
            f"const gd::Vec<{cuda_type(t.data_type)}, {width}> v{t.id} = "
            f"gd::load_vec<{cuda_type(t.data_type)}, {width}>({names[t.id]} + first);"
            for t in read.values()
        ]
        dx_type = cuda_type(self.dx.data_type)
        given = {i: f"gd::element<{self.compute}>({v}, e)" for i, v in vectors.items()}
        element = [f"const {itype} p = first + e;", *self._dx_values(params, itype, given, "out.v[e]")]
        out = declare(params, [self.dx], writable=True)[self.dx.id]
        body = [
            f"const {itype} first = v * {width};",
            *loads,
            f"gd::Vec<{dx_type}, {width}> out;",
            "#pragma unroll",
            f"for (int e = 0; e < {width}; ++e) {{",
            *indent(element, 1).splitlines(),
            "}",
            f"gd::store_vec<{dx_type}, {width}>({out} + first, out);",
        ]
        return grid_stride("v", first_thread(itype), self.x.static_numel // width, itype, body)

    def _dx_values(self, params: KernelParams, itype: str, given: dict[int, str], target: str = "") -> list[str]:
        """dx at flat index p (in dx's memory order): grad and x read as ``given`` (by tensor id)
        or through their strides; stored to ``target``, or to dx through its strides."""
        c, x = self.compute, self.x
        body = [*coordinates("p", x.static_dim, stride_order(self.dx.static_dim, self.dx.static_stride), "c", itype)]
        body += self._values(params, with_g=True, given=given)
        sums = params.scratch(SET_SUMS, c)
        out = declare(params, [self.dx], writable=True)[self.dx.id]
        factor = "scale * " if self.shared else ""
        n = literal(math.prod(x.static_dim[axis] for axis in self.set_axes), c)
        body += [
            f"const {itype} o = {linear_index(x.static_dim, self.set_kept, 'c')};",
            f"const {c} mean_gx = {factor}{sums}[o] / {n};",
        ]
        if self.mean is not None:
            body += [f"const {c} mean_g = {factor}{sums}[{self.set_count} + o] / {n};"]
            value = "inv * (g - mean_g - xhat * mean_gx)"
        else:
            value = "inv * (g - xhat * mean_gx)"
        target = target or f"{out}[{offset(self.dx, x.static_dim, 'c')}]"
        return [*body, f"{target} = {store(self.dx.data_type, value)};"]
