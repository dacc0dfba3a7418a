"""Normalization ops: reference semantics against loop-based textbook formulas, backward ops
against finite differences of the forward ops, shape validation, and optional outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.ops import Category, get_op
from graphdnn.ops.norms import NormForwardPhase

EPS = 2.0**-10  # exact in float32, the type of Python-number constants
NORM_KINDS = (
    "batchnorm",
    "batchnorm_inference",
    "layernorm",
    "rmsnorm",
    "instancenorm",
    "groupnorm",
    "batchnorm_backward",
    "layernorm_backward",
    "rmsnorm_backward",
    "adalayernorm",
    "instancenorm_backward",
    "groupnorm_backward",
    "adalayernorm_backward",
)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240607)


def _graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double")


def _run(g: gd.OperationGraphSpec, outputs: list, feeds: dict) -> list[np.ndarray]:
    for t in outputs:
        t.set_output(True)
    result = reference.execute(g, feeds)
    return [result[t.name] for t in outputs]


def _input(g: gd.OperationGraphSpec, dims: list[int], layout: str = "nchw", name: str = "x") -> gd.TensorSpec:
    stride = gd.nhwc_strides(dims) if layout == "nhwc" else gd.nchw_strides(dims)
    return g.tensor(dims, stride=stride, name=name)


def _per_channel(dims: list[int]) -> list[int]:
    return [1, dims[1]] + [1] * (len(dims) - 2)


def _set_stats(values: np.ndarray, eps: float, centered: bool = True) -> tuple[float, float]:
    """Mean and 1/sqrt(biased variance + eps) of one set, summed in plain Python."""
    items = values.ravel().tolist()
    mean = sum(items) / len(items) if centered else 0.0
    var = sum((v - mean) ** 2 for v in items) / len(items)
    return mean, 1.0 / math.sqrt(var + eps)


def _loop_norm(x: np.ndarray, axes: tuple[int, ...], eps: float, centered: bool = True):
    """Statistics of every set spanned by ``axes``, one set at a time; dims keep 1 on ``axes``."""
    dims = tuple(1 if axis in axes else extent for axis, extent in enumerate(x.shape))
    mean, inv = np.zeros(dims), np.zeros(dims)
    for index in np.ndindex(*dims):
        members = tuple(slice(None) if axis in axes else i for axis, i in enumerate(index))
        mean[index], inv[index] = _set_stats(x[members], eps, centered)
    return mean, inv


FORWARD_SHAPES = [
    ([3, 5], "nchw"),
    ([3, 5, 7], "nchw"),
    ([3, 5, 7], "nhwc"),
    ([3, 5, 7, 1], "nchw"),
    ([3, 5, 7, 1], "nhwc"),
    ([2, 3, 4, 1, 3], "nhwc"),
]


# -- batch norm ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("dims", "layout"), FORWARD_SHAPES)
def test_batchnorm_matches_per_channel_loop(rng, dims, layout):
    g = _graph()
    x = _input(g, dims, layout)
    scale, bias = g.tensor(_per_channel(dims), name="scale"), g.tensor(_per_channel(dims), name="bias")
    y, mean, inv, next_mean, next_var = g.batchnorm(x, scale, bias, epsilon=EPS)
    assert next_mean is None and next_var is None
    assert y.get_stride() == list(x.stride)  # the input's layout
    assert mean.get_dim() == inv.get_dim() == _per_channel(dims)

    xs, ss, bs = rng.normal(size=dims) * 3 + 1, rng.normal(size=_per_channel(dims)), rng.normal(size=_per_channel(dims))
    got_y, got_mean, got_inv = _run(g, [y, mean, inv], {x: xs, scale: ss, bias: bs})

    want_y = np.empty(dims)
    for c in range(dims[1]):
        m, i = _set_stats(xs[:, c], EPS)
        assert got_mean.ravel()[c] == pytest.approx(m, rel=1e-12)
        assert got_inv.ravel()[c] == pytest.approx(i, rel=1e-12)
        want_y[:, c] = (xs[:, c] - m) * i * ss.ravel()[c] + bs.ravel()[c]
    np.testing.assert_allclose(got_y, want_y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dims", [[3, 5, 7, 1], [1, 3]])  # [1, 3]: one element per channel
def test_batchnorm_updates_running_statistics(rng, dims):
    g = _graph()
    x = _input(g, dims)
    per_channel = _per_channel(dims)
    scale, bias, run_mean, run_var = (g.tensor(per_channel, name=n) for n in ("scale", "bias", "rm", "rv"))
    momentum = g.tensor([1], is_pass_by_value=True, data_type="float", name="momentum")
    _, mean, _, next_mean, next_var = g.batchnorm(x, scale, bias, run_mean, run_var, EPS, momentum)
    xs = rng.normal(size=dims)
    feeds = {x: xs, scale: rng.normal(size=per_channel), bias: rng.normal(size=per_channel)}
    rm, rv = rng.normal(size=per_channel), rng.uniform(0.5, 2.0, size=per_channel)
    got_mean, got_next_mean, got_next_var = _run(
        g, [mean, next_mean, next_var], feeds | {run_mean: rm, run_var: rv, momentum: 0.25}
    )
    for c in range(dims[1]):
        items = xs[:, c].ravel().tolist()
        n = len(items)
        m = sum(items) / n
        unbiased = sum((v - m) ** 2 for v in items) / (n - 1) if n > 1 else 0.0
        assert got_mean.ravel()[c] == pytest.approx(m, rel=1e-12)
        assert got_next_mean.ravel()[c] == pytest.approx(0.75 * rm.ravel()[c] + 0.25 * m, rel=1e-12)
        assert got_next_var.ravel()[c] == pytest.approx(0.75 * rv.ravel()[c] + 0.25 * unbiased, rel=1e-12)


@pytest.mark.parametrize(("dims", "layout"), FORWARD_SHAPES)
def test_batchnorm_inference_applies_given_statistics(rng, dims, layout):
    g = _graph()
    x = _input(g, dims, layout)
    per_channel = _per_channel(dims)
    mean, inv, scale, bias = (g.tensor(per_channel, name=n) for n in ("mean", "inv", "scale", "bias"))
    y = g.batchnorm_inference(x, mean, inv, scale, bias)
    assert y.get_stride() == list(x.stride)
    values = {t: rng.normal(size=per_channel) for t in (mean, inv, scale, bias)}
    xs = rng.normal(size=dims)
    (got,) = _run(g, [y], values | {x: xs})
    for c in range(dims[1]):
        m, i, s, b = (values[t].ravel()[c] for t in (mean, inv, scale, bias))
        np.testing.assert_allclose(got[:, c], (xs[:, c] - m) * i * s + b, rtol=1e-12, atol=1e-12)


# -- layer, RMS and instance norm ------------------------------------------------------------------
# (input dims, scale dims, the axes each set spans, written out by hand)
LAYERNORM_CASES = [
    ([3, 5], [1, 5], (1,)),
    ([3, 5, 7], [5, 7], (1, 2)),  # scale right-aligned, leading dim missing
    ([3, 5, 7], [1, 5, 1], (1,)),  # one set per (n, w)
    ([3, 5, 7, 1], [1, 5, 7, 1], (1, 2)),
    ([2, 3, 4, 1, 3], [1, 1, 4, 1, 3], (2, 4)),
    ([3, 1], [1, 1], (1,)),  # scale 1 everywhere: every axis but the first
    ([2, 3, 4], [1], (1, 2)),
]


@pytest.mark.parametrize(("dims", "scale_dims", "axes"), LAYERNORM_CASES)
def test_layernorm_matches_per_row_loop(rng, dims, scale_dims, axes):
    g = _graph()
    x = _input(g, dims)
    scale, bias = g.tensor(scale_dims, name="scale"), g.tensor(scale_dims, name="bias")
    y, mean, inv = g.layernorm("training", x, scale, bias, EPS)
    stats_dims = [1 if axis in axes else d for axis, d in enumerate(dims)]
    assert mean.get_dim() == inv.get_dim() == stats_dims
    xs, ss, bs = rng.normal(size=dims) * 2 - 1, rng.normal(size=scale_dims), rng.normal(size=scale_dims)
    got_y, got_mean, got_inv = _run(g, [y, mean, inv], {x: xs, scale: ss, bias: bs})
    want_mean, want_inv = _loop_norm(xs, axes, EPS)
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got_inv, want_inv, rtol=1e-12)
    np.testing.assert_allclose(got_y, (xs - want_mean) * want_inv * ss + bs, rtol=1e-12, atol=1e-12)


def test_layernorm_output_follows_input_layout(rng):
    dims = [3, 5, 7, 1]
    g = _graph()
    x = _input(g, dims, "nhwc")
    scale, bias = g.tensor([1, 5, 7, 1], name="scale"), g.tensor([1, 5, 7, 1], name="bias")
    y, mean, _ = g.layernorm(NormForwardPhase.TRAINING, x, scale, bias, EPS)
    assert y.get_stride() == list(gd.nhwc_strides(dims))
    assert mean.get_stride() == list(gd.packed_strides([3, 1, 1, 1]))
    xs = rng.normal(size=dims)
    (got,) = _run(g, [y], {x: xs, scale: np.ones([1, 5, 7, 1]), bias: np.zeros([1, 5, 7, 1])})
    want_mean, want_inv = _loop_norm(xs, (1, 2), EPS)
    np.testing.assert_allclose(got, (xs - want_mean) * want_inv, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("dims", "scale_dims", "axes"), LAYERNORM_CASES[:4])
def test_rmsnorm_matches_per_row_loop(rng, dims, scale_dims, axes, with_bias):
    g = _graph()
    x = _input(g, dims)
    scale = g.tensor(scale_dims, name="scale")
    bias = g.tensor(scale_dims, name="bias") if with_bias else None
    y, inv = g.rmsnorm("training", x, scale, bias, EPS)
    xs, ss = rng.normal(size=dims) + 0.5, rng.normal(size=scale_dims)
    feeds = {x: xs, scale: ss}
    bs = rng.normal(size=scale_dims) if with_bias else 0.0
    if with_bias:
        feeds[bias] = bs
    got_y, got_inv = _run(g, [y, inv], feeds)
    _, want_inv = _loop_norm(xs, axes, EPS, centered=False)
    np.testing.assert_allclose(got_inv, want_inv, rtol=1e-12)
    np.testing.assert_allclose(got_y, xs * want_inv * ss + bs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("dims", "layout"), FORWARD_SHAPES[1:])
def test_instancenorm_matches_per_sample_channel_loop(rng, dims, layout):
    g = _graph()
    x = _input(g, dims, layout)
    scale, bias = g.tensor(_per_channel(dims), name="scale"), g.tensor(_per_channel(dims), name="bias")
    y, mean, inv = g.instancenorm("training", x, scale, bias, EPS)
    assert mean.get_dim() == dims[:2] + [1] * (len(dims) - 2)
    assert y.get_stride() == list(x.stride)
    xs, ss, bs = rng.normal(size=dims), rng.normal(size=_per_channel(dims)), rng.normal(size=_per_channel(dims))
    got_y, got_mean, got_inv = _run(g, [y, mean, inv], {x: xs, scale: ss, bias: bs})
    for n in range(dims[0]):
        for c in range(dims[1]):
            m, i = _set_stats(xs[n, c], EPS)
            assert got_mean[n, c].item() == pytest.approx(m, rel=1e-12, abs=1e-14)
            assert got_inv[n, c].item() == pytest.approx(i, rel=1e-12)
            want = (xs[n, c] - m) * i * ss.ravel()[c] + bs.ravel()[c]
            np.testing.assert_allclose(got_y[n, c], want, rtol=1e-12, atol=1e-12)


# -- group norm ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dims", "layout", "groups"),
    [([3, 6], "nchw", 2), ([3, 6, 5], "nhwc", 3), ([3, 6, 7, 1], "nchw", 1), ([2, 6, 3, 1, 2], "nhwc", 6)],
)
def test_groupnorm_matches_per_sample_group_loop(rng, dims, layout, groups):
    g = _graph()
    x = _input(g, dims, layout)
    scale, bias = g.tensor(_per_channel(dims), name="scale"), g.tensor(_per_channel(dims), name="bias")
    y, mean, inv = g.groupnorm(x, scale, bias, EPS, groups, norm_forward_phase="training")
    assert mean.get_dim() == [dims[0], groups] + [1] * (len(dims) - 2)
    assert y.get_stride() == list(x.stride)
    xs, ss, bs = rng.normal(size=dims), rng.normal(size=_per_channel(dims)), rng.normal(size=_per_channel(dims))
    got_y, got_mean, got_inv = _run(g, [y, mean, inv], {x: xs, scale: ss, bias: bs})
    per_group = dims[1] // groups
    for n in range(dims[0]):
        for k in range(groups):
            channels = slice(k * per_group, (k + 1) * per_group)
            m, i = _set_stats(xs[n, channels], EPS)
            assert got_mean[n, k].item() == pytest.approx(m, rel=1e-12, abs=1e-14)
            assert got_inv[n, k].item() == pytest.approx(i, rel=1e-12)
            for c in range(channels.start, channels.stop):
                want = (xs[n, c] - m) * i * ss.ravel()[c] + bs.ravel()[c]
                np.testing.assert_allclose(got_y[n, c], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("dims", "scale_dims"), [([2, 3, 4], [2, 1, 4]), ([3, 5], [3, 5]), ([2, 2, 3, 2], [2, 1, 3, 2])]
)
@pytest.mark.parametrize("with_bias", [True, False])
def test_adalayernorm_matches_per_row_loop_with_per_sample_affine(rng, dims, scale_dims, with_bias):
    g = _graph()
    x, scale = g.tensor(dims, name="x"), g.tensor(scale_dims, name="scale")
    bias = g.tensor(scale_dims, name="bias") if with_bias else None
    y, mean, inv = g.adalayernorm("training", x, scale, bias, EPS)
    assert mean.get_dim() == [dims[0], *(1 if s > 1 else d for s, d in zip(scale_dims[1:], dims[1:]))]
    xv, sv = rng.normal(size=dims), rng.normal(size=scale_dims)
    bv = rng.normal(size=scale_dims) if with_bias else np.zeros(scale_dims)
    feeds = {x: xv, scale: sv, **({bias: bv} if with_bias else {})}
    got_y, got_mean, got_inv = _run(g, [y, mean, inv], feeds)
    axes = tuple(axis for axis in range(1, len(dims)) if scale_dims[axis] > 1)
    want_mean, want_inv = _loop_norm(xv, axes, EPS)
    np.testing.assert_allclose(got_mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_inv, want_inv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_y, (xv - want_mean) * want_inv * sv + bv, rtol=1e-12, atol=1e-12)


# -- backward ops against finite differences ----------------------------------------------------------
def _central_differences(loss, arrays: dict[str, np.ndarray], h: float = 1e-6) -> dict[str, np.ndarray]:
    """d loss / d every element of every array, by central differences."""
    grads = {}
    for name, array in arrays.items():
        grad = np.zeros_like(array)
        for index in np.ndindex(*array.shape):
            plus, minus = array.copy(), array.copy()
            plus[index] += h
            minus[index] -= h
            grad[index] = (loss({**arrays, name: plus}) - loss({**arrays, name: minus})) / (2 * h)
        grads[name] = grad
    return grads


def _forward(build, dims: list[int], param_dims: list[int], with_bias: bool = True):
    """A forward graph (built by ``build(g, x, scale, bias)``) and a function running it by name."""
    g = _graph()
    x, scale = g.tensor(dims, name="x"), g.tensor(param_dims, name="scale")
    bias = g.tensor(param_dims, name="bias") if with_bias else None
    outputs = [t for t in build(g, x, scale, bias) if t is not None]
    for t in outputs:
        t.set_output(True)
    ir = g.validate()
    return lambda feeds: [reference.execute(ir, feeds)[t.name] for t in outputs]


def _check_backward(forward, backward, dims, param_dims, rng, with_bias=True):
    """Run the backward op (grad = w) on the forward's saved statistics; compare with d sum(w * y)."""
    arrays = {"x": rng.normal(size=dims) * 2 + 0.5, "scale": rng.normal(size=param_dims)}
    if with_bias:
        arrays["bias"] = rng.normal(size=param_dims)
    w = rng.normal(size=dims)
    _, *stats = forward(arrays)
    numeric = _central_differences(lambda feeds: float(np.sum(w * forward(feeds)[0])), arrays)

    g = _graph()
    grad, x, scale = g.tensor(dims, name="grad"), g.tensor(dims, name="x"), g.tensor(param_dims, name="scale")
    saved = [g.tensor(list(s.shape), name=f"stat{i}") for i, s in enumerate(stats)]
    dx, dscale, dbias = backward(g, grad, x, scale, *saved)
    assert dx.get_dim() == dims and dscale.get_dim() == param_dims
    feeds = {grad: w, x: arrays["x"], scale: arrays["scale"], **dict(zip(saved, stats))}
    wanted = [dx, dscale] + ([dbias] if with_bias else [])
    got = _run(g, wanted, feeds)
    for name, value in zip(("x", "scale", "bias"), got):
        np.testing.assert_allclose(value, numeric[name], rtol=1e-6, atol=1e-7, err_msg=f"d{name}")
    return dbias


