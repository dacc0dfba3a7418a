"""RNN / LSTM / GRU inference: one kernel per layer and direction, one block per sequence
running all T steps, the hidden (and cell) state in shared memory.

Sequences are independent, so a block can walk its own through time with only
``__syncthreads`` between steps (no grid-wide barrier, no kernel per step), and stop at its
own length (the steps past it store zeros). Each step, the
block's threads compute the G*H gate pre-activations (a row of W_ih against the step's
input and a row of W_hh against h, plus the biases), then one thread per hidden unit
applies the cell. Layers run one after another: a layer's output sequence (both directions
side by side) goes to a scratch buffer that the next layer reads, the last layer's to y.

This is the simple, correct path, not the fast one: every block reads all of W_hh from L2
every step, with no tensor cores. The issue's target (the input projections as one big
GEMM, the recurrence persistent with the weights resident in shared memory or registers)
is future work.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.ops.rnn import GATES, WEIGHTS_PER_DIRECTION, RnnAttributes, RnnMode

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import FusedProgram, Kernel, Scratch
from ..pointwise import literal
from .direct_common import anchor_of, compute_for, declare, make_kernel, read, written

SHARED_LIMIT = 48 * 1024  # static shared memory a kernel may declare


def layer_buffer(layer: int) -> str:
    """The scratch buffer that holds ``layer``'s output sequence (two, alternating)."""
    return f"rnn_layer{layer % 2}"


