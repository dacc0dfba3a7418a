"""The ``attention`` rule: attention written from primitives becomes one sdpa-anchored kernel.

Each hand-written form (Kᵀ by strides or by a transpose, the scale after the first matmul
or on Q, with or without a bias, one K/V head for all query heads, a causal mask from
gen_index, a comparison and binary_select of -inf) fuses into one
ATTENTION node whose synthesized ``sdpa`` anchor computes what an explicit ``sdpa`` graph
computes (to 1e-10: the same float64 definition on the same values) and what the primitive
chain computes (to 1e-5: the chain rounds its float intermediates, the kernel does not).
Near misses stay unfused, with the reason in the rejection log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from fusion_rules import Family, Partition, Rejection
from fusion_rules.partition_reference import execute_partition
from graphdnn.lower import lower
from graphdnn.signature import signature
from tests.graph_strategies import random_feeds
from tests.test_fusion_property import check_partition, relative_error


@dataclass(frozen=True)
class Form:
    """One way of writing attention: O = softmax(scale · Q Kᵀ + bias) V."""

    b: int = 2
    h: int = 3
    hk: int = 3  # K and V heads (1: every query head reads the one head, by broadcasting)
    sq: int = 5
    skv: int = 7
    d: int = 4
    dv: int = 6
    k_form: str = "strides"  # "strides": Kᵀ a strided view; "transpose": a transpose of K; "bshd": of [B, S, H, D]
    scale: str | None = "constant"  # "constant", "tensor" (a one-element input), "pre" (Q scaled first), None
    bias: tuple[int, ...] | None = (1, 1, 5, 7)
    axis: int = -1
    io: str = "float"
    intermediate: str = "float"
    causal: str | None = None  # "top_left" (j <= i) or "bottom_right" (j <= i + Skv - Sq)
    compare: str = "ge"  # how the mask is written: see _masked
    window: int | None = None  # with a causal mask: sdpa's sliding_window_length

    @property
    def offset(self) -> int:
        """c in the mask j <= i + c."""
        return self.skv - self.sq if self.causal == "bottom_right" else 0

    def build(self, sdpa: bool = False) -> gd.OperationGraphSpec:
        """The primitive chain, or (``sdpa``) the same attention as one explicit sdpa op."""
        g = gd.OperationGraphSpec(name="attn", io_data_type=self.io, intermediate_data_type=self.intermediate)
        q = g.tensor(name="q", dim=[self.b, self.h, self.sq, self.d])
        v = g.tensor(name="v", dim=[self.b, self.hk, self.skv, self.dv])
        scale = g.tensor(name="s", dim=[1, 1, 1, 1]) if self.scale in ("tensor", "pre") else 0.125
        bias = None if self.bias is None else g.tensor(name="bias", dim=list(self.bias))
        if sdpa:
            k = self._k_for_sdpa(g)
            top_left, bottom_right = self.causal == "top_left", self.causal == "bottom_right"
            o = g.sdpa(
                q,
                k,
                v,
                attn_scale=scale if self.scale else None,
                bias=bias,
                use_causal_mask=top_left,
                use_causal_mask_bottom_right=bottom_right,
                sliding_window_length=self.window,
                name="attn",
            )[0]
            o.set_name("o").set_output(True)
            return g
        if self.scale == "pre":
            q = g.mul(q, scale, name="qscale")
        s = g.matmul(q, self._kt(g), name="qk")
        if self.scale in ("constant", "tensor"):
            s = g.mul(s, scale, name="scale")
        if bias is not None:
            s = g.add(s, bias, name="bias_add")
        if self.causal is not None:
            s = self._masked(g, s)
        p = g.softmax(s, axis=self.axis, name="sm")
        p.set_name("p")
        g.matmul(p, v, name="pv").set_name("o").set_output(True)
        return g

    def _masked(self, g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        """s with keys j > i + c hidden, written one of the ways a user would:
        ge: keep = i + c >= j; le: keep = j <= i + c; gt: keep = i + c + 1 > j; lt: keep = j < i + c + 1;
        hide: -inf where j > i + c (binary_select picks input0 where the mask is non-zero);
        sub: keep = i >= j - c. A window also keeps only j > i + c - window: logical_and of that
        comparison (logical_or of its negation where hide)."""
        index_row, index_col = g.gen_index(s, axis=-2, name="row"), g.gen_index(s, axis=-1, name="col")
        row, col = index_row, index_col
        c = self.offset + (1 if self.compare in ("gt", "lt") else 0)
        if self.compare == "sub" and c:
            col = g.sub(col, float(c), name="offset")
        elif c:
            row = g.add(float(c), row, name="offset")
        start = (
            g.add(index_row, float(self.offset - self.window), name="start") if self.window is not None else index_row
        )
        if self.compare == "hide":
            hide = g.cmp_gt(col, row, name="keep")
            if self.window is not None:
                hide = g.logical_or(hide, g.cmp_le(index_col, start, name="window"), name="both")
            return g.binary_select(float("-inf"), s, hide, name="mask")
        compare = {"ge": g.cmp_ge, "gt": g.cmp_gt, "sub": g.cmp_ge, "le": g.cmp_le, "lt": g.cmp_lt}[self.compare]
        keep = compare(row, col, name="keep") if self.compare in ("ge", "gt", "sub") else compare(col, row, name="keep")
        if self.window is not None:
            keep = g.logical_and(g.cmp_gt(index_col, start, name="window"), keep, name="both")
        return g.binary_select(s, float("-inf"), keep, name="mask")

    def _kt(self, g: gd.OperationGraphSpec) -> gd.TensorSpec:
        b, hk, skv, d = self.b, self.hk, self.skv, self.d
        if self.k_form == "strides":  # [B, H, D, Skv] over a row-major [B, H, Skv, D] buffer
            return g.tensor(name="k", dim=[b, hk, d, skv], stride=[hk * skv * d, skv * d, 1, d])
        if self.k_form == "transpose":
            return g.transpose(g.tensor(name="k", dim=[b, hk, skv, d]), [0, 1, 3, 2], name="kt")
        return g.transpose(g.tensor(name="k", dim=[b, skv, hk, d]), [0, 2, 3, 1], name="kt")

    def _k_for_sdpa(self, g: gd.OperationGraphSpec) -> gd.TensorSpec:
        b, hk, skv, d = self.b, self.hk, self.skv, self.d
        if self.k_form == "bshd":  # the same memory, read as [B, H, S, D] through its strides
            return g.tensor(name="k", dim=[b, hk, skv, d], stride=[skv * hk * d, d, hk * d, 1])
        return g.tensor(name="k", dim=[b, hk, skv, d])

    def sdpa_feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The chain's feeds for the explicit sdpa graph (the same values)."""
        out = dict(feeds)
        if self.k_form == "strides":
            out["k"] = np.ascontiguousarray(feeds["k"].swapaxes(-1, -2))
        elif self.k_form == "bshd":
            out["k"] = feeds["k"].transpose(0, 2, 1, 3)
        return out