@pytest.mark.parametrize("dims", [[2, 3, 2], [4, 3], [2, 2, 1, 2]])
def test_batchnorm_backward_is_the_gradient_of_batchnorm(rng, dims):
    forward = _forward(lambda g, x, s, b: g.batchnorm(x, s, b, epsilon=EPS)[:3], dims, _per_channel(dims))
    _check_backward(forward, lambda g, *t: g.batchnorm_backward(*t), dims, _per_channel(dims), rng)


@pytest.mark.parametrize(("dims", "scale_dims"), [([3, 4], [1, 4]), ([2, 3, 2], [1, 3, 1]), ([2, 2, 3], [2, 3])])
def test_layernorm_backward_is_the_gradient_of_layernorm(rng, dims, scale_dims):
    forward = _forward(lambda g, x, s, b: g.layernorm("training", x, s, b, EPS), dims, scale_dims)
    _check_backward(forward, lambda g, *t: g.layernorm_backward(*t), dims, scale_dims, rng)


@pytest.mark.parametrize("has_dbias", [True, False])
@pytest.mark.parametrize(("dims", "scale_dims"), [([3, 4], [4]), ([2, 3, 2], [1, 3, 1])])
def test_rmsnorm_backward_is_the_gradient_of_rmsnorm(rng, dims, scale_dims, has_dbias):
    forward = _forward(lambda g, x, s, b: g.rmsnorm("training", x, s, b, EPS), dims, scale_dims, has_dbias)
    dbias = _check_backward(
        forward, lambda g, *t: g.rmsnorm_backward(*t, has_dbias=has_dbias), dims, scale_dims, rng, has_dbias
    )
    assert (dbias is not None) == has_dbias