def emit_rnn(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    a = node.attributes
    x = node.input("x")
    assert x is not None and isinstance(a, RnnAttributes)
    compute = compute_for(fused)
    size = 8 if compute == "double" else 4
    hidden, gates = a.hidden_size, GATES[a.mode]
    shared = (gates * hidden + 2 * hidden) * size  # the gates, h, and c (LSTM) or W_hn h (GRU)
    if shared > SHARED_LIMIT:
        raise UnsupportedError(
            f"rnn keeps a sequence's {gates} x {hidden} gates and its state in shared memory ({shared} bytes, "
            f"over {SHARED_LIMIT}); a smaller hidden_size runs here",
            node=node.name,
        )
    steps, batch = x.static_dim[:2]
    kernels = [
        _layer_kernel(fused, ctx, compute, layer, direction)
        for layer in range(a.num_layers)
        for direction in range(a.directions)
    ]
    sequence_bytes = steps * batch * a.directions * hidden * size
    scratch = tuple(Scratch(layer_buffer(layer), sequence_bytes) for layer in range(min(2, a.num_layers - 1)))
    return FusedProgram(fused.name, tuple(kernels), scratch)


def _layer_kernel(fused: FusedNode, ctx: EmitContext, compute: str, layer: int, direction: int) -> Kernel:
    node = anchor_of(fused)
    a = node.attributes
    x, hx, cx, lengths = node.input("x"), node.input("hx"), node.input("cx"), node.input("seq_lengths")
    y, hy, cy = node.output("y"), node.output("hy"), node.output("cy")
    assert x is not None and y is not None and isinstance(a, RnnAttributes)
    steps, batch = x.static_dim[:2]
    hidden, gates, width = a.hidden_size, GATES[a.mode], a.directions * a.hidden_size
    index = layer * a.directions + direction
    first = index * WEIGHTS_PER_DIRECTION
    w_ih, w_hh, b_ih, b_hh = node.inputs_of("weights")[first : first + WEIGHTS_PER_DIRECTION]
    last = layer == a.num_layers - 1

    params = KernelParams()
    # hx and cx (x, in layer 0), and the two biases, may be one tensor: each declared once
    names = declare(params, [x if layer == 0 else None, w_ih, w_hh, b_ih, b_hh, lengths, hx, cx])
    if layer == 0:
        source = names[x.id]
        inputs = x.static_dim[2]

        def step_input(k: str) -> str:
            return read(x, source, offset_at(x, ["t", "n", k]), compute)
    else:
        below = params.scratch(layer_buffer(layer - 1), compute)
        inputs = width

        def step_input(k: str) -> str:
            return f"{below}[((long long)t * {batch} + n) * {width} + {k}]"

    length_of = names[lengths.id] if lengths is not None else None
    initial_h = names[hx.id] if hx is not None else None
    initial_c = names[cx.id] if cx is not None else None
    out_y = params.tensor(y, writable=True) if last and written(fused, y) else None
    out_buffer = params.scratch(layer_buffer(layer), compute) if not last else None
    final_h = params.tensor(hy, writable=True) if hy is not None and written(fused, hy) else None
    final_c = params.tensor(cy, writable=True) if cy is not None and written(fused, cy) else None

    def weight(t: Tensor, row: str, column: str | None = None) -> str:
        return read(t, names[t.id], offset_at(t, [row] if column is None else [row, column]), compute)

    zero, one = literal(0, compute), literal(1, compute)
    lstm, gru = a.mode is RnnMode.LSTM, a.mode is RnnMode.GRU

    def state(tensor: Tensor | None, name: str | None) -> str:
        if tensor is None or name is None:
            return zero
        return read(tensor, name, offset_at(tensor, [str(index), "n", "j"]), compute)

    if lengths is not None and length_of is not None:
        given = f"(long long){length_of}[{offset_at(lengths, ['n'])}]"
        length = [
            f"const long long given = {given};",
            "// a length outside [0, T] (the reference refuses it) is clamped",
            f"const int length = (int)(given < 0 ? 0 : given > {steps} ? {steps} : given);",
        ]
    else:
        length = [f"const int length = {steps};"]
    body = [
        "const int n = blockIdx.x;",
        *length,
        f"auto sigmoid = []({compute} v) {{ return {one} / ({one} + exp(-v)); }};",
        f"__shared__ {compute} h[{hidden}], state[{hidden}], gates[{gates * hidden}];",
        f"for (int j = threadIdx.x; j < {hidden}; j += blockDim.x) {{",
        f"  h[j] = {state(hx, initial_h)};",
        *([f"  state[j] = {state(cx, initial_c)};"] if lstm else []),
        "}",
        "__syncthreads();",
        f"for (int step = 0; step < {steps}; ++step) {{",
        f"  const int t = {f'{steps - 1} - step' if direction else 'step'};",
        "  if (t >= length) {  // past the sequence's length (the same t on every thread): y is 0",
        *(["    " + line for line in _zero_output(out_y, out_buffer, y, batch, width, hidden, direction, zero)]),
        "    continue;",
        "  }",
        f"  for (int g = threadIdx.x; g < {gates * hidden}; g += blockDim.x) {{",
        f"    {compute} from_x = {weight(b_ih, 'g')};",
        f"    for (int k = 0; k < {inputs}; ++k) from_x += {weight(w_ih, 'g', 'k')} * {step_input('k')};",
        f"    {compute} from_h = {weight(b_hh, 'g')};",
        f"    for (int k = 0; k < {hidden}; ++k) from_h += {weight(w_hh, 'g', 'k')} * h[k];",
    ]
    if gru:  # the new gate keeps W_hn h apart: the reset gate scales it alone
        body += [
            f"    if (g < {2 * hidden}) {{",
            "      gates[g] = from_x + from_h;",
            "    } else {",
            "      gates[g] = from_x;",
            f"      state[g - {2 * hidden}] = from_h;",
            "    }",
        ]
    else:
        body.append("    gates[g] = from_x + from_h;")
    body += ["  }", "  __syncthreads();", f"  for (int j = threadIdx.x; j < {hidden}; j += blockDim.x) {{"]
    body += ["    " + line for line in _cell(a.mode, hidden, compute, zero, one)]
    body.append("    h[j] = value;")
    if out_y is not None:
        at = offset_at(y, ["t", "n", f"{direction * hidden} + j" if direction else "j"])
        body.append(f"    {out_y}[{at}] = {store(y.data_type, 'value')};")
    if out_buffer is not None:
        body.append(f"    {out_buffer}[((long long)t * {batch} + n) * {width} + {direction * hidden} + j] = value;")
    body += ["  }", "  __syncthreads();", "}"]
    finals = [(hy, final_h, "h"), (cy, final_c, "state")]
    for tensor, name, values in finals:
        if tensor is not None and name is not None:
            at = offset_at(tensor, [str(index), "n", "j"])
            body.append(
                f"for (int j = threadIdx.x; j < {hidden}; j += blockDim.x) "
                f"{name}[{at}] = {store(tensor.data_type, f'{values}[j]')};"
            )
    pattern = f"rnn_{a.mode.value}_layer{layer}{'_reverse' if direction else ''}"
    return make_kernel(ctx, fused, pattern, params, body, (batch, 1, 1))


def _zero_output(
    out_y: str | None,
    out_buffer: str | None,
    y: Tensor,
    batch: int,
    width: int,
    hidden: int,
    direction: int,
    zero: str,
) -> list[str]:
    """Store 0 as this direction's output at step t (y, or the layer's buffer)."""
    column = f"{direction * hidden} + j" if direction else "j"
    if out_y is not None:
        store_zero = f"{out_y}[{offset_at(y, ['t', 'n', column])}] = {store(y.data_type, zero)};"
    elif out_buffer is not None:
        store_zero = f"{out_buffer}[((long long)t * {batch} + n) * {width} + {column}] = {zero};"
    else:
        return []
    return [f"for (int j = threadIdx.x; j < {hidden}; j += blockDim.x) {store_zero}"]


def _cell(mode: RnnMode, hidden: int, compute: str, zero: str, one: str) -> list[str]:
    """``value``: unit j's new hidden state from gates (and, LSTM, the cell state it updates)."""
    if mode is RnnMode.RELU:
        return [f"const {compute} value = max(gates[j], {zero});"]
    if mode is RnnMode.TANH:
        return [f"const {compute} value = tanh(gates[j]);"]
    if mode is RnnMode.LSTM:
        return [
            f"const {compute} cell = sigmoid(gates[{hidden} + j]) * state[j] + "
            f"sigmoid(gates[j]) * tanh(gates[{2 * hidden} + j]);",
            "state[j] = cell;",
            f"const {compute} value = sigmoid(gates[{3 * hidden} + j]) * tanh(cell);",
        ]
    return [
        f"const {compute} reset = sigmoid(gates[j]);",
        f"const {compute} update = sigmoid(gates[{hidden} + j]);",
        f"const {compute} fresh = tanh(gates[{2 * hidden} + j] + reset * state[j]);",
        f"const {compute} value = ({one} - update) * fresh + update * h[j];",
    ]
