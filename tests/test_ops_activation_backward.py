"""Activation backward ops (cuDNN frontend ``*_backward(loss, input)``): the reference against
central differences of the forward op's reference, values at the kinks, stability far out,
validation errors, JSON, and fusion into elementwise kernels and epilogues."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.ops.pointwise import BACKWARD_OF

from .compile_check import compile_graphs

# backward kind -> (attributes, given to both the forward and the backward builder; the points where
# the forward op has a kink, kept away from by the finite differences)
CASES: dict[str, tuple[dict[str, float], tuple[float, ...]]] = {
    "relu_backward": ({"negative_slope": 0.1, "lower_clip": -0.5, "upper_clip": 1.5}, (-0.5, 1.5)),
    "leaky_relu_backward": ({"negative_slope": 0.2}, (0.0,)),
    "elu_backward": ({"alpha": 0.7}, (0.0,)),
    "gelu_backward": ({}, ()),
    "gelu_approx_tanh_backward": ({}, ()),
    "swish_backward": ({"swish_beta": 1.5}, ()),
    "sigmoid_backward": ({}, ()),
    "tanh_backward": ({}, ()),
    "softplus_backward": ({"softplus_beta": 2.0}, ()),
}

STEP = 1e-6


def double_graph(name: str = "bwd") -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(name=name, io_data_type="double", intermediate_data_type="double")


def forward(kind: str, attrs: dict[str, float], x: np.ndarray) -> np.ndarray:
    g = double_graph()
    y = getattr(g, BACKWARD_OF[kind])(g.tensor(list(x.shape), name="x"), **attrs).set_output(True)
    return gd.reference.execute(g, {"x": x})[y.name]


def test_every_backward_kind_has_a_case_and_a_frontend_builder() -> None:
    assert set(CASES) == set(BACKWARD_OF)
    for kind in BACKWARD_OF:
        parameters = list(inspect.signature(getattr(gd.OperationGraphSpec, kind)).parameters)
        assert parameters[1:3] == ["loss", "input"], kind
        assert parameters[-2:] == ["compute_data_type", "name"], kind


@pytest.mark.parametrize("kind", sorted(CASES))
def test_reference_is_loss_times_the_central_difference_of_the_forward_op(kind: str, rng: np.random.Generator) -> None:
    """loss [1, 4, 1, 3] and input [2, 1, 5, 3] broadcast to dx [2, 4, 5, 3]."""
    attrs, kinks = CASES[kind]
    x = rng.uniform(-4, 4, (2, 1, 5, 3))
    for kink in kinks:  # the derivative is one-sided there: keep the differences on one side
        x = np.where(np.abs(x - kink) < 1e-3, kink + 0.01, x)
    loss = rng.standard_normal((1, 4, 1, 3))
    g = double_graph()
    dx = getattr(g, kind)(g.tensor([1, 4, 1, 3], name="loss"), g.tensor([2, 1, 5, 3], name="x"), **attrs)
    dx.set_output(True)
    assert dx.dim == (2, 4, 5, 3)
    got = gd.reference.execute(g, {"loss": loss, "x": x})[dx.name]
    slope = (forward(kind, attrs, x + STEP) - forward(kind, attrs, x - STEP)) / (2 * STEP)
    np.testing.assert_allclose(got, loss * slope, rtol=1e-7, atol=1e-8)


def one_value(kind: str, x: list[float], **attrs: Any) -> np.ndarray:
    """dx for loss 1 at the points ``x``."""
    g = double_graph()
    n = len(x)
    dx = getattr(g, kind)(g.tensor([n], name="loss"), g.tensor([n], name="x"), **attrs).set_output(True)
    return gd.reference.execute(g, {"loss": np.ones(n), "x": np.array(x)})[dx.name]


def test_slopes_at_the_kinks() -> None:
    """At lower_clip the lower slope, at upper_clip 0 (as PyTorch's threshold and hardtanh
    backward), 1 strictly between; leaky ReLU and ELU take their negative side at 0."""
    relu = {"negative_slope": 0.25, "lower_clip": -1.0, "upper_clip": 2.0}
    np.testing.assert_array_equal(one_value("relu_backward", [-1.0, -0.5, 2.0, 3.0], **relu), [0.25, 1, 0, 0])
    np.testing.assert_array_equal(one_value("relu_backward", [0.0, 1e-300, 1e300]), [0, 1, 1])
    np.testing.assert_array_equal(one_value("leaky_relu_backward", [0.0, 1.0]), [0.01, 1])
    np.testing.assert_allclose(one_value("elu_backward", [0.0, -1.0], alpha=0.5), [0.5, 0.5 * np.exp(-1)])


def test_far_out_the_slopes_are_finite() -> None:
    """No inf / inf or inf - inf at |x| = 40 and 800 (e^800 overflows float64)."""
    for kind, at_minus, at_plus in [
        ("sigmoid_backward", 0.0, 0.0),
        ("tanh_backward", 0.0, 0.0),
        ("gelu_backward", 0.0, 1.0),
        ("gelu_approx_tanh_backward", 0.0, 1.0),
        ("swish_backward", 0.0, 1.0),
        ("softplus_backward", 0.0, 1.0),
        ("elu_backward", 0.0, 1.0),
    ]:
        got = one_value(kind, [-800.0, -40.0, 40.0, 800.0])
        assert np.isfinite(got).all(), (kind, got)
        np.testing.assert_allclose(got, [at_minus, at_minus, at_plus, at_plus], atol=1e-15, err_msg=kind)


def test_sigmoid_and_tanh_backward_take_the_forward_input_not_the_output() -> None:
    """cuDNN's SIGMOID_BWD / TANH_BWD read x (xDesc), unlike PyTorch's sigmoid_backward(grad, y)."""
    np.testing.assert_allclose(one_value("sigmoid_backward", [0.0, 2.0]), [0.25, np.exp(-2) / (1 + np.exp(-2)) ** 2])
    np.testing.assert_allclose(one_value("tanh_backward", [0.0, 1.0]), [1.0, 1 - np.tanh(1.0) ** 2])


def test_errors_name_the_node_and_the_tensors() -> None:
    g = double_graph()
    loss, x = g.tensor([4, 3], name="loss"), g.tensor([4, 5], name="x")
    with pytest.raises(
        gd.ShapeError, match=r"node 'gelu_backward_0', tensor 'x': cannot broadcast loss \[4, 3\], input \[4, 5\]"
    ):
        g.gelu_backward(loss, x)
    y = g.tensor([4, 3], name="y")
    with pytest.raises(
        gd.AttributeValueError, match="node 'swish_backward_0': attribute 'swish_beta' must be a number"
    ):
        g.swish_backward(loss, y, swish_beta="big")
    with pytest.raises(gd.AttributeValueError, match=r"node 'tanh_backward_0': unknown attribute 'alpha'"):
        g._add_node("tanh_backward", {"loss": loss, "input": y}, {"alpha": 1.0})


def every_backward_op(g: gd.OperationGraphSpec, loss: gd.TensorSpec, x: gd.TensorSpec) -> None:
    for kind, (attrs, _) in CASES.items():
        getattr(g, kind)(loss, x, **attrs).set_name(kind).set_output(True)


def test_json_round_trip_keeps_kinds_and_attributes(rng: np.random.Generator) -> None:
    g = double_graph()
    every_backward_op(g, g.tensor([3, 4], name="loss"), g.tensor([1, 4], name="x"))
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert again.signature() == g.signature()
    feeds = {"loss": rng.standard_normal((3, 4)), "x": rng.standard_normal((1, 4))}
    want, got = gd.reference.execute(g, feeds), gd.reference.execute(again, feeds)
    for kind in CASES:
        np.testing.assert_array_equal(got[kind], want[kind])
    assert '"op": "relu_backward"' in g.to_json() and '"upper_clip": 1.5' in g.to_json()


def drelu_dadd_dbn(io: str) -> gd.OperationGraphSpec:
    """The frontend's drelu-dadd-dbn sample: dy through relu's gradient, plus a residual gradient,
    into batchnorm backward (NHWC, 7 channels, odd spatial extent)."""
    g = gd.OperationGraphSpec(name=f"drelu_dadd_dbn_{io}", io_data_type=io, intermediate_data_type="float")
    dims = [2, 7, 5, 3]
    nhwc = gd.nhwc_strides(dims)
    dy, relu_in = g.tensor(dims, nhwc, name="dy"), g.tensor(dims, nhwc, name="relu_in")
    residual, x = g.tensor(dims, nhwc, name="dresidual"), g.tensor(dims, nhwc, name="x")
    channel = [1, 7, 1, 1]
    scale, mean, inv = (g.tensor(channel, name=n) for n in ("scale", "mean", "inv_variance"))
    grad = g.add(g.relu_backward(dy, relu_in, name="drelu"), residual, name="dadd")
    for out in g.batchnorm_backward(grad, x, scale, mean, inv, name="dbn"):
        assert out is not None
        out.set_output(True)
    return g


def matmul_dgelu(io: str) -> gd.OperationGraphSpec:
    """dgelu(loss = A @ B, input = the saved pre-activation) in the GEMM's epilogue."""
    g = gd.OperationGraphSpec(name=f"matmul_dgelu_{io}", io_data_type=io, intermediate_data_type="float")
    a, b = g.tensor([2, 33, 24], name="a"), g.tensor([2, 24, 40], name="b")
    saved = g.tensor([2, 33, 40], name="pre_activation")
    g.gelu_backward(g.matmul(a, b), saved, name="dgelu").set_name("dx").set_output(True)
    return g


