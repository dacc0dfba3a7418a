"""Attention graphs on awkward shapes, masks, layouts and types: compiled for sm_80 and sm_90 on
every machine (test_codegen_attention.py) and run against the reference on a GPU
(test_gpu_attention.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import graphdnn as gd
from graphdnn.dtypes import DataType


@dataclass(frozen=True)
class AttentionCase:
    b: int = 2
    hq: int = 4
    hk: int = 2
    sq: int = 129
    skv: int = 77
    d: int = 64
    dv: int = 64
    data_type: DataType = DataType.BFLOAT16
    kv_type: DataType | None = None  # K and V's type when it differs from Q's
    layout: str = "bhsd"  # or "bshd": sequence-major rows, heads interleaved; "shared_kv": one K and V for every batch
    scale: str = "constant"  # "constant", "runtime" (pass-by-value) or "none"
    bias: tuple[int, int, int, int] | None = None  # which dims of [B, Hq, Sq, Skv] the bias has
    padding: bool = False
    stats: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    dropout: float | None = None  # the drop rate; the seed an int64 tensor, the offset a pass-by-value one
    batch_max: int | None = None  # a dynamic graph: the batch is symbol 'batch' in 1..batch_max (b unused)
    # a dynamic graph over the lengths: Sq is symbol 'sq' in 1..sq_max, Skv 'skv' in 1..skv_max (sq and
    # skv unused), or with one_length Sq and Skv are one symbol 'seq' in 1..sq_max
    sq_max: int | None = None
    skv_max: int | None = None
    one_length: bool = False

    def build(self) -> gd.OperationGraphSpec:
        g = self.graph("attention")
        q, k, v, extra = self.inputs(g)
        o, stats = g.sdpa(q, k, v, generate_stats=self.stats, name="attention", **extra, **self.options)
        o.set_output(True).set_name("o")
        if stats is not None:
            stats.set_output(True).set_name("stats")
        return g

    def graph(self, name: str) -> gd.OperationGraphSpec:
        return gd.OperationGraphSpec(name=name, io_data_type=self.data_type, compute_data_type=DataType.FLOAT)

    def inputs(self, g: gd.OperationGraphSpec) -> tuple[gd.TensorSpec, gd.TensorSpec, gd.TensorSpec, dict[str, Any]]:
        """Q, K, V and the other arguments forward and backward share (scale, bias, lengths)."""
        kv_type = self.kv_type or self.data_type
        b = g.dim("batch", 1, self.batch_max) if self.batch_max is not None else self.b
        sq, skv = self._lengths(g)
        q = g.tensor(name="q", dim=[b, self.hq, sq, self.d], stride=self._strides(self.hq, sq, self.d))
        k = g.tensor(
            name="k",
            dim=[b, self.hk, skv, self.d],
            stride=self._strides(self.hk, skv, self.d, kv=True),
            data_type=kv_type,
        )
        v = g.tensor(
            name="v",
            dim=[b, self.hk, skv, self.dv],
            stride=self._strides(self.hk, skv, self.dv, kv=True),
            data_type=kv_type,
        )
        extra: dict[str, Any] = {}
        if self.scale == "constant":
            extra["attn_scale"] = self.d**-0.5
        elif self.scale == "runtime":
            extra["attn_scale"] = g.tensor(
                name="scale", dim=[1, 1, 1, 1], data_type=DataType.FLOAT, is_pass_by_value=True
            )
        if self.bias is not None:
            full = (b, self.hq, sq, skv)
            extra["bias"] = g.tensor(name="bias", dim=[n if keep else 1 for n, keep in zip(full, self.bias)])
        if self.padding:
            extra["use_padding_mask"] = True
            extra["seq_len_q"] = g.tensor(name="seq_q", dim=[b, 1, 1, 1], data_type=DataType.INT32)
            extra["seq_len_kv"] = g.tensor(name="seq_kv", dim=[b, 1, 1, 1], data_type=DataType.INT32)
        if self.dropout is not None:
            seed = g.tensor(name="seed", dim=[1, 1, 1, 1], data_type=DataType.INT64)
            offset = g.tensor(name="offset", dim=[1, 1, 1, 1], data_type=DataType.INT64, is_pass_by_value=True)
            extra["dropout"] = (self.dropout, seed, offset)
        return q, k, v, extra

    def _lengths(self, g: gd.OperationGraphSpec) -> tuple[Any, Any]:
        """Sq and Skv: numbers, or the symbols of a graph over the lengths."""
        if self.one_length:
            assert self.sq_max is not None
            seq = g.dim("seq", 1, self.sq_max)
            return seq, seq
        sq = g.dim("sq", 1, self.sq_max) if self.sq_max is not None else self.sq
        return sq, g.dim("skv", 1, self.skv_max) if self.skv_max is not None else self.skv

    def _strides(self, heads: int, seq: Any, width: int, kv: bool = False) -> list[Any]:
        if self.layout == "shared_kv" and kv:  # a broadcast view: batch stride 0
            return [0, seq * width, width, 1]
        if self.layout == "bshd":
            return [seq * heads * width, width, heads * width, 1]
        return [heads * seq * width, seq * width, width, 1]


CASES = {
    "kv_shared_across_batch": AttentionCase(
        b=3, hq=4, hk=2, sq=100, skv=150, layout="shared_kv", options={"use_causal_mask": True}
    ),
    "one_row_one_key": AttentionCase(b=1, hq=1, hk=1, sq=1, skv=1),
    "mha_odd_lengths": AttentionCase(hq=2, hk=2, sq=7, skv=129),
    "gqa_4to1_causal": AttentionCase(hq=8, hk=2, sq=129, skv=129, options={"use_causal_mask": True}),
    "mqa_bottom_right_longer_kv": AttentionCase(
        hq=4, hk=1, sq=33, skv=1000, options={"use_causal_mask_bottom_right": True}
    ),
    "bottom_right_longer_q": AttentionCase(sq=200, skv=70, options={"use_causal_mask_bottom_right": True}),
    "sliding_window_causal": AttentionCase(
        sq=300, skv=300, options={"use_causal_mask": True, "sliding_window_length": 37}
    ),
    "sliding_window_alone": AttentionCase(sq=100, skv=150, options={"sliding_window_length": 16}),
    "alibi_causal_6_heads": AttentionCase(
        hq=6, hk=3, sq=90, skv=90, options={"use_causal_mask": True, "use_alibi_mask": True}
    ),
    "bias_per_key": AttentionCase(bias=(True, False, False, True)),
    "bias_full": AttentionCase(b=1, hq=2, hk=1, sq=65, skv=65, bias=(True, True, True, True)),
    "padding_with_empty_sequences": AttentionCase(b=4, sq=100, skv=90, padding=True),
    "padding_causal_bottom_right": AttentionCase(
        b=3, sq=64, skv=128, padding=True, options={"use_causal_mask_bottom_right": True}
    ),
    "d128_bshd": AttentionCase(hq=4, hk=4, sq=257, skv=300, d=128, dv=128, layout="bshd"),
    "d256_fp16": AttentionCase(b=1, hq=2, hk=1, sq=130, skv=200, d=256, dv=256, data_type=DataType.HALF),
    "d72_dv40": AttentionCase(d=72, dv=40),
    "d100_scalar_loads": AttentionCase(d=100, dv=36, sq=50, skv=61),
    "d16_fp16_runtime_scale": AttentionCase(d=16, dv=16, data_type=DataType.HALF, scale="runtime"),
    "no_scale_no_stats": AttentionCase(scale="none", stats=False, sq=40, skv=40, d=32, dv=32),
    "fp32_simt": AttentionCase(data_type=DataType.FLOAT, sq=70, skv=45, d=40, dv=24),
    "mixed_types_simt": AttentionCase(kv_type=DataType.HALF, sq=33, skv=65, options={"use_causal_mask": True}),
    "dropout_half_gqa": AttentionCase(hq=8, hk=2, sq=100, skv=77, dropout=0.5),
    "dropout_causal_d72": AttentionCase(sq=129, skv=129, d=72, dv=72, dropout=0.1, options={"use_causal_mask": True}),
    "dropout_fp32_simt": AttentionCase(data_type=DataType.FLOAT, sq=70, skv=45, d=40, dv=24, dropout=0.1),
    "dropout_decode_gqa": AttentionCase(b=2, hq=8, hk=2, sq=1, skv=300, d=128, dv=128, dropout=0.5),
}


def self_attention(data_type: DataType) -> gd.OperationGraphSpec:
    """One tensor as Q, K and V (the kernel takes it once)."""
    g = gd.OperationGraphSpec(name="self_attention", io_data_type=data_type)
    x = g.tensor(name="x", dim=[2, 2, 33, 64])
    o, _ = g.sdpa(x, x, x, attn_scale=0.125, use_causal_mask=True)
    o.set_output(True).set_name("o")
    return g


@dataclass(frozen=True)
class PagedCase:
    """sdpa over a paged KV cache: K and V page pools ``[pages, hk, page_size, d(v)]``, page
    tables ``[b, 1, max_pages, 1]`` and each sequence's length; :meth:`feeds` fills them with
    shuffled pages and ragged lengths (1, odd, the longest), :meth:`dense` is the same
    attention on the gathered K/V."""

    b: int = 3
    hq: int = 8
    hk: int = 2
    sq: int = 1
    max_len: int = 100  # Skv, paged_attention_max_seq_len_kv
    page_size: int = 16
    d: int = 64
    dv: int = 64
    data_type: DataType = DataType.BFLOAT16
    options: dict[str, Any] = field(default_factory=lambda: {"use_causal_mask_bottom_right": True})
    stats: bool = True
    layout: str = "hnd"  # the pools' layout: [page, head, row, d], or "nhd": [page, row, head, d] (vLLM's)
    dropout: float | None = None  # the drop rate, with constant seed and offset
    batch_max: int | None = None  # a dynamic graph: the batch is symbol 'batch' in 1..batch_max (feeds: b of them)

    @property
    def max_pages(self) -> int:
        return -(-self.max_len // self.page_size)

    @property
    def pages(self) -> int:
        return (self.batch_max or self.b) * self.max_pages + 3  # spare pages no table names

    def build(self) -> gd.OperationGraphSpec:
        g, q, seq_q, seq_kv = self._common("paged_attention")
        k, v = (
            g.tensor(name=n, dim=[self.pages, self.hk, self.page_size, w], stride=self._pool_strides(w))
            for n, w in (("k", self.d), ("v", self.dv))
        )
        b = q.dim[0]
        tables = [g.tensor(name=n, dim=[b, 1, self.max_pages, 1], data_type=DataType.INT32) for n in ("tk", "tv")]
        o, stats = g.sdpa(
            q, k, v, attn_scale=self.d**-0.5, use_padding_mask=True, seq_len_q=seq_q, seq_len_kv=seq_kv,
            generate_stats=self.stats, paged_attention_k_table=tables[0], paged_attention_v_table=tables[1],
            paged_attention_max_seq_len_kv=self.max_len, name="attention", **self.options, **self._dropout(),
        )  # fmt: skip
        return self._outputs(g, o, stats)

    def dense(self) -> gd.OperationGraphSpec:
        g, q, seq_q, seq_kv = self._common("dense_attention")
        k = g.tensor(name="k", dim=[self.b, self.hk, self.max_len, self.d])
        v = g.tensor(name="v", dim=[self.b, self.hk, self.max_len, self.dv])
        o, stats = g.sdpa(
            q, k, v, attn_scale=self.d**-0.5, use_padding_mask=True, seq_len_q=seq_q, seq_len_kv=seq_kv,
            generate_stats=self.stats, name="attention", **self.options, **self._dropout(),
        )  # fmt: skip
        return self._outputs(g, o, stats)

    def _dropout(self) -> dict[str, Any]:
        return {} if self.dropout is None else {"dropout": (self.dropout, 1234, 5)}

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        """Random Q and pools; each table a shuffle of the pool's pages; lengths 1, odd, longest."""
        rng = np.random.default_rng(seed)
        lengths = [1, self.max_len - (1 - self.max_len % 2), self.max_len][: self.b]
        lengths += list(rng.integers(1, self.max_len + 1, self.b - len(lengths)))
        table_shape = (self.b, 1, self.max_pages, 1)
        return {
            "q": rng.standard_normal((self.b, self.hq, self.sq, self.d)).astype(self.data_type.numpy),
            "k": rng.standard_normal((self.pages, self.hk, self.page_size, self.d)).astype(self.data_type.numpy),
            "v": rng.standard_normal((self.pages, self.hk, self.page_size, self.dv)).astype(self.data_type.numpy),
            "tk": rng.permutation(self.pages)[: self.b * self.max_pages].reshape(table_shape).astype(np.int32),
            "tv": rng.permutation(self.pages)[: self.b * self.max_pages].reshape(table_shape).astype(np.int32),
            "seq_q": np.full((self.b, 1, 1, 1), self.sq, dtype=np.int32),
            "seq_kv": np.array(lengths, dtype=np.int32).reshape(self.b, 1, 1, 1),
        }

    def _pool_strides(self, width: int) -> list[int]:
        if self.layout == "nhd":
            return [self.page_size * self.hk * width, width, self.hk * width, 1]
        return [self.hk * self.page_size * width, self.page_size * width, width, 1]

    def _common(self, name: str) -> tuple[gd.OperationGraphSpec, gd.TensorSpec, gd.TensorSpec, gd.TensorSpec]:
        g = gd.OperationGraphSpec(name=name, io_data_type=self.data_type, compute_data_type=DataType.FLOAT)
        b = g.dim("batch", 1, self.batch_max) if self.batch_max is not None else self.b
        q = g.tensor(name="q", dim=[b, self.hq, self.sq, self.d])
        seq_q = g.tensor(name="seq_q", dim=[b, 1, 1, 1], data_type=DataType.INT32)
        seq_kv = g.tensor(name="seq_kv", dim=[b, 1, 1, 1], data_type=DataType.INT32)
        return g, q, seq_q, seq_kv

    def _outputs(
        self, g: gd.OperationGraphSpec, o: gd.TensorSpec, stats: gd.TensorSpec | None
    ) -> gd.OperationGraphSpec:
        o.set_output(True).set_name("o")
        if stats is not None:
            stats.set_output(True).set_name("stats")
        return g


