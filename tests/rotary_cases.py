"""RoPE on sdpa's Q and K written from primitives, with knobs for the forms the rotary_attention
rule takes and the near misses it refuses: used by the CPU tests of the rule and the GPU tests
of the kernels."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import graphdnn as gd
from graphdnn.dtypes import DataType


@dataclass(frozen=True)
class RopeForm:
    """How one RoPE is written; the defaults are Llama's rotate-half form in float factors."""

    theta: float = 10000.0
    negated: bool = False  # concatenate([-x2, x1]) and a plain sin, instead of [x2, x1] and a signed sin
    factor_type: DataType = DataType.FLOAT  # the factors' type (bfloat16 loses RoPE's precision)
    swap: tuple[int, int] = (1, 0)  # which halves the concatenate joins, in order (RoPE's: second, first)
    position_axis: int = 2  # gen_index's axis for the positions (2 is RoPE's)
    tables: int = 0  # cos and sin given as tensors of this rank ([S, D] or [1, 1, S, D]); 0: from gen_index


def rope(g: gd.OperationGraphSpec, x: gd.TensorSpec, form: RopeForm, name: str) -> gd.TensorSpec:
    """``x cos + rotate_half(x) sin`` of ``x`` [B, H, S, D] at positions 0..S-1."""
    d = x.dim[3]
    half = d // 2

    def typed(t: gd.TensorSpec) -> gd.TensorSpec:
        return t.set_data_type(form.factor_type)

    if form.tables:
        dims = [1, 1, x.dim[2], d][4 - form.tables :]
        cos, sin = (g.tensor(dims, name=f"{name}.{f}", data_type=form.factor_type) for f in ("cos", "sin"))
        return _combine(g, x, cos, sin, form, name)

    position = g.gen_index(x, form.position_axis, name=f"{name}.position")
    column = g.gen_index(x, 3, name=f"{name}.column")
    frequency = typed(g.mod(column, half, name=f"{name}.frequency"))
    exponent = typed(g.mul(frequency, -2.0 * math.log(form.theta) / d, name=f"{name}.exponent"))
    angle = typed(g.mul(position, typed(g.exp(exponent, name=f"{name}.inv_freq")), name=f"{name}.angle"))
    sin = typed(g.sin(angle, name=f"{name}.sin"))
    if not form.negated:
        first = g.cmp_lt(column, half, name=f"{name}.first_half")
        sign = typed(g.add(typed(g.mul(first, -2.0, name=f"{name}.minus_two")), 1.0, name=f"{name}.sign"))
        sin = typed(g.mul(sin, sign, name=f"{name}.signed_sin"))
    return _combine(g, x, typed(g.cos(angle, name=f"{name}.cos")), sin, form, name)


def _combine(
    g: gd.OperationGraphSpec, x: gd.TensorSpec, cos: gd.TensorSpec, sin: gd.TensorSpec, form: RopeForm, name: str
) -> gd.TensorSpec:
    """``x cos + swap(x) sin``: swap(x) the concatenate of x's halves (the second negated when
    ``form.negated``)."""
    d = x.dim[3]
    half = d // 2
    halves = [
        g.slice(x, [slice(None)] * 3 + [slice(0, half)], name=f"{name}.x1"),
        g.slice(x, [slice(None)] * 3 + [slice(half, d)], name=f"{name}.x2"),
    ]
    parts = [halves[i] for i in form.swap]
    if form.negated:
        parts[0] = g.neg(parts[0], name=f"{name}.minus_x2")
    rotated = g.concatenate(parts, axis=3, name=f"{name}.swap")
    x_cos = g.mul(x, cos, name=f"{name}.x_cos").set_data_type(form.factor_type)
    rot_sin = g.mul(rotated, sin, name=f"{name}.rot_sin").set_data_type(form.factor_type)
    return g.add(x_cos, rot_sin, name=name).set_data_type(x.data_type)


TABLES = RopeForm(negated=True, tables=4)  # torch's form: x cos + [-x2, x1] sin, cos and sin given


@dataclass(frozen=True)
class RotaryCase:
    b: int = 2
    hq: int = 4
    hk: int = 2
    sq: int = 37
    skv: int = 37
    d: int = 64
    data_type: DataType = DataType.BFLOAT16
    q: RopeForm | None = field(default_factory=RopeForm)  # None: no RoPE on that operand
    k: RopeForm | None = field(default_factory=RopeForm)
    options: dict[str, Any] = field(default_factory=lambda: {"use_causal_mask": True})
    expose_q_rope: bool = False  # Q's RoPE output is a graph output too

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(io_data_type=self.data_type, compute_data_type=DataType.FLOAT, name="rope_attention")
        q = g.tensor([self.b, self.hq, self.sq, self.d], name="q")
        k = g.tensor([self.b, self.hk, self.skv, self.d], name="k")
        v = g.tensor([self.b, self.hk, self.skv, self.d], name="v")
        q_in = q if self.q is None else rope(g, q, self.q, "q_rope")
        if self.expose_q_rope:
            q_in.set_output(True)
        k_in = k if self.k is None else rope(g, k, self.k, "k_rope")
        o, _ = g.sdpa(q_in, k_in, v, attn_scale=1.0 / math.sqrt(self.d), name="attention", **self.options)
        o.set_output(True).set_name("o")
        return g


GPU_CASES = {
    "odd_gqa_causal_d128": RotaryCase(b=2, hq=8, hk=2, sq=133, skv=133, d=128),
    "d64_fp16_not_causal": RotaryCase(b=1, hq=4, hk=4, sq=77, skv=77, d=64, data_type=DataType.HALF, options={}),
    "q_only_bottom_right": RotaryCase(
        hq=4, hk=1, sq=50, skv=201, d=128, k=None, options={"use_causal_mask_bottom_right": True}
    ),
    "k_only_negated_theta_500k": RotaryCase(sq=65, skv=300, q=None, k=RopeForm(theta=500000.0, negated=True)),
    "decode_gqa": RotaryCase(b=3, hq=8, hk=2, sq=1, skv=517, d=128, options={}),
    "fp32_simt": RotaryCase(sq=20, skv=33, d=32, data_type=DataType.FLOAT, options={}),
    "tables_gqa_causal": RotaryCase(b=2, hq=8, hk=2, sq=100, skv=100, d=128, q=TABLES, k=TABLES),
    "tables_decode_bf16": RotaryCase(
        b=3,
        hq=8,
        hk=2,
        sq=1,
        skv=300,
        d=64,
        q=RopeForm(negated=True, tables=2, factor_type=DataType.BFLOAT16),
        k=RopeForm(negated=True, tables=2, factor_type=DataType.BFLOAT16),
        options={},
    ),
}
