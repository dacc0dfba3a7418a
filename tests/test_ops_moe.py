"""topk, moe_router, gather, moe_permutation, moe_unpermute and moe_grouped_matmul: the
reference against loops, the documented orders (ties, NaN), out-of-range indices refused
with a FeedError, JSON, and every validation error."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference


def graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="float", intermediate_data_type="float")


def loop_topk(row: list[float], k: int) -> list[int]:
    """Selection by repeated scans: NaN first, then the largest, ties to the lower index."""
    chosen: list[int] = []
    for _ in range(k):
        best = None
        for i, v in enumerate(row):
            if i in chosen:
                continue
            nan, best_nan = math.isnan(v), best is not None and math.isnan(row[best])
            if best is None or (nan and not best_nan) or (not nan and not best_nan and v > row[best]):
                best = i
        assert best is not None
        chosen.append(best)
    return chosen


# -- topk ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dims", "k", "axis"), [((4, 9), 3, -1), ((5, 2, 7), 7, 2), ((6, 3), 2, 0), ((1, 40), 1, 1)])
def test_topk_matches_the_loop_with_ties_and_nan(dims, k, axis, rng):
    x = rng.integers(-3, 4, dims).astype(np.float64)  # many ties
    x.flat[rng.integers(0, x.size, 3)] = np.nan
    g = graph()
    values, indices = g.topk(g.tensor(list(dims), name="x"), k, axis=axis, name="tk")
    values.set_output(True)
    indices.set_output(True)
    out = reference.execute(g, {"x": x.astype(np.float32)})
    moved = np.moveaxis(x, axis, -1)
    want = np.array([loop_topk(list(row), k) for row in moved.reshape(-1, moved.shape[-1])]).reshape(
        (*moved.shape[:-1], k)
    )
    np.testing.assert_array_equal(out[indices.name], np.moveaxis(want, -1, axis))
    np.testing.assert_array_equal(out[values.name], np.moveaxis(np.take_along_axis(moved, want, -1), -1, axis))
    assert out[indices.name].dtype == np.int32


def test_topk_indices_may_be_int64_but_not_float():
    g = graph()
    _, indices = g.topk(g.tensor([2, 5], name="x"), 2, name="tk")
    indices.set_output(True).set_data_type("int64")
    assert g.validate().outputs[0].data_type is gd.DataType.INT64
    indices.set_data_type("float")
    with pytest.raises(
        gd.DataTypeError, match=r"node 'tk'.*indices 'tk::indices' is float; topk writes it as int32 or int64"
    ):
        g.validate()


@pytest.mark.parametrize(
    ("k", "axis", "message"), [(0, -1, r"k must be in \[1, 5\]"), (6, -1, "got 6"), (1, 3, "axis 3")]
)
def test_topk_bad_attributes(k, axis, message):
    g = graph()
    with pytest.raises(gd.AttributeValueError, match=f"node 'tk'.*{message}"):
        g.topk(g.tensor([2, 5], name="x"), k, axis=axis, name="tk")


# -- moe_router -------------------------------------------------------------------------------
def router(score: str, k: int, bias: bool = False, renormalize: bool = True, scaling: float = 1.0):
    g = graph()
    logits = g.tensor([6, 8], name="logits")
    b = g.tensor([8], name="bias") if bias else None
    w, i = g.moe_router(logits, k, score, bias=b, renormalize=renormalize, scaling_factor=scaling, name="router")
    w.set_output(True)
    i.set_output(True)
    return g, w, i


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_router_weights_and_choices(score, renormalize, rng):
    logits = rng.standard_normal((6, 8)).astype(np.float32)
    g, w, i = router(score, 2, renormalize=renormalize, scaling=2.5)
    out = reference.execute(g, {"logits": logits})
    x = logits.astype(np.float64)
    scores = np.exp(x) / np.exp(x).sum(1, keepdims=True) if score == "softmax" else 1 / (1 + np.exp(-x))
    for t in range(6):
        chosen = loop_topk(list(x[t]), 2)
        np.testing.assert_array_equal(out[i.name][t], chosen)
        picked = scores[t, chosen] / (scores[t, chosen].sum() if renormalize else 1.0)
        np.testing.assert_allclose(out[w.name][t], 2.5 * picked, rtol=1e-6)
    if renormalize:
        np.testing.assert_allclose(out[w.name].sum(1), 2.5, rtol=1e-6)


def test_router_bias_steers_the_choice_but_not_the_weights():
    """DeepSeek-V3: sigmoid scores plus a per-expert bias choose; the unbiased scores weigh."""
    logits = np.zeros((6, 8), dtype=np.float32)
    logits[:, 0] = 3.0  # the best score everywhere
    bias = np.zeros(8, dtype=np.float32)
    bias[[5, 6]] = [1.0, 2.0]  # pushes experts 5 and 6 past it
    g, w, i = router("sigmoid", 2, bias=True, renormalize=False)
    out = reference.execute(g, {"logits": logits, "bias": bias})
    np.testing.assert_array_equal(out[i.name], np.tile([6, 5], (6, 1)))
    np.testing.assert_allclose(out[w.name], 0.5, rtol=1e-7)


def test_router_validation():
    g = graph()
    logits = g.tensor([4, 8], name="logits")
    with pytest.raises(gd.AttributeValueError, match=r"node 'r'.*k must be in \[1, 8\] \(the number of experts"):
        g.moe_router(logits, 9, name="r")
    with pytest.raises(gd.ShapeError, match=r"node 'r'.*bias has dims \[4\], expected \[8\]"):
        g.moe_router(logits, 2, bias=g.tensor([4], name="b"), name="r")
    with pytest.raises(gd.AttributeValueError, match="score_function"):
        g.moe_router(logits, 2, "relu", name="r")


# -- permutation, gather, unpermute, grouped matmul -----------------------------------------
def moe_pipeline(tokens=6, k=2, experts=4, hidden=5, out=3):
    g = graph()
    chosen = g.tensor([tokens, k], name="chosen", data_type="int32")
    weights = g.tensor([tokens, k], name="weights")
    h = g.tensor([tokens, hidden], name="h")
    w = g.tensor([experts, hidden, out], name="w")
    token_index, slot, firsts = g.moe_permutation(chosen, experts, name="perm")
    rows = g.gather(h, token_index, name="permute")
    y = g.moe_grouped_matmul(rows, w, firsts, name="experts")
    combined = g.moe_unpermute(y, slot, weights, name="combine")
    for t in (token_index, slot, firsts, rows, y, combined):
        t.set_output(True)
    return g, (token_index, slot, firsts, rows, y, combined)


def test_permutation_groups_choices_by_expert_then_token(rng):
    chosen = np.array([[2, 0], [0, 2], [3, 0], [2, 3], [0, 0], [1, 2]], dtype=np.int32)
    g, (token_index, slot, firsts, *_) = moe_pipeline()
    feeds = {
        "chosen": chosen,
        "weights": np.ones((6, 2), np.float32),
        "h": np.ones((6, 5), np.float32),
        "w": np.ones((4, 5, 3), np.float32),
    }
    out = reference.execute(g, feeds)
    # expert 0: (0,1) (1,0) (2,1) (4,0) (4,1); expert 1: (5,0); expert 2: (0,0) (1,1) (3,0) (5,1); expert 3: (2,0) (3,1)
    np.testing.assert_array_equal(out[token_index.name], [0, 1, 2, 4, 4, 5, 0, 1, 3, 5, 2, 3])
    np.testing.assert_array_equal(out[firsts.name], [0, 5, 6, 10])
    np.testing.assert_array_equal(out[slot.name], [[6, 0], [1, 7], [10, 2], [8, 11], [3, 4], [5, 9]])
    assert all(t.data_type is gd.DataType.INT32 for t in (token_index, slot, firsts))


def test_the_pipeline_equals_a_loop_over_tokens_and_choices(rng):
    chosen = rng.integers(0, 4, (6, 2)).astype(np.int32)
    chosen[:, 1] = np.where(chosen[:, 1] == chosen[:, 0], (chosen[:, 0] + 1) % 4, chosen[:, 1])
    chosen[:, :] = np.where(np.arange(6)[:, None] < 4, chosen, 3)  # expert 3 busy, some expert maybe idle
    weights = rng.random((6, 2)).astype(np.float32)
    h = rng.standard_normal((6, 5)).astype(np.float32)
    w = rng.standard_normal((4, 5, 3)).astype(np.float32)
    g, (*_, combined) = moe_pipeline()
    out = reference.execute(g, {"chosen": chosen, "weights": weights, "h": h, "w": w})
    want = np.zeros((6, 3))
    for t in range(6):
        for j in range(2):
            want[t] += float(weights[t, j]) * (h[t].astype(np.float64) @ w[chosen[t, j]])
    np.testing.assert_allclose(out[combined.name], want, rtol=1e-5, atol=1e-6)


def test_grouped_matmul_rows_belong_to_the_last_expert_starting_at_or_before_them(rng):
    g = graph()
    token, w = g.tensor([7, 4], name="token"), g.tensor([3, 4, 2], name="w")
    firsts = g.tensor([3], name="firsts", data_type="int32")
    y = g.moe_grouped_matmul(token, w, firsts, name="mm").set_output(True)
    a, b = rng.standard_normal((7, 4)).astype(np.float32), rng.standard_normal((3, 4, 2)).astype(np.float32)
    # rows 0: none; 1-2: expert 0; 3-6: expert 2 (expert 1 holds no row: its range is empty)
    out = reference.execute(g, {"token": a, "w": b, "firsts": np.array([1, 3, 3], np.int32)})
    expert = [None, 0, 0, 2, 2, 2, 2]
    want = np.array([np.zeros(2) if e is None else a[s] @ b[e].astype(np.float64) for s, e in enumerate(expert)])
    np.testing.assert_allclose(out[y.name], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("token", "offsets", "message"),
    [
        ([2, 7, 4], [3], r"token has dims \[2, 7, 4\]; expected \[rows, K\] or \[1, rows, K\]"),
        ([7, 4], [3, 1], r"first_token_offset has dims \[3, 1\], expected \[3\] or \[3, 1, 1\]"),
    ],
)
def test_grouped_matmul_takes_the_frontend_form_and_nothing_else(token, offsets, message):
    g = graph()
    w, t, f = g.tensor([3, 4, 2], name="w"), g.tensor(token, name="t"), g.tensor(offsets, name="f", data_type="int32")
    with pytest.raises(gd.GraphError, match=message):
        g.moe_grouped_matmul(t, w, f, name="mm")


def test_gather_along_an_inner_axis(rng):
    g = graph()
    x, index = g.tensor([2, 5, 3], name="x"), g.tensor([4], name="i", data_type="int64")
    y = g.gather(x, index, axis=1, name="ga").set_output(True)
    a = rng.standard_normal((2, 5, 3)).astype(np.float32)
    picks = np.array([4, 0, 0, 2])
    np.testing.assert_array_equal(reference.execute(g, {"x": a, "i": picks})[y.name], a[:, picks, :])
    assert y.dim == (2, 4, 3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            4,
            r"node 'perm'.*expert_indices 'chosen' holds 4 at flat position 3; expert indices must be in \[0, 4\)",
        ),
        (-1, r"node 'perm'.*holds -1"),
    ],
)
def test_out_of_range_expert_indices_are_a_feed_error(value, message):
    g, _ = moe_pipeline()
    chosen = np.zeros((6, 2), np.int32)
    chosen.flat[3] = value
    ones = {name: np.ones(dims, np.float32) for name, dims in (("weights", (6, 2)), ("h", (6, 5)), ("w", (4, 5, 3)))}
    feeds = {"chosen": chosen, **ones}
    with pytest.raises(gd.FeedError, match=message):
        reference.execute(g, feeds)


def test_gather_and_unpermute_refuse_out_of_range_rows():
    g = graph()
    y = g.gather(g.tensor([3, 2], name="x"), g.tensor([2], name="i", data_type="int32"), name="ga")
    y.set_output(True)
    with pytest.raises(
        gd.FeedError, match=r"node 'ga'.*index 'i' holds 3 at flat position 1; rows must be in \[0, 3\)"
    ):
        reference.execute(g, {"x": np.ones((3, 2), np.float32), "i": np.array([0, 3], np.int32)})
    g = graph()
    y = g.moe_unpermute(g.tensor([3, 2], name="x"), g.tensor([2, 2], name="s", data_type="int32"), name="un")
    y.set_output(True)
    with pytest.raises(gd.FeedError, match=r"node 'un'.*slot 's' holds -2"):
        reference.execute(g, {"x": np.ones((3, 2), np.float32), "s": np.array([[0, 1], [-2, 2]], np.int32)})


def test_json_round_trip_of_the_pipeline():
    g, _ = moe_pipeline()
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text


def test_movement_validation():
    g = graph()
    x = g.tensor([4, 3], name="x")
    with pytest.raises(gd.DataTypeError, match=r"node 'ga'.*index 'i' is float; gather takes int32 or int64 indices"):
        g.gather(x, g.tensor([2], name="i"), name="ga")
    with pytest.raises(gd.ShapeError, match=r"node 'ga'.*index has dims \[2, 1\]; gather takes a 1-D index"):
        g.gather(x, g.tensor([2, 1], name="i2", data_type="int32"), name="ga")
    chosen = g.tensor([4], name="c", data_type="int32")
    with pytest.raises(gd.ShapeError, match=r"node 'p'.*expert_indices has dims \[4\]; expected \[tokens, k\]"):
        g.moe_permutation(chosen, 8, name="p")
    with pytest.raises(gd.AttributeValueError, match=r"node 'p'.*num_experts must be >= 1, got 0"):
        g.moe_permutation(g.tensor([4, 2], name="c2", data_type="int32"), 0, name="p")
    slot = g.tensor([4, 2], name="s", data_type="int32")
    with pytest.raises(gd.ShapeError, match=r"node 'u'.*weights has dims \[4, 3\], expected slot's \[4, 2\]"):
        g.moe_unpermute(x, slot, g.tensor([4, 3], name="w"), name="u")
    firsts = g.tensor([3], name="f", data_type="int32")
    with pytest.raises(gd.ShapeError, match=r"node 'mm'.*weight has dims \[3, 4, 2\]; expected \[experts, 3, N\]"):
        g.moe_grouped_matmul(x, g.tensor([3, 4, 2], name="w3"), firsts, name="mm")
    with pytest.raises(gd.ShapeError, match=r"node 'mm'.*first_token_offset has dims \[3\], expected \[2\]"):
        g.moe_grouped_matmul(x, g.tensor([2, 3, 2], name="w4"), firsts, name="mm")


def test_random_inputs_stay_in_range():
    """graphdnn run draws index inputs inside what each op accepts."""
    from graphdnn.random_inputs import random_inputs

    g, _ = moe_pipeline()
    ir = g.validate()
    feeds = random_inputs(ir, 3)
    assert feeds["chosen"].min() >= 0 and feeds["chosen"].max() <= 3
    reference.execute(ir, feeds)
