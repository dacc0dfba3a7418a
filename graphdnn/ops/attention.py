"""Scaled dot-product attention forward (``sdpa``), in the cuDNN frontend's names and semantics.

Q is ``[B, Hq, Sq, D]``, K ``[B, Hk, Skv, D]``, V ``[B, Hk, Skv, Dv]`` (BSHD or BHSD
layouts come through strides), or with a paged KV cache (the cuDNN frontend's
``paged_attention_k_table`` / ``_v_table``) K and V are page pools ``[pages, Hk, page_size, D(v)]``
and PAGE_TABLE_K / PAGE_TABLE_V ``[B, 1, max_pages, 1]`` integers give, for each sequence, the
pool page that holds its keys ``p * page_size`` to ``(p + 1) * page_size - 1``; query head ``h`` reads key/value head ``h // (Hq // Hk)``
(grouped-query and multi-query attention). O is ``[B, Hq, Sq, Dv]``, row-major; STATS, the
natural-log log-sum-exp of each row's visible scores, ``[B, Hq, Sq, 1]`` float32, only
with ``generate_stats``. Dropout (``dropout_probability`` with SEED and OFFSET) drops softmax
elements after the normalisation's sum: STATS stays that of the undropped softmax, as in
FlashAttention and cuDNN (:func:`dropout_keep` defines the mask). An absent ATTN_SCALE means 1.0, as in the cuDNN frontend (not
PyTorch's 1/sqrt(D)). docs/ops.md states the masks exactly; :meth:`Sdpa.reference` is
their definition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..dtypes import DataType, round_to
from ..errors import DataTypeError, GraphError, StructureError
from ..symbolic import Extent, upper
from .attention_ragged import PACKED, RAGGED_ROLES, by_sequences, check_ragged, is_ragged, ragged_batch
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, register
from .random import as_uint64, uniform
from .rotary import rotate_by_tables, rotate_half, table_broadcasts

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec

MAX_HEAD_DIM = 256  # D and Dv: the largest head dimension the attention kernels take
SEQ_LEN_ROLES = ("SEQ_LEN_Q", "SEQ_LEN_KV")
PAGE_TABLE_ROLES = ("PAGE_TABLE_K", "PAGE_TABLE_V")
DROPOUT_ROLES = ("SEED", "OFFSET")
ROTARY_TABLES = {"Q": ("ROPE_COS_Q", "ROPE_SIN_Q"), "K": ("ROPE_COS_K", "ROPE_SIN_K")}  # (cos, sin) by operand


@dataclasses.dataclass(frozen=True)
class SdpaAttributes(Attributes):
    generate_stats: bool = False
    use_causal_mask: bool = False
    use_causal_mask_bottom_right: bool = False
    sliding_window_length: int | None = None
    use_padding_mask: bool = False
    use_alibi_mask: bool = False
    paged_attention_max_seq_len_kv: int | None = None  # the logical Skv of a paged cache
    dropout_probability: float | None = None  # with SEED and OFFSET: dropout on the softmax
    max_seq_len_q: int | None = None  # a packed Q's longest sequence (bounds the kernels' grid)


@dataclasses.dataclass(frozen=True)
class RotarySdpaAttributes(SdpaAttributes):
    """sdpa after rotary position embeddings (RoPE) of Q and/or K: the anchor's attributes that
    the ``rotary_attention`` fusion rule builds from RoPE written in primitives. No builder makes
    them: a graph states RoPE as its ops, the rule finds it. An operand with cos and sin tables
    (ROPE_COS_Q / ROPE_SIN_Q, ROPE_COS_K / ROPE_SIN_K) is rotated by them
    (:func:`.rotary.rotate_by_tables`, the swapped half negated with ``rotary_negated``), one
    without by theta (:func:`.rotary.rotate_half`)."""

    rotary_theta: float = 10000.0
    rotary_q: bool = False
    rotary_k: bool = False
    rotary_negated: bool = False


class Masks(Protocol):
    """The mask attributes sdpa and sdpa_backward share (read-only, as their dataclasses are frozen)."""

    @property
    def use_causal_mask(self) -> bool: ...
    @property
    def use_causal_mask_bottom_right(self) -> bool: ...
    @property
    def sliding_window_length(self) -> int | None: ...
    @property
    def use_padding_mask(self) -> bool: ...
    @property
    def use_alibi_mask(self) -> bool: ...
    @property
    def dropout_probability(self) -> float | None: ...


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """The ALiBi paper's per-head slopes (Press et al., 2022), one per query head.

    For a power of two n: ``2^(-8 (h+1) / n)``. Otherwise the slopes of the closest
    smaller power of two n, then every other slope of 2n, as the paper's code does.
    """
    if heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {heads}")
    closest = 1 << (heads.bit_length() - 1)
    slopes = tuple(2.0 ** (-8.0 * (h + 1) / closest) for h in range(closest))
    return slopes + alibi_slopes(2 * closest)[0::2][: heads - closest] if heads > closest else slopes


@register
class Sdpa(Op):
    kind = "sdpa"
    category = Category.ATTENTION
    inputs = (
        Role("Q", floating=True),
        Role("K", floating=True),
        Role("V", floating=True),
        Role("ATTN_SCALE", optional=True, scalar=True),
        Role("BIAS", optional=True, floating=True),
        Role("SEQ_LEN_Q", optional=True),
        Role("SEQ_LEN_KV", optional=True),
        Role("PAGE_TABLE_K", optional=True),
        Role("PAGE_TABLE_V", optional=True),
        Role("SEED", optional=True, scalar=True),
        Role("OFFSET", optional=True, scalar=True),
        Role("RAGGED_OFFSET_Q", optional=True),
        Role("RAGGED_OFFSET_KV", optional=True),
        Role("ROPE_COS_Q", optional=True, floating=True),  # the rotary_attention rule's tables
        Role("ROPE_SIN_Q", optional=True, floating=True),
        Role("ROPE_COS_K", optional=True, floating=True),
        Role("ROPE_SIN_K", optional=True, floating=True),
    )
    outputs = (Role("O"), Role("STATS"))
    attributes = SdpaAttributes

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        return self.output_names if attributes.generate_stats else frozenset({"O"})  # type: ignore[attr-defined]

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        _, q_heads, sq, _, dv = check_problem(node)
        check_rotary_tables(node)
        rows = node.input("Q").dim[0]  # type: ignore[union-attr]  # B, or 1 for a packed (ragged) Q
        inferred = {"O": Inferred((rows, q_heads, sq, dv))}
        if node.attributes.generate_stats:  # type: ignore[attr-defined]
            inferred["STATS"] = Inferred((rows, q_heads, sq, 1), data_type=DataType.FLOAT)
        return inferred

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self._attend(node, rotated_operands(node, x))

    def _attend(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        attrs: SdpaAttributes = node.attributes  # type: ignore[assignment]
        if any(role in x for role in RAGGED_ROLES):
            return by_sequences(node, x, lambda padded: self._attend(node, padded))
        if "PAGE_TABLE_K" in x:
            skv = paged_kv_length(node)
            k = gather_pages(node, x["K"], x["PAGE_TABLE_K"], x["SEQ_LEN_KV"], skv, "PAGE_TABLE_K")
            v = gather_pages(node, x["V"], x["PAGE_TABLE_V"], x["SEQ_LEN_KV"], skv, "PAGE_TABLE_V")
            x = {**x, "K": k, "V": v}
        scores, visible, v = masked_scores(attrs, x)

        # Stable softmax over the visible keys; a row with none gives O = 0 and STATS = -inf.
        row_max = np.where(visible, scores, -np.inf).max(axis=-1, keepdims=True)
        row_max = np.where(np.isfinite(row_max), row_max, 0.0)
        weights = np.exp(np.where(visible, scores - row_max, -np.inf))  # exp(-inf) = 0: no overflow where hidden
        total = weights.sum(axis=-1, keepdims=True)
        empty = total == 0.0
        safe_total = np.where(empty, 1.0, total)
        kept = dropout_keep(attrs, x, weights.shape)
        outputs = {"O": np.matmul(weights if kept is None else weights * kept, v) / safe_total}
        if attrs.generate_stats:
            outputs["STATS"] = np.where(empty, -np.inf, row_max + np.log(safe_total))
        return outputs

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        return sequence_length_range(node, role)


def rotated_operands(node: Node, x: Mapping[str, Any]) -> Mapping[str, Any]:
    """``x`` with Q and/or K rotated as :class:`RotarySdpaAttributes` say, each rounded to its
    tensor's type (the attention kernels' operands are in that type); ``x`` itself otherwise."""
    attrs = node.attributes
    if not isinstance(attrs, RotarySdpaAttributes):
        return x
    rotated = dict(x)
    for role, on in (("Q", attrs.rotary_q), ("K", attrs.rotary_k)):
        tensor = node.input(role)
        cos, sin = ROTARY_TABLES[role]
        if not on or tensor is None:
            continue
        if cos in x:
            value = rotate_by_tables(x[role], x[cos], x[sin], attrs.rotary_negated)
        else:
            value = rotate_half(x[role], attrs.rotary_theta)
        rotated[role] = round_to(tensor.data_type, value)
    return rotated


def check_rotary_tables(node: Node) -> None:
    """RoPE's cos and sin tables come in pairs, only on the rotary_attention rule's anchor for an
    operand it rotates, each broadcastable against the operand's [S, D] (leading dims 1)."""
    attrs = node.attributes
    for role, tables in ROTARY_TABLES.items():
        bound = [t for t in tables if node.input(t) is not None]
        if not bound:
            continue
        rotated = isinstance(attrs, RotarySdpaAttributes) and (attrs.rotary_q if role == "Q" else attrs.rotary_k)
        if not rotated or len(bound) != 2:
            raise StructureError(
                f"{bound[0]} is given: RoPE tables come in pairs, and only the rotary_attention fusion rule binds them",
                node=node.name,
            )
        operand = node.input(role)
        assert operand is not None
        for table_role in tables:
            table = node.input(table_role)
            assert table is not None
            if not table_broadcasts(table.dim, operand.dim):
                fail(
                    node,
                    f"{table_role} has dims {list(table.dim)}; a RoPE table broadcasts against {role}'s [S, D] "
                    f"= {list(operand.dim[2:])} (leading dims 1)",
                    role=table_role,
                )


