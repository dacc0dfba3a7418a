"""The frontend's attention methods (``sdpa``, ``sdpa_backward``): its masks, dropout and ragged
tensors turned into graphdnn's arguments."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from ..tensor import TensorSpec
from .enums import diagonal_alignment
from .ops_base import MaybeTensor, OpsBase, compute_type
from .ragged import Side


def _diagonal_band(
    name: str,
    causal: bool,
    bottom_right: bool,
    window: int | None,
    alignment: diagonal_alignment,
    left_bound: int | None,
    right_bound: int | None,
) -> tuple[bool, bool, int | None]:
    """The frontend's diagonal band as graphdnn's masks (use_causal_mask,
    use_causal_mask_bottom_right, sliding_window_length): a right bound of 0 is the causal mask
    (bottom-right aligned with BOTTOM_RIGHT), a left bound is the sliding window."""
    if right_bound not in (None, 0):
        raise UnsupportedError(
            f"sdpa diagonal_band_right_bound={right_bound}: graphdnn's masks are causal (0) or none", node=name
        )
    if right_bound == 0:
        aligned_bottom_right = alignment is type(alignment).BOTTOM_RIGHT
        bottom_right = bottom_right or aligned_bottom_right
        causal = causal or not aligned_bottom_right
    if left_bound is not None:
        window = left_bound
    return causal, bottom_right, window


def _check_dropout(op: str, name: str, dropout: Any, rng_dump: MaybeTensor) -> None:
    """The frontend's ``dropout=(probability, seed, offset)`` goes to the builder as it is; its other
    forms (a caller's mask and scale) and ``rng_dump`` are refused, saying what to do instead."""
    if dropout is not None and (not isinstance(dropout, tuple | list) or len(dropout) != 3):
        raise UnsupportedError(
            f"{op} dropout={dropout!r}: graphdnn takes dropout=(probability, seed, offset), not a caller's "
            "(mask, scale)",
            node=name,
        )
    if rng_dump is not None:
        raise UnsupportedError(
            f"{op} rng_dump: graphdnn writes no dropout mask from sdpa; rng(seed, offset, 1 - probability, "
            "shape=[B, Hq, Sq, Skv]) draws the same mask (docs/ops.md, sdpa dropout)",
            node=name,
        )


class AttentionOps(OpsBase):
    """The attention op methods of :class:`~graphdnn.cudnn.pygraph`, mixed in."""

    # -- attention -------------------------------------------------------------------------------
    def sdpa(
        self,
        q: TensorSpec,
        k: TensorSpec,
        v: TensorSpec,
        is_inference: bool | None = None,
        attn_scale: TensorSpec | float | None = None,
        bias: MaybeTensor = None,
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q: MaybeTensor = None,
        seq_len_kv: MaybeTensor = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        diagonal_alignment: diagonal_alignment = diagonal_alignment.TOP_LEFT,
        diagonal_band_left_bound: int | None = None,
        diagonal_band_right_bound: int | None = None,
        dropout: Any = None,
        rng_dump: MaybeTensor = None,
        paged_attention_k_table: MaybeTensor = None,
        paged_attention_v_table: MaybeTensor = None,
        paged_attention_max_seq_len_kv: int | None = None,
        compute_data_type: Any = None,
        name: str = "",
        generate_stats: bool | None = None,
    ) -> list[MaybeTensor]:
        """-> [O, Stats]; Stats is None unless ``generate_stats`` (or ``is_inference=False``).

        Paged attention maps as it is: K and V are the page pools, the tables and
        ``paged_attention_max_seq_len_kv`` go to the node (which, as the frontend, needs
        ``use_padding_mask`` with ``seq_len_q`` and ``seq_len_kv``). The diagonal band maps onto graphdnn's masks: a right bound of 0 is the causal mask
        (bottom-right aligned with BOTTOM_RIGHT), a left bound is the sliding window.
        """
        _check_dropout("sdpa", name, dropout, rng_dump)
        use_causal_mask, use_causal_mask_bottom_right, sliding_window_length = _diagonal_band(
            name, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, diagonal_alignment,
            diagonal_band_left_bound, diagonal_band_right_bound,
        )  # fmt: skip
        if generate_stats is None:
            generate_stats = is_inference is False
        node = self._node(name)
        ragged_q, ragged_kv = self._ragged(node, [[("q", q)], [("k", k), ("v", v)]])
        o, stats = self._spec.sdpa(
            q, k, v, attn_scale, bias, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length,
            use_padding_mask, seq_len_q, seq_len_kv, use_alibi_mask, generate_stats,
            compute_type(compute_data_type), node,
            paged_attention_k_table=paged_attention_k_table, paged_attention_v_table=paged_attention_v_table,
            paged_attention_max_seq_len_kv=paged_attention_max_seq_len_kv, dropout=dropout,
            **_ragged_arguments(ragged_q, ragged_kv),
        )  # fmt: skip
        self._pack_later(ragged_q, [("O", o), ("Stats", stats)])
        return self._label(node, [o, stats], ("O", "Stats"))

    scaled_dot_product_flash_attention = sdpa  # the frontend's other name for it

    def sdpa_backward(
        self,
        q: TensorSpec,
        k: TensorSpec,
        v: TensorSpec,
        o: TensorSpec,
        dO: TensorSpec,  # the frontend's name
        stats: TensorSpec,
        attn_scale: TensorSpec | float | None = None,
        bias: MaybeTensor = None,
        dBias: MaybeTensor = None,  # the frontend's name
        use_alibi_mask: bool = False,
        use_padding_mask: bool = False,
        seq_len_q: MaybeTensor = None,
        seq_len_kv: MaybeTensor = None,
        max_total_seq_len_q: int | None = None,
        max_total_seq_len_kv: int | None = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        diagonal_alignment: diagonal_alignment = diagonal_alignment.TOP_LEFT,
        diagonal_band_left_bound: int | None = None,
        diagonal_band_right_bound: int | None = None,
        dropout: Any = None,
        rng_dump: MaybeTensor = None,
        use_deterministic_algorithm: bool = False,
        compute_data_type: Any = None,
        name: str = "",
    ) -> list[MaybeTensor]:
        """-> [dQ, dK, dV], from the forward's O and Stats, with its scale, bias, masks and lengths.

        ``use_deterministic_algorithm`` keeps the kernels that sum every gradient element in a
        fixed order (on sm_90 the default wgmma kernels add dQ's partial sums in varying order).
        graphdnn needs no bound on the tokens of ragged tensors, so ``max_total_seq_len_q`` /
        ``_kv`` are accepted and unused.
        """
        if dBias is not None:
            raise UnsupportedError("sdpa_backward dBias: graphdnn's attention backward has no bias gradient", node=name)
        _check_dropout("sdpa_backward", name, dropout, rng_dump)
        use_causal_mask, use_causal_mask_bottom_right, sliding_window_length = _diagonal_band(
            name, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, diagonal_alignment,
            diagonal_band_left_bound, diagonal_band_right_bound,
        )  # fmt: skip
        node = self._node(name)
        ragged_q, ragged_kv = self._ragged(
            node, [[("q", q), ("o", o), ("dO", dO), ("stats", stats)], [("k", k), ("v", v)]]
        )
        for what, value, side in (
            ("max_total_seq_len_q", max_total_seq_len_q, ragged_q),
            ("max_total_seq_len_kv", max_total_seq_len_kv, ragged_kv),
        ):
            if value is not None and side is None:
                raise UnsupportedError(
                    f"sdpa_backward {what}={value}: a bound on the tokens of ragged tensors, and this side has no "
                    "ragged offsets",
                    node=node,
                )
        grads = self._spec.sdpa_backward(
            q, k, v, o, dO, stats, attn_scale, bias, use_causal_mask, use_causal_mask_bottom_right,
            sliding_window_length, use_padding_mask, seq_len_q, seq_len_kv, use_alibi_mask,
            compute_type(compute_data_type), node, dropout=dropout,
            use_deterministic_algorithm=use_deterministic_algorithm, **_ragged_arguments(ragged_q, ragged_kv),
        )  # fmt: skip
        self._pack_later(ragged_q, [("dQ", grads[0])])
        self._pack_later(ragged_kv, [("dK", grads[1]), ("dV", grads[2])])
        return self._label(node, list(grads), ("dQ", "dK", "dV"))

    # -- data movement ---------------------------------------------------------------------------


def _ragged_arguments(q: Side | None, kv: Side | None) -> dict[str, Any]:
    """graphdnn's attention arguments for the ragged sides: token offsets and Q's longest sequence."""
    return {
        "ragged_offset_q": None if q is None else q.tokens,
        "ragged_offset_kv": None if kv is None else kv.tokens,
        "max_seq_len_q": None if q is None else q.seq_len,
    }
