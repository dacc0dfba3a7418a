"""Attention backward family: the ``sdpa_backward`` op as a preprocess kernel (``delta``, the
row sums of dO * O) then a dK/dV kernel and a dQ kernel, all deterministic (no atomics: every
gradient element is summed by one thread in a fixed order).

Two paths: FlashAttention-2-style tile products on mma.sync tensor cores (sm_80+, sm_90 too)
when Q, K, V and dO are all fp16 or all bf16 and the head dims are at most 128
(attention_backward_mma.py), else fp32 SIMT tiles (attention_backward_simt.py), which take
any type, layout and head dim (the tuning ``{"path": "simt"}`` takes them for any problem:
the CPU emulation runs them, and they check the tensor-core kernels on a GPU).

Packed (ragged) sequences run on either path, after attention_ragged.py's fill of the packed
gradients with zeros (the kernels write only the rows and keys of each sequence).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import FusedProgram
from . import attention_backward_mma, attention_backward_simt
from .attention_backward_problem import backward_of, preprocess_kernel
from .attention_ragged import fill_kernel

SIMT: dict[str, object] = {"path": "simt"}  # the tuning that takes the SIMT kernels where mma.sync could run


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    ab = backward_of(fused)
    if ctx.tuning and ctx.tuning != SIMT:
        raise UnsupportedError(f"attention_backward tuning {ctx.tuning} is not one of its choices [{SIMT}]")
    on_tensor_cores = attention_backward_mma.supported(ab) and ctx.tuning != SIMT
    path = attention_backward_mma if on_tensor_cores else attention_backward_simt
    packed = [(ab.dq, "0.0f")] if ab.problem.ragged_q is not None else []
    packed += [(ab.dk, "0.0f"), (ab.dv, "0.0f")] if ab.problem.ragged_kv is not None else []
    fill = (fill_kernel(fused, ctx, packed),) if packed else ()
    kernels = (preprocess_kernel(fused, ctx, ab), path.dkdv_kernel(fused, ctx, ab), path.dq_kernel(fused, ctx, ab))
    return FusedProgram(fused.name, (*fill, *kernels), (ab.scratch,))