def attention_nodes(partition: Partition) -> list[str]:
    return [f.name for f in partition.nodes if f.family is Family.ATTENTION]


def check_fused(form: Form, seed: int = 0) -> Partition:
    """``form`` fuses into one ATTENTION node equivalent to the explicit sdpa and to the chain."""
    ir = form.build().validate()
    partition = gd.fuse(ir)
    check_partition(partition)
    (fused,) = partition.nodes
    assert (fused.family, fused.rule, fused.synthesized) == (Family.ATTENTION, "attention", True)
    assert fused.anchor is not None and fused.anchor.op == "sdpa"
    assert [t.name for t in fused.outputs] == ["o"]
    feeds = random_feeds(ir, seed)
    got = execute_partition(partition, feeds)["o"]
    explicit = form.build(sdpa=True)
    want = gd.reference.execute(explicit, form.sdpa_feeds({k: np.asarray(v) for k, v in feeds.items()}))["o"]
    assert relative_error(got, want) <= 1e-10
    assert relative_error(got, gd.reference.execute(ir, feeds)["o"]) <= 1e-5
    return partition


FORMS = {
    "strided_kt_constant_scale_bias": Form(),
    "transposed_k": Form(k_form="transpose"),
    "bshd_k_through_a_transpose": Form(k_form="bshd"),
    "scale_tensor": Form(scale="tensor", bias=(2, 3, 5, 7)),
    "q_scaled_first": Form(scale="pre"),
    "no_scale_no_bias": Form(scale=None, bias=None),
    "one_kv_head": Form(hk=1, bias=(1, 3, 1, 7)),
    "half_io_float_intermediates": Form(io="half"),
    "half_intermediates": Form(io="half", intermediate="half"),
    "causal_cmp_ge": Form(causal="top_left"),
    "causal_cmp_le": Form(causal="top_left", compare="le", bias=None),
    "causal_cmp_gt_by_one": Form(causal="top_left", compare="gt", scale="pre"),
    "causal_cmp_lt_by_one": Form(causal="top_left", compare="lt", k_form="transpose"),
    "causal_hidden_where_set": Form(causal="top_left", compare="hide"),
    "causal_more_queries_than_keys": Form(causal="top_left", sq=9, skv=4, bias=None),
    "bottom_right_cmp_ge": Form(causal="bottom_right"),
    "bottom_right_cmp_lt": Form(causal="bottom_right", compare="lt", scale=None),
    "bottom_right_hidden_where_set": Form(causal="bottom_right", compare="hide", hk=1, bias=(1, 3, 1, 7)),
    "bottom_right_offset_on_the_keys": Form(causal="bottom_right", compare="sub"),
    "bottom_right_half": Form(causal="bottom_right", io="half"),
    "sliding_window": Form(causal="top_left", window=2),
    "sliding_window_hidden_where_set": Form(causal="top_left", compare="hide", window=3),
    "sliding_window_bottom_right": Form(causal="bottom_right", compare="lt", window=1),
    "sliding_window_more_queries_than_keys": Form(causal="top_left", sq=9, skv=4, window=6, bias=None),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_each_form_is_one_attention_node(name: str) -> None:
    form = FORMS[name]
    if form.io == "float":
        check_fused(form)
        return
    partition = gd.fuse(form.build())  # half: the sdpa reference and the chain differ by half roundings
    (fused,) = partition.nodes
    assert fused.family is Family.ATTENTION and fused.synthesized


def test_describe_shows_the_synthesized_sdpa_and_the_k_view() -> None:
    text = gd.fuse(Form().build()).describe()
    assert text.splitlines()[:5] == [
        "partition of 'attn': 5 nodes -> 1 fused nodes",
        "  attention_0 [attention, rule attention]: qk, scale, bias_add, sm, pv",
        "    computes sdpa(Q=q, K=k viewed as [2, 3, 7, 4] strides [84, 28, 4, 1], V=v, ATTN_SCALE=0.125, "
        "BIAS=bias) -> o",
        "    reads  q, k, bias, v",
        "    writes o",
    ]


def test_the_transpose_joins_and_its_input_is_read_as_k() -> None:
    partition = gd.fuse(Form(k_form="bshd").build())
    (fused,) = partition.nodes
    assert [n.name for n in fused.nodes] == ["kt", "qk", "scale", "bias_add", "sm", "pv"]
    assert fused.anchor is not None
    k = fused.anchor.input("K")
    assert k is not None and (k.name, k.dim, k.stride) == ("k", (2, 3, 7, 4), (84, 4, 12, 1))


def test_a_transpose_read_elsewhere_stays_and_its_output_is_viewed() -> None:
    g = Form(k_form="transpose").build()
    g.relu(g.tensor_named("kt::y"), name="other").set_output(True)
    partition = gd.fuse(g)
    (attention,) = [f for f in partition.nodes if f.family is Family.ATTENTION]
    assert "kt" not in [n.name for n in attention.nodes]
    assert attention.anchor is not None and attention.anchor.input("K").name == "kt::y"  # type: ignore[union-attr]
    feeds = random_feeds(g.validate(), 1)
    assert relative_error(execute_partition(partition, feeds)["o"], gd.reference.execute(g, feeds)["o"]) <= 1e-5


def test_the_fused_node_lowers_to_one_attention_kernel() -> None:
    ir = Form().build().validate()
    (source,) = lower(gd.fuse(ir, arch=90), 90, signature(ir), lambda h: h).sources.values()
    assert "_simt" in source.name and "score" in source.source
    ir = Form(io="half").build().validate()
    (source,) = lower(gd.fuse(ir, arch=90), 90, signature(ir), lambda h: h).sources.values()
    assert "_flash" in source.name


def test_disable_by_name_leaves_the_primitive_kernels() -> None:
    partition = gd.fuse(Form().build(), disable=["attention"])
    assert attention_nodes(partition) == []
    assert len(partition.nodes) > 1


# -- near misses ------------------------------------------------------------------------------
CHAIN = ("qk", "scale", "bias_add", "sm", "pv")


def rejected(g: gd.OperationGraphSpec) -> tuple[Partition, list[Rejection]]:
    partition = gd.fuse(g)
    assert attention_nodes(partition) == []
    return partition, [r for r in partition.rejections if r.rule == "attention"]


def test_softmax_over_another_axis_is_not_attention() -> None:
    _, log = rejected(Form(axis=2).build())
    assert log == [
        Rejection("attention", CHAIN, "sm normalizes axis 2 of the scores [2, 3, 5, 7], not the last (keys)")
    ]


def test_probabilities_marked_as_an_output_stay_in_memory() -> None:
    g = Form().build()
    g.tensor_named("p").set_output(True)
    _, log = rejected(g)
    assert log == [Rejection("attention", ("sm", "pv"), "sm's output 'p' is a graph output")]


def test_scores_read_elsewhere_stay_in_memory() -> None:
    g = Form().build()
    g.reduction(g.tensor_named("qk::C"), mode="max", axes=[3], name="peek").set_output(True)
    _, log = rejected(g)
    assert log == [Rejection("attention", CHAIN, "qk's output is also read by peek")]


def test_a_bias_that_is_not_rank_4_is_refused() -> None:
    _, log = rejected(Form(bias=(5, 7)).build())
    assert log == [
        Rejection(
            "attention",
            CHAIN,
            "bias_add's operand 'bias' has dims [5, 7]; an sdpa bias has rank 4, each dim 1 or that of the "
            "scores [2, 3, 5, 7]",
        )
    ]


def test_query_heads_broadcast_against_key_heads_are_refused() -> None:
    g = Form(h=1, hk=3, bias=None).build()
    _, log = rejected(g)
    assert log == [
        Rejection(
            "attention",
            ("qk", "scale", "sm", "pv"),
            "Q has 1 heads and K, V 3: broadcasting matches sdpa's grouping (query head h reads h // (Hq / Hk)) "
            "only when Hk = Hq or Hk = 1",
        )
    ]


def test_double_intermediates_are_refused() -> None:
    _, log = rejected(Form(intermediate="double").build())
    assert log == [
        Rejection(
            "attention",
            CHAIN,
            "qk's output 'qk::C' is double; the attention kernel keeps scores in float and probabilities in the "
            "input type, so only float, half and bfloat16 intermediates keep their accuracy",
        )
    ]


def test_a_scale_of_many_elements_is_refused() -> None:
    g = gd.OperationGraphSpec(name="attn", io_data_type="float")
    q, kt, v = (
        g.tensor(name=n, dim=dims) for n, dims in (("q", [1, 2, 3, 4]), ("kt", [1, 2, 4, 5]), ("v", [1, 2, 5, 4]))
    )
    m = g.tensor(name="m", dim=[1, 1, 3, 5])
    g.matmul(g.softmax(g.mul(g.matmul(q, kt, name="qk"), m, name="mask"), name="sm"), v, name="pv").set_output(True)
    _, log = rejected(g)
    assert log == [
        Rejection(
            "attention",
            ("qk", "mask", "sm", "pv"),
            "mask's operand 'm' has dims [1, 1, 3, 5], not one element (an attention scale)",
        )
    ]


# -- random forms -----------------------------------------------------------------------------
@st.composite
def forms(draw: st.DrawFn) -> Form:
    b, h, sq, skv = (draw(st.integers(1, 4)) for _ in range(4))
    hk = draw(st.sampled_from([1, h]))
    scores = (b, h, sq, skv)
    bias = draw(st.none() | st.tuples(*(st.sampled_from([1, s]) for s in scores)))
    # bottom right only where every row keeps a key (Skv >= Sq): other masks are refused
    causal = draw(st.sampled_from([None, "top_left", *(["bottom_right"] if skv >= sq else [])]))
    # a window leaves every row a key when it reaches back to key Skv - 1 from the last row (top left)
    window = draw(st.none() | st.integers(max(1, sq - skv + 1) if causal == "top_left" else 1, sq + skv))
    return Form(
        b=b,
        h=h,
        hk=hk,
        sq=sq,
        skv=skv,
        d=draw(st.integers(1, 9)),
        dv=draw(st.integers(1, 9)),
        k_form=draw(st.sampled_from(["strides", "transpose", "bshd"])),
        scale=draw(st.sampled_from(["constant", "tensor", "pre", None])),
        bias=bias,
        causal=causal,
        window=window if causal else None,
        compare=draw(st.sampled_from(["ge", "le", "gt", "lt", "hide", "sub"])),
    )


@pytest.mark.compile_sample
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=forms(), seed=st.integers(0, 2**16))
def test_random_forms_fuse_and_match_sdpa_and_the_chain(form: Form, seed: int) -> None:
    check_fused(form, seed)


