"""RNN / LSTM / GRU inference (cuDNN's ``cudnnRNNForward``): per layer, one GEMM for the input
projections of every step, gate and direction, then one launch per time step.

The projections W_ih x_t + b_ih do not depend on the recurrence, so a layer's whole sequence
goes through one tensor-core GEMM first (rnn_projection.py; CUDA-core FMAs for float and
double weights) into a scratch buffer. What is left per step is h_{t-1} @ W_hh^T for all
sequences at once, fused with the gates and the cell update (rnn_step.py): both directions
in one launch, the hidden units spread over the blocks. A step needs every block's h_{t-1},
so steps are separate launches of one compiled kernel (T of them per layer; a CUDA graph
replays them), never a grid-wide barrier: no co-residency to guarantee, no deadlock on a
GPU smaller than the one the grid was sized for. A layer's output sequence (both directions
side by side) goes to a scratch buffer that the next layer's projection reads, the last
layer's to y. rnn_layer.py lists the scratch buffers.

Every shape, direction count, mode and data type takes this path; variable sequence lengths
are per sequence in the step kernel (past its length a sequence's state stays and y is 0).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ops.rnn import RnnMode

from ..context import EmitContext
from ..kernel import FusedProgram, Scratch
from .rnn_layer import STATE_C, STATE_H, STATE_H16, STEP, XPROJ, RnnLayer, layer_buffer
from .rnn_projection import projection_kernel
from .rnn_step import step_kernel
from .rnn_step_mma import copies_state16


def emit_rnn(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    first = RnnLayer.of(fused, 0)
    a, size = first.a, first.element_bytes
    kernels = []
    layers = [RnnLayer.of(fused, index) for index in range(a.num_layers)]
    for layer in layers:
        kernels += [projection_kernel(layer, ctx), *[step_kernel(layer, ctx)] * layer.steps]
    sequence = first.steps * first.batch * a.directions
    states = a.directions * first.batch * a.hidden_size
    scratch = [
        Scratch(XPROJ, sequence * first.gates * a.hidden_size * size),
        Scratch(STATE_H, 2 * states * size),
        *([Scratch(STATE_H16, 2 * states * 2)] if any(copies_state16(layer, ctx) for layer in layers) else []),
        *([Scratch(STATE_C, states * size)] if a.mode is RnnMode.LSTM else []),
        Scratch(STEP, 8),
        *(Scratch(layer_buffer(i), sequence * a.hidden_size * size) for i in range(min(2, a.num_layers - 1))),
    ]
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))
