"""Attention family: the ``sdpa`` op (scaled dot-product attention forward) as one kernel that
never writes the score matrix to memory.

Two paths, both correct for every mask, layout and head dim up to 256:
- flash attention on tensor cores when Q, K and V are all fp16 or all bf16: mma.sync
  (attention_flash.py), or on sm_90 for head dims 64 and 128 with contiguous rows the
  warp-specialised wgmma kernel (attention_wgmma.py), the default there (5-13% faster on an
  H100) and the tuning choices ``{"path": "wgmma", ...}`` (``{"path": "wgmma"}`` alone: its default);
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
from .attention_wgmma import configs as wgmma_configs
from .attention_wgmma import supported as wgmma_supported
from .attention_wgmma import wgmma_attention_kernel
from .tensor_core import TENSOR_CORE_TYPES


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    a = attention_of(fused)
    if not on_tensor_cores(a):
        return FusedProgram(fused.name, (simt_kernel(fused, ctx, a),))
    if ctx.tuning.get("path") == "wgmma" or (not ctx.tuning and wgmma_supported(a, ctx.arch)):
        return FusedProgram(fused.name, (wgmma_attention_kernel(fused, ctx, a),))
    return FusedProgram(fused.name, (flash_kernel(fused, ctx, a, config(a, ctx.tuning)),))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Warps per block and keys per tile of the flash kernel, and keys per stage and turn-taking
    of the Hopper one (autotuning); none on the SIMT path."""
    a = attention_of(fused)
    if not on_tensor_cores(a):
        return []
    return flash_candidates(a) + ([c.choice() for c in wgmma_configs(a)] if wgmma_supported(a, arch) else [])


def on_tensor_cores(a: Attention) -> bool:
    types = {a.q.data_type, a.k.data_type, a.v.data_type}
    return len(types) == 1 and types <= TENSOR_CORE_TYPES