@pytest.mark.parametrize("dims", [[2, 3, 2, 2], [1, 2, 5]])
def test_instancenorm_backward_is_the_gradient_of_instancenorm(rng, dims):
    forward = _forward(lambda g, x, s, b: g.instancenorm("training", x, s, b, EPS), dims, _per_channel(dims))
    _check_backward(forward, lambda g, *t: g.instancenorm_backward(*t), dims, _per_channel(dims), rng)


@pytest.mark.parametrize(("dims", "groups"), [([2, 4, 3], 2), ([2, 6, 2, 1], 3), ([1, 3, 2], 1)])
def test_groupnorm_backward_is_the_gradient_of_groupnorm(rng, dims, groups):
    forward = _forward(lambda g, x, s, b: g.groupnorm(x, s, b, EPS, groups, "training"), dims, _per_channel(dims))
    _check_backward(forward, lambda g, *t: g.groupnorm_backward(*t, groups=groups), dims, _per_channel(dims), rng)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize(("dims", "scale_dims"), [([2, 3, 4], [2, 1, 4]), ([2, 2, 3, 2], [2, 1, 3, 2])])
def test_adalayernorm_backward_is_the_gradient_of_adalayernorm(rng, dims, scale_dims, with_bias):
    forward = _forward(lambda g, x, s, b: g.adalayernorm("training", x, s, b, EPS), dims, scale_dims, with_bias)
    _check_backward(forward, lambda g, *t: g.adalayernorm_backward(*t), dims, scale_dims, rng, with_bias)


