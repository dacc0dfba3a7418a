"""Attention family: the ``sdpa`` op (scaled dot-product attention forward) as one kernel that
never writes the score matrix to memory.

Two paths, both correct for every mask, layout and head dim up to 256:
- flash attention on mma.sync tensor cores when Q, K and V are all fp16 or all bf16
  (attention_flash.py);
- one warp per query row in fp32 for anything else (attention_simt.py).
"""

from __future__ import annotations

from fusion_rules import FusedNode

from ..context import EmitContext
from ..kernel import FusedProgram
from .attention_flash import candidates as flash_candidates
from .attention_flash import config, flash_kernel
from .attention_problem import Attention, attention_of
from .attention_simt import simt_kernel
from .tensor_core import TENSOR_CORE_TYPES


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    a = attention_of(fused)
    tensor_cores = on_tensor_cores(a)
    kernel = flash_kernel(fused, ctx, a, config(a, ctx.tuning)) if tensor_cores else simt_kernel(fused, ctx, a)
    return FusedProgram(fused.name, (kernel,))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Warps per block and keys per tile of the flash kernel (autotuning); none on the SIMT path."""
    a = attention_of(fused)
    return flash_candidates(a) if on_tensor_cores(a) else []


def on_tensor_cores(a: Attention) -> bool:
    types = {a.q.data_type, a.k.data_type, a.v.data_type}
    return len(types) == 1 and types <= TENSOR_CORE_TYPES