# -- causal masks -----------------------------------------------------------------------------
MASKED = ("qk", "scale", "bias_add", "row", "col", "keep", "mask", "sm", "pv")


def test_describe_shows_the_causal_flag_and_the_mask_nodes() -> None:
    text = gd.fuse(Form(causal="bottom_right").build()).describe()
    assert text.splitlines()[1:3] == [
        "  attention_0 [attention, rule attention]: qk, scale, bias_add, row, col, offset, keep, mask, sm, pv",
        "    computes sdpa(Q=q, K=k viewed as [2, 3, 7, 4] strides [84, 28, 4, 1], V=v, ATTN_SCALE=0.125, "
        "BIAS=bias, use_causal_mask_bottom_right=True) -> o",
    ]


def test_a_causal_chain_lowers_to_one_attention_kernel() -> None:
    ir = Form(causal="top_left", io="half", window=3).build().validate()
    partition = gd.fuse(ir, arch=90)
    (source,) = lower(partition, 90, signature(ir), lambda h: h).sources.values()
    assert "_flash" in source.name
    (fused,) = partition.nodes
    assert fused.anchor is not None
    assert (fused.anchor.attributes.use_causal_mask, fused.anchor.attributes.sliding_window_length) == (True, 3)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        (
            Form(causal="top_left", sq=9, skv=4, window=2, bias=None),
            "mask keeps the keys i - 1 <= j <= i of row i: rows 5 to 8 keep none, where the chain's softmax gives "
            "NaN and sdpa gives O = 0",
        ),
        (Form(causal="top_left", window=0, bias=None), "mask keeps the keys i + 1 <= j <= i of row i: none"),
    ],
)
def test_a_window_leaving_rows_empty_is_refused(form: Form, reason: str) -> None:
    _, log = rejected(form.build())
    assert log == [Rejection("attention", MASKED[:2] + MASKED[-3:], reason)]


