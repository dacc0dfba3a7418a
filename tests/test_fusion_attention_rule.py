"""The ``attention`` rule: attention written from primitives becomes one sdpa-anchored kernel.

Each hand-written form (Kᵀ by strides or by a transpose, the scale after the first matmul
or on Q, with or without a bias, one K/V head for all query heads) fuses into one
ATTENTION node whose synthesized ``sdpa`` anchor computes what an explicit ``sdpa`` graph
computes (to 1e-10: the same float64 definition on the same values) and what the primitive
chain computes (to 1e-5: the chain rounds its float intermediates, the kernel does not).
Near misses stay unfused, with the reason in the rejection log.
"""

from __future__ import annotations

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

    def build(self, sdpa: bool = False) -> gd.OperationGraphSpec:
        """The primitive chain, or (``sdpa``) the same attention as one explicit sdpa op."""
        g = gd.OperationGraphSpec(name="attn", io_data_type=self.io, intermediate_data_type=self.intermediate)
        q = g.tensor(name="q", dim=[self.b, self.h, self.sq, self.d])
        v = g.tensor(name="v", dim=[self.b, self.hk, self.skv, self.dv])
        scale = g.tensor(name="s", dim=[1, 1, 1, 1]) if self.scale in ("tensor", "pre") else 0.125
        bias = None if self.bias is None else g.tensor(name="bias", dim=list(self.bias))
        if sdpa:
            k = self._k_for_sdpa(g)
            o = g.sdpa(q, k, v, attn_scale=scale if self.scale else None, bias=bias, name="attn")[0]
            o.set_name("o").set_output(True)
            return g
        if self.scale == "pre":
            q = g.mul(q, scale, name="qscale")
        s = g.matmul(q, self._kt(g), name="qk")
        if self.scale in ("constant", "tensor"):
            s = g.mul(s, scale, name="scale")
        if bias is not None:
            s = g.add(s, bias, name="bias_add")
        p = g.softmax(s, axis=self.axis, name="sm")
        p.set_name("p")
        g.matmul(p, v, name="pv").set_name("o").set_output(True)
        return g

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
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(form=forms(), seed=st.integers(0, 2**16))
def test_random_forms_fuse_and_match_sdpa_and_the_chain(form: Form, seed: int) -> None:
    check_fused(form, seed)
