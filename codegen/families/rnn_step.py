"""One time step of one RNN layer, both directions, all sequences: h_{t-1} @ W_hh^T (an
[N, H] x [H, G*H] product) fused with the gates, the cell update and the stores.

The same kernel is launched T times per layer (a CUDA graph replays them without host
overhead); the step it runs is in the ``rnn_step`` scratch counter, which the projection
reset and the last block of each launch advances (blocks read it before taking their ticket,
so none can see the next step's value). A block owns U consecutive hidden units of one
direction (grid: H / U x D), so the G*U rows of W_hh it needs are its own and the units
it updates depend on no other block within the step: kernel boundaries are the only
synchronisation.

The product runs on the tensor cores for fp16 / bf16 weights from sm_80 (h_{t-1} rounded to
the weights' type for it, as cuDNN does: rnn_step_overlap.py by default, rnn_step_mma.py under
the launch choice rnn_step_schedule "serial"); else here, on the CUDA cores in
the compute type: the block stages its W_hh rows and h_{t-1} in chunks of k through shared
memory; lane i of each warp is sequence n0 + i, warps split the units and k (partial sums
meet in shared memory), and each thread keeps all G gates of its units in registers, so the
cell update follows the product without another pass. Either way U is chosen to spread the
units over about one block per SM (launch choice rnn_step_units: measured slower with fewer,
larger blocks at H 1024), and the state stays float or double between steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from graphdnn.arch import sm_count
from graphdnn.ir import Tensor
from graphdnn.ops.rnn import RnnMode

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import THREADS, declare, make_kernel, read, written
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .rnn_layer import (
    STATE_C,
    STATE_H,
    STATE_H16,
    STEP,
    XPROJ,
    RnnLayer,
    StepProduct,
    StepSources,
    advance_step,
    by_direction,
    launch_choice,
    layer_buffer,
    length_check,
    stage_step_operands,
)
from .rnn_projection import with_mma_functions
from .rnn_step_mma import PIECE, StepCopies, copies_state16, mma_product, recurrence_type
from .rnn_step_overlap import overlapped_product

WARPS = THREADS // 32
MAX_UNITS = 32  # per block: at most 4 units per warp, 4 * G accumulators per thread
SCHEDULES = ("overlapped", "serial")  # of the tensor-core product: rnn_step_overlap.py, rnn_step_mma.py
SCHEDULE = "rnn_step_schedule"  # the launch choice, one of SCHEDULES
UNITS = "rnn_step_units"  # the launch choice: hidden units per block (default: about one block per SM)
SHARED_BUDGET = 46 * 1024  # of the 48 KiB a kernel may declare statically
PAD = 33  # the staged h's row stride in elements: lanes read consecutive banks


@dataclass(frozen=True)
class StepShape:
    units: int  # U: hidden units per block
    unit_warps: int  # warps along the units (a power of 2)
    k_warps: int  # warps along k (WARPS / unit_warps)
    vector: int  # W_hh elements per shared-memory load (16 bytes)
    chunk: int  # KC: k staged per pass

    @property
    def per_warp(self) -> int:
        """Units each warp updates (the last warps' last may be past U: zero rows)."""
        return -(-self.units // self.unit_warps)

    def shared_bytes(self, gates: int, size: int) -> int:
        rows = self.per_warp * self.unit_warps * gates
        partials = WARPS * 32 * self.per_warp * gates if self.k_warps > 1 else 0
        return (rows * (self.chunk + self.vector) + self.chunk * PAD + partials) * size


def step_shape(hidden: int, gates: int, directions: int, size: int, arch: int, units: int | None = None) -> StepShape:
    """The step kernel's blocking for ``size``-byte compute elements: ``units`` per block (by
    default about one block per SM), and k chunks that keep the shared memory within
    SHARED_BUDGET."""
    if units is None:
        units = max(1, -(-directions * hidden // sm_count(arch)))
    units = min(MAX_UNITS, hidden, units)
    unit_warps = 1
    while unit_warps * 2 <= min(units, WARPS):
        unit_warps *= 2
    vector = 16 // size
    chunk = 32 * -(-hidden // 32)  # a multiple of 32 = vector * k_warps at most: the warps' k ranges split evenly
    shape = StepShape(units, unit_warps, WARPS // unit_warps, vector, chunk)
    while chunk > 32 and shape.shared_bytes(gates, size) > SHARED_BUDGET:
        chunk -= 32
        shape = StepShape(units, unit_warps, WARPS // unit_warps, vector, chunk)
    return shape


def step_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel:
    a, c, d = layer.a, layer.compute, layer.directions
    node, fused = layer.node, layer.fused
    s = step_shape(layer.hidden, layer.gates, d, layer.element_bytes, ctx.arch, _units(ctx, node.name))
    hx, cx, lengths = node.input("hx"), node.input("cx"), node.input("seq_lengths")
    y, hy, cy = node.output("y"), node.output("hy"), node.output("cy")
    lstm = a.mode is RnnMode.LSTM
    w_hh = [layer.weights(direction)[1] for direction in range(d)]
    b_hh = [layer.weights(direction)[3] for direction in range(d)]

    params = KernelParams()
    names = declare(params, [*w_hh, *b_hh, lengths, hx, cx])
    xproj, state_h = params.scratch(XPROJ, c), params.scratch(STATE_H, c)
    state_c = params.scratch(STATE_C, c) if lstm else None
    counter = params.scratch(STEP, "unsigned")
    out_y = params.tensor(y, writable=True) if layer.last and y is not None and written(fused, y) else None
    out_buffer = params.scratch(layer_buffer(layer.layer), c) if not layer.last else None
    final_h = params.tensor(hy, writable=True) if hy is not None and written(fused, hy) else None
    final_c = params.tensor(cy, writable=True) if cy is not None and written(fused, cy) else None
    reserve = node.output("reserve")  # rnn_training's
    out_reserve = params.tensor(reserve, writable=True) if reserve is not None and written(fused, reserve) else None

    def element(t: Tensor, coordinate: list[str]) -> str:
        return read(t, names[t.id], offset_at(t, coordinate), c)

    def initial(t: Tensor | None, n: str, j: str) -> str:
        return element(t, ["index", n, j]) if t is not None else "0"

    sources = StepSources(
        by_direction(d, "dir", [element(w, ["g * H + j", "k"]) for w in w_hh]),
        f"(step == 0 ? {initial(hx, 'm', 'k')} : h_prev[m * H + k])",
    )
    operand = recurrence_type(layer, ctx)
    copies = None
    if operand is not None and copies_state16(layer, ctx):
        contiguous = all(w.static_stride[-1] == 1 and w.static_stride[0] % PIECE == 0 for w in w_hh)
        copies = StepCopies(
            by_direction(d, "dir", [f"&{names[w.id]}[{offset_at(w, ['g * H + j', 'k'])}]" for w in w_hh])
            if contiguous
            else None,
            names[w_hh[0].id],
            params.aligned_flag(),
            params.scratch(STATE_H16, cuda_type(operand)),
        )
    if operand is None:
        p = _fma_product(layer, s, sources)
    elif launch_choice(ctx, node.name, SCHEDULE, "overlapped", SCHEDULES, "'overlapped' or 'serial'") == "overlapped":
        p = overlapped_product(layer, s.units, operand, sources, copies, ctx.arch)
    else:
        p = mma_product(layer, s.units, operand, sources, copies, ctx.arch)
    from_x = f"{xproj} + ((long long)t * N + n) * (D * G * H) + dir * (G * H) + j"
    h_old = f"step == 0 ? {initial(hx, 'n', 'j')} : h_prev[n * H + j]"
    c_old = f"step == 0 ? {initial(cx, 'n', 'j')} : {state_c}[(dir * N + n) * H + j]" if lstm else None
    bias = by_direction(d, "dir", [element(b, ["g * H + j"]) for b in b_hh])
    body = [
        f"constexpr int T = {layer.steps}, N = {layer.batch}, H = {layer.hidden}, G = {layer.gates}, D = {d};",
        f"constexpr int U = {s.units};",
        *p.constants,
        "const int dir = blockIdx.y, u0 = blockIdx.x * U;",
        f"const int index = {layer.layer * d} + dir;  // of this layer and direction in hx, hy",
        f"const int step = (int)*(volatile unsigned*)&{counter}[0];",
        "const int t = dir ? T - 1 - step : step, parity = step & 1;",
        f"const {c}* const h_prev = {state_h} + (parity * D + dir) * N * H;",
        f"{c}* const h_next = {state_h} + ((parity ^ 1) * D + dir) * N * H;",
        f"auto sigmoid = []({c} v) {{ return ({c})1 / (({c})1 + exp(-v)); }};",
        *p.shared,
        f"for (int n0 = 0; n0 < N; n0 += {p.sequences}) {{",
        *("  " + line for line in (_prefetch(p, c, from_x, h_old, c_old, bias) if p.cells else [])),
        *("  " + line for line in p.product),
        *("  " + line for line in p.cell_open),
        *("    " + line for line in length_check(names[lengths.id] if lengths is not None else None, lengths)),
    ]
    if p.cells:
        gate_x, gate_bias = "x_pre[q][{g}]", "b_pre[q][g]"
        body += [f"    const {c} h_old = h_pre[q];", *([f"    const {c} c_old = c_pre[q];"] if lstm else [])]
    else:
        gate_x, gate_bias = "from_x[{g} * H]", bias
        body += [f"    const {c}* const from_x = {from_x};", f"    const {c} h_old = {h_old};"]
        body += [f"    const {c} c_old = {c_old};"] if c_old is not None else []
    body += [
        f"    {c} pre[G];  // W_hh h + b_hh of each gate",
        "#pragma unroll",
        f"    for (int g = 0; g < G; ++g) pre[g] = {p.product_of} + {gate_bias};",
        *("    " + line for line in _cell(a.mode, c, lambda g: gate_x.format(g=g))),
        f"    const {c} h_new = within ? value : h_old;",
        "    h_next[n * H + j] = h_new;",
        *("    " + line for line in p.state_stores),
    ]
    if lstm:
        body.append(f"    {state_c}[(dir * N + n) * H + j] = within ? cell : c_old;")
    column = "dir * H + j"
    if out_y is not None:
        assert y is not None
        body.append(
            f"    {out_y}[{offset_at(y, ['t', 'n', column])}] = {store(y.data_type, f'within ? value : ({c})0')};"
        )
    if out_reserve is not None:
        assert reserve is not None
        fields = [*_reserve_fields(a.mode, lambda g: gate_x.format(g=g)), "value"]
        for field, value in enumerate(fields):
            at = offset_at(reserve, [str(layer.layer), "t", "n", "dir", f"{field} * H + j"])
            body.append(f"    {out_reserve}[{at}] = {store(reserve.data_type, f'within ? {value} : ({c})0')};")
    if out_buffer is not None:
        body.append(f"    {out_buffer}[((long long)t * N + n) * (D * H) + {column}] = within ? value : 0;")
    finals = [(hy, final_h, "within ? value : h_old"), (cy, final_c, "within ? cell : c_old")]
    for tensor, name, value in finals:
        if tensor is not None and name is not None:
            at = offset_at(tensor, ["index", "n", "j"])
            body.append(f"    if (step == T - 1) {name}[{at}] = {store(tensor.data_type, value)};")
    body += [
        *("  " + line for line in p.cell_close),
        "}",
        *advance_step(counter),
    ]
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_step{'_mma' if operand is not None else ''}"
    pattern += "_training" if out_reserve is not None else ""
    grid = (-(-layer.hidden // s.units), d, 1)
    kernel = make_kernel(ctx, fused, pattern, params, body, grid)
    if operand is None:
        return kernel
    kernel = with_mma_functions(kernel, operand)
    if copies is not None:
        kernel = dataclasses.replace(kernel, source=kernel.source.replace(_ENTRY, ASYNC_COPY_PRELUDE + _ENTRY, 1))
    return dataclasses.replace(kernel, shared_bytes=p.shared_bytes)


_ENTRY = 'extern "C" __global__'


def _units(ctx: EmitContext, node: str) -> int | None:
    """The ``rnn_step_units`` launch choice (None: the default)."""
    units = launch_choice(
        ctx, node, UNITS, None, [None, *range(1, MAX_UNITS + 1)], f"a whole number from 1 to {MAX_UNITS}"
    )
    return None if units is None else int(units)  # type: ignore[call-overload]


def _fma_product(layer: RnnLayer, s: StepShape, sources: StepSources) -> StepProduct:
    """CUDA-core FMAs in the compute type: lane i of each warp is sequence n0 + i, warps split
    the units and k, each thread keeps all G gates of its units in registers."""
    c = layer.compute
    rows = s.per_warp * s.unit_warps * layer.gates
    vector_type = {4: "float4", 8: "double2"}[layer.element_bytes]
    constants = [
        f"constexpr int UW = {s.unit_warps}, KW = {s.k_warps}, TU = {s.per_warp}, KC = {s.chunk};",
        f"constexpr int V = {s.vector}, STRIDE = KC + V, ROWS = {rows}, PAD = {PAD};",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, uw = warp % UW, kw = warp / UW;",
    ]
    shared = [
        f"__shared__ __align__(16) {c} ws[ROWS * STRIDE];  // row (unit u, gate g) = u * G + g",
        f"__shared__ {c} hs[KC * PAD];  // h_{{t-1}}[n0 + n][k0 + k] at k * PAD + n",
        *([f"__shared__ {c} partial[KW * UW * 32 * TU * G];"] if s.k_warps > 1 else []),
    ]
    product = [
        "const int n = n0 + lane;",
        f"{c} acc[TU][G];",
        "#pragma unroll",
        "for (int u = 0; u < TU; ++u)",
        "#pragma unroll",
        "  for (int g = 0; g < G; ++g) acc[u][g] = 0;",
        "for (int k0 = 0; k0 < H; k0 += KC) {",
        "  __syncthreads();  // everyone is done with the previous chunk",
        *(
            "  " + line
            for line in stage_step_operands(sources, "32", "hs[(i % KC) * PAD + i / KC]", c, lambda value: value, "0")
        ),
        "  __syncthreads();",
        "  for (int kk = kw * (KC / KW); kk < (kw + 1) * (KC / KW); kk += V) {",
        f"    {c} h[V];",
        "#pragma unroll",
        "    for (int v = 0; v < V; ++v) h[v] = hs[(kk + v) * PAD + lane];",
        "#pragma unroll",
        "    for (int u = 0; u < TU; ++u)",
        "#pragma unroll",
        "      for (int g = 0; g < G; ++g) {",
        f"        const {vector_type} w = *reinterpret_cast<const {vector_type}*>(&ws[((uw + u * UW) * G + g) * STRIDE + kk]);",
        f"        acc[u][g] += {_dot(s.vector)};",
        "      }",
        "  }",
        "}",
        *_reduce(s.k_warps),
    ]
    cell_open = [
        "if (kw == 0 && n < N) {",
        "#pragma unroll",
        "  for (int u = 0; u < TU; ++u) {",
        "    const int j = u0 + uw + u * UW;",
        "    if (uw + u * UW >= U || j >= H) continue;",
    ]
    return StepProduct(constants, shared, 32, product, cell_open, ["  }", "}"], "acc[u][g]")


def _dot(vector: int) -> str:
    parts = "xyzw"[:vector]
    return " + ".join(f"w.{p} * h[{i}]" for i, p in enumerate(parts))


def _reduce(k_warps: int) -> list[str]:
    """The k warps' partial sums into the first's accumulators (kw == 0)."""
    if k_warps == 1:
        return []
    return [
        "#pragma unroll",
        "for (int u = 0; u < TU; ++u)",
        "#pragma unroll",
        "  for (int g = 0; g < G; ++g) partial[((kw * UW + uw) * 32 + lane) * TU * G + u * G + g] = acc[u][g];",
        "__syncthreads();",
        "if (kw == 0)",
        "  for (int w = 1; w < KW; ++w)",
        "#pragma unroll",
        "    for (int u = 0; u < TU; ++u)",
        "#pragma unroll",
        "      for (int g = 0; g < G; ++g) acc[u][g] += partial[((w * UW + uw) * 32 + lane) * TU * G + u * G + g];",
    ]


def _cell(mode: RnnMode, c: str, x: Callable[[int], str]) -> list[str]:
    """``value`` (and LSTM's ``cell``): the new state from ``pre`` (W_hh h + b_hh per gate),
    ``x(g)`` (W_ih x + b_ih of gate g), ``h_old`` and ``c_old``."""
    if mode is RnnMode.RELU:
        return [f"const {c} value = max({x(0)} + pre[0], ({c})0);"]
    if mode is RnnMode.TANH:
        return [f"const {c} value = tanh({x(0)} + pre[0]);"]
    if mode is RnnMode.LSTM:
        return [
            f"const {c} cell = sigmoid({x(1)} + pre[1]) * c_old + sigmoid({x(0)} + pre[0]) * tanh({x(2)} + pre[2]);",
            f"const {c} value = sigmoid({x(3)} + pre[3]) * tanh(cell);",
        ]
    return [  # GRU: the reset gate scales W_hn h + b_hn alone
        f"const {c} reset = sigmoid({x(0)} + pre[0]), update = sigmoid({x(1)} + pre[1]);",
        f"const {c} fresh = tanh({x(2)} + reset * pre[2]);",
        f"const {c} value = (({c})1 - update) * fresh + update * h_old;",
    ]


def _reserve_fields(mode: RnnMode, x: Callable[[int], str]) -> list[str]:
    """rnn_training's reserve fields before h (graphdnn/ops/rnn.py) from what :func:`_cell`
    defines: the activated gates, then LSTM's cell or GRU's W_hn h + b_hn."""
    if mode is RnnMode.LSTM:
        gates = [f"sigmoid({x(0)} + pre[0])", f"sigmoid({x(1)} + pre[1])", f"tanh({x(2)} + pre[2])"]
        return [*gates, f"sigmoid({x(3)} + pre[3])", "cell"]
    if mode is RnnMode.GRU:
        return ["reset", "update", "fresh", "pre[2]"]
    return []


def _prefetch(p: StepProduct, c: str, from_x: str, h_old: str, c_old: str | None, bias: str) -> list[str]:
    """The cell operands of this thread's ``p.cells`` cells into registers (x_pre, b_pre,
    h_pre, c_pre), issued before the product so that their latency hides behind it."""
    arrays = f"x_pre[{p.cells}][G], b_pre[{p.cells}][G], h_pre[{p.cells}]" + (f", c_pre[{p.cells}]" if c_old else "")
    return [
        f"{c} {arrays};  // the cells' operands, loaded before the product",
        "#pragma unroll",
        f"for (int q = 0; q < {p.cells}; ++q) {{",
        *("  " + line for line in p.cell_at),
        f"  const {c}* const from_x = {from_x};",
        "#pragma unroll",
        "  for (int g = 0; g < G; ++g) {",
        "    x_pre[q][g] = from_x[g * H];",
        f"    b_pre[q][g] = {bias};",
        "  }",
        f"  h_pre[q] = {h_old};",
        *([f"  c_pre[q] = {c_old};"] if c_old else []),
        "}",
    ]
