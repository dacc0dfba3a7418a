"""The direct family: a simple, correct kernel for every op that no other family takes.

A direct fused node holds one node, its anchor. Each op kind has one emitter (in the
``direct_*`` modules, by kind of work): data movement as strided copies, pooling (forward,
backward, adaptive) and resampling as per-output gathers, convolution gradients, and the
reductions (genstats, conv_wgrad) on one reduction pattern; local response normalisation
over channel windows; the spatial transformer's grid generator and bilinear sampler; CTC
loss and RNN / LSTM / GRU inference (a block per sequence); block-scaled quantization;
top-k, the router and the mixture-of-experts movement ops and grouped matmul (on tensor
cores through the GEMM family's kernels where they take it, gemm_grouped.py). The backward
norms have families of their own; layer and RMS norm backward of rows too long for registers come back
to direct_norm.py's kernels.
"""

from __future__ import annotations

from collections.abc import Callable

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import FusedProgram
from . import (
    direct_conv,
    direct_ctc,
    direct_lrn,
    direct_moe,
    direct_movement,
    direct_norm,
    direct_quantize,
    direct_rnn,
    direct_rnn_backward,
    direct_sampler,
    direct_window,
    norm_backward_sets,
)
from .direct_common import anchor_of, compute_for
from .gemm_grouped import candidates as grouped_candidates
from .gemm_grouped import grouped_problem

EMITTERS: dict[str, Callable[[FusedNode, EmitContext], FusedProgram]] = {
    "reshape": direct_movement.emit_reshape,
    "transpose": direct_movement.emit_transpose,
    "slice": direct_movement.emit_slice,
    "concatenate": direct_movement.emit_concatenate,
    "pooling": direct_window.emit_pooling,
    "pooling_backward": direct_window.emit_pooling_backward,
    "adaptive_pooling": direct_window.emit_adaptive_pooling,
    "resample": direct_window.emit_resample,
    "conv_dgrad": direct_conv.emit_dgrad,
    "conv_wgrad": direct_conv.emit_wgrad,
    "genstats": direct_norm.emit_genstats,
    "instancenorm_backward": norm_backward_sets.emit,
    "groupnorm_backward": norm_backward_sets.emit,
    "lrn": direct_lrn.emit_lrn,
    "lrn_backward": direct_lrn.emit_lrn_backward,
    "ctc_loss": direct_ctc.emit_ctc_loss,
    "rnn": direct_rnn.emit_rnn,
    "rnn_training": direct_rnn.emit_rnn,
    "rnn_backward": direct_rnn_backward.emit_rnn_backward,
    "spatial_tf_grid_generator": direct_sampler.emit_grid_generator,
    "spatial_tf_grid_generator_backward": direct_sampler.emit_grid_generator_backward,
    "spatial_tf_sampler": direct_sampler.emit_sampler,
    "spatial_tf_sampler_backward": direct_sampler.emit_sampler_backward,
    "block_scale_quantize": direct_quantize.emit_quantize,
    "block_scale_dequantize": direct_quantize.emit_dequantize,
    "topk": direct_moe.emit_topk,
    "moe_router": direct_moe.emit_router,
    "gather": direct_moe.emit_gather,
    "moe_permutation": direct_moe.emit_permutation,
    "moe_unpermute": direct_moe.emit_unpermute,
    "moe_grouped_matmul": direct_moe.emit_grouped_matmul,
}


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    assert fused.nodes == (node,), f"a direct fused node holds one node, {fused.name} has {len(fused.nodes)}"
    emitter = EMITTERS.get(node.op)
    if emitter is None:
        raise UnsupportedError(
            f"the direct kernel family has no kernel for {node.op} (it has: {', '.join(sorted(EMITTERS))})",
            node=node.name,
        )
    return emitter(fused, ctx)


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Launch choices worth timing (autotuning): a small-group conv_wgrad's kernels over runs
    and on the tensor cores, a grouped matmul's tensor-core tiles; none for the other ops."""
    node = anchor_of(fused)
    if node.op == "moe_grouped_matmul":
        return grouped_candidates(grouped_problem(node), arch, compute_for(fused))
    return direct_conv.wgrad_candidates(fused) if node.op == "conv_wgrad" else []
