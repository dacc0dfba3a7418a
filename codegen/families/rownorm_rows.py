"""How a row-normalization kernel (rownorm.py) reaches its tensors: parameters and names, the
row and column parts of each offset, this thread's vector slots of the row (guarded loops),
vector loads and stores of the packed tensors, and element accesses of the others."""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.ir import Tensor
from graphdnn.layout import largest_storage_extent
from graphdnn.symbolic import Sym, upper

from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name, scalar_value
from ..cuda_types import cuda_type, load, store
from ..indexing import coordinates, divides, index_type, offset, restricted, row_major
from ..kernel import DynamicGrid, Kernel
from ..pointwise import literal
from .rownorm_launch import Config
from .rownorm_layout import RowLayout, memory_tensors


class Operands:
    """How a pass reaches each tensor at the current element (vector slot k, element e),
    recording the packed tensors it reads as vectors and whether it needs j's coordinates."""

    def __init__(self, kernel: RowAccess, vector_name: str, width: int) -> None:
        self.kernel = kernel
        self.vector_name = vector_name  # C name of the vector holding a packed tensor's elements, {id}
        self.width = width
        self.vectors: dict[int, Tensor] = {}
        self.columns = False

    def __call__(self, t: Tensor) -> str:
        k = self.kernel
        if t.is_pass_by_value:
            return scalar_value(t, k.names[t.id], k.compute)
        if t.id in k.held:
            return f"col{t.id}[k * {self.width} + e]"
        if t.id in k.layout.packed:
            self.vectors[t.id] = t
            return f"gd::element<{k.compute}>({self.vector_name.format(id=t.id)}, e)"
        return load(t.data_type, self.element(t), k.compute)

    def index(self, t: Tensor) -> str:
        """``t``'s own row-major index of the current element (rng draws from it)."""
        k, rows_major = self.kernel, row_major(t)
        row = offset(restricted(rows_major, k.layout.row_axes, k.rank), k.x.dim, "r")
        column = k.column_offset(rows_major)
        self.columns |= column != "0"
        return f"({row} + {column})"

    def element(self, t: Tensor) -> str:
        """``t``'s element at column j + e, through its strides."""
        column = self.kernel.column_offset(t)
        self.columns |= column != "0"
        return f"{self.kernel.names[t.id]}[{self.kernel.row_offset(t)} + {column}]"


