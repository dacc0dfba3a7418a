"""One step of an RNN layer's backward pass, both directions, all sequences: a block per
direction, 32 hidden units (a unit per lane) and NB sequences.

Launch s of a layer's T + 1 handles the forward step t = T - 1 - s of the forward direction and
t = s of the reverse one (each direction's sequence backwards). The gradient of the state step t
left is what was carried from the launch before (dhy at s 0), plus the gate gradients of the
step after t times column k of W_hh (a G*H-long sum over that step's dgates, which the previous
launch completed: kernel boundaries are the synchronisation, as in the forward's step kernel),
plus dy at t. The block's warps split the G*H rows of W_hh (a warp reads 32 consecutive units of
a row, and each element serves the block's NB sequences; in float, where G*H is a multiple of
4, four rows a pass, each sequence's four dgates one 16-byte load), their partial sums meet in shared
memory, then warp w updates the cells of sequences w, w + 8, ...: with the reserve's activated
gates the cell's backward gives the step's dgates for unit k (written for the products over all
steps, rnn_backward_sums.py) and what it carries to the launch after: the state's gradient
past a length, LSTM's cell gradient, GRU's z * dh. Past a sequence's length the step's dgates
are 0 and the gradients pass through. Launch T only finishes the sum and writes dhx and dcx.
"""

from __future__ import annotations

from collections.abc import Callable

from graphdnn.arch import sm_count
from graphdnn.ir import Tensor
from graphdnn.ops.rnn import LSTM_CELL_FIELD, RESERVE_FIELDS, RnnMode

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import THREADS, declare, make_kernel, read, written
from .rnn_layer import STEP, RnnLayer, advance_step, by_direction, launch_choice

DGATES, DGATES_H, CARRY_H, CARRY_C = "rnn_dgates", "rnn_dgates_h", "rnn_dh", "rnn_dc"
SEQUENCES = "rnn_backward_sequences"  # the launch choice: sequences per step block
MAX_SEQUENCES = 16


def grad_buffer(layer: int) -> str:
    """The scratch buffer that holds ``layer``'s output gradient (below the top; two, alternating)."""
    return f"rnn_grad{layer % 2}"


def sequence_length(name: str | None, lengths: Tensor | None) -> str:
    """A C expression: sequence n's length (clamped into [0, T]; the reference refuses others)."""
    if name is None or lengths is None:
        return "T"
    given = f"(long long){name}[{offset_at(lengths, ['n'])}]"
    return f"(int)({given} < 0 ? 0 : {given} > T ? T : {given})"


