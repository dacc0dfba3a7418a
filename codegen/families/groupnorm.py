"""Group and instance normalization, with an epilogue.

A *set* is one sample's group of C/groups consecutive channels with all their spatial
positions (instance norm: one channel, groups = C); its M elements are standardised with
its own statistics. One block per set (grid-stride over the sets) walks the set three
times: the sum (the mean), the centered sum of squares (the variance), then y = (x - mean)
* rstd * scale[c] + bias[c] with the epilogue, stored. Each thread accumulates in fp32 (in
double for double tensors); the block combines the threads' sums with gd::group_sum. The
re-reads of a set come from L2 (or L1 for small sets).

Elements are enumerated in x's memory order (NCHW: channel, then spatial; NHWC: spatial,
then channel), so neighbouring threads touch neighbouring addresses as far as the layout
allows; every tensor is addressed through its own strides, so any layout and any
broadcast operand works. Launch choice: ``threads`` per block (``ctx.tuning``, else
:func:`heuristic`; :func:`candidates` lists those worth timing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.errors import GraphError
from graphdnn.ir import Node, Tensor
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name, scalar_value
from ..cuda_types import load, store
from ..indexing import coordinates, index_type, offset, row_major_index
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal
from .norm_statistics import epsilon, normalize, write_statistics

MIN_THREADS, MAX_THREADS = 32, 1024
ELEMENTS_PER_THREAD = 8  # the heuristic sizes blocks for about this many elements per thread and pass


@dataclass(frozen=True)
class SetLayout:
    x: Tensor
    groups: int  # sets per sample
    channels: int  # channels per set
    size: int  # M, elements per set

    @property
    def sets(self) -> int:
        return self.x.static_dim[0] * self.groups


def analyze(fused: FusedNode) -> SetLayout:
    anchor = fused.anchor
    assert anchor is not None
    x = anchor.input("input")
    assert x is not None
    groups = anchor.attributes.groups if anchor.op == "groupnorm" else x.static_dim[1]  # type: ignore[attr-defined]
    channels = x.static_dim[1] // groups
    return SetLayout(x, groups, channels, channels * math.prod(x.static_dim[2:]))


def heuristic(layout: SetLayout) -> int:
    """Threads per block: about ELEMENTS_PER_THREAD elements each, a power of two in 32..512."""
    wanted = 1 << max(0, -(-layout.size // ELEMENTS_PER_THREAD) - 1).bit_length()
    return min(max(wanted, MIN_THREADS), MAX_THREADS // 2)


def candidates(fused: FusedNode, arch: int) -> list[dict[str, int]]:
    """Block sizes worth timing, the heuristic's first (the same on every ``arch``)."""
    layout = analyze(fused)
    first = heuristic(layout)
    others = [t for t in (128, 256, 512, 1024) if t != first and t // 2 < layout.size]
    return [{"threads": t} for t in (first, *others)]


def configured(layout: SetLayout, tuning: dict[str, object]) -> int:
    if not tuning:
        return heuristic(layout)
    threads = tuning.get("threads")
    if set(tuning) != {"threads"} or not isinstance(threads, int) or threads & (threads - 1):
        raise GraphError(f"group_norm tuning {tuning}: expected {{'threads': a power of two}}")
    if not MIN_THREADS <= threads <= MAX_THREADS:
        raise GraphError(f"group_norm tuning {tuning}: threads must be {MIN_THREADS} to {MAX_THREADS}")
    return threads


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    layout = analyze(fused)
    return FusedProgram(fused.name, (_SetKernel(fused, ctx, layout, configured(layout, ctx.tuning)).kernel(),))


class _SetKernel:
    def __init__(self, fused: FusedNode, ctx: EmitContext, layout: SetLayout, threads: int) -> None:
        anchor = fused.anchor
        assert anchor is not None and fused.prologue is None
        self.fused, self.ctx, self.layout, self.threads = fused, ctx, layout, threads
        self.anchor: Node = anchor
        self.x = layout.x
        self.memory = [t for t in (*fused.inputs, *fused.outputs) if not t.is_pass_by_value]
        self.compute = compute_of(self.memory)
        self.itype = index_type(self.memory, 2 * layout.sets, layout.size + threads)  # the loops step past the end once
        self.params = KernelParams()
        self.names = {t.id: self.params.tensor(t) for t in fused.inputs}
        self.names.update({t.id: self.params.tensor(t, writable=True) for t in fused.outputs})
        statistics = {t.id for t in anchor.output_tensors() if t is not anchor.output("y")}
        self.results = [t for t in fused.outputs if t.id not in statistics]

    def element_coordinates(self) -> list[str]:
        """Coordinates c{axis} in x of the set's element m (enumerated in x's memory order)."""
        dims = [1, self.layout.channels, *self.x.static_dim[2:]]
        lines = coordinates("m", dims, stride_order(self.x.static_dim, self.x.static_stride), "m", self.itype)
        channel = " + ".join(
            term
            for term, needed in (
                (f"g * {self.layout.channels}", self.layout.groups > 1),
                ("m1", self.layout.channels > 1),
            )
            if needed
        )
        lines += [f"const {self.itype} c0 = n;", f"const {self.itype} c1 = {channel or '0'};"]
        lines += [f"const {self.itype} c{axis} = m{axis};" for axis in range(2, len(self.x.dim))]
        return lines

    def value(self, t: Tensor) -> str:
        """``t`` at the current element."""
        if t.is_pass_by_value:
            return scalar_value(t, self.names[t.id], self.compute)
        return load(t.data_type, f"{self.names[t.id]}[{offset(t, self.x.static_dim, 'c')}]", self.compute)

    def walk(self, body: list[str]) -> list[str]:
        """``body`` for each element m of the set this thread visits."""
        return [
            f"for ({self.itype} m = threadIdx.x; m < SIZE; m += THREADS) {{",
            *indent([*self.element_coordinates(), *body], 1).splitlines(),
            "}",
        ]

    def reduce(self, value: str) -> str:
        scratch = "red" if self.threads > 32 else "nullptr"
        return f"gd::group_sum<THREADS, {self.compute}>({value}, {scratch}) / {literal(self.layout.size, self.compute)}"

    def apply(self) -> list[str]:
        values = epilogue.Values(self.compute, self.value, lambda t: row_major_index(t, self.x.static_dim, "c"))
        values.get(self.x)
        normalize(self.fused, values)
        stores = [
            f"{self.names[t.id]}[{offset(t, self.x.static_dim, 'c')}] = {store(t.data_type, values.get(t))};"
            for t in self.results
        ]
        return self.walk([*values.statements, *stores])

    def body(self) -> list[str]:
        c, layout = self.compute, self.layout
        x = self.value(self.x)
        sqrt = "sqrtf" if c == "float" else "sqrt"
        per_set = [
            f"const {self.itype} n = set / {layout.groups}, g = set % {layout.groups};",
            f"{c} sum = 0;",
            *self.walk([f"sum += {x};"]),
            f"const {c} mean = {self.reduce('sum')};",
            f"{c} squares = 0;",
            *self.walk([f"const {c} d = {x} - mean;", "squares += d * d;"]),
            f"const {c} rstd = {literal(1, c)} / {sqrt}({self.reduce('squares')} + eps);",
            # Statistics have dims [N, groups, 1, ...]: coordinates k0 = n, k1 = g.
            *write_statistics(
                self.anchor,
                self.names,
                lambda t: offset(t, t.static_dim, "k"),
                "threadIdx.x == 0",
                [f"const {self.itype} k0 = n, k1 = g;"],
            ),
            *self.apply(),
        ]
        lines = [
            f"constexpr {self.itype} SETS = {layout.sets}, SIZE = {layout.size};",
            f"constexpr int THREADS = {self.threads};",
            f"const {c} eps = {epsilon(self.anchor, self.names, c)};",
        ]
        if self.threads > 32:
            lines.append(f"__shared__ {c} red[THREADS / 32];  // group_sum's per-warp partials")
        return [
            *lines,
            f"for ({self.itype} set = blockIdx.x; set < SETS; set += gridDim.x) {{  // set = (n, g)",
            *indent(per_set, 1).splitlines(),
            "}",
        ]

    def kernel(self) -> Kernel:
        name, source = kernel_source(
            self.ctx, self.fused, pattern_name(self.fused), self.params, self.threads, indent(self.body(), 1)
        )
        blocks = min(self.layout.sets, 2**31 - 1)
        return Kernel(name, source, (blocks, 1, 1), (self.threads, 1, 1), 0, tuple(self.params.bindings))