def test_the_new_norms_survive_a_json_round_trip():
    g = gd.OperationGraphSpec(io_data_type="float", name="norms")
    x, dy, per_sample = g.tensor([2, 3, 4], name="x"), g.tensor([2, 3, 4], name="dy"), g.tensor([2, 1, 4], name="s")
    y, mean, inv = g.adalayernorm("training", x, per_sample, epsilon=EPS, name="ada")
    outputs = [y, *g.adalayernorm_backward(dy, x, per_sample, mean, inv, name="dada")]
    image, stats = g.tensor([2, 4, 3], name="image"), g.tensor([2, 2, 1], name="stats")
    outputs += g.groupnorm_backward(image, image, g.tensor([1, 4, 1]), stats, stats, groups=2, name="dgn")
    outputs += g.instancenorm_backward(image, image, g.tensor([1, 4, 1]), g.tensor([2, 4, 1]), g.tensor([2, 4, 1]))
    for t in outputs:
        t.set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text
    assert [node.attributes for node in again.validate().nodes] == [node.attributes for node in g.validate().nodes]


# -- validation -------------------------------------------------------------------------------------
def _bn_graph(dims=(3, 5, 7, 1)):
    g = gd.OperationGraphSpec(io_data_type="float")
    return g, g.tensor(list(dims), name="x")


