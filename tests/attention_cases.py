"""Attention graphs on awkward shapes, masks, layouts and types: compiled for sm_80 and sm_90 on
every machine (test_codegen_attention.py) and run against the reference on a GPU
(test_gpu_attention.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    layout: str = "bhsd"  # or "bshd": sequence-major rows, heads interleaved
    scale: str = "constant"  # "constant", "runtime" (pass-by-value) or "none"
    bias: tuple[int, int, int, int] | None = None  # which dims of [B, Hq, Sq, Skv] the bias has
    padding: bool = False
    stats: bool = True
    options: dict[str, Any] = field(default_factory=dict)

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
        q = g.tensor(name="q", dim=[self.b, self.hq, self.sq, self.d], stride=self._strides(self.hq, self.sq, self.d))
        k = g.tensor(
            name="k",
            dim=[self.b, self.hk, self.skv, self.d],
            stride=self._strides(self.hk, self.skv, self.d),
            data_type=kv_type,
        )
        v = g.tensor(
            name="v",
            dim=[self.b, self.hk, self.skv, self.dv],
            stride=self._strides(self.hk, self.skv, self.dv),
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
            full = (self.b, self.hq, self.sq, self.skv)
            extra["bias"] = g.tensor(name="bias", dim=[n if keep else 1 for n, keep in zip(full, self.bias)])
        if self.padding:
            extra["use_padding_mask"] = True
            extra["seq_len_q"] = g.tensor(name="seq_q", dim=[self.b, 1, 1, 1], data_type=DataType.INT32)
            extra["seq_len_kv"] = g.tensor(name="seq_kv", dim=[self.b, 1, 1, 1], data_type=DataType.INT32)
        return q, k, v, extra

    def _strides(self, heads: int, seq: int, width: int) -> list[int]:
        if self.layout == "bshd":
            return [seq * heads * width, width, heads * width, 1]
        return [heads * seq * width, seq * width, width, 1]


CASES = {
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
}


def self_attention(data_type: DataType) -> gd.OperationGraphSpec:
    """One tensor as Q, K and V (the kernel takes it once)."""
    g = gd.OperationGraphSpec(name="self_attention", io_data_type=data_type)
    x = g.tensor(name="x", dim=[2, 2, 33, 64])
    o, _ = g.sdpa(x, x, x, attn_scale=0.125, use_causal_mask=True)
    o.set_output(True).set_name("o")
    return g
