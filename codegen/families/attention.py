"""Attention family: the ``sdpa`` op (scaled dot-product attention forward) as one kernel that
never writes the score matrix to memory.

Three paths, all correct for every mask, layout and head dim up to 256:
- the decode kernel (attention_decode.py) for every paged KV cache and for at most
  DECODE_MAX_SQ query rows: GQA rows packed per kv head, the KV length split across blocks
  when the (batch, kv head) blocks cannot keep enough loads in flight; tuning
  ``{"path": "decode", "split": n, "threads": t, "keys_per_lane": k}`` (each key optional).
  Paged prefill (many query rows) runs there too: correct, not fast (the flash kernels do
  not read through page tables);
- flash attention on tensor cores when Q, K and V are all fp16 or all bf16: mma.sync
  (attention_flash.py), or on sm_90 for head dims 64 and 128 with contiguous rows the
  warp-specialised TMA/wgmma kernel (attention_wgmma.py), the default there (1.2-1.6x the
  mma.sync kernel on an H100) and the tuning choices ``{"path": "wgmma", ...}`` (``{"path": "wgmma"}`` alone: its default);
- one warp per query row in fp32 for anything else (attention_simt.py).

Every path takes dropout, drawing the reference's mask (attention_problem.dropout_function).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import FusedProgram
from .attention_decode import decode_choices, decode_program, uses_decode
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
    if ctx.tuning.get("path") == DECODE or (not ctx.tuning and uses_decode(a)):
        return decode_program(fused, ctx, a)
    if a.paged:
        raise UnsupportedError(
            f"attention tuning {dict(ctx.tuning)}: a paged KV cache runs on the decode kernel only "
            '(tuning {"path": "decode", "split": n})',
            node=a.node.name,
        )
    if not on_tensor_cores(a):
        return FusedProgram(fused.name, (simt_kernel(fused, ctx, a),))
    if ctx.tuning.get("path") == "wgmma" or (not ctx.tuning and wgmma_supported(a, ctx.arch)):
        return FusedProgram(fused.name, (wgmma_attention_kernel(fused, ctx, a),))
    return FusedProgram(fused.name, (flash_kernel(fused, ctx, a, config(a, ctx.tuning)),))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """The decode kernel's threads, key slots and KV splits where it applies; warps per block
    and keys per tile of the flash kernel, keys per stage and turn-taking of the Hopper one
    (autotuning)."""
    a = attention_of(fused)
    decode = decode_choices(a, arch)
    if a.paged:
        return decode
    if not uses_decode(a):
        decode = []
    if not on_tensor_cores(a):
        return decode
    return decode + flash_candidates(a) + ([c.choice() for c in wgmma_configs(a)] if wgmma_supported(a, arch) else [])


DECODE = "decode"


def on_tensor_cores(a: Attention) -> bool:
    types = {a.q.data_type, a.k.data_type, a.v.data_type}
    return len(types) == 1 and types <= TENSOR_CORE_TYPES
