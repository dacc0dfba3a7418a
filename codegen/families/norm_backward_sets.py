"""Instance and group norm backward in one pass over the big tensors: a block per tile of sets.

A tile (norm_backward_tiling.py: one sample's run of whole groups with all their spatial
positions) is loaded once, its grad and x held in registers; the block sums grad * xhat and grad
per channel (the *cells*), stores the cells to scratch, adds scale * cell over each set's channels
(the set sums), then writes dx from the registers: grad and x are read from memory once and dx
written once, the roofline's traffic. A second, small kernel adds the cells over the samples into
dscale and dbias in a fixed order (direct_norm's, on the cells), so every result is reproducible
run to run. Blocks stay resident and walk the tiles, each asking its next tile into L2 before
loading the current one (RESIDENT).

Where :func:`plan` finds no tiling, direct_norm's kernels (cells, parameter sums, set sums, dx) run.
"""

from __future__ import annotations

import dataclasses

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import GraphError

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import cuda_type, load, store
from ..indexing import offset
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal
from .direct_common import anchor_of, declare, written
from .direct_norm import CELL_SUMS, NormBackward, emit_norm_backward
from .direct_reduce import sums_kernels
from .norm_backward_tiling import Tiling, itemsize_of, plan

RESIDENT = True  # a grid of resident blocks walking the tiles, prefetching the next into L2
OTHER_REGISTERS = 48  # a thread's registers besides the held vectors (estimate, for the blocks per SM)
PREFETCH_L2 = """__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}"""


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """The one-pass kernel and the parameter sums where :func:`plan` finds a tiling, else direct_norm's kernels."""
    b = NormBackward.of(fused)
    tiling = plan(b)
    if isinstance(tiling, str):
        return emit_norm_backward(fused, ctx)
    if RESIDENT or ctx.tuning:
        registers = tiling.slots * 2 * -(-tiling.width * itemsize_of(b) // 4) + OTHER_REGISTERS
        per_sm = max(1, min(2048 // tiling.threads, 65536 // (tiling.threads * registers)))
        grid = min(tiling.blocks, _grid_choice(ctx.tuning) or sm_count(ctx.arch) * per_sm)
        tiling = dataclasses.replace(tiling, per_sm=per_sm, grid=grid)
    kernels = [_SetsKernel(b, tiling, ctx).kernel()]
    scratch = [Scratch(CELL_SUMS, 2 * tiling.samples * tiling.channels * (8 if b.compute == "double" else 4))]
    if written(fused, b.dscale) or (b.dbias is not None and written(fused, b.dbias)):
        programs, buffers = sums_kernels(ctx, fused, b.cell_parameter_sums(), b.compute)
        kernels += programs
        scratch += buffers
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))


def _grid_choice(tuning: dict[str, object]) -> int:
    """The launch choice {"grid": blocks} (resident blocks walking the tiles; tests force small grids), or 0."""
    if not tuning:
        return 0
    grid = tuning.get("grid")
    if set(tuning) != {"grid"} or not isinstance(grid, int) or grid < 1:
        raise GraphError(f"instance / group norm backward tuning {tuning}: expected {{'grid': blocks >= 1}}")
    return grid


class _SetsKernel:
    def __init__(self, b: NormBackward, tiling: Tiling, ctx: EmitContext) -> None:
        self.b, self.t, self.ctx = b, tiling, ctx
        self.c = b.compute
        self.params = KernelParams()
        self.names = declare(self.params, [b.grad, b.x, b.scale, b.mean, b.inv])
        self.names.update(declare(self.params, [b.dx], writable=True))
        self.cells = self.params.scratch(CELL_SUMS, self.c)
        self.aligned = self.params.aligned_flag() if tiling.width > 1 else ""
        self.vectors = False  # which path body() is emitting: vector or element accesses
        numel = tiling.samples * tiling.channels * tiling.spatial
        self.itype = "long long" if numel > 2**31 - 1 else "int"

    def channel_values(self, channel: str, suffix: str, names: tuple[str, ...]) -> list[str]:
        """scale (sc), mean (mu) and inv (rs) of tile channel ``channel``, those in ``names``, as
        {name}{suffix}: loaded at the coordinates k of the set view (n; group and channel in it)."""
        b, t = self.b, self.t
        coordinates = [
            *(["const int k0 = n;"] if "mu" in names or "rs" in names else []),
            f"const int kc = cb * {t.tile} + {channel};",
        ]
        if self.grouped:
            coordinates += [f"const int k1 = kc / {t.group};", f"const int k2 = kc % {t.group};"]
        else:
            coordinates += ["const int k1 = kc;"]
        tensors = {"sc": b.scale, "mu": b.mean, "rs": b.inv}
        values = []
        for name in names:
            tensor = tensors[name]
            assert tensor is not None
            pointer = self.names[tensor.id]
            at = f"{pointer}[{offset(tensor, b.x.static_dim, 'k')}]"
            values.append(f"{name}{suffix} = {load(tensor.data_type, at, self.c)};")
        return ["{", *indent([*coordinates, *values], 1).splitlines(), "}"]

    def vector_type(self, role: str) -> str:
        tensor = {"grad": self.b.grad, "x": self.b.x, "dx": self.b.dx}[role]
        return f"gd::Vec<{cuda_type(tensor.data_type)}, {self.t.width}>"

    def load_vectors(self, at: str) -> list[str]:
        """Slot k of grad and x (the vectors at element offset ``at``): one vector access each,
        or element by element on the element path."""
        w = self.t.width
        lines = []
        for tensor, target in ((self.b.grad, "vg"), (self.b.x, "vx")):
            pointer = self.names[tensor.id]
            if self.vectors:
                lines.append(f"{target}[k] = gd::load_vec<{cuda_type(tensor.data_type)}, {w}>({pointer} + {at});")
            else:
                lines += ["#pragma unroll", f"for (int e = 0; e < {w}; ++e) {target}[k].v[e] = {pointer}[{at} + e];"]
        return lines

    def store_vector(self, at: str) -> list[str]:
        w, dx = self.t.width, self.b.dx
        pointer = self.names[dx.id]
        if self.vectors:
            return [f"gd::store_vec<{cuda_type(dx.data_type)}, {w}>({pointer} + {at}, out);"]
        return ["#pragma unroll", f"for (int e = 0; e < {w}; ++e) {pointer}[{at} + e] = out.v[e];"]

    def origin(self, tile: str) -> list[str]:
        """n and cb of tile ``tile``, and ``first``: the element offset of this thread's slot 0 in it."""
        t, it = self.t, self.itype
        per_sample = t.channels // t.tile
        if t.nhwc:
            first = f"({it})n * {t.spatial * t.channels} + cb * {t.tile} + lead"
        else:
            first = f"(({it})n * {t.channels} + cb * {t.tile}) * {t.spatial} + lead"
        return [f"const int n = {tile} / {per_sample}, cb = {tile} % {per_sample};", f"const {it} first = {first};"]

    def slot(self) -> tuple[str, str]:
        """(the element offset of this thread's slot k from ``first``, whether slot k is in the
        tile: empty where every slot is). The offsets are constants once the slot loop is
        unrolled: the loads and stores address from one pointer per tensor and tile."""
        t, it = self.t, self.itype
        if t.nhwc:
            guard = f"row0 + k * {t.team} < {t.spatial}" if t.spatial % t.team else ""
            return f"({it})k * {t.team * t.channels}", guard
        walks = t.slots // (t.tile // t.teams)
        guard = f"lane + {t.team} * (k % {walks}) < {t.columns}" if t.columns % t.team else ""
        return f"({it})(k / {walks}) * {t.teams * t.spatial} + (k % {walks}) * {t.team * t.width}", guard

    def prefetch(self) -> list[str]:
        """The next tile's grad and x (this block's), asked into L2 before this tile's loads (few
        registers are live there), to stream in while this tile's loads, sums and dx run."""
        if not self.t.prefetch:
            return []
        at = self.slot()[0]
        asks = [f"prefetch_l2({self.names[t.id]} + first + {at});" for t in (self.b.grad, self.b.x)]
        return [
            f"if (tile + gridDim.x < {self.t.blocks}) {{  // the next tile into L2",
            *indent([*self.origin("(int)(tile + gridDim.x)"), *self.slot_loop(asks)], 1).splitlines(),
            "}",
        ]

    def declarations(self) -> list[str]:
        t, c = self.t, self.c
        lines = [
            f"{self.vector_type('grad')} vg[{t.slots}];",
            f"{self.vector_type('x')} vx[{t.slots}];",
            f"__shared__ {c} cell[2][{t.tile}];  // sum(grad * xhat), sum(grad) per channel of the tile",
            f"__shared__ {c} set_sums[2][{t.tile // t.group}];  // mean(g * xhat), mean(g) per set",
            # Two buffers, by the parity of the block's tile: a block's next tile stages its scale
            # while slower threads may still read this tile's (the barriers keep them one tile apart).
            f"__shared__ {c} tile_scale[2][{t.tile}];",
        ]
        it = self.itype
        if t.nhwc:
            lines += [
                f"const int col = threadIdx.x % {t.columns}, row0 = threadIdx.x / {t.columns};",
                f"const {it} lead = ({it})row0 * {t.channels} + col * {t.width};  // slot 0 in the tile",
            ]
        else:
            lines += [
                f"const int team = threadIdx.x / {t.team}, lane = threadIdx.x % {t.team};",
                f"const {it} lead = ({it})team * {t.spatial} + lane * {t.width};  // slot 0 in the tile",
            ]
        if not t.nhwc and t.team > 32:
            lines.append(f"__shared__ {c} red[{t.threads // 32}];  // group_sum's per-warp partials")
        if t.nhwc:
            lines.append(f"__shared__ {c} part[2][{t.partial_rows}][{t.tile}];  // the columns' partial sums")
        return lines

    def tiles(self) -> list[str]:
        """The loop over the tiles this block walks: loads, sums, dx."""
        t = self.t
        # The tile's scale, staged for the set sums while the loads are in flight (read after a barrier).
        scale = [f"{self.c} sc0;", *self.channel_values("q", "0", ("sc",)), "tile_scale[parity][q] = sc0;"]
        loads = [
            *self.prefetch(),
            *self.origin("tile"),
            "const int parity = (tile / gridDim.x) & 1;  // the block's tiles alternate the staging buffers",
            *self.slot_loop(self.load_vectors(f"first + {self.slot()[0]}")),
            f"for (int q = threadIdx.x; q < {t.tile}; q += {t.threads}) {{",
            *indent(scale, 1).splitlines(),
            "}",
        ]
        per_tile = [*loads, *(self.nhwc_body() if t.nhwc else self.nchw_body())]
        return [
            f"for (int tile = blockIdx.x; tile < {t.blocks}; tile += gridDim.x) {{  // (n, cb)",
            *indent(per_tile, 1).splitlines(),
            "}",
        ]

    def body(self) -> list[str]:
        """The declarations, then the tiles: with vector accesses where the pointers allow (and
        w > 1), else element by element, the same mapping (two paths: one branch per access
        made the compiler spill the held vectors)."""
        lines = self.declarations()
        if self.t.width == 1:
            return [*lines, *self.tiles()]
        self.vectors = True
        vectors = self.tiles()
        self.vectors = False
        return [
            *lines,
            f"if ({self.aligned}) {{  // {self.t.width}-element vector accesses",
            *indent(vectors, 1).splitlines(),
            "} else {  // a pointer is not aligned for vectors: element accesses",
            *indent(self.tiles(), 1).splitlines(),
            "}",
        ]

    def cells_and_sets(self) -> list[str]:
        """From cell[][] (complete): the cells to scratch, then the set sums (over a barrier)."""
        t, c = self.t, self.c
        total = t.samples * t.channels
        sets = t.tile // t.group
        n_elements = literal(t.group * t.spatial, c)
        return [
            f"for (int q = threadIdx.x; q < {t.tile}; q += {t.threads}) {{",
            f"  const {self.itype} o = ({self.itype})n * {t.channels} + cb * {t.tile} + q;",
            f"  {self.cells}[o] = cell[0][q];",
            f"  {self.cells}[{total} + o] = cell[1][q];",
            "}",
            f"for (int s = threadIdx.x; s < {sets}; s += {t.threads}) {{",
            f"  {c} gx = 0, g = 0;",
            f"  for (int j = s * {t.group}; j < (s + 1) * {t.group}; ++j) {{",
            "    gx += tile_scale[parity][j] * cell[0][j];",
            "    g += tile_scale[parity][j] * cell[1][j];",
            "  }",
            f"  set_sums[0][s] = gx / {n_elements};",
            f"  set_sums[1][s] = g / {n_elements};",
            "}",
            "__syncthreads();",
        ]

    @property
    def grouped(self) -> bool:
        x = anchor_of(self.b.fused).input("input")
        assert x is not None
        return len(self.b.x.dim) > len(x.dim)

    def element_terms(self, slot: str, e: str, suffix: str) -> list[str]:
        c = self.c
        return [
            f"const {c} d = gd::element<{c}>(vg[{slot}], {e});",
            f"const {c} xh = (gd::element<{c}>(vx[{slot}], {e}) - mu{suffix}) * rs{suffix};",
        ]

    def slot_loop(self, body: list[str], prelude: tuple[str, ...] = ()) -> list[str]:
        """``body`` for each slot k of this thread that is in the tile (after ``prelude``)."""
        guard = self.slot()[1]
        inner = [f"if ({guard}) {{", *indent(body, 1).splitlines(), "}"] if guard else body
        return [
            "#pragma unroll",
            f"for (int k = 0; k < {self.t.slots}; ++k) {{",
            *indent([*prelude, *inner], 1).splitlines(),
            "}",
        ]

    def accumulate(self, stats: str, sums: str, prelude: tuple[str, ...] = ()) -> list[str]:
        """The held elements' grad * xhat and grad (xhat from mu{stats}, rs{stats}) into sa{sums} and sb{sums}."""
        each = [*self.element_terms("k", "e", stats), f"sa{sums} += d * xh;", f"sb{sums} += d;"]
        return self.slot_loop(
            ["#pragma unroll", f"for (int e = 0; e < {self.t.width}; ++e) {{", *indent(each, 1).splitlines(), "}"],
            prelude,
        )

    def write_dx(self, coefficient: str, shared: str, stats: str, prelude: tuple[str, ...] = ()) -> list[str]:
        """dx of the held elements: inv * (grad * scale - mean(g) - xhat * mean(g * xhat)) as
        ga{coefficient} * grad + gb{shared} + gc{shared} * (x - mu{stats}), with ga = inv * scale,
        gb = -inv * mean(g), gc = -inv^2 * mean(g * xhat) (:meth:`coefficients`): three values per
        channel or set where the formula reads five, each a register beside the held vectors."""
        c = self.c
        value = f"ga{coefficient} * d + gb{shared} + gc{shared} * (gd::element<{c}>(vx[k], e) - mu{stats})"
        each = [f"const {c} d = gd::element<{c}>(vg[k], e);", f"out.v[e] = {store(self.b.dx.data_type, value)};"]
        body = [
            f"{self.vector_type('dx')} out;",
            "#pragma unroll",
            f"for (int e = 0; e < {self.t.width}; ++e) {{",
            *indent(each, 1).splitlines(),
            "}",
            *self.store_vector(f"first + {self.slot()[0]}"),
        ]
        return self.slot_loop(body, prelude)

    def coefficients(self, names: tuple[str, ...], channel: str, stats: str) -> list[str]:
        """Those of ga, gb and gc (:meth:`write_dx`) in ``names`` (as written, e.g. ``ga[e]``) of
        tile channel ``channel``, from rs{stats}, the staged scale and the set sums."""
        t = self.t
        values = {
            "ga": f"rs{stats} * tile_scale[parity][{channel}]",
            "gb": f"-rs{stats} * set_sums[1][({channel}) / {t.group}]",
            "gc": f"-rs{stats} * rs{stats} * set_sums[0][({channel}) / {t.group}]",
        }
        return [f"{name} = {values[name.split('[')[0]]};" for name in names]

    def nhwc_body(self) -> list[str]:
        """Per element column e: its sums added over the rows, then over the threads of the
        column (shuffles within a warp where I divides 32, then the partial rows in shared memory)."""
        t, c = self.t, self.c
        w = t.width
        # Where a vector's w channels are of one set (w divides the channels a group), its
        # statistics and means are one value each: fewer registers beside the held vectors.
        stats = "" if t.group % w == 0 else "[e]"
        lines = [
            f"{c} sa[{w}], sb[{w}];",
            "#pragma unroll",
            f"for (int e = 0; e < {w}; ++e) {{",
            "  sa[e] = 0;",
            "  sb[e] = 0;",
            "}",
        ]
        if stats == "":
            lines += [f"{c} mu, rs;", *self.channel_values(f"col * {w}", "", ("mu", "rs"))]
        else:
            lines += [
                f"{c} mu[{w}], rs[{w}];",
                "#pragma unroll",
                f"for (int e = 0; e < {w}; ++e) {{",
                *indent(self.channel_values(f"col * {w} + e", "[e]", ("mu", "rs")), 1).splitlines(),
                "}",
            ]
        lines += self.accumulate(stats, "[e]")
        if t.shuffled:
            lines += [
                "#pragma unroll",
                f"for (int e = 0; e < {w}; ++e) {{",
                "#pragma unroll",
                f"  for (int offset = 16; offset >= {t.columns}; offset /= 2) {{",
                "    sa[e] += gd::shfl_xor(sa[e], offset);",
                "    sb[e] += gd::shfl_xor(sb[e], offset);",
                "  }",
                "}",
                f"if (threadIdx.x % 32 < {t.columns}) {{",
                f"  const int pr = threadIdx.x / {max(t.columns, 32)};",
            ]
        else:
            lines += ["{", "  const int pr = row0;"]
        lines += [
            "#pragma unroll",
            f"  for (int e = 0; e < {w}; ++e) {{",
            f"    part[0][pr][col * {w} + e] = sa[e];",
            f"    part[1][pr][col * {w} + e] = sb[e];",
            "  }",
            "}",
            "__syncthreads();",
            f"for (int q = threadIdx.x; q < {t.tile}; q += {t.threads}) {{",
            f"  {c} a = 0, s = 0;",
            f"  for (int pr = 0; pr < {t.partial_rows}; ++pr) {{",
            "    a += part[0][pr][q];",
            "    s += part[1][pr][q];",
            "  }",
            "  cell[0][q] = a;",
            "  cell[1][q] = s;",
            "}",
            "__syncthreads();",
            *self.cells_and_sets(),
        ]
        each = ("ga[e]",) if stats == "" else ("ga[e]", "gb[e]", "gc[e]")
        lines += [
            f"{c} {', '.join(f'{name[:2]}[{w}]' for name in each)};",
            "#pragma unroll",
            f"for (int e = 0; e < {w}; ++e) {{",
            *indent(self.coefficients(each, f"col * {w} + e", stats), 1).splitlines(),
            "}",
        ]
        if stats == "":
            lines += [f"{c} gb, gc;", *self.coefficients(("gb", "gc"), f"col * {w}", "")]
        return [*lines, *self.write_dx("[e]", stats, stats)]

    def nchw_body(self) -> list[str]:
        """Per channel j of the team: its sums over the team's slots, then over the team (group_sum)."""
        t, c = self.t, self.c
        per_team = t.tile // t.teams
        channel = f"const int j = k / {t.slots // per_team};"
        scratch = "red" if t.team > 32 else "nullptr"
        coefficients = self.coefficients(("ga", "gb", "gc"), f"team + {t.teams} * j", "[j]")
        prelude = (channel, f"{c} ga, gb, gc;", *coefficients)
        return [
            f"{c} mu[{per_team}], rs[{per_team}], sa[{per_team}], sb[{per_team}];",
            "#pragma unroll",
            f"for (int j = 0; j < {per_team}; ++j) {{",
            *indent(self.channel_values(f"team + {t.teams} * j", "[j]", ("mu", "rs")), 1).splitlines(),
            "  sa[j] = 0;",
            "  sb[j] = 0;",
            "}",
            *self.accumulate("[j]", "[j]", (channel,)),
            "#pragma unroll",
            f"for (int j = 0; j < {per_team}; ++j) {{",
            f"  const {c} a = gd::group_sum<{t.team}, {c}>(sa[j], {scratch});",
            f"  const {c} s = gd::group_sum<{t.team}, {c}>(sb[j], {scratch});",
            "  if (lane == 0) {",
            f"    cell[0][team + {t.teams} * j] = a;",
            f"    cell[1][team + {t.teams} * j] = s;",
            "  }",
            "}",
            "__syncthreads();",
            *self.cells_and_sets(),
            *self.write_dx("", "", "[j]", prelude),
        ]

    def kernel(self) -> Kernel:
        t = self.t
        name, source = kernel_source(
            self.ctx,
            self.b.fused,
            f"{anchor_of(self.b.fused).op}_sets",
            self.params,
            t.threads,
            indent(self.body(), 1),
            t.per_sm if t.prefetch else 0,
            PREFETCH_L2 if t.prefetch else "",
        )
        grid = t.grid if t.prefetch else t.blocks
        alignment = t.width * itemsize_of(self.b)
        return Kernel(name, source, (grid, 1, 1), (t.threads, 1, 1), 0, tuple(self.params.bindings), alignment)
