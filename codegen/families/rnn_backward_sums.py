"""What an RNN layer's backward sums over all steps, once its step kernels have left every
step's gate gradients in scratch (direct_rnn_backward.py): the weight gradients and the input's,
as three GEMMs through the forward projection's tile product (rnn_projection.py: mma.sync with
fp32 accumulation, the operands rounded to the weights' fp16 / bf16 type as they are staged,
from sm_80 with a float compute type, as cuDNN keeps its gradients in the data type; FMA
tiles in the compute type otherwise).

- ``weight_kernel(..., "ih")``: per direction (blockIdx.y's quotient), dW_ih [G*H, W] = dgates^T x over
  the T*N (step, sequence) pairs, with a column of ones past x's W columns for db_ih;
- ``weight_kernel(..., "hh")``: dW_hh [G*H, H] = dgates^T h_prev (the state before each step:
  the reserve's h of the step before, or hx), a column of ones for db_hh (GRU's h-side gate
  gradients, which differ in the new gate);
- ``input_kernel``: the layer input's gradient [T*N, W] = dgates [T*N, D*G*H] times both
  directions' W_ih stacked: dx for layer 0, the layer below's output gradient (scratch) above.

Their operands are staged element by element: one of each product's is read across its rows
(dgates^T, W_ih^T), which 16-byte pieces cannot take.
"""

from __future__ import annotations

from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.ops.rnn import RESERVE_FIELDS, RnnAttributes, RnnMode, weight_dims

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import declare, make_kernel, read, written
from .rnn_backward_operands import DGATES_H_T, DGATES_T, H_PREV_T, INPUT_T, W_IH_T, rearranged
from .rnn_backward_step import DGATES, DGATES_H, grad_buffer, sequence_length
from .rnn_layer import RnnLayer, by_direction
from .rnn_projection import MMA_MIN_ARCH, TileSources, tile_product, tile_shape, with_mma_functions
from .rnn_projection_vector import VectorSources
from .tensor_core import TENSOR_CORE_TYPES

TILE_INDEX = "const int m = bm + i / BK, k = k0 + i % BK;"  # A's staged element i
REARRANGED = "// B's rows: rnn_backward_operands.py's"  # what a rearranged B's pieces need defined
COLUMN_INDEX = "const int column = bn + i / BK, k = k0 + i % BK;"  # B's


def operand_type(layer: RnnLayer, arch: int) -> DataType | None:
    """The tensor cores' operand type of the layer's backward products (its weights' fp16 or
    bf16 type with a float compute type from sm_80), or None for FMA tiles."""
    types = {t.data_type for d in range(layer.directions) for t in layer.weights(d)[:2]}
    if arch < MMA_MIN_ARCH or layer.compute != "float" or len(types) != 1:
        return None
    (only,) = types
    return only if only in TENSOR_CORE_TYPES else None


