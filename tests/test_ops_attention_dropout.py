"""sdpa and sdpa_backward with dropout=(probability, seed, offset): the mask is rng's Philox draw
at each score's row-major index (the layout every kernel reproduces), the kept fraction, the
1/(1-p) scale and the mean over seeds, reproducibility, STATS of the undropped softmax, the
backward as finite differences of the forward reference with the mask fixed, validation and
the JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.errors import AttributeValueError, GraphError, StructureError
from graphdnn.random_inputs import random_inputs
from tests.test_ops_attention import SCHEMA, qkv


def run(q, k, v, d_o=None, *, p=0.5, seed=7, offset=11, scale=0.6, **attrs: Any):  # type: ignore[no-untyped-def]
    """(O, STATS) of sdpa with dropout on the reference, in float64; with ``d_o`` also the
    gradients of sdpa_backward (dQ, dK, dV) on that O and STATS."""
    g = gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double")
    feeds: dict[gd.TensorSpec, Any] = {}
    for name, array in (("q", q), ("k", k), ("v", v)) + ((("do", d_o),) if d_o is not None else ()):
        feeds[g.tensor(array.shape, name=name)] = array
    qs, ks, vs, *rest = list(feeds)
    dropout = None
    if p is not None:
        seed_t = g.tensor([1, 1, 1, 1], data_type="int64", name="seed")
        feeds[seed_t] = np.array(seed, dtype=np.int64).reshape(1, 1, 1, 1)
        dropout = (p, seed_t, offset)
    o, stats = g.sdpa(qs, ks, vs, attn_scale=scale, generate_stats=True, dropout=dropout, **attrs)
    outputs = [o.set_output(True), stats.set_output(True)]  # type: ignore[union-attr]
    if d_o is not None:
        grads = g.sdpa_backward(qs, ks, vs, o, rest[0], stats, attn_scale=scale, dropout=dropout, **attrs)
        outputs += [grad.set_output(True) for grad in grads]
    result = reference.execute(g, feeds)
    return tuple(result[t.name] for t in outputs)


def mask_of(shape: tuple[int, ...], p: float, seed: int, offset: int) -> np.ndarray:
    """rng's Bernoulli(1 - p) mask of dims ``shape`` for that seed and offset."""
    g = gd.OperationGraphSpec(io_data_type="float")
    g.rng(seed, offset, 1.0 - p, shape=shape).set_output(True).set_name("mask")
    return reference.execute(g, {})["mask"]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261124)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_mask_is_rngs_draw_at_each_scores_row_major_index(rng, p: float) -> None:
    """Q = 0 makes the softmax uniform (1 / Skv) and V = I puts key j's weight in column j: O
    times Skv (1 - p) is the mask, which is rng's over [B, Hq, Sq, Skv] (GQA: 4 query heads on 2)."""
    b, hq, hk, sq, skv = 2, 4, 2, 5, 9
    q, k = np.zeros((b, hq, sq, 3)), rng.standard_normal((b, hk, skv, 3))
    v = np.broadcast_to(np.eye(skv), (b, hk, skv, skv)).copy()
    o, _ = run(q, k, v, p=p, seed=123456789, offset=2**40 + 3)
    np.testing.assert_allclose(o * skv * (1 - p), mask_of((b, hq, sq, skv), p, 123456789, 2**40 + 3), atol=1e-12)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_kept_fraction_is_one_minus_p_and_kept_values_are_scaled(rng, p: float) -> None:
    q, k = np.zeros((2, 4, 64, 2)), rng.standard_normal((2, 4, 128, 2))
    v = np.broadcast_to(np.eye(128), (2, 4, 128, 128)).copy()
    o, _ = run(q, k, v, p=p)
    values = np.unique(np.round(o * 128, 12))
    np.testing.assert_allclose(values, [0.0, 1.0 / (1.0 - p)])
    n = o.size  # 65536 draws: the kept fraction is within 5 standard deviations of 1 - p
    assert abs(np.count_nonzero(o) / n - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)


@pytest.mark.compile_sample
def test_the_mean_over_offsets_is_the_undropped_attention(rng) -> None:
    q, k, v = qkv(rng, 1, 2, 1, 3, 6, 4, 2)
    plain, _ = run(q, k, v, p=None)
    mean = np.mean([run(q, k, v, p=0.5, offset=n)[0] for n in range(400)], axis=0)
    assert np.abs(mean - plain).max() < 0.2 * np.abs(plain).max()  # the standard error at 400 draws: ~0.05


def test_the_same_seed_and_offset_give_the_same_output_others_fresh_ones(rng) -> None:
    q, k, v = qkv(rng, 2, 2, 2, 7, 13, 5, 3)
    first = run(q, k, v, seed=5, offset=9)[0]
    np.testing.assert_array_equal(first, run(q, k, v, seed=5, offset=9)[0])
    for other in ({"seed": 6, "offset": 9}, {"seed": 5, "offset": 10}):
        assert not np.allclose(first, run(q, k, v, **other)[0])


