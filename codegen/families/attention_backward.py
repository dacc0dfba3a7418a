"""Attention backward family: the ``sdpa_backward`` op as a preprocess kernel (``delta``, the
row sums of dO * O) then a dK/dV kernel and a dQ kernel, all deterministic (no atomics: every
gradient element is summed by one thread in a fixed order).

Two paths: FlashAttention-2-style tile products on mma.sync tensor cores when Q, K, V, O and
dO are all fp16 or all bf16 (attention_backward_mma.py), else fp32 SIMT tiles
(attention_backward_simt.py), which take any type, layout and head dim.
"""

from __future__ import annotations

from fusion_rules import FusedNode

from ..context import EmitContext
from ..kernel import FusedProgram
from .attention_backward_problem import backward_of, preprocess_kernel
from .attention_backward_simt import dkdv_kernel, dq_kernel


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    ab = backward_of(fused)
    kernels = (preprocess_kernel(fused, ctx, ab), dkdv_kernel(fused, ctx, ab), dq_kernel(fused, ctx, ab))
    return FusedProgram(fused.name, kernels, (ab.scratch,))