class RowAccess:
    """The parts of a row kernel that say where things are; the kernel adds what it computes."""

    def __init__(self, fused: FusedNode, ctx: EmitContext, layout: RowLayout, config: Config) -> None:
        anchor = fused.anchor
        assert anchor is not None
        self.fused, self.ctx, self.layout, self.config = fused, ctx, layout, config
        self.anchor = anchor
        self.centered = anchor.op != "rmsnorm"
        self.x = layout.x
        self.rank = len(self.x.dim)
        self.memory = memory_tensors(fused)
        self.compute = compute_of(self.memory)
        self.chunks = config.chunks(layout)
        self.slots = config.vectors_per_thread * layout.vec  # elements a thread holds
        chunk = config.threads_per_row * self.slots
        self.sms = sm_count(ctx.arch)
        self.blocks = config.groups(layout)  # at the most rows of a dynamic layout
        self.max_blocks = config.blocks_per_sm * self.sms if config.blocks_per_sm else 2**31 - 1
        self.blocks = min(self.blocks, self.max_blocks)
        # Margins: the row loop steps past ROWS once, inactive rows' offsets run past the end.
        margins = [2 * largest_storage_extent(t.dim, t.stride) for t in self.memory]
        self.itype = index_type(self.memory, 2 * upper(layout.rows), layout.width + chunk, *margins)
        # Rows that fill every block's R rows (at every value of a dynamic layout's symbols).
        self.whole_groups = divides(layout.rows, config.rows_per_block)
        self.params = KernelParams()
        self.names = {t.id: self.params.tensor(t) for t in fused.inputs}
        self.names.update({t.id: self.params.tensor(t, writable=True) for t in fused.outputs})
        self.aligned = self.params.aligned_flag()
        stats = [anchor.output(role) for role in ("mean", "inv_variance")]
        self.stats = {t.id: t for t in stats if t is not None}
        written = {t.id for t in fused.outputs}
        self.writes_sum = fused.prologue is not None and self.x.id in written
        # Outputs computed per element in the apply pass: y and the epilogue's results.
        self.results = [t for t in fused.outputs if t.id != self.x.id and t.id not in self.stats]
        # Per-column operands held in registers across rows (col{id}[]) on the path being written.
        self.held: dict[int, Tensor] = {}

    # -- walking the rows ------------------------------------------------------------------------
    def this_row(self, first: str) -> list[str]:
        """``row``, ``active`` and the row offsets of this thread's row in the group starting at ``first``."""
        return [
            f"const {self.itype} row = {first} + threadIdx.x / GROUP;",
            *([] if self.whole_groups else ["const bool active = row < ROWS;"]),
            *self.row_prelude(),
        ]

    def walk(self, per_row: list[str]) -> list[str]:
        """``per_row`` for each group of rows of this block (first: the group's first row)."""
        step = f"({self.itype})gridDim.x * ROWS_PER_BLOCK"
        return [
            f"for ({self.itype} first = ({self.itype})blockIdx.x * ROWS_PER_BLOCK; first < ROWS; first += {step}) {{",
            *indent(per_row, 1).splitlines(),
            "}",
        ]

    def reduce(self, value: str) -> str:
        """The mean over the row of ``value``, summed over the row's group (every thread of the block calls it)."""
        scratch = "red" if self.config.threads_per_row > 32 else "nullptr"
        return f"gd::group_sum<GROUP, {self.compute}>({value}, {scratch}) / {literal(self.layout.width, self.compute)}"

    def kernel(self, body: list[str]) -> Kernel:
        """The kernel running ``body`` on this launch's grid (``blocks``) and blocks."""
        threads = self.config.threads
        name, source = kernel_source(
            self.ctx,
            self.fused,
            pattern_name(self.fused),
            self.params,
            threads,
            indent(body, 1),
            self.config.blocks_per_sm,
        )
        vectors = [t for t in self.memory if t.id in self.layout.packed]
        alignment = max((self.layout.vec * t.data_type.itemsize for t in vectors), default=16)
        grid = (min(self.blocks, 2**31 - 1), 1, 1)
        rows = self.layout.rows
        blocks = DynamicGrid(rows, self.config.rows_per_block, self.max_blocks) if isinstance(rows, Sym) else None
        bindings = tuple(self.params.bindings)
        return Kernel(name, source, grid, (threads, 1, 1), 0, bindings, max(alignment, 16), blocks=blocks)

    # -- offsets -------------------------------------------------------------------------------
    def row_offset(self, t: Tensor) -> str:
        part = offset(restricted(t, self.layout.row_axes, self.rank), self.x.dim, "r")
        return "0" if part == "0" else f"o{t.id}"

    def column_offset(self, t: Tensor) -> str:
        """The column part of ``t``'s offset at element j + e (general tensors)."""
        return offset(restricted(t, self.layout.norm_axes, self.rank), self.x.dim, "c")

    def row_prelude(self) -> list[str]:
        """The row's coordinates and each tensor's row offset."""
        dims = [1 if axis in self.layout.norm_axes else extent for axis, extent in enumerate(self.x.dim)]
        lines = coordinates("row", dims, self.layout.order, "r", self.itype)
        for t in self.memory:
            part = offset(restricted(t, self.layout.row_axes, self.rank), self.x.dim, "r")
            if part != "0":
                lines.append(f"const {self.itype} o{t.id} = {part};")
        return lines

    def column_coordinates(self) -> list[str]:
        dims = [extent if axis in self.layout.norm_axes else 1 for axis, extent in enumerate(self.x.dim)]
        return coordinates("(j + e)", dims, self.layout.order, "c", self.itype)

    # -- per-slot loops ------------------------------------------------------------------------
    def guard(self, rows: bool) -> str:
        """The condition for vector slot k (column j) of this thread to hold row elements."""
        conditions = []
        if rows and not self.whole_groups:
            conditions.append("active")
        if self.chunks * self.config.threads_per_row * self.slots != self.layout.width:
            conditions.append("j < WIDTH")
        return " && ".join(conditions) or "true"

    def slot_loop(
        self, width: int, body: list[str], otherwise: list[str] | None = None, rows: bool = True
    ) -> list[str]:
        """``for k``: body for each vector slot of the row this thread holds (guarded)."""
        lines = [
            "#pragma unroll",
            f"for (int k = 0; k < {self.slots // width}; ++k) {{",
            f"  const {self.itype} j = chunk + (k * GROUP + lane) * {width};",
        ]
        guard = self.guard(rows)
        if guard == "true":
            lines += ["  {", *indent(body, 2).splitlines(), "  }"]
        else:
            lines += [f"  if ({guard}) {{", *indent(body, 2).splitlines(), "  }"]
            if otherwise:
                lines += ["  else {", *indent(otherwise, 2).splitlines(), "  }"]
        return [*lines, "}"]

    def element_loop(self, width: int, body: list[str]) -> list[str]:
        if width == 1:
            return ["const int e = 0;", *body]
        return ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {{", *indent(body, 1).splitlines(), "}"]

    def vec_type(self, t: Tensor, width: int) -> str:
        return f"gd::Vec<{cuda_type(t.data_type)}, {width}>"

    def stores(
        self, outputs: list[tuple[Tensor, str]], width: int, operands: Operands
    ) -> tuple[list[str], list[str], list[str]]:
        """(declarations, per-element statements, after-loop statements) storing each output's value."""
        declare, each, after = [], [], []
        for t, value in outputs:
            stored = store(t.data_type, value)
            if t.id in self.layout.packed:
                declare.append(f"{self.vec_type(t, width)} out{t.id};")
                each.append(f"out{t.id}.v[e] = {stored};")
                after.append(f"gd::store_vec<{cuda_type(t.data_type)}, {width}>({self.pointer(t)} + j, out{t.id});")
            else:
                each.append(f"{operands.element(t)} = {stored};")
        return declare, each, after

    def pointer(self, t: Tensor) -> str:
        row = self.row_offset(t)
        return self.names[t.id] if row == "0" else f"{self.names[t.id]} + {row}"

    def vector_loads(self, tensors: dict[int, Tensor], width: int, target: str, declare: bool) -> list[str]:
        return [
            f"{'const ' + self.vec_type(t, width) + ' ' if declare else ''}{target.format(id=t.id)} = "
            f"gd::load_vec<{cuda_type(t.data_type)}, {width}>({self.pointer(t)} + j);"
            for t in tensors.values()
        ]

    def raw_vectors(self, raw: dict[int, Tensor], width: int) -> list[str]:
        return [f"{self.vec_type(t, width)} in{t.id}[{self.slots // width}];" for t in raw.values()]

    def raw_loads(self, raw: dict[int, Tensor], width: int) -> list[str]:
        """in{id}[] <- this thread's raw vectors of its row, every load in flight before any is used."""
        return self.slot_loop(width, self.vector_loads(raw, width, "in{id}[k]", declare=False)) if raw else []