def test_per_channel_dims_are_checked():
    g, x = _bn_graph()
    with pytest.raises(
        gd.ShapeError,
        match=r"node 'bn'.*scale has dims \[1, 4, 1, 1\], expected \[1, 5, 1, 1\] \(one value per channel\)",
    ):
        g.batchnorm(x, g.tensor([1, 4, 1, 1]), g.tensor([1, 5, 1, 1]), epsilon=EPS, name="bn")
    with pytest.raises(gd.ShapeError, match=r"node 'bni'.*mean has dims \[5\], expected \[1, 5, 1, 1\]"):
        per_channel = [1, 5, 1, 1]
        g.batchnorm_inference(x, g.tensor([5]), *(g.tensor(per_channel) for _ in range(3)), name="bni")
    with pytest.raises(gd.ShapeError, match=r"node 'in'.*bias has dims \[1, 5\], expected \[1, 5, 1, 1\]"):
        g.instancenorm("training", x, g.tensor([1, 5, 1, 1]), g.tensor([1, 5]), EPS, name="in")


def test_running_statistics_are_checked():
    g, x = _bn_graph()
    per_channel = [1, 5, 1, 1]
    scale, bias = g.tensor(per_channel), g.tensor(per_channel)
    with pytest.raises(gd.ShapeError, match=r"node 'a'.*in_running_var has dims \[1, 5\], expected \[1, 5, 1, 1\]"):
        g.batchnorm(x, scale, bias, g.tensor(per_channel), g.tensor([1, 5]), EPS, 0.1, name="a")
    with pytest.raises(gd.StructureError, match=r"node 'b'.*in_running_var is given alone"):
        g.batchnorm(x, scale, bias, in_running_var=g.tensor(per_channel), epsilon=EPS, momentum=0.1, name="b")
    with pytest.raises(gd.StructureError, match=r"node 'c'.*momentum is needed"):
        g.batchnorm(x, scale, bias, g.tensor(per_channel), g.tensor(per_channel), EPS, name="c")
    with pytest.raises(gd.StructureError, match=r"node 'd'.*missing input 'epsilon'"):
        g.batchnorm(x, scale, bias, name="d")


