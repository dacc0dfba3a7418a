"""The operands of an RNN layer's all-step backward GEMMs (rnn_backward_sums.py) rearranged so
that each row runs along the GEMM's k in the tensor cores' 16-bit type: then the GEMMs take the
forward projection's pipelined loop of 16-byte pieces instead of staging element by element.

Per layer, one kernel per operand, transposing through 32 x 32 tiles of shared memory (reads
along the source's rows, writes along the scratch's), into scratch:

- ``rnn_dgates_t`` [D*G*H, T*N]: the step kernels' gate gradients transposed (k: the
  (step, sequence) pairs of dW's sums); ``rnn_dgates_h_t`` the same of GRU's h-side ones;
- ``rnn_input_t`` [W + 1, T*N]: the layer's input transposed (x, or the layer below's h
  fields), and a row of ones (the bias gradients as one more column of dW);
- ``rnn_h_prev_t`` [D, H + 1, T*N]: each direction's state before each step (the reserve's h
  of the step before, or hx) transposed, and a row of ones;
- ``rnn_w_ih_t`` [W, D*G*H]: both directions' W_ih transposed (k: the gate rows dx sums over).
"""

from __future__ import annotations

from collections.abc import Callable

from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.ops.rnn import RESERVE_FIELDS, RnnMode

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import offset_at
from ..kernel import Kernel, Scratch
from .direct_common import THREADS, declare, make_kernel, read
from .rnn_backward_step import DGATES, DGATES_H, sequence_length
from .rnn_layer import RnnLayer, by_direction
from .rnn_projection_vector import PIECE

DGATES_T, DGATES_H_T, INPUT_T, H_PREV_T, W_IH_T = (
    "rnn_dgates_t",
    "rnn_dgates_h_t",
    "rnn_input_t",
    "rnn_h_prev_t",
    "rnn_w_ih_t",
)


def rearranged(layer: RnnLayer, operand: DataType | None) -> bool:
    """Whether the layer's GEMMs take rearranged operands: tensor cores, and both k extents
    (T*N of dW's, D*G*H of dx's) whole pieces."""
    pairs, rows = layer.steps * layer.batch, layer.directions * layer.gates * layer.hidden
    return operand is not None and pairs % PIECE == 0 and rows % PIECE == 0


def scratch(first: RnnLayer, widest: int, operand: DataType) -> list[Scratch]:
    """The buffers, sized for the widest layer input (``widest`` elements)."""
    size = 2  # bytes of a 16-bit operand
    pairs, rows = first.steps * first.batch, first.directions * first.gates * first.hidden
    gru = first.a.mode is RnnMode.GRU
    return [
        Scratch(DGATES_T, rows * pairs * size),
        *([Scratch(DGATES_H_T, rows * pairs * size)] if gru else []),
        Scratch(INPUT_T, (widest + 1) * pairs * size),
        Scratch(H_PREV_T, first.directions * (first.hidden + 1) * pairs * size),
        Scratch(W_IH_T, widest * rows * size),
    ]