def step_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel:
    a, c, d = layer.a, layer.compute, layer.directions
    node, fused = layer.node, layer.fused
    lstm, gru = a.mode is RnnMode.LSTM, a.mode is RnnMode.GRU
    hx, cx, lengths = node.input("hx"), node.input("cx"), node.input("seq_lengths")
    reserve, dy, dhy, dcy = node.input("reserve"), node.input("dy"), node.input("dhy"), node.input("dcy")
    assert reserve is not None and dy is not None
    dhx, dcx = node.output("dhx"), node.output("dcx")
    w_hh = [layer.weights(direction)[1] for direction in range(d)]

    params = KernelParams()
    names = declare(params, [*w_hh, lengths, hx, cx, reserve, dhy, dcy, dy if layer.last else None])
    dgates = params.scratch(DGATES, c)
    dgates_h = params.scratch(DGATES_H, c) if gru else dgates
    carry_h, counter = params.scratch(CARRY_H, c), params.scratch(STEP, "unsigned")
    carry_c = params.scratch(CARRY_C, c) if lstm else None
    grad = None if layer.last else params.scratch(grad_buffer(layer.layer), c)
    out_dhx = params.tensor(dhx, writable=True) if dhx is not None and written(fused, dhx) else None
    out_dcx = params.tensor(dcx, writable=True) if dcx is not None and written(fused, dcx) else None

    def element(t: Tensor, coordinate: list[str]) -> str:
        return read(t, names[t.id], offset_at(t, coordinate), c)

    def state(t: Tensor | None) -> str:
        return element(t, ["index", "n", "k"]) if t is not None else "0"

    def saved(step: str, field: int) -> str:
        return element(reserve, [str(layer.layer), step, "n", "dir", f"{field} * H + k"])

    if layer.last:
        from_dy = element(dy, ["t", "n", "dir * H + k"])
    else:
        from_dy = f"{grad}[((long long)t * N + n) * (D * H) + dir * H + k]"
    fields = RESERVE_FIELDS[a.mode]
    earlier = {  # the state before step t: the reserve's at the step before, or the initial one
        "h_prev": f"started ? {saved('before', fields - 1)} : {state(hx)}",
        "c_prev": f"started ? {saved('before', LSTM_CELL_FIELD)} : {state(cx)}",
    }
    finals = [(dhx, out_dhx, "dh"), (dcx, out_dcx, "dc")]
    per_block = sequences_per_block(layer, ctx)
    cell = [
        f"{c} dh = (step == 0 ? {state(dhy)} : {carry_h}[at]) + sum;",
        *([f"{c} dc = step == 0 ? {state(dcy)} : {carry_c}[at];"] if lstm else []),
        "if (step == T) {",
        *(
            f"  {name}[{offset_at(tensor, ['index', 'n', 'k'])}] = {store(tensor.data_type, value)};"
            for tensor, name, value in finals
            if tensor is not None and name is not None
        ),
        "  continue;",
        "}",
        f"const int length = {sequence_length(names[lengths.id] if lengths is not None else None, lengths)};",
        "const int before = dir ? t + 1 : t - 1;  // the step that ran before t",
        "const bool started = dir ? before < length : before >= 0;",
        f"{c}* const dgx = {dgates} + ((long long)t * N + n) * (D * G * H) + dir * (G * H) + k;",
        *([f"{c}* const dgh = {dgates_h} + ((long long)t * N + n) * (D * G * H) + dir * (G * H) + k;"] if gru else []),
        "if (t < length) {",
        f"  dh += {from_dy};",
        *("  " + line for line in _cell_backward(a.mode, c, lambda f: saved("t", f), earlier)),
        f"  {carry_h}[at] = {'dh * update' if gru else '0'};",
        *([f"  {carry_c}[at] = dc * forget;"] if lstm else []),
        "} else {  // past the sequence's length: nothing to differentiate, the gradients pass",
        f"  for (int g = 0; g < G; ++g) {{ dgx[g * H] = 0;{' dgh[g * H] = 0;' if gru else ''} }}",
        f"  {carry_h}[at] = dh;",
        *([f"  {carry_c}[at] = dc;"] if lstm else []),
        "}",
    ]

    def weight(r: str) -> str:
        return by_direction(d, "dir", [element(w, [r, "k"]) for w in w_hh])

    if c == "float" and layer.gates * layer.hidden % 4 == 0:  # dgates rows of whole float4s
        product = [
            "for (int r = warp * 4; r < G * H; r += WARPS * 4) {  // 4 rows a pass: one 16-byte dgates load each",
            f"  const float w0 = {weight('r')}, w1 = {weight('r + 1')}, w2 = {weight('r + 2')}, w3 = {weight('r + 3')};",
            "#pragma unroll",
            "  for (int q = 0; q < NB; ++q) {",
            "    const float4 g = *reinterpret_cast<const float4*>(&dg[row[q] + r]);",
            "    acc[q] += g.x * w0 + g.y * w1 + g.z * w2 + g.w * w3;",
            "  }",
            "}",
        ]
    else:
        product = [
            "for (int r = warp; r < G * H; r += WARPS) {",
            f"  const {c} w = {weight('r')};",
            "#pragma unroll",
            "  for (int q = 0; q < NB; ++q) acc[q] += dg[row[q] + r] * w;",
            "}",
        ]
    units = -(-layer.hidden // 32)
    body = [
        f"constexpr int T = {layer.steps}, N = {layer.batch}, H = {layer.hidden}, G = {layer.gates}, D = {d};",
        f"constexpr int NB = {per_block}, WARPS = {THREADS // 32};  // the block's sequences; warps split W_hh's rows",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dir = blockIdx.y;",
        f"const int n0 = blockIdx.x / {units} * NB, k = blockIdx.x % {units} * 32 + lane;  // unit k of lane",
        f"const int step = (int)*(volatile unsigned*)&{counter}[0];",
        f"const int index = {layer.layer * d} + dir;  // of this layer and direction in dhy, dhx",
        "const int t = dir ? step : T - 1 - step;  // the forward step this launch differentiates (none at step T)",
        f"__shared__ {c} partial[WARPS][NB][32];  // each warp's share of the sums",
        f"{c} acc[NB];",
        "#pragma unroll",
        "for (int q = 0; q < NB; ++q) acc[q] = 0;",
        "if (step > 0 && k < H) {  // what the step after t sends back through W_hh: column k, the warp's rows",
        "  const int later = dir ? t - 1 : t + 1;",
        f"  const {c}* const dg = {dgates_h} + ((long long)later * N + n0) * (D * G * H) + dir * (G * H);",
        "  long long row[NB];  // sequences past N read the last one's (their sums are dropped)",
        "#pragma unroll",
        "  for (int q = 0; q < NB; ++q) row[q] = (long long)(n0 + q < N ? q : N - 1 - n0) * (D * G * H);",
        *("  " + line for line in product),
        "}",
        "#pragma unroll",
        "for (int q = 0; q < NB; ++q) partial[warp][q][lane] = acc[q];",
        "__syncthreads();",
        "for (int q = warp; q < NB && n0 + q < N && k < H; q += WARPS) {  // the cells: warp w takes sequences w, w + WARPS..",
        "  const int n = n0 + q;",
        "  const long long at = ((long long)dir * N + n) * H + k;",
        f"  {c} sum = 0;",
        "  for (int w = 0; w < WARPS; ++w) sum += partial[w][q][lane];",
        *("  " + line for line in cell),
        "}",
        *advance_step(counter),
    ]
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_backward_step"
    grid = (units * -(-layer.batch // per_block), d, 1)
    return make_kernel(ctx, fused, pattern, params, body, grid)


def sequences_per_block(layer: RnnLayer, ctx: EmitContext) -> int:
    """The ``rnn_backward_sequences`` launch choice: the sequences a step block sums dh for, each
    W_hh element it reads serving all of them (default: 16, halved while that leaves fewer
    blocks than SMs, and no more than the batch needs)."""
    default = min(MAX_SEQUENCES, 1 << (layer.batch - 1).bit_length())
    units = -(-layer.hidden // 32) * layer.directions
    while default > 1 and units * -(-layer.batch // default) < sm_count(ctx.arch):
        default //= 2
    allowed = [1 << p for p in range(MAX_SEQUENCES.bit_length())]
    value = launch_choice(ctx, layer.node.name, SEQUENCES, default, allowed, f"a power of 2 up to {MAX_SEQUENCES}")
    return int(value)  # type: ignore[call-overload]


def _cell_backward(mode: RnnMode, c: str, saved: Callable[[int], str], earlier: dict[str, str]) -> list[str]:
    """One cell's backward for unit k: the gate gradients into ``dgx`` (and GRU's ``dgh``) from
    ``dh`` (and LSTM's ``dc``, which it completes), with ``saved(f)`` the step's reserve field
    f; defines what the step carries back (``forget``, ``update``)."""
    one = f"({c})1"
    if mode in (RnnMode.RELU, RnnMode.TANH):
        h = f"const {c} h = {saved(0)};"
        derivative = f"(h > 0 ? {one} : ({c})0)" if mode is RnnMode.RELU else f"({one} - h * h)"
        return [h, f"dgx[0] = dh * {derivative};"]
    if mode is RnnMode.LSTM:
        return [
            f"const {c} input = {saved(0)}, forget = {saved(1)}, fresh = {saved(2)}, output = {saved(3)};",
            f"const {c} tanh_c = tanh({saved(4)}), c_prev = {earlier['c_prev']};",
            f"dc += dh * output * ({one} - tanh_c * tanh_c);",
            f"dgx[0] = dc * fresh * input * ({one} - input);",
            f"dgx[H] = dc * c_prev * forget * ({one} - forget);",
            f"dgx[2 * H] = dc * input * ({one} - fresh * fresh);",
            f"dgx[3 * H] = dh * tanh_c * output * ({one} - output);",
        ]
    return [
        f"const {c} reset = {saved(0)}, update = {saved(1)}, fresh = {saved(2)}, from_h = {saved(3)};",
        f"const {c} h_prev = {earlier['h_prev']};",
        f"const {c} d_new = dh * ({one} - update) * ({one} - fresh * fresh);",
        f"const {c} d_reset = d_new * from_h * reset * ({one} - reset);",
        f"const {c} d_update = dh * (h_prev - fresh) * update * ({one} - update);",
        "dgx[0] = d_reset; dgx[H] = d_update; dgx[2 * H] = d_new;",
        "dgh[0] = d_reset; dgh[H] = d_update; dgh[2 * H] = d_new * reset;",
    ]
