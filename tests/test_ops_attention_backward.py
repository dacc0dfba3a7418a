"""sdpa_backward: the reference against torch autograd through an independent masked softmax
(every mask, GQA/MQA, bias, padding, D != Dv), against central finite differences of the
forward reference, the rows the forward saw empty, validation errors and the JSON round trip."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from graphdnn import reference
from graphdnn.errors import DataTypeError, GraphError, ShapeError, StructureError
from graphdnn.ops import Category, get_op
from tests.test_ops_attention import MASKS, paper_slopes, qkv

torch = pytest.importorskip("torch")


# -- the oracle: torch autograd through a masked softmax written from its definition ------------
def torch_gradients(q, k, v, d_o, *, scale=1.0, bias=None, seq_q=None, seq_kv=None, **attrs: Any):
    """(dQ, dK, dV) of sum(O * dO), O the forward of docs/ops.md, in float64 torch."""
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    batch, heads, sq, _ = q.shape
    skv, group = k.shape[2], heads // k.shape[1]
    lq = torch.tensor([sq if seq_q is None else min(max(n, 0), sq) for n in seq_q or [sq] * batch])
    lkv = torch.tensor([skv if seq_kv is None else min(max(n, 0), skv) for n in seq_kv or [skv] * batch])
    i = torch.arange(sq).view(1, 1, sq, 1)
    j = torch.arange(skv).view(1, 1, 1, skv)
    lq, lkv = lq.view(batch, 1, 1, 1), lkv.view(batch, 1, 1, 1)
    diag = i + (lkv - lq if attrs.get("use_causal_mask_bottom_right") else 0)
    keep = (i < lq) & (j < lkv)
    if attrs.get("use_causal_mask") or attrs.get("use_causal_mask_bottom_right"):
        keep = keep & (j <= diag)
    if attrs.get("sliding_window_length") is not None:
        keep = keep & (j > diag - attrs["sliding_window_length"])
    s = scale * tq @ tk.repeat_interleave(group, 1).transpose(-1, -2)
    if bias is not None:
        s = s + torch.tensor(bias)
    if attrs.get("use_alibi_mask"):
        s = s + torch.tensor(paper_slopes(heads), dtype=torch.float64).view(1, heads, 1, 1) * (j - diag)
    keep = keep.expand(s.shape)
    top = torch.where(keep, s, -torch.inf).amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, 0.0)
    e = torch.where(keep, torch.exp(torch.where(keep, s - top, 0.0)), 0.0)
    total = e.sum(-1, keepdim=True)
    o = e @ tv.repeat_interleave(group, 1) / torch.where(total == 0, 1.0, total)
    (o * torch.tensor(d_o)).sum().backward()
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


# -- graphdnn: sdpa then sdpa_backward on its O and STATS, in float64 ---------------------------
def run_backward(q, k, v, d_o, *, scale=None, bias=None, seq_q=None, seq_kv=None, bshd=False, **attrs: Any):
    g = gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double")
    feeds: dict[gd.TensorSpec, Any] = {}

    def tensor(name: str, array: np.ndarray, data_type: str | None = None) -> gd.TensorSpec:
        stride = gd.packed_strides(array.shape, (0, 2, 1, 3)) if bshd and array.ndim == 4 else None
        spec = g.tensor(array.shape, stride=stride, data_type=data_type, name=name)
        feeds[spec] = array
        return spec

    qs, ks, vs, dos = (tensor(n, a) for n, a in (("q", q), ("k", k), ("v", v), ("do", d_o)))
    kw: dict[str, Any] = dict(attrs, attn_scale=scale)
    if bias is not None:
        kw["bias"] = tensor("bias", bias)
    if seq_q is not None:
        kw["use_padding_mask"] = True
        kw["seq_len_q"] = tensor("seq_q", np.array(seq_q, np.int32).reshape(-1, 1, 1, 1), "int32")
        kw["seq_len_kv"] = tensor("seq_kv", np.array(seq_kv, np.int32).reshape(-1, 1, 1, 1), "int32")
    o, stats = g.sdpa(qs, ks, vs, generate_stats=True, **kw)
    grads = g.sdpa_backward(qs, ks, vs, o, dos, stats, name="bwd", **kw)
    for grad in grads:
        grad.set_output(True)
    result = reference.execute(g, feeds)
    return tuple(result[grad.name] for grad in grads)


def assert_gradients(got, want) -> None:
    """Equal up to STATS' float32 rounding (P = exp(score - STATS) carries its relative error)."""
    for name, a, b in zip(("dQ", "dK", "dV"), got, want):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6, err_msg=name)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261123)