def operand_kernels(layer: RnnLayer, ctx: EmitContext, operand: DataType) -> list[Kernel]:
    a, c, d = layer.a, layer.compute, layer.directions
    node = layer.node
    x, hx, lengths, reserve = layer.x, node.input("hx"), node.input("seq_lengths"), node.input("reserve")
    assert reserve is not None
    pairs, gate_rows, width, hidden = layer.steps * layer.batch, layer.gates * layer.hidden, layer.width, layer.hidden
    last_field = RESERVE_FIELDS[a.mode] - 1
    one = f"({c})1"
    at_pair = f"const int t = col / {layer.batch}, n = col % {layer.batch};"

    def dgates(name: str) -> Callable[[KernelParams], tuple[list[str], str]]:
        return lambda params: ([], f"{params.scratch(name, c)}[(long long)col * {d * gate_rows} + row]")

    def inputs(params: KernelParams) -> tuple[list[str], str]:
        if layer.layer == 0:
            names = declare(params, [x])
            value = read(x, names[x.id], offset_at(x, ["t", "n", "row"]), c)
        else:  # the layer below's h fields, the directions side by side
            names = declare(params, [reserve])
            below = [str(layer.layer - 1), "t", "n", f"row / {hidden}", f"{last_field} * {hidden} + row % {hidden}"]
            value = read(reserve, names[reserve.id], offset_at(reserve, below), c)
        return [at_pair], f"row < {width} ? {value} : {one}"

    def states(params: KernelParams) -> tuple[list[str], str]:
        names = declare(params, [reserve, hx, lengths])

        def element(t: Tensor, coordinate: list[str]) -> str:
            return read(t, names[t.id], offset_at(t, coordinate), c)

        h_prev = element(reserve, [str(layer.layer), "before", "n", "dir", f"{last_field} * H + j"])
        initial = element(hx, ["index", "n", "j"]) if hx is not None else "0"
        lines = [
            f"constexpr int T = {layer.steps}, H = {hidden};",
            "const int dir = row / (H + 1), j = row % (H + 1);",
            f"const int index = {layer.layer * d} + dir;  // of this layer and direction in hx",
            at_pair,
            "const int before = dir ? t + 1 : t - 1;  // the step that ran before t",
            f"const int length = {sequence_length(names[lengths.id] if lengths is not None else None, lengths)};",
            "const bool started = dir ? before < length : before >= 0;",
        ]
        return lines, f"j < H ? (started ? {h_prev} : {initial}) : {one}"

    def weights(params: KernelParams) -> tuple[list[str], str]:
        w_ih = [layer.weights(direction)[0] for direction in range(d)]
        names = declare(params, w_ih)
        value = by_direction(d, "dir", [read(w, names[w.id], offset_at(w, ["r", "row"]), c) for w in w_ih])
        return [f"const int dir = col / {gate_rows}, r = col % {gate_rows};"], value

    plans = [
        ("dgates_t", DGATES_T, d * gate_rows, pairs, dgates(DGATES)),
        *([("dgates_h_t", DGATES_H_T, d * gate_rows, pairs, dgates(DGATES_H))] if a.mode is RnnMode.GRU else []),
        ("input_t", INPUT_T, width + 1, pairs, inputs),
        ("h_prev_t", H_PREV_T, d * (hidden + 1), pairs, states),
        ("w_ih_t", W_IH_T, width, d * gate_rows, weights),
    ]
    return [_kernel(layer, ctx, operand, *plan) for plan in plans]


def _kernel(
    layer: RnnLayer,
    ctx: EmitContext,
    operand: DataType,
    what: str,
    name: str,
    rows: int,
    cols: int,
    value_of: Callable[[KernelParams], tuple[list[str], str]],
) -> Kernel:
    """The [rows, cols] scratch ``name``, element (row, col) the ``value_of`` value (after its
    lines) rounded to ``operand``, through 32 x 32 tiles of shared memory: every source runs
    along ``row`` and the scratch along ``col``, so lanes read consecutive rows, then write
    consecutive columns."""
    params = KernelParams()
    target = params.scratch(name, cuda_type(operand))
    lines, value = value_of(params)
    body = [
        f"constexpr int ROWS = {rows}, COLS = {cols};",
        f"__shared__ {layer.compute} tile[32][33];",
        "const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5, r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;",
        f"for (int slot = ty; slot < 32; slot += {THREADS // 32}) {{",
        "  const int row = r0 + tx, col = c0 + slot;",
        "  if (row < ROWS && col < COLS) {",
        *("    " + line for line in lines),
        f"    tile[slot][tx] = {value};",
        "  }",
        "}",
        "__syncthreads();",
        f"for (int slot = ty; slot < 32; slot += {THREADS // 32}) {{",
        "  const int row = r0 + slot, col = c0 + tx;",
        f"  if (row < ROWS && col < COLS) {target}[(long long)row * COLS + col] = {store(operand, 'tile[tx][slot]')};",
        "}",
    ]
    pattern = f"rnn_{layer.a.mode.value}_layer{layer.layer}_backward_{what}"
    return make_kernel(ctx, layer.fused, pattern, params, body, (-(-cols // 32), -(-rows // 32), 1))