def test_two_causal_bounds_are_refused() -> None:
    def twice(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        row, col = g.gen_index(s, axis=2, name="row"), g.gen_index(s, axis=3, name="col")
        return g.logical_and(g.cmp_ge(row, col, name="keep"), g.cmp_le(col, row, name="again"), name="both")

    _, log = rejected(masked_chain(twice))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "mask keeps the keys j <= i and j <= i of row i: two causal bounds, where sdpa takes one",
        )
    ]


Keep = Callable[[gd.OperationGraphSpec, gd.TensorSpec], gd.TensorSpec]


def masked_chain(keep: Keep, hidden: float | str = float("-inf"), sq: int = 5, skv: int = 7) -> gd.OperationGraphSpec:
    """softmax(binary_select(0.125 · Q Kᵀ, hidden, keep(g, scores))) V; ``hidden`` a constant or an input's name."""
    g = gd.OperationGraphSpec(name="attn", io_data_type="float")
    q, v = g.tensor(name="q", dim=[2, 3, sq, 4]), g.tensor(name="v", dim=[2, 3, skv, 6])
    kt = g.tensor(name="k", dim=[2, 3, 4, skv], stride=[3 * skv * 4, skv * 4, 1, 4])
    s = g.mul(g.matmul(q, kt, name="qk"), 0.125, name="scale")
    value = g.tensor(name=hidden, dim=[1, 1, 1, 1]) if isinstance(hidden, str) else hidden
    p = g.softmax(g.binary_select(s, value, keep(g, s), name="mask"), name="sm")
    g.matmul(p, v, name="pv").set_name("o").set_output(True)
    return g


