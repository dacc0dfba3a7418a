"""Attention backward family: the ``sdpa_backward`` op as a preprocess kernel (``delta``, the
row sums of dO * O) then a dK/dV kernel and a dQ kernel.

Three paths:
- FlashAttention-2-style tile products on mma.sync tensor cores (sm_80+, sm_90 too) when Q,
  K, V and dO are all fp16 or all bf16 and the head dims are at most 128
  (attention_backward_mma.py), deterministic (no atomics: every gradient element is summed by
  one thread in a fixed order);
- on sm_90, for fp16/bf16 at head dims 64 and 128 with no mask or a causal one, wgmma kernels in
  FlashAttention-3's shape (attention_backward_tile.py), the default there: dK, dV and dQ's sums
  in one kernel, dQ added in fp32 by bulk reductions (the preprocess kernel zeroes
  ``dq_accum``) and converted by the last kernel (attention_backward_passes.py), not bitwise
  deterministic. The dK/dV kernel
  either copies with every thread (attention_backward_wgmma.py) or is fed by a producer
  warpgroup's TMA loads (attention_backward_ws.py): ``{"path": "wgmma", "producer": False}`` or
  ``True`` names one (with ``"kv_registers": True`` at head dim 64, K and V held in registers;
  with ``"rows": 128`` at head dim 64, 128-row query tiles; with ``"dq_behind": True`` at head
  dim 128, dQ's product a tile behind, and with ``"pingpong": True`` too the warpgroups taking
  turns to issue their first products),
  ``{"path": "wgmma"}`` takes the default for the problem; ``{"path": "mma"}`` names the
  mma.sync path;
- else fp32 SIMT tiles (attention_backward_simt.py), which take any type, layout and head dim
  (the tuning ``{"path": "simt"}`` takes them for any problem: the CPU emulation runs them, and
  they check the tensor-core kernels on a GPU).

Packed (ragged) sequences run on the mma.sync or SIMT path, after attention_ragged.py's fill of
the packed gradients with zeros (the kernels write only the rows and keys of each sequence).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import FusedProgram, Kernel
from . import (
    attention_backward_mma,
    attention_backward_passes,
    attention_backward_simt,
    attention_backward_wgmma,
    attention_backward_ws,
)
from .attention_backward_problem import AttentionBackward, backward_of, preprocess_kernel
from .attention_backward_tile import WIDE_BQ
from .attention_ragged import fill_kernel

SIMT: dict[str, object] = {"path": "simt"}  # the tuning that takes the SIMT kernels where mma.sync could run
MMA: dict[str, object] = {"path": "mma"}
WGMMA: dict[str, object] = {"path": "wgmma"}  # the wgmma kernels' default dK/dV kernel for the problem
WGMMA_COPIES: dict[str, object] = {"path": "wgmma", "producer": False}  # every thread copies
WGMMA_PRODUCER: dict[str, object] = {"path": "wgmma", "producer": True}  # a TMA producer warpgroup
# and K and V held in the consumers' registers (head dim 64)
WGMMA_PRODUCER_KV: dict[str, object] = {"path": "wgmma", "producer": True, "kv_registers": True}
# and 128-row query tiles (head dim 64)
WGMMA_PRODUCER_WIDE: dict[str, object] = {"path": "wgmma", "producer": True, "rows": 128}
# and dQ's product a tile behind (head dim 128)
WGMMA_PRODUCER_BEHIND: dict[str, object] = {"path": "wgmma", "producer": True, "dq_behind": True}
# and the warpgroups taking turns to issue Sᵀ and dPᵀ
WGMMA_PRODUCER_PINGPONG: dict[str, object] = {"path": "wgmma", "producer": True, "dq_behind": True, "pingpong": True}
CONSUMERS = {
    str(WGMMA_PRODUCER): attention_backward_ws.Consumers(),
    str(WGMMA_PRODUCER_KV): attention_backward_ws.Consumers(kv_registers=True),
    str(WGMMA_PRODUCER_WIDE): attention_backward_ws.Consumers(rows=WIDE_BQ),
    str(WGMMA_PRODUCER_BEHIND): attention_backward_ws.Consumers(dq_behind=True),
    str(WGMMA_PRODUCER_PINGPONG): attention_backward_ws.Consumers(dq_behind=True, pingpong=True),
}  # the producer kernel's choices
CHOICES = (
    SIMT,
    MMA,
    WGMMA,
    WGMMA_COPIES,
    WGMMA_PRODUCER,
    WGMMA_PRODUCER_KV,
    WGMMA_PRODUCER_WIDE,
    WGMMA_PRODUCER_BEHIND,
    WGMMA_PRODUCER_PINGPONG,
)


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    ab = backward_of(fused)
    if ctx.tuning and ctx.tuning not in CHOICES:
        raise UnsupportedError(f"attention_backward tuning {ctx.tuning} is not one of its choices {list(CHOICES)}")
    if path(ab, ctx) == "wgmma":
        kernels = (
            attention_backward_passes.preprocess_kernel(fused, ctx, ab),
            dkdv_kernel(fused, ctx, ab),
            attention_backward_passes.dq_kernel(fused, ctx, ab),
        )
        return FusedProgram(fused.name, kernels, (ab.scratch, ab.dq_scratch))
    module = attention_backward_mma if path(ab, ctx) == "mma" else attention_backward_simt
    packed = [(ab.dq, "0.0f")] if ab.problem.ragged_q is not None else []
    packed += [(ab.dk, "0.0f"), (ab.dv, "0.0f")] if ab.problem.ragged_kv is not None else []
    fill = (fill_kernel(fused, ctx, packed),) if packed else ()
    kernels = (preprocess_kernel(fused, ctx, ab), module.dkdv_kernel(fused, ctx, ab), module.dq_kernel(fused, ctx, ab))
    return FusedProgram(fused.name, (*fill, *kernels), (ab.scratch,))


def path(ab: AttentionBackward, ctx: EmitContext) -> str:
    """ "simt", "mma" or "wgmma": the tuning's, else wgmma where it applies (measured faster than
    mma.sync on an H200: benchmarks/RESULTS.md, session 7), else mma.sync where it applies, else
    SIMT. A tuning that names a path the problem cannot take is an error saying why."""
    if ctx.tuning == SIMT:
        return "simt"
    wgmma_unsupported = attention_backward_wgmma.unsupported(ab, ctx.arch)
    wgmma_tuned = ctx.tuning.get("path") == "wgmma"
    if wgmma_tuned and wgmma_unsupported is not None:
        raise UnsupportedError(
            f"sdpa_backward node '{ab.problem.node.name}': the wgmma kernels do not take {wgmma_unsupported}"
        )
    if wgmma_tuned or (not ctx.tuning and wgmma_unsupported is None):
        return "wgmma"
    if attention_backward_mma.supported(ab):
        return "mma"
    if ctx.tuning == MMA:
        raise UnsupportedError(
            f"sdpa_backward node '{ab.problem.node.name}': the mma.sync kernels take fp16 or bf16 Q, K, V and dO "
            f"with head dims up to {attention_backward_mma.MAX_HEAD_DIM}"
        )
    return "simt"


def default_dkdv(ab: AttentionBackward) -> dict[str, object]:
    """The wgmma dK/dV kernel measured fastest on an H200 (benchmarks/RESULTS.md, issue 10,
    h/attnbwd3): at D 128 the producer kernel with dQ's product a tile behind and the warpgroups
    taking turns (1.11x the kernel without either without a mask; under a causal mask 1.02x dQ a
    tile behind alone at S 4096, which was 1.08x the kernel without it, and as fast at S 8192); at
    D 64 128-row query tiles (1.09-1.14x without a mask), under a causal mask K and V in registers
    as before (128-row tiles only tied it)."""
    if ab.problem.d == attention_backward_ws.WIDE_HEAD_DIM:
        return WGMMA_PRODUCER_KV if ab.problem.causal else WGMMA_PRODUCER_WIDE
    return WGMMA_PRODUCER_PINGPONG


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """The wgmma path's dK/dV kernel: the tuning's, else :func:`default_dkdv`'s. A producer
    kernel's choice the head dim cannot take (K and V in registers or 128-row query tiles at head
    dim 128, dQ a tile behind at 64) is an error saying why."""
    choice = default_dkdv(ab) if ctx.tuning in ({}, WGMMA) else ctx.tuning
    if choice == WGMMA_COPIES:
        return attention_backward_wgmma.dkdv_kernel(fused, ctx, ab)
    consumers = CONSUMERS[str(choice)]
    problem = consumers.problem(ab.problem.d)
    if problem is not None:
        raise UnsupportedError(f"sdpa_backward node '{ab.problem.node.name}': {problem}")
    return attention_backward_ws.dkdv_kernel(fused, ctx, ab, consumers)
