"""Ragged (packed) sequences for ``sdpa`` and ``sdpa_backward``: the rows of every sequence of a batch stored one
after another, without padding, as FlashAttention's variable-length API and the cuDNN
frontend's ragged offsets store them.

With RAGGED_OFFSET_Q, Q is one packed sequence ``[1, Hq, Tq, D]`` (any strides: THD is
``[Tq*Hq*D, D, Hq*D, 1]``) and RAGGED_OFFSET_Q ``[B + 1, 1, 1, 1]`` integers give the token
where each sequence starts (``cu_seqlens``: 0, len0, len0 + len1, ..., the last the total);
O ``[1, Hq, Tq, Dv]`` and STATS ``[1, Hq, Tq, 1]`` are packed the same way. With
RAGGED_OFFSET_KV, K and V are packed ``[1, Hk, Tkv, D(v)]`` likewise. Both need
use_padding_mask: SEQ_LEN_Q and SEQ_LEN_KV ``[B, 1, 1, 1]`` give the batch and how many rows
of its range each sequence uses.

Offsets are tokens, not elements (the frontend counts elements), so one offsets tensor
serves Q, O and STATS whatever their strides and head dims. Every offsets tensor is a valid
input: offsets are clamped to ``[0, T]``, and token t belongs to the *last* sequence b whose
offset is at most t, so sequence b owns tokens ``[off[b], min(off[b+1:]))`` (empty when a
later offset is smaller). Sequences never overlap, so no two writers race on the GPU, and
the offsets of cu_seqlens give each sequence exactly its rows. A sequence uses the first
``min(seq_len, owned tokens)`` of its rows (and at most ``max_seq_len_q`` rows of Q, an
attribute that bounds the GPU grid); O is zero and STATS -inf at every other token.

``sdpa_backward`` packs the same way: RAGGED_OFFSET_Q packs Q, O, dO, STATS and dQ,
RAGGED_OFFSET_KV packs K, V, dK and dV; a gradient is zero at every token no sequence uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..errors import DataTypeError, StructureError
from ..symbolic import Extent
from .base import fail

if TYPE_CHECKING:
    from ..ir import Node

RAGGED_ROLES = ("RAGGED_OFFSET_Q", "RAGGED_OFFSET_KV")
PACKED = {"RAGGED_OFFSET_Q": ("Q",), "RAGGED_OFFSET_KV": ("K", "V")}  # the inputs whose dims say they are packed
# every tensor each offsets tensor packs, sdpa's and sdpa_backward's, inputs and outputs
PACKS = {"RAGGED_OFFSET_Q": ("Q", "O", "DO", "STATS", "DQ"), "RAGGED_OFFSET_KV": ("K", "V", "DK", "DV")}
LENGTHS = {"RAGGED_OFFSET_Q": "SEQ_LEN_Q", "RAGGED_OFFSET_KV": "SEQ_LEN_KV"}


def is_ragged(node: Node, role: str) -> bool:
    return any(r == role for r, _ in node.inputs) and node.input(role) is not None


def ragged_batch(node: Node) -> Extent | None:
    """B of a node with a ragged Q (SEQ_LEN_Q's dim 0), None when Q is not ragged."""
    if not is_ragged(node, "RAGGED_OFFSET_Q"):
        return None
    lengths = node.input("SEQ_LEN_Q")
    if lengths is None or not node.attributes.use_padding_mask:  # type: ignore[attr-defined]
        raise StructureError(
            "RAGGED_OFFSET_Q needs use_padding_mask with seq_len_q and seq_len_kv: they give the batch and each "
            "sequence's length",
            node=node.name,
        )
    return lengths.dim[0]


def check_ragged(node: Node, batch: Extent) -> None:
    """Each offsets tensor: an integer ``[B + 1, 1, 1, 1]`` with use_padding_mask, its packed
    inputs one sequence (dim 0 of 1), K and V not a page pool; max_seq_len_q at least 1, only
    with RAGGED_OFFSET_Q."""
    longest = node.attributes.max_seq_len_q  # type: ignore[attr-defined]
    if longest is not None and (longest < 1 or not is_ragged(node, "RAGGED_OFFSET_Q")):
        raise StructureError(
            f"max_seq_len_q is {longest}; it bounds the sequences of a packed Q (ragged_offset_q) and is at least 1",
            node=node.name,
        )
    for role in RAGGED_ROLES:
        offsets = node.input(role) if is_ragged(node, role) else None
        if offsets is None:
            continue
        if not node.attributes.use_padding_mask:  # type: ignore[attr-defined]
            raise StructureError(
                f"{role} needs use_padding_mask with seq_len_q and seq_len_kv (each sequence's length)", node=node.name
            )
        if role == "RAGGED_OFFSET_KV" and node.input("PAGE_TABLE_K") is not None:
            raise StructureError(
                "RAGGED_OFFSET_KV and a paged KV cache exclude each other: K and V are page pools", node=node.name
            )
        if offsets.data_type.is_set and (offsets.data_type.is_floating or offsets.data_type is DataType.BOOLEAN):
            raise DataTypeError(
                f"{role} '{offsets.name}' is {offsets.data_type.value}; ragged offsets are integer token indices",
                node=node.name,
                tensor=offsets.name,
            )
        if len(offsets.dim) != 4 or offsets.dim[0] != batch + 1 or tuple(offsets.dim[1:]) != (1, 1, 1):
            fail(node, f"{role} has dims {list(offsets.dim)}, expected [B + 1, 1, 1, 1] with B = {batch}", role=role)
        for packed in PACKED[role]:
            tensor = node.input(packed)
            assert tensor is not None
            if tensor.dim[0] != 1:
                fail(
                    node,
                    f"{packed} has dims {list(tensor.dim)}; with {role} it is packed, [1, H, T, head dim]",
                    role=packed,
                )


def owned_ranges(offsets: np.ndarray, total: int) -> np.ndarray:
    """``[B, 2]``: the tokens ``[start, end)`` each sequence owns (the module's rule)."""
    starts = np.clip(offsets.reshape(-1).astype(np.int64), 0, total)
    ends = np.minimum.accumulate(starts[::-1])[::-1]  # ends[b] = min(starts[b:])
    return np.stack([starts[:-1], np.maximum(ends[1:], starts[:-1])], axis=1)


def unpack(node: Node, x: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The padded problem of a ragged one: packed inputs as ``[B, H, T, d]`` (each sequence's
    owned rows first, zeros after) and the sequence lengths cut to the rows owned; also the
    owned ranges of each offsets role's sequences, for :func:`pack`."""
    padded = dict(x)
    ranges: dict[str, np.ndarray] = {}
    for role in RAGGED_ROLES:
        if role not in x:
            continue
        total = x[PACKED[role][0]].shape[2]
        ranges[role] = owned = owned_ranges(x[role], total)
        for name in (name for name in PACKS[role] if name in x):
            packed = x[name]
            out = np.zeros((len(owned), packed.shape[1], total, packed.shape[3]), packed.dtype)
            for b, (start, end) in enumerate(owned):
                out[b, :, : end - start] = packed[0, :, start:end]
            padded[name] = out
        longest = node.attributes.max_seq_len_q if role == "RAGGED_OFFSET_Q" else None  # type: ignore[attr-defined]
        seq_len = np.clip(x[LENGTHS[role]].reshape(-1), 0, total if longest is None else min(total, longest))
        padded[LENGTHS[role]] = np.minimum(seq_len, owned[:, 1] - owned[:, 0]).reshape(-1, 1, 1, 1)
    return padded, ranges


def pack(
    outputs: dict[str, np.ndarray], padded: Mapping[str, Any], ranges: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Padded outputs ``[B, H, T, d]`` of a packed side back into packed ``[1, H, T, d]``: each
    sequence's first ``padded`` length rows at its owned range; STATS -inf and the others
    (O, gradients) zero at every other token. Outputs of a side not packed stay as they are."""
    packed = dict(outputs)
    for role, owned in ranges.items():
        lengths = padded[LENGTHS[role]].reshape(-1)
        for name in (name for name in PACKS[role] if name in outputs):
            value = outputs[name]
            out = np.full((1, *value.shape[1:]), -np.inf if name == "STATS" else 0.0)
            for b, (start, _) in enumerate(owned):
                out[0, :, start : start + int(lengths[b])] = value[b, :, : int(lengths[b])]
            packed[name] = out
    return packed


def by_sequences(
    node: Node, x: Mapping[str, Any], dense: Callable[[dict[str, Any]], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """A ragged node's reference: ``dense`` (the op's reference) on the padded problem, packed back."""
    padded, ranges = unpack(node, x)
    return pack(dense({k: v for k, v in padded.items() if k not in RAGGED_ROLES}), padded, ranges)