def test_layernorm_scale_and_bias_dims_are_checked():
    g = gd.OperationGraphSpec(io_data_type="float")
    x = g.tensor([4, 5, 3], name="x")
    with pytest.raises(
        gd.ShapeError, match=r"node 'a'.*bias has dims \[1, 5, 1\], expected \[1, 5, 3\] \(the same dims as scale\)"
    ):
        g.layernorm("training", x, g.tensor([1, 5, 3]), g.tensor([1, 5, 1]), EPS, name="a")
    with pytest.raises(
        gd.ShapeError,
        match=r"node 'b'.*scale has dims \[1, 6, 3\], expected 1 or the input's extent on each axis \(input has dims \[4, 5, 3\]\)",
    ):
        g.rmsnorm("inference", x, g.tensor([1, 6, 3]), epsilon=EPS, name="b")
    with pytest.raises(gd.ShapeError, match=r"node 'c'.*scale has dims \[1, 1, 5, 3\]"):
        g.layernorm("training", x, g.tensor([1, 1, 5, 3]), g.tensor([1, 1, 5, 3]), EPS, name="c")


def test_adalayernorm_scale_must_be_per_sample():
    g = gd.OperationGraphSpec(io_data_type="float")
    x = g.tensor([4, 5, 3], name="x")
    for name, dims in (("a", [1, 1, 3]), ("b", [1, 3]), ("c", [4, 1, 2])):
        with pytest.raises(
            gd.ShapeError,
            match=rf"node '{name}'.*scale has dims .*expected one row of scales per sample: the input's batch extent "
            r"first.*\[4, 1, \.\.\., 3\]",
        ):
            g.adalayernorm("training", x, g.tensor(dims), epsilon=EPS, name=name)
    with pytest.raises(gd.ShapeError, match=r"node 'd'.*bias has dims \[4, 1, 1\], expected \[4, 1, 3\]"):
        g.adalayernorm("training", x, g.tensor([4, 1, 3]), g.tensor([4, 1, 1]), EPS, name="d")
    with pytest.raises(gd.ShapeError, match=r"node 'e'.*mean has dims \[4, 1, 3\], expected \[4, 5, 1\]"):
        g.adalayernorm_backward(x, x, g.tensor([4, 1, 3]), g.tensor([4, 1, 3]), g.tensor([4, 5, 1]), name="e")