def test_backward_ops_fuse_as_elementwise_ops() -> None:
    """dadd, the op making dbn's grad, is dbn's prologue (one prologue node: drelu before it runs
    as an elementwise kernel); dgelu joins the GEMM's epilogue."""
    partition = gd.fuse(drelu_dadd_dbn("float").validate())
    [group] = [f for f in partition.nodes if f.family.value == "elementwise"]
    assert [n.name for n in group.nodes] == ["drelu"]
    [dbn] = [f for f in partition.nodes if f.family.value == "batchnorm_backward"]
    assert dbn.prologue is not None and dbn.prologue.name == "dadd"
    [gemm] = gd.fuse(matmul_dgelu("half").validate()).nodes
    assert gemm.family.value == "gemm" and sorted(n.op for n in gemm.nodes) == ["gelu_backward", "matmul"]


@pytest.mark.parametrize("io", ["float", "half", "bfloat16", "fp8_e4m3"])
def test_backward_kernels_compile_for_every_target(io: str) -> None:
    g = gd.OperationGraphSpec(name=f"activation_backward_{io}", io_data_type=io, intermediate_data_type="float")
    every_backward_op(g, g.tensor([3, 5, 33], stride=[165, 1, 5], name="loss"), g.tensor([1, 5, 33], name="x"))
    graphs = [g.validate(), drelu_dadd_dbn(io).validate(), matmul_dgelu(io).validate()]
    report = compile_graphs(graphs)
    assert report.failures == [], "\n\n".join(report.failures)
    assert report.graphs == len(graphs)


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["float", "half", "bfloat16"])
def test_fused_backward_graphs_on_the_gpu_match_the_reference(io: str) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(drelu_dadd_dbn(io))
    check_on_gpu(matmul_dgelu(io))