def causal(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
    return g.cmp_ge(g.gen_index(s, axis=2, name="row"), g.gen_index(s, axis=3, name="col"), name="keep")


MASKED = ("qk", "scale", "row", "col", "keep", "mask", "sm", "pv")


def test_the_hand_written_causal_chain_fuses() -> None:
    g = masked_chain(causal)
    partition = gd.fuse(g)
    (fused,) = partition.nodes
    assert fused.anchor is not None and fused.anchor.attributes.use_causal_mask  # type: ignore[attr-defined]
    feeds = random_feeds(g.validate(), 3)
    assert relative_error(execute_partition(partition, feeds)["o"], gd.reference.execute(g, feeds)["o"]) <= 1e-5


def test_a_hidden_value_that_rounds_to_minus_inf_is_taken() -> None:
    g = masked_chain(causal, hidden=-1e39)  # beyond float's range: the float constant is -inf
    (fused,) = gd.fuse(g).nodes
    assert fused.anchor is not None and fused.anchor.attributes.use_causal_mask  # type: ignore[attr-defined]


def test_a_fractional_offset_is_refused() -> None:
    def half_step(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        row = g.add(g.gen_index(s, axis=2, name="row"), 0.5, name="offset")
        return g.cmp_ge(row, g.gen_index(s, axis=3, name="col"), name="keep")

    _, log = rejected(masked_chain(half_step))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "offset offsets an index by 'offset::b'; a causal mask's offset is an integral constant added to the "
            "index or subtracted from it",
        )
    ]


