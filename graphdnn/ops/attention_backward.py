"""Scaled dot-product attention backward (``sdpa_backward``), in the cuDNN frontend's names and
semantics: dQ, dK and dV of :class:`~graphdnn.ops.attention.Sdpa`'s O, from O, dO and the
forward's STATS (the row log-sum-exp), with the same masks, lengths, bias, ALiBi and GQA.

With P the softmax the forward applied (``exp(score - STATS)`` on the visible keys, 0 on
the others), ``delta_i = sum_d dO[i, d] O[i, d]`` and ``dS = P * (dO Vᵀ - delta)``:
``dV = Pᵀ dO``, ``dQ = scale dS K``, ``dK = scale dSᵀ Q``; dK and dV of a key/value head sum
over the query heads that read it (grouped- and multi-query attention). BIAS and ALiBi
shift the scores only, so they enter through P; their own gradient (the frontend's dBias)
is not an output.

With dropout (the forward's mask Z, kept elements scaled by r = 1 / (1 - p), so that
O = (r Z P) V): ``dV = (r Z P)ᵀ dO`` and ``dS = P * (r Z (dO Vᵀ) - delta)``; delta is still
``sum_d dO O``, as in FlashAttention.

Packed (ragged) sequences as the forward's (ops/attention_ragged.py): RAGGED_OFFSET_Q packs Q,
O, dO, STATS and dQ, RAGGED_OFFSET_KV packs K, V, dK and dV; the gradients are zero at tokens
no sequence uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..errors import DataTypeError
from ..symbolic import Extent
from .attention import check_problem, dropout_inputs, dropout_keep, masked_scores, rank4, sequence_length_range
from .attention_ragged import RAGGED_ROLES, by_sequences, is_ragged
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class SdpaBackwardAttributes(Attributes):
    use_causal_mask: bool = False
    use_causal_mask_bottom_right: bool = False
    sliding_window_length: int | None = None
    use_padding_mask: bool = False
    use_alibi_mask: bool = False
    dropout_probability: float | None = None
    max_seq_len_q: int | None = None  # a packed Q's longest sequence (bounds the kernels' grid)
    use_deterministic_algorithm: bool = False  # the same bits run to run (no kernel that adds in varying order)


@register
class SdpaBackward(Op):
    kind = "sdpa_backward"
    category = Category.ATTENTION
    inputs = (
        Role("Q", floating=True),
        Role("K", floating=True),
        Role("V", floating=True),
        Role("O", floating=True),
        Role("DO", floating=True),
        Role("STATS", floating=True),
        Role("ATTN_SCALE", optional=True, scalar=True),
        Role("BIAS", optional=True, floating=True),
        Role("SEQ_LEN_Q", optional=True),
        Role("SEQ_LEN_KV", optional=True),
        Role("SEED", optional=True, scalar=True),
        Role("OFFSET", optional=True, scalar=True),
        Role("RAGGED_OFFSET_Q", optional=True),
        Role("RAGGED_OFFSET_KV", optional=True),
    )
    outputs = (Role("DQ"), Role("DK"), Role("DV"))
    attributes = SdpaBackwardAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        _, q_heads, sq, _, dv = check_problem(node)
        rows = node.input("Q").dim[0]  # type: ignore[union-attr]  # B, or 1 for a packed (ragged) Q
        packed = is_ragged(node, "RAGGED_OFFSET_Q")
        shape = "[1, Hq, T, Dv] (packed by RAGGED_OFFSET_Q)" if packed else "[B, Hq, Sq, Dv]"
        for role in ("O", "DO"):
            if rank4(node, role).dim != (rows, q_heads, sq, dv):
                fail(
                    node,
                    f"{role} has dims {list(rank4(node, role).dim)}; expected O's {shape} = {[rows, q_heads, sq, dv]}",
                    role=role,
                )
        stats = rank4(node, "STATS")
        if stats.dim != (rows, q_heads, sq, 1):
            fail(
                node,
                f"STATS has dims {list(stats.dim)}; expected {'[1, Hq, T, 1]' if packed else '[B, Hq, Sq, 1]'} = "
                f"{[rows, q_heads, sq, 1]}",
                role="STATS",
            )
        if stats.data_type.is_set and stats.data_type is not DataType.FLOAT:
            raise DataTypeError(
                f"STATS '{stats.name}' is {stats.data_type.value}; sdpa writes its statistics in float32",
                node=node.name,
                tensor=stats.name,
            )
        return {role: Inferred(node.input(role[1:]).dim) for role in ("DQ", "DK", "DV")}  # type: ignore[union-attr]

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        attrs: SdpaBackwardAttributes = node.attributes  # type: ignore[assignment]
        if any(role in x for role in RAGGED_ROLES):
            return by_sequences(node, x, lambda padded: self.reference(node, padded))
        scores, visible, v = masked_scores(attrs, x)
        stats = x["STATS"]
        live = visible & np.isfinite(stats)  # a row the forward saw empty (STATS = -inf) has P = 0
        p = np.where(live, np.exp(np.where(live, scores - stats, 0.0)), 0.0)
        d_o = x["DO"]
        delta = (d_o * x["O"]).sum(axis=-1, keepdims=True)
        dp = np.matmul(d_o, v.swapaxes(-1, -2))
        kept = dropout_keep(attrs, x, p.shape)
        if kept is not None:  # O = (P kept) V: dV sees the dropped P, dP reaches P through the mask
            p_dropped, dp = p * kept, dp * kept
        ds = p * (dp - delta)
        scale = x.get("ATTN_SCALE", 1.0)
        k, q = x["K"], x["Q"]
        group = q.shape[1] // k.shape[1]
        dq = scale * np.matmul(ds, np.repeat(k, group, axis=1))
        dk = scale * np.matmul(ds.swapaxes(-1, -2), q)
        dv = np.matmul((p if kept is None else p_dropped).swapaxes(-1, -2), d_o)
        return {"DQ": dq, "DK": _per_kv_head(dk, group), "DV": _per_kv_head(dv, group)}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        return sequence_length_range(node, role)


def _per_kv_head(per_query_head: np.ndarray, group: int) -> np.ndarray:
    """Sum the gradients of the ``group`` query heads that read each key/value head."""
    batch, heads, rows, cols = per_query_head.shape
    return per_query_head.reshape(batch, heads // group, group, rows, cols).sum(axis=2)


class AttentionBackwardMethods:
    _add_node: Callable[..., list[Any]]
    scalar: Callable[..., Any]

    def sdpa_backward(
        self,
        q: TensorSpec,
        k: TensorSpec,
        v: TensorSpec,
        o: TensorSpec,
        dO: TensorSpec,  # the frontend's name
        stats: TensorSpec,
        attn_scale: TensorSpec | float | None = None,
        bias: TensorSpec | None = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        use_padding_mask: bool = False,
        seq_len_q: TensorSpec | None = None,
        seq_len_kv: TensorSpec | None = None,
        use_alibi_mask: bool = False,
        compute_data_type: Any = None,
        name: str | None = None,
        *,
        dropout: tuple[float, TensorSpec | int, TensorSpec | int] | None = None,
        ragged_offset_q: TensorSpec | None = None,
        ragged_offset_kv: TensorSpec | None = None,
        max_seq_len_q: int | None = None,
        use_deterministic_algorithm: bool = False,
    ) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        """Attention backward -> (dQ, dK, dV), shaped like Q, K and V (row-major unless set).

        Takes the forward's O and STATS (``sdpa(..., generate_stats=True)``) and the same
        scale, bias, masks, lengths and ``dropout=(probability, seed, offset)`` the forward had
        (the same seed and offset regenerate its mask); ``attn_scale`` None means 1.0.
        ``ragged_offset_q`` / ``ragged_offset_kv`` / ``max_seq_len_q``: the forward's packed
        sequences (Q, O, dO, STATS and dQ, or K, V, dK and dV as ``[1, H, T, head dim]``).
        ``use_deterministic_algorithm`` (the frontend's name): gradients that are the same bits
        run to run, from kernels that sum each element in a fixed order (on sm_90, not the
        faster wgmma kernels, whose dQ adds partial sums in varying order).
        """
        inputs = {"Q": q, "K": k, "V": v, "O": o, "DO": dO, "STATS": stats, "ATTN_SCALE": attn_scale, "BIAS": bias}
        inputs |= {"SEQ_LEN_Q": seq_len_q, "SEQ_LEN_KV": seq_len_kv}
        inputs |= {"RAGGED_OFFSET_Q": ragged_offset_q, "RAGGED_OFFSET_KV": ragged_offset_kv}
        probability = dropout_inputs(self.scalar, dropout, inputs, name)
        attrs = {
            "use_causal_mask": use_causal_mask,
            "use_causal_mask_bottom_right": use_causal_mask_bottom_right,
            "sliding_window_length": sliding_window_length,
            "use_padding_mask": use_padding_mask,
            "use_alibi_mask": use_alibi_mask,
            "dropout_probability": probability,
            "max_seq_len_q": max_seq_len_q,
            "use_deterministic_algorithm": use_deterministic_algorithm,
        }
        dq, dk, dv = self._add_node("sdpa_backward", inputs, attrs, name=name, compute_data_type=compute_data_type)
        return dq, dk, dv