def test_groupnorm_backward_statistics_are_per_group():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale = g.tensor([2, 6, 3], name="x"), g.tensor([1, 6, 1])
    with pytest.raises(gd.ShapeError, match=r"node 'gb'.*mean has dims \[2, 6, 1\], expected \[2, 3, 1\]"):
        g.groupnorm_backward(x, x, scale, g.tensor([2, 6, 1]), g.tensor([2, 3, 1]), groups=3, name="gb")
    with pytest.raises(gd.AttributeValueError, match=r"node 'gc'.*groups is 4"):
        g.groupnorm_backward(x, x, scale, g.tensor([2, 2, 1]), g.tensor([2, 2, 1]), groups=4, name="gc")
    with pytest.raises(gd.ShapeError, match=r"node 'ib'.*scale has dims \[1, 6\], expected \[1, 6, 1\]"):
        g.instancenorm_backward(x, x, g.tensor([1, 6]), g.tensor([2, 6, 1]), g.tensor([2, 6, 1]), name="ib")


def test_groups_must_divide_channels():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale, bias = g.tensor([2, 6, 3]), g.tensor([1, 6, 1]), g.tensor([1, 6, 1])
    with pytest.raises(
        gd.AttributeValueError, match=r"node 'gn'.*groups is 4; it must be at least 1 and divide the input's 6 channels"
    ):
        g.groupnorm(x, scale, bias, EPS, groups=4, name="gn")
    with pytest.raises(gd.AttributeValueError, match=r"groups is 0"):
        g.groupnorm(x, scale, bias, EPS, groups=0)


def test_epsilon_must_be_a_scalar():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale = g.tensor([4, 5]), g.tensor([1, 5])
    with pytest.raises(gd.ShapeError, match=r"node 'ln'.*epsilon 'eps' must be a one-element scalar, has dims \[2\]"):
        g.layernorm("training", x, scale, g.tensor([1, 5]), g.tensor([2], name="eps"), name="ln")