def test_a_finite_hidden_value_is_refused() -> None:
    _, log = rejected(masked_chain(causal, hidden=-1e4))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "mask puts -10000.0 on the hidden keys, not -inf: softmax still gives them the weight exp(value - row max), "
            "not zero for rows whose visible scores are within 745 of it, and the average of a row with no visible "
            "key, where sdpa gives them none",
        )
    ]


def test_a_hidden_value_from_a_tensor_is_refused() -> None:
    _, log = rejected(masked_chain(causal, hidden="m"))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "mask puts 'm' on the hidden keys, a tensor; an sdpa mask needs the constant -inf",
        )
    ]


def test_a_mask_given_as_a_tensor_is_refused() -> None:
    _, log = rejected(masked_chain(lambda g, s: g.tensor(name="keep", dim=[1, 1, 5, 7])))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "mask's mask 'keep' is not a comparison (cmp_ge, cmp_gt, cmp_le, cmp_lt) of gen_index indexes; only "
            "causal masks written that way become sdpa masks",
        )
    ]


def test_a_mask_on_the_wrong_axes_is_refused() -> None:
    def heads(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        return g.cmp_ge(g.gen_index(s, axis=1, name="row"), g.gen_index(s, axis=3, name="col"), name="keep")

    _, log = rejected(masked_chain(heads))
    assert log == [
        Rejection(
            "attention",
            MASKED[:2] + MASKED[-3:],
            "keep compares indexes along axes 1 and 3 of the scores; a causal mask compares the query index "
            "(axis 2) with the key index (axis 3)",
        )
    ]


def test_an_index_of_another_tensor_is_refused() -> None:
    def other(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        x = g.tensor(name="x", dim=[2, 3, 5, 7])
        return g.cmp_ge(g.gen_index(x, axis=2, name="row"), g.gen_index(s, axis=3, name="col"), name="keep")

    _, log = rejected(masked_chain(other))
    assert log == [Rejection("attention", MASKED[:2] + MASKED[-3:], "row indexes 'x', not the scores")]


@pytest.mark.parametrize(
    ("offset", "keep", "sq", "reason"),
    [
        (
            1,
            "ge",
            5,
            "mask keeps the keys j <= i + 1 of row i; sdpa's causal masks keep j <= i (top left) or "
            "j <= i + Skv - Sq = i + 2 (bottom right)",
        ),
        (
            2,
            "gt",
            5,
            "mask keeps the keys j <= i + 1 of row i; sdpa's causal masks keep j <= i (top left) or "
            "j <= i + Skv - Sq = i + 2 (bottom right)",
        ),
        (
            -2,
            "ge",
            9,
            "mask keeps the keys j <= i - 2 of row i: rows 0 to 1 keep none, where the chain's softmax gives NaN "
            "and sdpa gives O = 0",
        ),
        (0, "le", 5, "mask keeps the keys j >= i of row i: an anti-causal mask, which sdpa has no form of"),
    ],
)
def test_a_mask_sdpa_has_no_flag_for_is_refused(offset: int, keep: str, sq: int, reason: str) -> None:
    def shifted(g: gd.OperationGraphSpec, s: gd.TensorSpec) -> gd.TensorSpec:
        row = g.gen_index(s, axis=2, name="row")
        row = g.add(row, float(offset), name="offset") if offset else row
        return getattr(g, f"cmp_{keep}")(row, g.gen_index(s, axis=3, name="col"), name="keep")

    _, log = rejected(masked_chain(shifted, sq=sq))
    assert log == [Rejection("attention", MASKED[:2] + MASKED[-3:], reason)]


def test_a_mask_that_is_an_output_or_read_elsewhere_stays_in_memory() -> None:
    g = masked_chain(causal)
    g.tensor_named("keep::y").set_output(True)
    _, log = rejected(g)
    assert log == [Rejection("attention", MASKED, "keep's output 'keep::y' is a graph output")]
    g = masked_chain(causal)
    g.relu(g.tensor_named("row::y"), name="other").set_output(True)
    _, log = rejected(g)
    assert log == [Rejection("attention", MASKED, "row's output is also read by other")]
