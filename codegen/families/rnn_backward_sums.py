"""What an RNN layer's backward sums over all steps, once its step kernels have left every
step's gate gradients in scratch (direct_rnn_backward.py): the weight gradients and the input's.

- ``weight_kernel``: a thread per element of dW_ih [G*H, W], dW_hh [G*H, H], db_ih and db_hh
  of each direction, each a sum over the T*N (step, sequence) pairs: dgates^T x, dgates^T
  h_prev, and the dgates' sums. Consecutive threads take consecutive gate rows, so the dgates
  they read are contiguous and x or h_prev is one value for the warp.
- ``input_kernel``: a thread per element of the layer's input gradient [T, N, W], the sum
  over both directions' G*H gate rows of dgates W_ih: dx for layer 0, the layer below's
  output gradient (scratch) above it.

Both in the compute type on the CUDA cores, with the step kernel's notation (T, N, H, G, D).
"""

from __future__ import annotations

from graphdnn.ir import Tensor
from graphdnn.ops.rnn import RESERVE_FIELDS, RnnAttributes, RnnMode, weight_dims

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import THREADS, declare, make_kernel, read, written
from .rnn_backward_step import DGATES, DGATES_H, grad_buffer, sequence_length
from .rnn_layer import RnnLayer, by_direction


def weight_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel | None:
    """dW_ih, dW_hh, db_ih, db_hh of ``layer`` into dweights (None when it is not stored)."""
    a, c, d, node = layer.a, layer.compute, layer.directions, layer.node
    dweights = node.output("dweights")
    if not written(layer.fused, dweights):
        return None
    assert dweights is not None
    x, hx, lengths, reserve = layer.x, node.input("hx"), node.input("seq_lengths"), node.input("reserve")
    assert reserve is not None
    params = KernelParams()
    names = declare(params, [x if layer.layer == 0 else reserve, reserve, hx, lengths])
    dgates = params.scratch(DGATES, c)
    dgates_h = params.scratch(DGATES_H, c) if a.mode is RnnMode.GRU else dgates
    out = params.tensor(dweights, writable=True)
    fields = RESERVE_FIELDS[a.mode]

    def element(t: Tensor, coordinate: list[str]) -> str:
        return read(t, names[t.id], offset_at(t, coordinate), c)

    if layer.layer == 0:
        source = element(x, ["t", "n", "col"])
    else:  # the layer below's h fields, the directions side by side
        source = element(reserve, [str(layer.layer - 1), "t", "n", "col / H", f"{fields - 1} * H + col % H"])
    h_prev = element(reserve, [str(layer.layer), "before", "n", "dir", f"{fields - 1} * H + k"])
    initial = element(hx, ["index", "n", "k"]) if hx is not None else "0"
    first = sum(_count(a, layer.x, below) for below in range(layer.layer))
    position = f"{first} + dir * {_count(a, layer.x, layer.layer) // d} + place"
    body = [
        f"constexpr int T = {layer.steps}, N = {layer.batch}, H = {layer.hidden}, GH = {layer.gates * layer.hidden};",
        f"constexpr int D = {d}, W = {layer.width}, COLS = W + H + 2;",
        f"const long long i = (long long)blockIdx.x * {THREADS} + threadIdx.x;",
        "if (i < (long long)D * COLS * GH) {",
        "  const int r = (int)(i % GH), col = (int)(i / GH % COLS), dir = (int)(i / GH / COLS);",
        f"  const int index = {layer.layer * d} + dir;  // of this layer and direction in hx",
        f"  const {c}* const dg_x = {dgates} + dir * GH + r;  // (t, n) at (t * N + n) * D * GH",
        f"  const {c}* const dg_h = {dgates_h} + dir * GH + r;",
        f"  {c} sum = 0;",
        "  long long place;  // in this direction's w_ih, w_hh, b_ih, b_hh, one after the other",
        "  if (col < W) {  // dW_ih = dgates^T x",
        "    for (int t = 0; t < T; ++t)",
        f"      for (int n = 0; n < N; ++n) sum += dg_x[((long long)t * N + n) * D * GH] * {source};",
        "    place = (long long)r * W + col;",
        "  } else if (col < W + H) {  // dW_hh = dgates^T h_prev",
        "    const int k = col - W;",
        "    for (int t = 0; t < T; ++t) {",
        "      const int before = dir ? t + 1 : t - 1;  // the step that ran before t",
        "      for (int n = 0; n < N; ++n) {",
        f"        const int length = {sequence_length(names[lengths.id] if lengths is not None else None, lengths)};",
        "        const bool started = dir ? before < length : before >= 0;",
        f"        sum += dg_h[((long long)t * N + n) * D * GH] * (started ? {h_prev} : {initial});",
        "      }",
        "    }",
        "    place = (long long)GH * W + (long long)r * H + k;",
        "  } else {  // the biases: the dgates' sums",
        "    const bool from_x = col == W + H;",
        f"    const {c}* const dg = from_x ? dg_x : dg_h;",
        "    for (long long tn = 0; tn < (long long)T * N; ++tn) sum += dg[tn * D * GH];",
        "    place = (long long)GH * (W + H) + (from_x ? 0 : GH) + r;",
        "  }",
        f"  {out}[{offset_at(dweights, [position])}] = {store(dweights.data_type, 'sum')};",
        "}",
    ]
    count = d * (layer.width + layer.hidden + 2) * layer.gates * layer.hidden
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_backward_weights"
    return make_kernel(ctx, layer.fused, pattern, params, body, (-(-count // THREADS), 1, 1))


def input_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel | None:
    """The gradient of ``layer``'s input (None for a dx that is not stored)."""
    a, c, d, node = layer.a, layer.compute, layer.directions, layer.node
    dx = node.output("dx")
    if layer.layer == 0 and not written(layer.fused, dx):
        return None
    w_ih = [layer.weights(direction)[0] for direction in range(d)]
    params = KernelParams()
    names = declare(params, w_ih)
    dgates = params.scratch(DGATES, c)
    weight = by_direction(d, "dir", [read(w, names[w.id], offset_at(w, ["r", "col"]), c) for w in w_ih])
    if layer.layer == 0:
        assert dx is not None
        target = f"{params.tensor(dx, writable=True)}[{offset_at(dx, ['t', 'n', 'col'])}]"
        value = store(dx.data_type, "sum")
    else:
        target, value = f"{params.scratch(grad_buffer(layer.layer - 1), c)}[tn * W + col]", "sum"
    body = [
        f"constexpr int T = {layer.steps}, N = {layer.batch}, GH = {layer.gates * layer.hidden};",
        f"constexpr int D = {d}, W = {layer.width};",
        f"const long long i = (long long)blockIdx.x * {THREADS} + threadIdx.x;",
        "if (i < (long long)T * N * W) {",
        "  const int col = (int)(i % W);",
        "  const long long tn = i / W;",
        "  const int t = (int)(tn / N), n = (int)(tn % N);",
        f"  {c} sum = 0;",
        "  for (int dir = 0; dir < D; ++dir) {",
        f"    const {c}* const dg = {dgates} + (tn * D + dir) * GH;",
        f"    for (int r = 0; r < GH; ++r) sum += dg[r] * {weight};",
        "  }",
        f"  {target} = {value};",
        "}",
    ]
    count = layer.steps * layer.batch * layer.width
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_backward_input"
    return make_kernel(ctx, layer.fused, pattern, params, body, (-(-count // THREADS), 1, 1))


def _count(a: RnnAttributes, x: Tensor, layer: int) -> int:
    """Weight elements of one layer, all directions."""
    sizes = [int(dims[0]) * (int(dims[1]) if len(dims) > 1 else 1) for dims in weight_dims(a, x.static_dim[2], layer)]
    return a.directions * sum(sizes)