def test_stats_are_the_undropped_softmaxs_and_a_zero_rate_changes_nothing(rng) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 5, 3)
    plain_o, plain_stats = run(q, k, v, p=None, use_causal_mask=True)
    o, stats = run(q, k, v, p=0.3, use_causal_mask=True)
    np.testing.assert_array_equal(stats, plain_stats)
    assert not np.allclose(o, plain_o)
    zero_o, zero_stats = run(q, k, v, p=0.0, use_causal_mask=True)
    np.testing.assert_array_equal(zero_o, plain_o)
    np.testing.assert_array_equal(zero_stats, plain_stats)


@pytest.mark.parametrize("attrs", [{}, {"use_causal_mask_bottom_right": True, "sliding_window_length": 4}])
def test_backward_is_the_finite_difference_gradient_with_the_mask_fixed(rng, attrs: dict[str, Any]) -> None:
    """d/dx sum(O(x) * dO) by central differences of the forward reference: the seed and offset
    fix the mask, so O is a smooth function of Q, K and V (GQA: 4 query heads on 2)."""
    q, k, v = qkv(rng, 1, 4, 2, 4, 6, 3, 2)
    d_o = rng.standard_normal((1, 4, 4, 2))
    grads = run(q, k, v, d_o, p=0.4, **attrs)[2:]
    plain = run(q, k, v, d_o, p=None, **attrs)[2:]
    step = 1e-6
    for index, (x, grad) in enumerate(zip((q, k, v), grads)):
        assert not np.allclose(grad, plain[index])  # the mask reaches every gradient
        for at in np.ndindex(x.shape):
            plus, minus = ([a.copy() for a in (q, k, v)] for _ in range(2))
            plus[index][at] += step
            minus[index][at] -= step
            loss = [(run(*args, p=0.4, **attrs)[0] * d_o).sum() for args in (plus, minus)]
            assert grad[at] == pytest.approx((loss[0] - loss[1]) / (2 * step), abs=1e-6)


def graph_with_dropout(p: Any = 0.2, **kw: Any) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="bfloat16")
    q, k, v = (g.tensor([2, 4, 7, 16], name=n) for n in ("q", "k", "v"))
    seed = g.tensor([1, 1, 1, 1], data_type="int64", name="seed")
    offset = g.tensor([1, 1, 1, 1], data_type="int64", is_pass_by_value=True, name="offset")
    o, stats = g.sdpa(q, k, v, generate_stats=True, dropout=(p, seed, offset), name="att", **kw)
    o.set_output(True)
    assert stats is not None
    for grad in g.sdpa_backward(q, k, v, o, g.tensor([2, 4, 7, 16], name="do"), stats, dropout=(p, seed, offset)):
        grad.set_output(True)
    return g


@pytest.mark.parametrize("p", [1.0, -0.1])
def test_a_rate_outside_zero_to_one_is_refused(p: float) -> None:
    with pytest.raises(
        AttributeValueError, match=rf"node 'att'.*dropout_probability is {p}; a drop rate lies in \[0, 1\)"
    ):
        graph_with_dropout(p).validate()


def test_dropout_must_be_a_triple_and_seed_and_offset_come_with_a_rate() -> None:
    g = gd.OperationGraphSpec(io_data_type="bfloat16")
    q = g.tensor([1, 1, 2, 8], name="q")
    with pytest.raises(GraphError, match=r"node 'att'.*dropout must be \(probability, seed, offset\), got \(0.5, 1\)"):
        g.sdpa(q, q, q, dropout=(0.5, 1), name="att")
    document = json.loads(graph_with_dropout().to_json())
    (node,) = [n for n in document["nodes"] if n["op"] == "sdpa"]
    node["attributes"]["dropout_probability"] = None
    with pytest.raises(StructureError, match=r"node 'att'.*SEED is given but dropout_probability is not set"):
        gd.OperationGraphSpec.from_json(json.dumps(document)).validate()
    node["attributes"]["dropout_probability"] = 0.5
    del node["inputs"]["OFFSET"]
    with pytest.raises(StructureError, match=r"node 'att'.*dropout needs a seed and an offset.*OFFSET is not given"):
        gd.OperationGraphSpec.from_json(json.dumps(document)).validate()


def test_json_round_trip_keeps_the_rate_and_the_signature_sees_it() -> None:
    g = graph_with_dropout(0.2, use_causal_mask=True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text
    pytest.importorskip("jsonschema").validate(json.loads(text), SCHEMA)
    rates = {n.op: n.attributes.dropout_probability for n in again.validate().nodes}  # type: ignore[attr-defined]
    assert rates == {"sdpa": 0.2, "sdpa_backward": 0.2}
    assert graph_with_dropout(0.3, use_causal_mask=True).signature() != g.signature()
    ir = g.validate()
    feeds = random_inputs(ir, seed=2)
    assert 0 <= int(feeds["seed"].ravel()[0]) < 2**31 and 0 <= int(feeds["offset"].ravel()[0]) < 2**31