def sequence_length_range(node: Node, role: str) -> tuple[int, int] | None:
    """A sequence length lies in [0, S] (the kernels clamp others, random inputs need not); a
    page table entry names a page of its pool; a dropout seed or offset is a non-negative int32,
    as rng's."""
    if role in DROPOUT_ROLES:
        return 0, 2**31 - 1
    if role in RAGGED_ROLES:
        packed = node.input(PACKED[role][0])
        assert packed is not None
        return 0, packed.static_dim[2]
    if role in PAGE_TABLE_ROLES:
        pool = node.input("K" if role == "PAGE_TABLE_K" else "V")
        assert pool is not None
        return 0, pool.static_dim[0] - 1
    if role not in SEQ_LEN_ROLES:
        return None
    q = node.input("Q")
    assert q is not None
    return 0, upper(q.dim[2] if role == "SEQ_LEN_Q" else kv_length(node))  # a symbolic length's maximum


def kv_length(node: Node) -> Extent:
    """Skv, the keys a sequence may have: K's dim 2 (a symbol in a dynamic graph), or with a paged
    cache paged_attention_max_seq_len_kv, else the K table's pages times the page size."""
    k = node.input("K")
    assert k is not None
    return k.dim[2] if node.input("PAGE_TABLE_K") is None else paged_kv_length(node)