# (batch, Hq, Hk, Sq, Skv, D, Dv)
SHAPES = {
    "mha_7x13": (2, 2, 2, 7, 13, 5, 3),
    "gqa4_13x7": (1, 8, 2, 13, 7, 4, 6),
    "mqa_1x13": (2, 3, 1, 1, 13, 3, 2),
    "mqa_13x1": (1, 6, 1, 13, 1, 2, 5),
}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_is_torch_autograd_of_the_forward(rng, shape: str, mask: str) -> None:
    q, k, v = qkv(rng, *SHAPES[shape])
    d_o = rng.standard_normal((*q.shape[:3], v.shape[3]))
    attrs = MASKS[mask]
    got = run_backward(q, k, v, d_o, scale=0.375, bshd="7" in shape, **attrs)
    assert_gradients(got, torch_gradients(q, k, v, d_o, scale=0.375, **attrs))


@pytest.mark.parametrize("mask", ["none", "causal", "bottom_right_window", "alibi"])
@pytest.mark.parametrize(("seq_q", "seq_kv"), [([0, 5], [13, 0]), ([7, 3], [4, 13]), ([9, -2], [20, 6])])
def test_padding_with_empty_and_clamped_sequences(rng, mask: str, seq_q: list[int], seq_kv: list[int]) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 3, 4)
    d_o = rng.standard_normal((2, 4, 7, 4))
    attrs = MASKS[mask]
    got = run_backward(q, k, v, d_o, seq_q=seq_q, seq_kv=seq_kv, **attrs)
    assert_gradients(got, torch_gradients(q, k, v, d_o, seq_q=seq_q, seq_kv=seq_kv, **attrs))


@pytest.mark.parametrize("bias_dims", [(1, 1, 7, 13), (2, 4, 1, 13), (2, 4, 7, 13)])
def test_a_bias_shifts_the_scores(rng, bias_dims: tuple[int, ...]) -> None:
    q, k, v = qkv(rng, 2, 4, 2, 7, 13, 3, 4)
    d_o, bias = rng.standard_normal((2, 4, 7, 4)), rng.standard_normal(bias_dims)
    got = run_backward(q, k, v, d_o, bias=bias, scale=0.5, use_causal_mask_bottom_right=True)
    assert_gradients(got, torch_gradients(q, k, v, d_o, bias=bias, scale=0.5, use_causal_mask_bottom_right=True))


@pytest.mark.compile_sample
@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(*(st.integers(1, 3),) * 2, *(st.integers(1, 9),) * 4),
    mask=st.sampled_from(sorted(MASKS)),
    scale=st.floats(0.05, 1.5),
    seed=st.integers(0, 2**16),
)
def test_any_shape_and_mask_matches_torch_autograd(shape, mask: str, scale: float, seed: int) -> None:
    batch, kv_heads, sq, skv, d, dv = shape
    heads = kv_heads * (1 + seed % 3)
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, batch, heads, kv_heads, sq, skv, d, dv)
    d_o = rng.standard_normal((batch, heads, sq, dv))
    got = run_backward(q, k, v, d_o, scale=scale, **MASKS[mask])
    assert_gradients(got, torch_gradients(q, k, v, d_o, scale=scale, **MASKS[mask]))


def test_reference_is_the_finite_difference_gradient_of_the_forward_reference(rng) -> None:
    """d/dx sum(O(x) * dO) by central differences of sdpa's own reference, element by element."""
    from tests.test_ops_attention import run_sdpa

    q, k, v = qkv(rng, 1, 4, 2, 5, 6, 3, 2)
    d_o = rng.standard_normal((1, 4, 5, 2))
    attrs = {"use_causal_mask_bottom_right": True, "use_alibi_mask": True, "sliding_window_length": 4}
    grads = run_backward(q, k, v, d_o, scale=0.7, **attrs)
    step = 1e-6
    for index, (x, grad) in enumerate(zip((q, k, v), grads)):
        for at in np.ndindex(x.shape):
            plus, minus = ([a.copy() for a in (q, k, v)] for _ in range(2))
            plus[index][at] += step
            minus[index][at] -= step
            loss = [(run_sdpa(*args, scale=0.7, **attrs)[0] * d_o).sum() for args in (plus, minus)]
            assert grad[at] == pytest.approx((loss[0] - loss[1]) / (2 * step), abs=1e-6)