def test_integer_input_is_rejected():
    g = gd.OperationGraphSpec(io_data_type="float")
    x = g.tensor([4, 5], data_type="int32", name="ints")
    with pytest.raises(gd.DataTypeError, match=r"node 'ln'.*input 'ints' is int32; layernorm needs a floating type"):
        g.layernorm("training", x, g.tensor([1, 5]), g.tensor([1, 5]), EPS, name="ln")


def test_input_rank_and_attributes_are_checked():
    g = gd.OperationGraphSpec(io_data_type="float")
    with pytest.raises(
        gd.ShapeError, match=r"node 'in'.*input has dims \[4, 5\], expected \[N, C, \*spatial\] of rank 3 to 5"
    ):
        g.instancenorm("training", g.tensor([4, 5]), g.tensor([1, 5]), g.tensor([1, 5]), EPS, name="in")
    with pytest.raises(gd.ShapeError, match=r"node 'ln'.*input has dims \[5\], expected rank 2 or more"):
        g.layernorm("training", g.tensor([5]), g.tensor([5]), g.tensor([5]), EPS, name="ln")
    with pytest.raises(gd.AttributeValueError, match=r"norm_forward_phase' must be one of 'training', 'inference'"):
        g.layernorm("warmup", g.tensor([4, 5]), g.tensor([1, 5]), g.tensor([1, 5]), EPS)


def test_backward_inputs_are_checked():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale = g.tensor([3, 4], name="x"), g.tensor([1, 4])
    with pytest.raises(gd.ShapeError, match=r"node 'a'.*mean has dims \[1, 4\], expected \[3, 1\]"):
        g.layernorm_backward(g.tensor([3, 4]), x, scale, g.tensor([1, 4]), g.tensor([3, 1]), name="a")
    with pytest.raises(
        gd.ShapeError, match=r"node 'b'.*grad has dims \[3, 1\], expected \[3, 4\] \(the input's dims\)"
    ):
        g.rmsnorm_backward(g.tensor([3, 1]), x, scale, g.tensor([3, 1]), has_dbias=False, name="b")
    with pytest.raises(gd.ShapeError, match=r"node 'c'.*inv_variance has dims \[4\], expected \[1, 4\]"):
        g.batchnorm_backward(g.tensor([3, 4]), x, scale, g.tensor([1, 4]), g.tensor([4]), name="c")


# -- optional outputs ---------------------------------------------------------------------------------
def test_inference_outputs_only_y():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale, bias = g.tensor([4, 5]), g.tensor([1, 5]), g.tensor([1, 5])
    outputs = g.layernorm("inference", x, scale, bias, EPS, name="ln")
    assert outputs[1:] == [None, None]
    outputs[0].set_output(True)
    ir = g.validate()
    assert [role for role, _ in ir.nodes[0].outputs] == ["y"]

    assert g.rmsnorm(NormForwardPhase.INFERENCE, x, scale, epsilon=EPS)[1] is None
    assert g.instancenorm("inference", g.tensor([2, 5, 3]), g.tensor([1, 5, 1]), g.tensor([1, 5, 1]), EPS)[1:] == [
        None,
        None,
    ]
    assert g.groupnorm(g.tensor([2, 5, 3]), g.tensor([1, 5, 1]), g.tensor([1, 5, 1]), EPS, groups=5)[1:] == [None, None]


def test_training_outputs_and_optional_gradients():
    g = gd.OperationGraphSpec(io_data_type="float")
    x, scale, bias = g.tensor([4, 5]), g.tensor([1, 5]), g.tensor([1, 5])
    assert all(t is not None for t in g.layernorm("TRAINING", x, scale, bias, EPS))
    assert all(t is not None for t in g.rmsnorm("training", x, scale, epsilon=EPS))
    assert g.batchnorm(x, scale, bias, epsilon=EPS)[3:] == [None, None]
    inv = g.tensor([4, 1])
    assert g.rmsnorm_backward(g.tensor([4, 5]), x, scale, inv, has_dbias=False)[2] is None
    assert g.rmsnorm_backward(g.tensor([4, 5]), x, scale, inv, has_dbias=True)[2] is not None


@pytest.mark.parametrize("kind", NORM_KINDS)
def test_every_norm_is_a_normalization(kind):
    assert get_op(kind).category is Category.NORMALIZATION