def paged_kv_length(node: Node) -> int:
    """A paged cache's Skv: paged_attention_max_seq_len_kv, else the K table's pages times the
    page size (static: the pools and tables take no symbolic lengths)."""
    k, table = node.input("K"), node.input("PAGE_TABLE_K")
    assert k is not None and table is not None
    explicit = node.attributes.paged_attention_max_seq_len_kv  # type: ignore[attr-defined]
    return explicit if explicit is not None else table.static_axis(2) * k.static_axis(2)


def gather_pages(
    node: Node, pool: np.ndarray, table: np.ndarray, lengths: np.ndarray, skv: int, role: str
) -> np.ndarray:
    """The dense ``[B, H, Skv, D]`` K or V of a page pool: sequence b's key j from page
    ``table[b, 0, j // page_size, 0]``, row ``j % page_size``. Only the pages that hold keys
    below the sequence's length are read (the kernels read no other), the rest is zero."""
    batch, page_size = table.shape[0], pool.shape[2]
    dense = np.zeros((batch, pool.shape[1], skv, pool.shape[3]), dtype=pool.dtype)
    for b in range(batch):
        length = min(max(int(lengths.reshape(-1)[b]), 0), skv)
        for p in range(-(-length // page_size)):
            page = int(table[b, 0, p, 0])
            if not 0 <= page < pool.shape[0]:
                raise GraphError(
                    f"{role} names page {page} for sequence {b}, page {p}; the pool has pages 0 to {pool.shape[0] - 1}",
                    node=node.name,
                )
            rows = min(page_size, length - p * page_size)
            dense[b, :, p * page_size : p * page_size + rows] = pool[page, :, :rows]
    return dense


def dropout_keep(attrs: Masks, x: Mapping[str, Any], shape: tuple[int, ...]) -> np.ndarray | None:
    """Dropout's factor per score ``[B, Hq, Sq, Skv]``: ``1 / (1 - p)`` where the element is kept,
    0 where dropped; None without dropout.

    Element ``(b, h, i, j)`` is kept when rng's Bernoulli draw with probability ``1 - p`` at its
    row-major index ``((b Hq + h) Sq + i) Skv + j`` gives 1 (:mod:`graphdnn.ops.random`: Philox4x32-10,
    key SEED, counter (index, OFFSET)): a pure function of (SEED, OFFSET, b, h, i, j), so every
    kernel, forward and backward, draws the same mask. Skv is the logical key count (a paged
    cache's too), so a mask does not depend on how K and V are stored."""
    p = attrs.dropout_probability
    if p is None:
        return None
    kept = uniform(shape, as_uint64(x["SEED"]), as_uint64(x["OFFSET"])) < 1.0 - p
    return np.where(kept, 1.0 / (1.0 - p), 0.0)


def masked_scores(attrs: Masks, x: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scores ``[B, Hq, Sq, Skv]`` (scale, bias and ALiBi applied), which of them are
    visible under the masks and lengths, and V repeated to Q's heads: what the forward's
    reference and the backward's share."""
    q, k, v = x["Q"], x["K"], x["V"]
    batch, q_heads, sq, _ = q.shape
    skv = k.shape[2]
    group = q_heads // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h reads head h // group
    scores = x.get("ATTN_SCALE", 1.0) * np.matmul(q, k.swapaxes(-1, -2)) + x.get("BIAS", 0.0)

    # Effective lengths per batch, as [B, 1, 1, 1]; rows i and keys j broadcast against them.
    if attrs.use_padding_mask:
        lq = np.clip(x["SEQ_LEN_Q"], 0, sq).reshape(batch, 1, 1, 1)
        lkv = np.clip(x["SEQ_LEN_KV"], 0, skv).reshape(batch, 1, 1, 1)
    else:
        lq, lkv = np.full((batch, 1, 1, 1), sq), np.full((batch, 1, 1, 1), skv)
    i, j = np.arange(sq).reshape(1, 1, sq, 1), np.arange(skv).reshape(1, 1, 1, skv)
    diagonal = i + (lkv - lq if attrs.use_causal_mask_bottom_right else 0)  # the causal diagonal, per row
    visible = (i < lq) & (j < lkv)
    if attrs.use_causal_mask or attrs.use_causal_mask_bottom_right:
        visible = visible & (j <= diagonal)
    if attrs.sliding_window_length is not None:
        visible = visible & (j > diagonal - attrs.sliding_window_length)
    if attrs.use_alibi_mask:
        scores = scores + np.array(alibi_slopes(q_heads)).reshape(1, q_heads, 1, 1) * (j - diagonal)
    return scores, np.broadcast_to(visible, scores.shape), v


def check_problem(node: Node) -> tuple[Extent, Extent, Extent, Extent, Extent]:
    """Check Q, K, V, BIAS, the sequence lengths and the mask attributes (forward and backward
    take the same); return (B, Hq, Sq, D, Dv)."""
    q, k, v = (rank4(node, role) for role in ("Q", "K", "V"))
    _, q_heads, sq, d = q.dim
    batch = ragged_batch(node) or q.dim[0]
    kv_batch = 1 if is_ragged(node, "RAGGED_OFFSET_KV") else batch
    if q_heads % k.dim[1]:
        fail(node, f"Q has {q_heads} heads, not a multiple of K and V's {k.dim[1]}", role="K")
    for role, extent in (("Q", d), ("V", v.dim[3])):
        if extent > MAX_HEAD_DIM:
            fail(node, f"{role} has head dim {extent}; sdpa takes head dims up to {MAX_HEAD_DIM}", role=role)
    skv: Extent
    if any(node.input(role) is not None for role in PAGE_TABLE_ROLES):
        skv = _check_paged(node, batch, d)
    else:
        if getattr(node.attributes, "paged_attention_max_seq_len_kv", None) is not None:
            fail_attribute(node, "paged_attention_max_seq_len_kv is set without paged_attention_k_table / _v_table")
        if k.dim[0] != kv_batch or k.dim[3] != d:
            batch_is = "B = 1 (packed: RAGGED_OFFSET_KV)" if kv_batch != batch else f"Q's B = {batch}"
            fail(node, f"K has dims {list(k.dim)}; expected [B, Hk, Skv, D] with {batch_is} and D = {d}", role="K")
        if v.dim[:3] != k.dim[:3]:
            fail(
                node,
                f"V has dims {list(v.dim)}; expected [B, Hk, Skv, Dv] with K's [B, Hk, Skv] = {list(k.dim[:3])}",
                role="V",
            )
        skv = k.dim[2]
    check_attributes(node)
    check_seq_lens(node, batch)
    check_ragged(node, batch)
    check_dropout(node)
    bias = node.input("BIAS")
    scores = (batch, q_heads, sq, skv)
    if bias is not None and (len(bias.dim) != 4 or any(e not in (1, s) for e, s in zip(bias.dim, scores))):
        fail(
            node,
            f"BIAS has dims {list(bias.dim)}; expected rank 4, each dim 1 or that of [B, Hq, Sq, Skv] = {list(scores)}",
            role="BIAS",
        )
    return batch, q_heads, sq, d, v.dim[3]


def rank4(node: Node, role: str) -> Tensor:
    tensor = node.input(role)
    assert tensor is not None
    if len(tensor.dim) != 4:
        fail(node, f"{role} has dims {list(tensor.dim)}; sdpa takes rank-4 [B, H, S, D] tensors", role=role)
    return tensor


def check_attributes(node: Node) -> None:
    attrs: Masks = node.attributes  # type: ignore[assignment]
    causal = attrs.use_causal_mask or attrs.use_causal_mask_bottom_right
    if attrs.use_causal_mask and attrs.use_causal_mask_bottom_right:
        fail_attribute(node, "use_causal_mask and use_causal_mask_bottom_right exclude each other; set one")
    if attrs.sliding_window_length is not None and attrs.sliding_window_length < 1:
        fail_attribute(node, f"sliding_window_length is {attrs.sliding_window_length}; it must be at least 1")
    if attrs.use_alibi_mask and not causal:
        fail_attribute(node, "use_alibi_mask needs a causal mask (use_causal_mask or use_causal_mask_bottom_right)")


def check_dropout(node: Node) -> None:
    """SEED and OFFSET bound exactly when dropout_probability is set, which lies in [0, 1)."""
    p = node.attributes.dropout_probability  # type: ignore[attr-defined]
    bound = [role for role in DROPOUT_ROLES if node.input(role) is not None]
    if p is None:
        if bound:
            raise StructureError(f"{bound[0]} is given but dropout_probability is not set", node=node.name)
        return
    if not 0.0 <= p < 1.0:
        fail_attribute(node, f"dropout_probability is {p}; a drop rate lies in [0, 1)")
    missing = [role for role in DROPOUT_ROLES if role not in bound]
    if missing:
        raise StructureError(
            f"dropout needs a seed and an offset (dropout=(probability, seed, offset)); {missing[0]} is not given",
            node=node.name,
        )


def check_seq_lens(node: Node, batch: Extent) -> None:
    """SEQ_LEN_Q and SEQ_LEN_KV: both bound, [B, 1, 1, 1] integers, exactly when use_padding_mask."""
    bound = [role for role in SEQ_LEN_ROLES if node.input(role) is not None]
    if node.attributes.use_padding_mask:  # type: ignore[attr-defined]
        missing = [role for role in SEQ_LEN_ROLES if role not in bound]
        if missing:
            raise StructureError(f"use_padding_mask needs {' and '.join(missing)}, which is not given", node=node.name)
    elif bound:
        raise StructureError(f"{bound[0]} is given but use_padding_mask is false", node=node.name)
    for role in bound:
        tensor = node.input(role)
        assert tensor is not None
        if tensor.data_type.is_set and (tensor.data_type.is_floating or tensor.data_type is DataType.BOOLEAN):
            raise DataTypeError(
                f"{role} '{tensor.name}' is {tensor.data_type.value}; sequence lengths are integers",
                node=node.name,
                tensor=tensor.name,
            )
        if tensor.dim != (batch, 1, 1, 1):
            fail(node, f"{role} has dims {list(tensor.dim)}, expected [B, 1, 1, 1] = [{batch}, 1, 1, 1]", role=role)


def _check_paged(node: Node, batch: Extent, d: Extent) -> int:
    """K and V page pools with their tables, as the cuDNN frontend takes them; returns Skv.

    Both tables [B, 1, max_pages, 1] integers; K ``[pages, Hk, page_size, D]``, V ``[pages_v,
    Hk, page_size_v, Dv]`` (the pools and page sizes may differ); use_padding_mask with
    SEQ_LEN_KV, which says how many keys each sequence has (the frontend requires it); Skv,
    paged_attention_max_seq_len_kv or else the K table's pages times its page size, within
    what each table can address."""
    tables = {role: node.input(role) for role in PAGE_TABLE_ROLES}
    missing = [role for role, t in tables.items() if t is None]
    if missing:
        raise StructureError(
            f"a paged KV cache needs both paged_attention_k_table and paged_attention_v_table; {missing[0]} is not given",
            node=node.name,
        )
    if not node.attributes.use_padding_mask:  # type: ignore[attr-defined]
        raise StructureError(
            "a paged KV cache needs use_padding_mask with seq_len_q and seq_len_kv (each sequence's length), "
            "as in the cuDNN frontend",
            node=node.name,
        )
    k, v = node.input("K"), node.input("V")
    assert k is not None and v is not None
    if k.dim[1] != v.dim[1] or k.dim[3] != d:
        fail(
            node,
            f"K has dims {list(k.dim)}, V {list(v.dim)}; paged, expected K [pages, Hk, page_size, D] with Q's "
            f"D = {d} and V [pages, Hk, page_size, Dv] with the same Hk",
            role="K",
        )
    for role, t in tables.items():
        assert t is not None
        if t.data_type.is_set and (t.data_type.is_floating or t.data_type is DataType.BOOLEAN):
            raise DataTypeError(
                f"{role} '{t.name}' is {t.data_type.value}; page tables hold integer page numbers",
                node=node.name,
                tensor=t.name,
            )
        if len(t.dim) != 4 or t.dim[0] != batch or t.dim[1] != 1 or t.dim[3] != 1:
            fail(node, f"{role} has dims {list(t.dim)}, expected [B, 1, max_pages, 1] with B = {batch}", role=role)
    skv = paged_kv_length(node)
    if skv < 1:
        fail_attribute(node, f"paged_attention_max_seq_len_kv is {skv}; it must be at least 1")
    for role, pool in (("PAGE_TABLE_K", k), ("PAGE_TABLE_V", v)):
        table = tables[role]
        assert table is not None
        reach = table.static_axis(2) * pool.static_axis(2)
        if skv > reach:
            fail(
                node,
                f"{role} addresses {table.static_axis(2)} pages of {pool.static_axis(2)} keys = {reach} keys, fewer than "
                f"Skv = {skv} (paged_attention_max_seq_len_kv, or the K table's pages times K's page size)",
                role=role,
            )
    return skv


def dropout_inputs(scalar: Callable[..., Any], dropout: Any, inputs: dict[str, Any], name: str | None) -> float | None:
    """The builder's ``dropout=(probability, seed, offset)``: SEED and OFFSET into ``inputs`` (a
    Python int as an int64 constant, exact where a float constant would round past 2^24, as rng
    takes it); returns the probability, None without dropout."""
    if dropout is None:
        return None
    if not isinstance(dropout, tuple | list) or len(dropout) != 3:
        raise GraphError(f"dropout must be (probability, seed, offset), got {dropout!r}", node=name)
    probability, seed, offset = dropout
    for role, value in (("SEED", seed), ("OFFSET", offset)):
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        inputs[role] = scalar(value, data_type="int64") if is_number else value
    return float(probability)


class AttentionMethods:
    _add_node: Callable[..., list[Any]]
    scalar: Callable[..., Any]

    def sdpa(
        self,
        q: TensorSpec,
        k: TensorSpec,
        v: TensorSpec,
        attn_scale: TensorSpec | float | None = None,
        bias: TensorSpec | None = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        use_padding_mask: bool = False,
        seq_len_q: TensorSpec | None = None,
        seq_len_kv: TensorSpec | None = None,
        use_alibi_mask: bool = False,
        generate_stats: bool = False,
        compute_data_type: Any = None,
        name: str | None = None,
        *,
        paged_attention_k_table: TensorSpec | None = None,
        paged_attention_v_table: TensorSpec | None = None,
        paged_attention_max_seq_len_kv: int | None = None,
        dropout: tuple[float, TensorSpec | int, TensorSpec | int] | None = None,
        ragged_offset_q: TensorSpec | None = None,
        ragged_offset_kv: TensorSpec | None = None,
        max_seq_len_q: int | None = None,
    ) -> tuple[TensorSpec, TensorSpec | None]:
        """Attention forward -> (O, STATS); STATS is None unless ``generate_stats``.

        ``attn_scale`` None means 1.0 (the cuDNN frontend's default), not 1/sqrt(D). With the
        page tables, K and V are page pools (a paged KV cache; docs/ops.md has the rules).
        ``dropout=(probability, seed, offset)``, as the frontend's: the softmax's elements are
        dropped with that probability and the kept ones scaled by 1 / (1 - probability), the mask
        drawn from Philox with the seed and offset (one-element tensors or Python ints).
        ``ragged_offset_q`` / ``ragged_offset_kv``: packed sequences (Q and O, or K and V, as
        ``[1, H, T, head dim]``; ``[B + 1, 1, 1, 1]`` token offsets, as FlashAttention's
        cu_seqlens; ops/attention_ragged.py has the rules); ``max_seq_len_q``, the longest packed
        sequence's rows, bounds the GPU grid (by default every sequence may hold all tokens).
        """
        inputs = {"Q": q, "K": k, "V": v, "ATTN_SCALE": attn_scale, "BIAS": bias}
        inputs |= {"SEQ_LEN_Q": seq_len_q, "SEQ_LEN_KV": seq_len_kv}
        inputs |= {"PAGE_TABLE_K": paged_attention_k_table, "PAGE_TABLE_V": paged_attention_v_table}
        inputs |= {"RAGGED_OFFSET_Q": ragged_offset_q, "RAGGED_OFFSET_KV": ragged_offset_kv}
        probability = dropout_inputs(self.scalar, dropout, inputs, name)
        attrs = {
            "generate_stats": generate_stats,
            "use_causal_mask": use_causal_mask,
            "use_causal_mask_bottom_right": use_causal_mask_bottom_right,
            "sliding_window_length": sliding_window_length,
            "use_padding_mask": use_padding_mask,
            "use_alibi_mask": use_alibi_mask,
            "paged_attention_max_seq_len_kv": paged_attention_max_seq_len_kv,
            "dropout_probability": probability,
            "max_seq_len_q": max_seq_len_q,
        }
        o, stats = self._add_node("sdpa", inputs, attrs, name=name, compute_data_type=compute_data_type)
        return o, stats