def test_rows_the_forward_saw_empty_have_zero_gradients(rng) -> None:
    q, k, v = qkv(rng, 1, 2, 1, 7, 3, 2, 2)
    d_o = rng.standard_normal((1, 2, 7, 2))
    dq, dk, dv = run_backward(q, k, v, d_o, use_causal_mask_bottom_right=True)  # rows 0-3 see no key
    assert (dq[:, :, :4] == 0).all() and np.isfinite(dq).all()
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


# -- the node: dims, validation, JSON ------------------------------------------------------------
def graph_with(**overrides: Any) -> tuple[gd.OperationGraphSpec, dict[str, Any]]:
    """A bf16 graph and sdpa_backward's tensor arguments, each made by a default or an override."""
    makers: dict[str, Any] = {
        "q": lambda g: g.tensor([2, 4, 7, 16], name="q"),
        "k": lambda g: g.tensor([2, 2, 9, 16], name="k"),
        "v": lambda g: g.tensor([2, 2, 9, 8], name="v"),
        "o": lambda g: g.tensor([2, 4, 7, 8], name="o"),
        "dO": lambda g: g.tensor([2, 4, 7, 8], name="do"),
        "stats": lambda g: g.tensor([2, 4, 7, 1], data_type="float", name="stats"),
    }
    g = gd.OperationGraphSpec(io_data_type="bfloat16")
    return g, {role: make(g) for role, make in (makers | overrides).items()}


def test_gradients_take_the_dims_of_q_k_and_v_and_the_io_type() -> None:
    g, args = graph_with()
    dq, dk, dv = g.sdpa_backward(**args, attn_scale=0.25, use_causal_mask=True)
    assert (dq.dim, dk.dim, dv.dim) == ((2, 4, 7, 16), (2, 2, 9, 16), (2, 2, 9, 8))
    assert tuple(dq.stride) == (448, 112, 16, 1)
    assert get_op("sdpa_backward").category is Category.ATTENTION
    for t in (dq, dk, dv):
        t.set_output(True)
    ir = g.validate()
    assert {t.data_type.value for t in ir.outputs} == {"bfloat16"}


ERRORS = {
    "o_dims": ({"o": lambda g: g.tensor([2, 4, 7, 9], name="o")}, {}, ShapeError, r"O has dims \[2, 4, 7, 9\].*\[2, 4, 7, 8\]"),
    "do_dims": ({"dO": lambda g: g.tensor([2, 4, 8, 8], name="do")}, {}, ShapeError, r"DO has dims"),
    "stats_dims": ({"stats": lambda g: g.tensor([2, 4, 7, 2], data_type="float", name="stats")}, {}, ShapeError, r"STATS has dims \[2, 4, 7, 2\]"),
    "stats_type": ({"stats": lambda g: g.tensor([2, 4, 7, 1], name="stats")}, {}, DataTypeError, r"STATS 'stats' is bfloat16"),
    "heads": ({"k": lambda g: g.tensor([2, 3, 9, 16], name="k"), "v": lambda g: g.tensor([2, 3, 9, 8], name="v")}, {}, ShapeError, "not a multiple"),
    "alibi_alone": ({}, {"use_alibi_mask": True}, GraphError, "use_alibi_mask needs a causal mask"),
    "two_causal": ({}, {"use_causal_mask": True, "use_causal_mask_bottom_right": True}, GraphError, "exclude each other"),
    "padding_without_lengths": ({}, {"use_padding_mask": True}, StructureError, "needs SEQ_LEN_Q and SEQ_LEN_KV"),
    "window": ({}, {"sliding_window_length": 0}, GraphError, "at least 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", ERRORS)
def test_validation_errors_name_the_node_and_the_role(case: str) -> None:
    overrides, attrs, error, message = ERRORS[case]
    g, args = graph_with(**overrides)
    with pytest.raises(error, match=message) as raised:
        g.sdpa_backward(**args, **attrs, name="bwd")
        g.validate()
    assert "bwd" in str(raised.value)


def test_json_round_trip_keeps_the_node_and_its_signature(rng) -> None:
    g, args = graph_with()
    seq = {n: g.tensor([2, 1, 1, 1], data_type="int32", name=n) for n in ("sq", "skv")}
    grads = g.sdpa_backward(
        **args, attn_scale=0.5, use_causal_mask_bottom_right=True, sliding_window_length=3, use_padding_mask=True,
        seq_len_q=seq["sq"], seq_len_kv=seq["skv"], bias=g.tensor([1, 4, 7, 9], name="bias"), name="bwd",
    )  # fmt: skip
    for grad in grads:
        grad.set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text
    (node,) = [n for n in again.validate().nodes if n.op == "sdpa_backward"]
    assert node.attributes.sliding_window_length == 3 and node.attributes.use_causal_mask_bottom_right