def gathered(case: PagedCase, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dense graph's feeds: each sequence's pages gathered in table order (zero past its length)."""
    dense = {name: feeds[name] for name in ("q", "seq_q", "seq_kv")}
    for pool, table in (("k", "tk"), ("v", "tv")):
        rows = feeds[table][:, 0, :, 0]  # [b, max_pages]
        pages = feeds[pool][rows]  # [b, max_pages, hk, page_size, d]
        full = pages.transpose(0, 2, 1, 3, 4).reshape(case.b, case.hk, case.max_pages * case.page_size, -1)
        keep = np.arange(case.max_len)[None, None, :, None] < feeds["seq_kv"].reshape(case.b, 1, 1, 1)
        dense[pool] = np.where(keep, full[:, :, : case.max_len], 0).astype(case.data_type.numpy)
    return dense


PAGED_CASES = {
    "decode_gqa_4to1": PagedCase(),
    "decode_mha_page_64": PagedCase(hq=4, hk=4, page_size=64, max_len=200),
    "decode_mqa_8to1_d128": PagedCase(b=1, hq=8, hk=1, d=128, dv=128, max_len=1000),
    "decode_no_mask_fp16": PagedCase(data_type=DataType.HALF, options={}),
    "prefill_chunk_causal": PagedCase(b=2, hq=4, hk=2, sq=5, max_len=77, page_size=16),
    "decode_nhd_pools": PagedCase(b=2, hq=8, hk=4, max_len=130, page_size=32, d=128, dv=128, layout="nhd"),
    "prefill_long_q": PagedCase(b=2, hq=2, hk=1, sq=40, max_len=50, page_size=16, d=32, dv=48),
    "sliding_window": PagedCase(
        options={"use_causal_mask_bottom_right": True, "sliding_window_length": 20}, max_len=90
    ),
    "prefill_dropout": PagedCase(b=2, hq=4, hk=2, sq=3, max_len=77, page_size=16, dropout=0.5),
}

# Dense attention with few query rows: the decode kernel, as paged attention.
DECODE_CASES = {
    "mqa_long": AttentionCase(b=1, hq=8, hk=1, sq=1, skv=5000, d=128, dv=128, stats=True),
    "gqa_bshd_padded": AttentionCase(
        b=3,
        hq=32,
        hk=8,
        sq=1,
        skv=777,
        d=128,
        dv=128,
        layout="bshd",
        padding=True,
        options={"use_causal_mask_bottom_right": True},
    ),
    "two_tokens_alibi_bias": AttentionCase(
        b=2,
        hq=4,
        hk=2,
        sq=2,
        skv=300,
        bias=(True, True, False, True),
        options={"use_causal_mask_bottom_right": True, "use_alibi_mask": True},
    ),
    "fp32_d72": AttentionCase(b=2, hq=6, hk=3, sq=3, skv=129, d=72, dv=40, data_type=DataType.FLOAT),
}


@dataclass(frozen=True)
class RaggedCase:
    """Packed sequences (THD: ``[1, H, T, d]``, token stride H*d) with cu_seqlens offsets; Q and
    K/V each packed or padded. ``lengths_q`` / ``lengths_kv``: each sequence's rows; ``spare``
    tokens follow the last sequence (no one owns them); ``short`` rows of each range unused
    (SEQ_LEN below the owned rows)."""

    lengths_q: tuple[int, ...] = (5, 0, 130, 1)
    lengths_kv: tuple[int, ...] = (7, 3, 129, 64)
    hq: int = 4
    hk: int = 2
    d: int = 64
    dv: int = 64
    data_type: DataType = DataType.BFLOAT16
    packed_kv: bool = True
    spare: int = 3
    short: int = 1
    stats: bool = True
    options: dict[str, Any] = field(default_factory=lambda: {"use_causal_mask_bottom_right": True})

    @property
    def b(self) -> int:
        return len(self.lengths_q)

    def tokens(self, lengths: tuple[int, ...]) -> int:
        return sum(lengths) + self.spare

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(
            name="ragged_attention", io_data_type=self.data_type, compute_data_type=DataType.FLOAT
        )
        q, k, v, extra = self.inputs(g)
        o, stats = g.sdpa(q, k, v, generate_stats=self.stats, name="attention", **extra)
        o.set_output(True).set_name("o")
        if stats is not None:
            stats.set_output(True).set_name("stats")
        return g

    def packed(self, g: gd.OperationGraphSpec, name: str, heads: int, tokens: int, width: int) -> gd.TensorSpec:
        """A packed ``[1, heads, tokens, width]`` tensor in THD order."""
        return g.tensor(
            name=name, dim=[1, heads, tokens, width], stride=[tokens * heads * width, width, heads * width, 1]
        )

    def inputs(self, g: gd.OperationGraphSpec) -> tuple[gd.TensorSpec, gd.TensorSpec, gd.TensorSpec, dict[str, Any]]:
        """Q, K, V and the arguments sdpa and sdpa_backward share (scale, lengths, offsets, options)."""
        tq, tkv = self.tokens(self.lengths_q), self.tokens(self.lengths_kv)
        q = self.packed(g, "q", self.hq, tq, self.d)
        if self.packed_kv:
            k, v = (self.packed(g, n, self.hk, tkv, w) for n, w in (("k", self.d), ("v", self.dv)))
        else:
            skv = max(self.lengths_kv)
            k, v = (g.tensor(name=n, dim=[self.b, self.hk, skv, w]) for n, w in (("k", self.d), ("v", self.dv)))
        lengths = [g.tensor(name=n, dim=[self.b, 1, 1, 1], data_type=DataType.INT32) for n in ("seq_q", "seq_kv")]
        sides = ("cu_q", "cu_kv") if self.packed_kv else ("cu_q",)
        offsets = [g.tensor(name=n, dim=[self.b + 1, 1, 1, 1], data_type=DataType.INT32) for n in sides]
        extra = {"attn_scale": self.d**-0.5, "use_padding_mask": True, "seq_len_q": lengths[0]}
        extra |= {"seq_len_kv": lengths[1], "ragged_offset_q": offsets[0]}
        extra |= {"ragged_offset_kv": offsets[-1] if self.packed_kv else None}
        return q, k, v, extra | self.options

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        tq, tkv = self.tokens(self.lengths_q), self.tokens(self.lengths_kv)
        kv_rows = (1, tkv) if self.packed_kv else (self.b, max(self.lengths_kv))
        feeds = {
            "q": rng.standard_normal((1, self.hq, tq, self.d)),
            "k": rng.standard_normal((kv_rows[0], self.hk, kv_rows[1], self.d)),
            "v": rng.standard_normal((kv_rows[0], self.hk, kv_rows[1], self.dv)),
        }
        feeds = {name: value.astype(self.data_type.numpy) for name, value in feeds.items()}
        for side, lengths in (("q", self.lengths_q), ("kv", self.lengths_kv)):
            if side == "q" or self.packed_kv:
                feeds[f"cu_{side}"] = np.cumsum((0, *lengths), dtype=np.int32).reshape(-1, 1, 1, 1)
            used = [max(0, n - self.short) for n in lengths]
            feeds[f"seq_{side}"] = np.array(used, dtype=np.int32).reshape(-1, 1, 1, 1)
        return feeds


RAGGED_CASES = {
    "packed_qkv_causal": RaggedCase(),
    "packed_q_padded_kv": RaggedCase(packed_kv=False, options={"use_causal_mask": True}),
    "gqa_8to1_d128_no_mask": RaggedCase(hq=8, hk=1, d=128, dv=128, options={}, data_type=DataType.HALF),
    "d72_dv40_window": RaggedCase(d=72, dv=40, options={"use_causal_mask": True, "sliding_window_length": 9}),
    "fp32_simt": RaggedCase(lengths_q=(3, 17, 0), lengths_kv=(4, 17, 2), data_type=DataType.FLOAT, d=40, dv=24),
    "one_sequence_no_spare": RaggedCase(lengths_q=(200,), lengths_kv=(200,), spare=0, short=0, options={}),
    "max_rows_130": RaggedCase(options={"use_causal_mask": True, "max_seq_len_q": 130}),
    "max_rows_cut_to_100": RaggedCase(data_type=DataType.HALF, options={"max_seq_len_q": 100}),
    "max_rows_simt": RaggedCase(
        lengths_q=(3, 17, 0), lengths_kv=(4, 17, 2), data_type=DataType.FLOAT, options={"max_seq_len_q": 9}
    ),
}


def offsets_out_of_order(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """packed_qkv_causal's feeds with its offsets clamped, overlapping and shuffled (the ownership rule)."""
    cu_q = np.array([70, 0, 5, 200, 139], np.int32).reshape(-1, 1, 1, 1)
    return feeds | {"cu_q": cu_q, "cu_kv": np.array([3, 50, 10, 77, 204], np.int32).reshape(-1, 1, 1, 1)}
