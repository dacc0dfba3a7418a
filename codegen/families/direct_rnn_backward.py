"""RNN / LSTM / GRU backward (cuDNN's ``cudnnRNNBackwardData_v8`` and ``...BackwardWeights_v8``):
per layer, from the top, T + 1 launches of a step kernel, then the weight and input gradients
over all steps at once.

Only the recurrence is sequential: a step's gate gradients need the gradient of the state it
left, which the step after it sends back through W_hh. So the step kernel (rnn_backward_step.py)
runs once per step, backwards through each direction's sequence, both directions in one launch:
it finishes the state's gradient (the carried part plus dgates_{later} @ W_hh plus dy), turns it
into the step's gate gradients with the reserve's activated gates, and keeps them, every step's,
in scratch. A last launch finishes dhx and dcx. What depends on all steps is then a GEMM
over them (rnn_backward_sums.py, the forward projection's tile product): dW_ih = dgates^T x,
dW_hh = dgates^T h_prev with the biases' sums, and dx = dgates W_ih (the layer below's
output gradient).

Scratch, in the compute type:

- ``rnn_dgates`` [T, N, D, G*H]: the gradients of W_ih x + b_ih of every step (0 past a
  sequence's length); ``rnn_dgates_h`` the same of W_hh h + b_hh, for GRU only (elsewhere
  they are equal and the kernels read ``rnn_dgates`` for both);
- ``rnn_dh`` / ``rnn_dc`` [D, N, H]: the state's and (LSTM) cell's gradient carried from one
  step to the one before (each element read and written by one thread);
- ``rnn_step`` (two unsigned ints): the launch's step and the ticket that finds its last
  block (as the forward's step kernel), reset by a one-thread kernel before each layer;
- ``rnn_grad0`` / ``rnn_grad1`` [T, N, D*H]: the output gradient of the layers below the top
  (alternating, so that a layer never writes the one it reads);
- on the tensor cores, where the sums' extents are whole 16-byte pieces, the GEMMs' operands
  rearranged into 16-bit scratch (rnn_backward_operands.py lists them).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ops.rnn import RnnMode

from ..context import EmitContext, KernelParams
from ..kernel import FusedProgram, Kernel, Scratch
from .direct_common import make_kernel
from .rnn_backward_operands import operand_kernels, rearranged
from .rnn_backward_operands import scratch as rearranged_scratch
from .rnn_backward_step import CARRY_C, CARRY_H, DGATES, DGATES_H, grad_buffer, step_kernel
from .rnn_backward_sums import input_kernel, operand_type, weight_kernel
from .rnn_layer import STEP, RnnLayer


def emit_rnn_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    first = RnnLayer.of(fused, 0)
    a, size = first.a, first.element_bytes
    operand = operand_type(first, ctx.arch)  # the same for every layer
    kernels: list[Kernel] = []
    for index in reversed(range(a.num_layers)):
        layer = RnnLayer.of(fused, index)
        kernels += [_reset(layer, ctx), *[step_kernel(layer, ctx)] * (layer.steps + 1)]
        if operand is not None and rearranged(layer, operand):
            kernels += operand_kernels(layer, ctx, operand)
        products = (weight_kernel(layer, ctx, "ih"), weight_kernel(layer, ctx, "hh"), input_kernel(layer, ctx))
        kernels += [k for k in products if k is not None]
    dgates = first.steps * first.batch * a.directions * first.gates * a.hidden_size * size
    states = a.directions * first.batch * a.hidden_size * size
    outputs = first.steps * first.batch * a.directions * a.hidden_size * size
    scratch = [
        Scratch(DGATES, dgates),
        *([Scratch(DGATES_H, dgates)] if a.mode is RnnMode.GRU else []),
        Scratch(CARRY_H, states),
        *([Scratch(CARRY_C, states)] if a.mode is RnnMode.LSTM else []),
        Scratch(STEP, 8),
        *(Scratch(grad_buffer(i), outputs) for i in range(min(2, a.num_layers - 1))),
    ]
    if operand is not None and rearranged(first, operand):
        widest = max(first.width, a.directions * a.hidden_size if a.num_layers > 1 else 0)
        scratch += rearranged_scratch(first, widest, operand)
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))


def _reset(layer: RnnLayer, ctx: EmitContext) -> Kernel:
    """Step 0 for the layer's first step launch."""
    params = KernelParams()
    counter = params.scratch(STEP, "unsigned")
    body = [f"if (blockIdx.x == 0 && threadIdx.x == 0) {{ {counter}[0] = 0; {counter}[1] = 0; }}"]
    return make_kernel(ctx, layer.fused, "rnn_backward_reset", params, body, (1, 1, 1))