def weight_kernel(layer: RnnLayer, ctx: EmitContext, which: str) -> Kernel | None:
    """dW_ih and db_ih (``which`` "ih") or dW_hh and db_hh ("hh") of ``layer`` into dweights
    (None when dweights is not stored)."""
    a, c, d, node = layer.a, layer.compute, layer.directions, layer.node
    dweights = node.output("dweights")
    if dweights is None or not written(layer.fused, dweights):
        return None
    params = KernelParams()
    operand = operand_type(layer, ctx.arch)
    gru_h = a.mode is RnnMode.GRU and which == "hh"
    columns = layer.width if which == "ih" else layer.hidden
    sources: TileSources | VectorSources
    if operand is not None and rearranged(layer, operand):
        staged = cuda_type(operand)
        gates = params.scratch(DGATES_H_T if gru_h else DGATES_T, staged)
        if which == "ih":
            b_at = f"&{params.scratch(INPUT_T, staged)}[(long long)column * GK + k]"
        else:
            b_at = f"&{params.scratch(H_PREV_T, staged)}[((long long)dir * (H + 1) + column) * GK + k]"
        sources = VectorSources(f"&{gates}[(long long)(dir * GH + m) * GK + k]", b_at, False, REARRANGED)
    else:
        sources = _weight_sources(layer, params, which, gru_h)
    out = params.tensor(dweights, writable=True)
    if which == "ih":
        place = "column < W ? (long long)m * W + column : (long long)GH * (W + H) + m"
    else:
        place = "column < H ? (long long)GH * W + (long long)m * H + column : (long long)GH * (W + H) + GH + m"
    first = sum(_count(a, layer.x, below) for below in range(layer.layer))
    position = f"{first} + dir * {_count(a, layer.x, layer.layer) // d} + ({place})"

    def stores(value: str) -> list[str]:
        return [
            f"if (m < GM && column < GN) {out}[{offset_at(dweights, [position])}] = {store(dweights.data_type, value)};"
        ]

    block_m, block_n = tile_shape(operand)
    column_blocks = -(-(columns + 1) // block_n)
    body = [
        f"constexpr int T = {layer.steps}, N = {layer.batch}, H = {layer.hidden}, GH = {layer.gates * layer.hidden};",
        f"constexpr int D = {d}, W = {layer.width};",
        f"constexpr int GM = GH, GN = {columns} + 1, GK = T * N;  // a column of ones for the bias",
        f"const int dir = blockIdx.y / {column_blocks};",
        *(
            [f"const int index = {layer.layer * d} + dir;  // of this layer and direction in hx"]
            if which == "hh"
            else []
        ),
        *tile_product(sources, operand, c, stores, column_blocks),
    ]
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_backward_weights_{which}"
    grid = (-(-layer.gates * layer.hidden // block_m), column_blocks * d, 1)
    kernel = make_kernel(ctx, layer.fused, pattern, params, body, grid)
    return with_mma_functions(kernel, operand) if operand is not None else kernel


def _weight_sources(layer: RnnLayer, params: KernelParams, which: str, gru_h: bool) -> TileSources:
    """dW's operands staged element by element: the gate gradients across their rows, and x or
    h_prev, with a column of ones for the bias."""
    a, c, node = layer.a, layer.compute, layer.node
    x, hx, lengths, reserve = layer.x, node.input("hx"), node.input("seq_lengths"), node.input("reserve")
    assert reserve is not None
    used = [x if layer.layer == 0 else reserve] if which == "ih" else [reserve, hx, lengths]
    names = declare(params, used)
    dgates = params.scratch(DGATES_H if gru_h else DGATES, c)
    last_field = RESERVE_FIELDS[a.mode] - 1

    def element(t: Tensor, coordinate: list[str]) -> str:
        return read(t, names[t.id], offset_at(t, coordinate), c)

    b_index = [COLUMN_INDEX, "const int t = k / N, n = k % N;"]
    if which == "ih":
        columns = layer.width
        if layer.layer == 0:
            source = element(x, ["t", "n", "column"])
        else:  # the layer below's h fields, the directions side by side
            below = [str(layer.layer - 1), "t", "n", "column / H", f"{last_field} * H + column % H"]
            source = element(reserve, below)
    else:
        columns = layer.hidden
        h_prev = element(reserve, [str(layer.layer), "before", "n", "dir", f"{last_field} * H + column"])
        initial = element(hx, ["index", "n", "column"]) if hx is not None else "0"
        b_index += [
            "const int before = dir ? t + 1 : t - 1;  // the step that ran before t",
            f"const int length = {sequence_length(names[lengths.id] if lengths is not None else None, lengths)};",
            "const bool started = dir ? before < length : before >= 0;",
        ]
        source = f"(started ? {h_prev} : {initial})"
    one = "1.0f" if c == "float" else "1.0"
    a_value = f"{dgates}[(long long)k * D * GH + dir * GH + m]"
    return TileSources(a_value, [TILE_INDEX], f"(column < {columns} ? {source} : {one})", b_index)


def input_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel | None:
    """The gradient of ``layer``'s input (None for a dx that is not stored)."""
    a, c, d, node = layer.a, layer.compute, layer.directions, layer.node
    dx = node.output("dx")
    if layer.layer == 0 and (dx is None or not written(layer.fused, dx)):
        return None
    params = KernelParams()
    operand = operand_type(layer, ctx.arch)
    dgates = params.scratch(DGATES, c)
    sources: TileSources | VectorSources
    if operand is not None and rearranged(layer, operand):
        b_at = f"&{params.scratch(W_IH_T, cuda_type(operand))}[(long long)column * GK + k]"
        sources = VectorSources(f"{dgates} + (long long)m * GK + k", b_at, True, REARRANGED)
    else:
        w_ih = [layer.weights(direction)[0] for direction in range(d)]
        names = declare(params, w_ih)
        weight = by_direction(d, "dir", [read(w, names[w.id], offset_at(w, ["row", "column"]), c) for w in w_ih])
        b_index = [COLUMN_INDEX, "const int dir = k / GH, row = k % GH;"]
        sources = TileSources(f"{dgates}[(long long)m * GK + k]", [TILE_INDEX], weight, b_index)
    if layer.layer == 0:
        assert dx is not None
        target = f"{params.tensor(dx, writable=True)}[{offset_at(dx, ['m / N', 'm % N', 'column'])}]"
        value_type: DataType | None = dx.data_type
    else:
        target, value_type = f"{params.scratch(grad_buffer(layer.layer - 1), c)}[(long long)m * GN + column]", None

    def stores(value: str) -> list[str]:
        converted = store(value_type, value) if value_type is not None else value
        return [f"if (m < GM && column < GN) {target} = {converted};"]

    block_m, block_n = tile_shape(operand)
    column_blocks = -(-layer.width // block_n)
    body = [
        f"constexpr int N = {layer.batch}, GH = {layer.gates * layer.hidden};",
        f"constexpr int GM = {layer.steps} * N, GN = {layer.width}, GK = {d} * GH;",
        *tile_product(sources, operand, c, stores, column_blocks),
    ]
    pattern = f"rnn_{a.mode.value}_layer{layer.layer}_backward_input"
    grid = (-(-layer.steps * layer.batch // block_m), column_blocks, 1)
    kernel = make_kernel(ctx, layer.fused, pattern, params, body, grid)
    return with_mma_functions(kernel, operand) if operand is not None else kernel


def _count(a: RnnAttributes, x: Tensor, layer: int) -> int:
    """Weight elements of one layer, all directions."""
    sizes = [int(dims[0]) * (int(dims[1]) if len(dims) > 1 else 1) for dims in weight_dims(a, x.static_dim[2], layer)]
    return a.directions * sum(sizes)
