"""sdpa: the reference against a naive per-row loop, STATS, empty rows, every validation error,
the ALiBi slopes, random inputs for sequence lengths, and the JSON round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

import graphdnn as gd
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.ops import Category, get_op
from graphdnn.ops.attention import alibi_slopes
from graphdnn.random_inputs import random_inputs
from tests.graph_strategies import attention_recipes, build

SCHEMA = json.loads((Path(gd.__file__).parent / "schema" / "graph-v1.schema.json").read_text())


# -- the naive reference -----------------------------------------------------------------------
def paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's get_slopes, as published."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def naive_sdpa(q, k, v, *, scale=1.0, bias=None, seq_q=None, seq_kv=None, **attrs: Any):
    """One (batch, head, row) at a time, in plain Python floats."""
    batch, heads, sq, _ = q.shape
    kv_heads, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    causal = attrs.get("use_causal_mask") or attrs.get("use_causal_mask_bottom_right")
    window = attrs.get("sliding_window_length")
    slopes = paper_slopes(heads)
    full_bias = None if bias is None else np.broadcast_to(bias, (batch, heads, sq, skv))
    out, stats = np.zeros((batch, heads, sq, dv)), np.full((batch, heads, sq, 1), -np.inf)
    for b in range(batch):
        lq = sq if seq_q is None else min(max(int(seq_q[b]), 0), sq)
        lkv = skv if seq_kv is None else min(max(int(seq_kv[b]), 0), skv)
        for h in range(heads):
            hk = h // (heads // kv_heads)
            for i in range(lq):
                diag = i + (lkv - lq if attrs.get("use_causal_mask_bottom_right") else 0)
                keys = [j for j in range(lkv) if (not causal or j <= diag) and (window is None or j > diag - window)]
                if not keys:
                    continue
                scores = []
                for j in keys:
                    s = scale * sum(float(q[b, h, i, t]) * float(k[b, hk, j, t]) for t in range(q.shape[3]))
                    s += 0.0 if full_bias is None else float(full_bias[b, h, i, j])
                    s += slopes[h] * (j - diag) if attrs.get("use_alibi_mask") else 0.0
                    scores.append(s)
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for t in range(dv):
                    out[b, h, i, t] = sum(w * float(v[b, hk, j, t]) for w, j in zip(weights, keys)) / total
                stats[b, h, i, 0] = top + math.log(total)
    return out, stats


# -- building and running ----------------------------------------------------------------------
def bshd(dims: tuple[int, ...]) -> tuple[int, ...]:
    return gd.packed_strides(dims, (0, 2, 1, 3))


def run_sdpa(q, k, v, *, bias=None, seq_q=None, seq_kv=None, scale=None, layout="bhsd", **attrs: Any):
    """(O, STATS or None) of one sdpa node on the reference backend, in float64."""
    g = gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double")
    feeds: dict[gd.TensorSpec, Any] = {}

    def tensor(name: str, array: np.ndarray, stride=None, data_type=None) -> gd.TensorSpec:
        spec = g.tensor(array.shape, stride=stride, data_type=data_type, name=name)
        feeds[spec] = array
        return spec

    strides = bshd if layout == "bshd" else gd.packed_strides
    qs, ks, vs = (tensor(n, a, strides(a.shape)) for n, a in (("q", q), ("k", k), ("v", v)))
    kw: dict[str, Any] = dict(attrs)
    if bias is not None:
        kw["bias"] = tensor("bias", bias)
    if seq_q is not None:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = tensor("seq_q", np.array(seq_q, np.int32).reshape(-1, 1, 1, 1), data_type="int32")
        kw["seq_len_kv"] = tensor("seq_kv", np.array(seq_kv, np.int32).reshape(-1, 1, 1, 1), data_type="int32")
    o, stats = g.sdpa(qs, ks, vs, attn_scale=scale, name="att", **kw)
    o.set_output(True)
    if stats is not None:
        stats.set_output(True)
    result = reference.execute(g, feeds)
    return result[o.name], None if stats is None else result[stats.name]


def qkv(rng, batch, heads, kv_heads, sq, skv, d, dv):
    return (
        rng.standard_normal((batch, heads, sq, d)),
        rng.standard_normal((batch, kv_heads, skv, d)),
        rng.standard_normal((batch, kv_heads, skv, dv)),
    )


def assert_stats(stats: np.ndarray | None, want: np.ndarray) -> None:
    """STATS is float32: equal to the float64 log-sum-exp up to its rounding."""
    assert stats is not None and stats.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(stats), np.isneginf(want))
    np.testing.assert_allclose(stats, want, rtol=1e-7, atol=1e-7)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261123)


# (batch, Hq, Hk, Sq, Skv, D, Dv)
SHAPES = {
    "one": (1, 1, 1, 1, 1, 1, 1),
    "mha_7x13": (2, 2, 2, 7, 13, 5, 3),
    "gqa4_13x7": (1, 8, 2, 13, 7, 4, 6),
    "mqa_1x13": (2, 3, 1, 1, 13, 3, 2),
    "mqa_13x1": (1, 6, 1, 13, 1, 2, 5),
}
MASKS = {
    "none": {},
    "causal": {"use_causal_mask": True},
    "bottom_right": {"use_causal_mask_bottom_right": True},
    "window": {"sliding_window_length": 3},
    "causal_window": {"use_causal_mask": True, "sliding_window_length": 2},
    "bottom_right_window": {"use_causal_mask_bottom_right": True, "sliding_window_length": 4},
    "alibi": {"use_causal_mask": True, "use_alibi_mask": True},
    "alibi_bottom_right_window": {
        "use_causal_mask_bottom_right": True,
        "use_alibi_mask": True,
        "sliding_window_length": 3,
    },
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_the_naive_loop(rng, shape: str, mask: str) -> None:
    q, k, v = qkv(rng, *SHAPES[shape])
    attrs = MASKS[mask]
    o, stats = run_sdpa(q, k, v, scale=0.375, generate_stats=True, layout="bshd" if "7" in shape else "bhsd", **attrs)
    want_o, want_stats = naive_sdpa(q, k, v, scale=0.375, **attrs)
    np.testing.assert_allclose(o, want_o, rtol=1e-12, atol=1e-12)
    assert_stats(stats, want_stats)


@pytest.mark.parametrize("mask", ["none", "causal", "bottom_right", "bottom_right_window", "alibi"])
@pytest.mark.parametrize(("seq_q", "seq_kv"), [([0, 5], [13, 0]), ([7, 3], [4, 13]), ([9, -2], [20, 6])])
def test_padding_with_empty_and_clamped_sequences(rng, mask: str, seq_q: list[int], seq_kv: list[int]) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 3, 4)
    attrs = MASKS[mask]
    o, stats = run_sdpa(q, k, v, seq_q=seq_q, seq_kv=seq_kv, generate_stats=True, **attrs)
    want_o, want_stats = naive_sdpa(q, k, v, seq_q=seq_q, seq_kv=seq_kv, **attrs)
    np.testing.assert_allclose(o, want_o, rtol=1e-12, atol=1e-12)
    assert_stats(stats, want_stats)


@pytest.mark.parametrize("bias_dims", [(1, 1, 7, 13), (2, 4, 1, 13), (2, 1, 7, 1), (2, 4, 7, 13)])
def test_bias_broadcasts(rng, bias_dims: tuple[int, ...]) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 3, 4)
    bias = rng.standard_normal(bias_dims)
    o, _ = run_sdpa(q, k, v, bias=bias, scale=0.5, use_causal_mask_bottom_right=True)
    want, _ = naive_sdpa(q, k, v, bias=bias, scale=0.5, use_causal_mask_bottom_right=True)
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)


def test_stats_are_the_log_sum_exp_of_the_scaled_scores_and_normalise_o(rng) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 3, 4)
    o, stats = run_sdpa(q, k, v, scale=0.25, generate_stats=True)
    scores = 0.25 * np.einsum("bhid,bhjd->bhij", q, np.repeat(k, 2, axis=1))
    top = scores.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))
    assert_stats(stats, lse)
    np.testing.assert_allclose(o, np.exp(scores - lse) @ np.repeat(v, 2, axis=1), rtol=1e-12, atol=1e-13)


def test_an_absent_scale_is_one_not_one_over_sqrt_d(rng) -> None:
    q, k, v = qkv(rng, 1, 2, 2, 3, 5, 16, 4)
    o, _ = run_sdpa(q, k, v)
    np.testing.assert_allclose(o, naive_sdpa(q, k, v, scale=1.0)[0], rtol=1e-12)
    assert not np.allclose(o, naive_sdpa(q, k, v, scale=0.25)[0])


def test_rows_without_a_visible_key_give_zero_and_minus_infinity(rng) -> None:
    q, k, v = qkv(rng, 1, 2, 1, 7, 3, 2, 2)
    o, stats = run_sdpa(q, k, v, generate_stats=True, use_causal_mask_bottom_right=True)
    assert stats is not None
    # Row i sees keys j <= i + (3 - 7): rows 0 to 3 see none.
    assert np.all(o[:, :, :4] == 0.0) and np.all(np.isneginf(stats[:, :, :4]))
    assert np.all(np.isfinite(stats[:, :, 4:])) and np.all(o[:, :, 4:] != 0.0)
    o, stats = run_sdpa(q, k, v, generate_stats=True, seq_q=[2], seq_kv=[3])
    assert np.all(o[:, :, 2:] == 0.0) and np.all(np.isneginf(stats[:, :, 2:]))


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 8, 12, 16, 24, 32])
def test_alibi_slopes_are_the_papers(heads: int) -> None:
    assert alibi_slopes(heads) == pytest.approx(paper_slopes(heads), rel=1e-15)
    if heads in (8, 16):
        assert alibi_slopes(heads) == tuple(2.0 ** (-8 * (h + 1) / heads) for h in range(heads))


def test_scale_may_be_a_runtime_scalar_and_the_kv_layout_any(rng) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 5, 6, 3, 4)
    g = gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double")
    qs = g.tensor(q.shape, stride=bshd(q.shape), name="q")
    ks, vs = g.tensor(k.shape, name="k"), g.tensor(v.shape, stride=bshd(v.shape), name="v")
    scale = g.tensor([1], is_pass_by_value=True, name="scale")
    o, stats = g.sdpa(qs, ks, vs, attn_scale=scale, use_causal_mask=True)
    assert stats is None and o.dim == (2, 4, 5, 4) and o.stride == gd.packed_strides((2, 4, 5, 4))
    o.set_output(True)
    got = reference.execute(g, {"q": q, "k": k, "v": v, "scale": 0.7})[o.name]
    np.testing.assert_allclose(got, naive_sdpa(q, k, v, scale=0.7, use_causal_mask=True)[0], rtol=1e-12)


def test_stats_are_float32_whatever_the_io_type() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    q, k = g.tensor([1, 2, 3, 8], name="q"), g.tensor([1, 2, 4, 8], name="k")
    o, stats = g.sdpa(q, k, k, generate_stats=True)
    assert stats is not None and stats.data_type is gd.DataType.FLOAT and stats.dim == (1, 2, 3, 1)
    o.set_output(True)
    stats.set_output(True)
    ir = g.validate()
    assert ir.tensor(stats.name).data_type is gd.DataType.FLOAT
    assert ir.tensor(o.name).data_type is gd.DataType.HALF


def test_sdpa_is_an_attention_op_that_stays_alone_in_its_family() -> None:
    assert get_op("sdpa").category is Category.ATTENTION
    g = gd.OperationGraphSpec(io_data_type="float")
    q = g.tensor([1, 2, 3, 8], name="q")
    o, _ = g.sdpa(q, q, q, name="att")
    g.relu(g.add(o, 1.0)).set_output(True)
    families = {fused.family: [n.name for n in fused.nodes] for fused in fuse(g.validate(), arch=90).nodes}
    assert families[Family.ATTENTION] == ["att"]


# -- validation ---------------------------------------------------------------------------------
def build_sdpa(
    q=(2, 4, 5, 8), k=(2, 2, 6, 8), v=(2, 2, 6, 3), *, bias=None, seq=None, seq_type="int32", types=None, **kw
) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="half")
    types = types or {}
    specs = {role: g.tensor(dims, name=role.lower(), data_type=types.get(role)) for role, dims in zip("QKV", (q, k, v))}
    if bias is not None:
        kw["bias"] = g.tensor(bias, name="bias")
    for role, dims in (seq or {}).items():
        kw[role] = g.tensor(dims, data_type=seq_type, name=role)
    o, _ = g.sdpa(specs["Q"], specs["K"], specs["V"], name="att", **kw)
    o.set_output(True)
    return g


PADDED = {"use_padding_mask": True, "seq": {"seq_len_q": (2, 1, 1, 1), "seq_len_kv": (2, 1, 1, 1)}}
ERRORS: dict[str, tuple[dict[str, Any], type[gd.GraphError], str]] = {
    "q_rank": ({"q": (4, 5, 8)}, gd.ShapeError, r"tensor 'q'.*Q has dims \[4, 5, 8\]; sdpa takes rank-4"),
    "v_rank": ({"v": (2, 2, 6, 3, 1)}, gd.ShapeError, r"tensor 'v'.*V has dims \[2, 2, 6, 3, 1\]; sdpa takes rank-4"),
    "k_batch": ({"k": (3, 2, 6, 8), "v": (3, 2, 6, 3)}, gd.ShapeError, r"tensor 'k'.*K has dims .*Q's B = 2"),
    "k_head_dim": ({"k": (2, 2, 6, 7)}, gd.ShapeError, r"tensor 'k'.*K has dims .*D = 8"),
    "v_seq": ({"v": (2, 2, 5, 3)}, gd.ShapeError, r"tensor 'v'.*V has dims \[2, 2, 5, 3\].*\[2, 2, 6\]"),
    "v_heads": ({"v": (2, 1, 6, 3)}, gd.ShapeError, r"tensor 'v'.*V has dims"),
    "heads": ({"q": (2, 3, 5, 8)}, gd.ShapeError, r"tensor 'k'.*Q has 3 heads, not a multiple of K and V's 2"),
    "d_large": (
        {"q": (1, 1, 2, 257), "k": (1, 1, 2, 257), "v": (1, 1, 2, 4)},
        gd.ShapeError,
        r"tensor 'q'.*Q has head dim 257; sdpa takes head dims up to 256",
    ),
    "dv_large": ({"v": (2, 2, 6, 300)}, gd.ShapeError, r"tensor 'v'.*V has head dim 300"),
    "both_causal": (
        {"use_causal_mask": True, "use_causal_mask_bottom_right": True},
        gd.AttributeValueError,
        r"node 'att'.*use_causal_mask and use_causal_mask_bottom_right exclude each other",
    ),
    "window": ({"sliding_window_length": 0}, gd.AttributeValueError, r"node 'att'.*sliding_window_length is 0"),
    "alibi": ({"use_alibi_mask": True}, gd.AttributeValueError, r"node 'att'.*use_alibi_mask needs a causal mask"),
    "padding_without_kv": (
        {"use_padding_mask": True, "seq": {"seq_len_q": (2, 1, 1, 1)}},
        gd.StructureError,
        r"node 'att'.*use_padding_mask needs SEQ_LEN_KV",
    ),
    "padding_without_both": (
        {"use_padding_mask": True},
        gd.StructureError,
        r"node 'att'.*use_padding_mask needs SEQ_LEN_Q and SEQ_LEN_KV",
    ),
    "lengths_without_padding": (
        {"seq": {"seq_len_kv": (2, 1, 1, 1)}},
        gd.StructureError,
        r"node 'att'.*SEQ_LEN_KV is given but use_padding_mask is false",
    ),
    "float_lengths": (
        {**PADDED, "seq_type": "float"},
        gd.DataTypeError,
        r"node 'att'.*SEQ_LEN_Q 'seq_len_q' is float; sequence lengths are integers",
    ),
    "length_dims": (
        {"use_padding_mask": True, "seq": {"seq_len_q": (2, 1, 1, 1), "seq_len_kv": (2, 1)}},
        gd.ShapeError,
        r"tensor 'seq_len_kv'.*SEQ_LEN_KV has dims \[2, 1\], expected \[B, 1, 1, 1\] = \[2, 1, 1, 1\]",
    ),
    "bias_rank": ({"bias": (5, 6)}, gd.ShapeError, r"tensor 'bias'.*BIAS has dims \[5, 6\]; expected rank 4"),
    "bias_dims": (
        {"bias": (1, 2, 5, 6)},
        gd.ShapeError,
        r"tensor 'bias'.*BIAS has dims \[1, 2, 5, 6\].*\[B, Hq, Sq, Skv\] = \[2, 4, 5, 6\]",
    ),
    "integer_q": ({"types": {"Q": "int8"}}, gd.DataTypeError, r"node 'att'.*Q 'q' is int8; sdpa needs a floating type"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_validation_errors_name_the_node_and_the_role(case: str) -> None:
    kwargs, error, pattern = ERRORS[case]
    with pytest.raises(error, match=pattern):
        build_sdpa(**kwargs).validate()


def test_a_tensor_scale_must_hold_one_element() -> None:
    g = gd.OperationGraphSpec(io_data_type="float")
    q, scale = g.tensor([1, 1, 2, 4], name="q"), g.tensor([2], name="scale")
    with pytest.raises(gd.ShapeError, match=r"node 'att'.*ATTN_SCALE 'scale' must be a one-element scalar"):
        g.sdpa(q, q, q, attn_scale=scale, name="att")


def test_stats_declared_in_another_type_are_refused() -> None:
    g = build_sdpa(generate_stats=True)
    stats = g.tensor_named("att::STATS").set_data_type("half").set_output(True)
    with pytest.raises(
        gd.DataTypeError, match=r"node 'att'.*output STATS 'att::STATS' is half; sdpa writes it as float"
    ):
        g.validate()
    stats.set_data_type("float")
    g.validate()


# -- files, random inputs ----------------------------------------------------------------------
def test_the_strict_reader_checks_attributes_and_optional_outputs() -> None:
    g = build_sdpa(use_causal_mask=True, **PADDED)
    doc = json.loads(g.to_json())
    node = doc["nodes"][0]
    assert node["op"] == "sdpa" and node["attributes"]["sliding_window_length"] is None
    node["attributes"]["use_causal_mask"] = "yes"
    with pytest.raises(gd.AttributeValueError, match=r"nodes\[0\]\.attributes\.use_causal_mask.*true or false"):
        gd.OperationGraphSpec.from_json(json.dumps(doc))
    node["attributes"] = {"is_inference": True}
    with pytest.raises(gd.AttributeValueError, match=r"unknown attribute 'is_inference'"):
        gd.OperationGraphSpec.from_json(json.dumps(doc))
    node["attributes"] = {"use_padding_mask": True}
    node["outputs"]["STATS"] = node["outputs"]["O"]
    with pytest.raises(gd.StructureError, match=r"node 'att'.*unexpected output 'STATS' for sdpa"):
        gd.OperationGraphSpec.from_json(json.dumps(doc)).validate()


def test_random_sequence_lengths_lie_within_the_sequences() -> None:
    g = build_sdpa(
        q=(64, 1, 5, 8),
        k=(64, 1, 13, 8),
        v=(64, 1, 13, 3),
        **PADDED | {"seq": {"seq_len_q": (64, 1, 1, 1), "seq_len_kv": (64, 1, 1, 1)}},
    )
    feeds = random_inputs(g.validate(), seed=3)
    for name, high in (("seq_len_q", 5), ("seq_len_kv", 13)):
        values = feeds[name].ravel()
        assert values.dtype == np.int32 and values.min() == 0 and values.max() == high


@pytest.mark.compile_sample
@settings(max_examples=40, deadline=None)
@given(recipe=attention_recipes())
def test_json_round_trip_keeps_an_attention_graph_and_its_signature(recipe) -> None:
    g, _ = build(recipe)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature()
    assert again.to_json() == text
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.compile_sample
@settings(max_examples=25, deadline=None)
@given(recipe=attention_recipes())
def test_attention_graphs_run_on_the_reference_with_random_inputs(recipe) -> None:
    ir = build(recipe)[0].validate()
    outputs = reference.execute(ir, random_inputs(ir, seed=1))
    for name, values in outputs.items():
        assert not np.isnan(values.astype(np.float64)).any(), name
