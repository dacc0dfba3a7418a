"""Convolutions: fprop against a direct loop, dgrad/wgrad by adjoint identities and finite differences."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import graphdnn as gd


def direct_conv(x: np.ndarray, w: np.ndarray, pre, post, stride, dilation, flip: bool = False) -> np.ndarray:
    """The textbook definition, one multiply-add at a time (cross-correlation unless ``flip``)."""
    batch, channels = x.shape[:2]
    k_out, c_per_group = w.shape[:2]
    k_per_group = k_out // (channels // c_per_group)
    in_sp, f_sp = x.shape[2:], w.shape[2:]
    out_sp = [
        (i + lo + hi - d * (f - 1) - 1) // s + 1 for i, f, lo, hi, s, d in zip(in_sp, f_sp, pre, post, stride, dilation)
    ]
    y = np.zeros((batch, k_out, *out_sp))
    for n in range(batch):
        for k in range(k_out):
            group = k // k_per_group
            for o in itertools.product(*map(range, out_sp)):
                acc = 0.0
                for c in range(c_per_group):
                    for t in itertools.product(*map(range, f_sp)):
                        pos = tuple(oi * s - lo + ti * d for oi, s, lo, ti, d in zip(o, stride, pre, t, dilation))
                        if all(0 <= p < e for p, e in zip(pos, in_sp)):
                            tap = tuple(f - 1 - ti for f, ti in zip(f_sp, t)) if flip else t
                            acc += x[(n, group * c_per_group + c, *pos)] * w[(k, c, *tap)]
                y[(n, k, *o)] = acc
    return y


def full_attributes(spatial: int, kw: dict[str, Any]) -> dict[str, list[int]]:
    """pre/post padding, stride and dilation as the op stores them, from builder keywords."""
    pad = kw.get("padding", [0] * spatial)
    return {
        "pre": kw.get("pre_padding", pad),
        "post": kw.get("post_padding", pad),
        "stride": kw.get("stride", [1] * spatial),
        "dilation": kw.get("dilation", [1] * spatial),
    }


def double_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(
        name="conv", io_data_type="double", intermediate_data_type="double", compute_data_type="double"
    )


# (image dims, weight dims, builder keywords, output dims worked out by hand)
FPROP_CASES = {
    "1d_stride2_pad1": ([2, 3, 7], [4, 3, 3], {"padding": [1], "stride": [2]}, [2, 4, 4]),
    "2d_c3_pad_one_side": ([2, 3, 5, 4], [4, 3, 3, 2], {"padding": [1, 0]}, [2, 4, 5, 3]),
    "2d_stride2": ([1, 3, 6, 5], [2, 3, 3, 3], {"padding": [1, 1], "stride": [2, 2]}, [1, 2, 3, 3]),
    "2d_dilation2": ([1, 2, 7, 6], [3, 2, 3, 2], {"dilation": [2, 2]}, [1, 3, 3, 4]),
    "2d_asymmetric_padding": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"pre_padding": [2, 0], "post_padding": [0, 1], "stride": [1, 2]},
        [1, 2, 5, 2],
    ),
    "2d_groups2": ([2, 4, 5, 4], [6, 2, 3, 3], {"padding": [1, 1]}, [2, 6, 5, 4]),
    "2d_depthwise": ([1, 3, 5, 5], [3, 1, 3, 3], {"padding": [1, 1], "stride": [2, 1]}, [1, 3, 3, 5]),
    "2d_depthwise_multiplier2": ([1, 3, 4, 4], [6, 1, 2, 2], {}, [1, 6, 3, 3]),
    "3d": ([1, 2, 4, 3, 5], [2, 2, 2, 2, 3], {"padding": [1, 0, 1], "stride": [1, 1, 2]}, [1, 2, 5, 2, 3]),
    "1d_everything": (
        [2, 4, 11],
        [2, 2, 3],
        {"pre_padding": [3], "post_padding": [1], "stride": [3], "dilation": [2]},
        [2, 2, 4],
    ),
    "2d_true_convolution": (
        [1, 2, 5, 4],
        [3, 2, 3, 2],
        {"convolution_mode": "convolution", "padding": [0, 1]},
        [1, 3, 3, 5],
    ),
}


@pytest.mark.parametrize("case", FPROP_CASES)
def test_fprop_matches_the_direct_loop(case: str, rng: np.random.Generator) -> None:
    x_dim, w_dim, kw, y_dim = FPROP_CASES[case]
    g = double_graph()
    x, w = g.tensor(x_dim, name="x"), g.tensor(w_dim, name="w")
    y = g.conv_fprop(x, w, **kw).set_output(True)
    assert y.dim == tuple(y_dim)
    feeds = {"x": rng.normal(size=x_dim), "w": rng.normal(size=w_dim)}
    a = full_attributes(len(x_dim) - 2, kw)
    expected = direct_conv(
        feeds["x"], feeds["w"], a["pre"], a["post"], a["stride"], a["dilation"], flip="convolution_mode" in kw
    )
    np.testing.assert_allclose(gd.reference.execute(g, feeds)[y.name], expected, rtol=1e-12, atol=1e-12)


def test_true_convolution_is_cross_correlation_with_the_flipped_filter(rng: np.random.Generator) -> None:
    g = double_graph()
    x, w = g.tensor([2, 2, 5, 6], name="x"), g.tensor([3, 2, 3, 2], name="w")
    y = g.conv_fprop(x, w, padding=[1, 1], convolution_mode="convolution").set_output(True)
    feeds = {"x": rng.normal(size=(2, 2, 5, 6)), "w": rng.normal(size=(3, 2, 3, 2))}
    flipped = feeds["w"][:, :, ::-1, ::-1]
    expected = direct_conv(feeds["x"], flipped, [1, 1], [1, 1], [1, 1], [1, 1])
    np.testing.assert_allclose(gd.reference.execute(g, feeds)[y.name], expected, rtol=1e-12, atol=1e-12)


def test_nhwc_in_gives_nhwc_out_with_the_same_values(rng: np.random.Generator) -> None:
    x_dim, w_dim = [2, 3, 5, 4], [4, 3, 3, 3]
    g = double_graph()
    x = g.tensor(x_dim, stride=gd.nhwc_strides(x_dim), name="x")
    w = g.tensor(w_dim, stride=gd.nhwc_strides(w_dim), name="w")
    y = g.conv_fprop(x, w, padding=[1, 1]).set_output(True)
    assert (y.dim, y.stride) == ((2, 4, 5, 4), gd.nhwc_strides([2, 4, 5, 4]))
    dy = g.tensor([2, 4, 5, 4], stride=gd.nhwc_strides([2, 4, 5, 4]), name="dy")
    dx = g.conv_dgrad(dy, w, padding=[1, 1], image_dim=x_dim).set_output(True)
    dw = g.conv_wgrad(x, dy, padding=[1, 1], filter_dim=w_dim).set_output(True)
    assert dx.stride == gd.nhwc_strides(x_dim) and dw.stride == gd.nhwc_strides(w_dim)
    feeds = {"x": rng.normal(size=x_dim), "w": rng.normal(size=w_dim), "dy": rng.normal(size=(2, 4, 5, 4))}
    expected = direct_conv(feeds["x"], feeds["w"], [1, 1], [1, 1], [1, 1], [1, 1])
    np.testing.assert_allclose(gd.reference.execute(g, feeds)[y.name], expected, rtol=1e-12, atol=1e-12)


def test_builder_defaults_are_no_padding_unit_stride_and_dilation() -> None:
    g = double_graph()
    y = g.conv_fprop(g.tensor([1, 2, 5, 4]), g.tensor([3, 2, 2, 3]))
    attrs = g.nodes[0].attributes
    assert (attrs.pre_padding, attrs.post_padding, attrs.stride, attrs.dilation) == ((0, 0), (0, 0), (1, 1), (1, 1))
    assert y.dim == (1, 3, 4, 2)


# -- backward ops: <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)> -------------------------
ADJOINT_CASES = {
    "2d_stride2_ambiguous_width": ([2, 3, 7, 6], [4, 3, 3, 3], {"stride": [2, 2], "padding": [1, 1]}),
    "2d_groups_dilation_asymmetric": (
        [1, 4, 6, 5],
        [6, 2, 2, 3],
        {"pre_padding": [1, 0], "post_padding": [0, 2], "dilation": [2, 1]},
    ),
    "1d_stride3_true_convolution": (
        [2, 2, 10],
        [3, 2, 3],
        {"stride": [3], "padding": [1], "convolution_mode": "convolution"},
    ),
    "3d_depthwise_stride2": ([1, 3, 4, 5, 3], [3, 1, 2, 3, 2], {"stride": [2, 1, 1], "padding": [0, 1, 0]}),
    "2d_stride2_dilation2_ambiguous": ([1, 2, 8, 8], [2, 2, 3, 3], {"stride": [2, 2], "dilation": [2, 2]}),
}


@pytest.mark.parametrize("case", ADJOINT_CASES)
def test_dgrad_and_wgrad_are_the_adjoints_of_fprop(case: str, rng: np.random.Generator) -> None:
    x_dim, w_dim, kw = ADJOINT_CASES[case]
    g = double_graph()
    x, w = g.tensor(x_dim, name="x"), g.tensor(w_dim, name="w")
    y = g.conv_fprop(x, w, **kw).set_output(True)
    dy = g.tensor(y.dim, name="dy")
    dx = g.conv_dgrad(dy, w, image_dim=x_dim, **kw).set_output(True)
    dw = g.conv_wgrad(x, dy, filter_dim=w_dim, **kw).set_output(True)
    assert (dx.dim, dw.dim) == (tuple(x_dim), tuple(w_dim))
    feeds = {"x": rng.normal(size=x_dim), "w": rng.normal(size=w_dim), "dy": rng.normal(size=y.dim)}
    out = gd.reference.execute(g, feeds)
    forward = np.vdot(out[y.name], feeds["dy"])
    np.testing.assert_allclose(np.vdot(feeds["x"], out[dx.name]), forward, rtol=1e-11)
    np.testing.assert_allclose(np.vdot(feeds["w"], out[dw.name]), forward, rtol=1e-11)


def test_dgrad_infers_the_smallest_image_and_image_dim_picks_another() -> None:
    g = double_graph()
    dy, w = g.tensor([2, 4, 4, 3], name="dy"), g.tensor([4, 3, 3, 3], name="w")
    smallest = g.conv_dgrad(dy, w, stride=[2, 2], padding=[1, 1]).set_output(True)
    chosen = g.conv_dgrad(dy, w, stride=[2, 2], padding=[1, 1], image_dim=[2, 3, 7, 6]).set_output(True)
    assert chosen.dim == (2, 3, 7, 6)
    ir = g.validate()
    assert ir.tensor(smallest.name).dim == (2, 3, 7, 5)  # (4-1)*2 - 2 + 3 = 7, (3-1)*2 - 2 + 3 = 5
    assert smallest.dim == (2, 3, 7, 5)  # written back to the builder by validation


def test_wgrad_dims_can_be_set_on_the_result() -> None:
    g = double_graph()
    x, dy = g.tensor([1, 2, 5, 5], name="x"), g.tensor([1, 3, 3, 3], name="dy")
    dw = g.conv_wgrad(x, dy).set_output(True)
    with pytest.raises(
        gd.ShapeError,
        match="node 'conv_wgrad_0': the filter dims of conv_wgrad cannot be inferred: pass filter_dim= or call set_dim on dw",
    ):
        g.validate()
    dw.set_dim([3, 2, 3, 3])
    assert g.validate().tensor(dw.name).dim == (3, 2, 3, 3)


def test_gradients_match_finite_differences(rng: np.random.Generator) -> None:
    x_dim, w_dim, pre, post, stride, dil = [1, 2, 4, 3], [2, 2, 2, 2], [1, 0], [1, 0], [2, 1], [1, 1]
    x0, w0 = rng.normal(size=x_dim), rng.normal(size=w_dim)
    dy0 = rng.normal(size=direct_conv(x0, w0, pre, post, stride, dil).shape)

    def loss(x: np.ndarray, w: np.ndarray) -> float:
        return float(np.sum(direct_conv(x, w, pre, post, stride, dil) * dy0))

    def central_difference(f, at: np.ndarray, h: float = 1e-3) -> np.ndarray:
        grad = np.zeros_like(at)
        for index in np.ndindex(*at.shape):
            step = np.zeros_like(at)
            step[index] = h
            grad[index] = (f(at + step) - f(at - step)) / (2 * h)
        return grad

    g = double_graph()
    x, w, dy = g.tensor(x_dim, name="x"), g.tensor(w_dim, name="w"), g.tensor(dy0.shape, name="dy")
    kw = {"pre_padding": pre, "post_padding": post, "stride": stride, "dilation": dil}
    dx = g.conv_dgrad(dy, w, image_dim=x_dim, **kw).set_output(True)
    dw = g.conv_wgrad(x, dy, filter_dim=w_dim, **kw).set_output(True)
    out = gd.reference.execute(g, {"x": x0, "w": w0, "dy": dy0})
    np.testing.assert_allclose(out[dx.name], central_difference(lambda v: loss(v, w0), x0), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(out[dw.name], central_difference(lambda v: loss(x0, v), w0), rtol=1e-7, atol=1e-9)


# -- errors ---------------------------------------------------------------------------------------------
FPROP_ERRORS = {
    "channels_not_a_multiple": (
        [1, 6, 5, 5],
        [4, 4, 3, 3],
        {},
        gd.ShapeError,
        "node 'conv_fprop_0': image has 6 channels, not a multiple of the weight's 4 input channels per group",
    ),
    "output_channels_not_divisible_into_groups": (
        [1, 4, 5, 5],
        [3, 2, 3, 3],
        {},
        gd.ShapeError,
        "node 'conv_fprop_0': weight has 3 output channels, not divisible into 2 groups",
    ),
    "filter_bigger_than_input": (
        [1, 2, 3, 6],
        [2, 2, 4, 1],
        {},
        gd.ShapeError,
        r"spatial dim 0: filter 4 \(dilation 1\) does not fit input 3 padded by 0\+0",
    ),
    "dilated_filter_bigger_than_padded_input": (
        [1, 2, 6, 3],
        [2, 2, 1, 3],
        {"dilation": [1, 2], "pre_padding": [0, 1], "post_padding": [0, 0]},
        gd.ShapeError,
        r"spatial dim 1: filter 3 \(dilation 2\) does not fit input 3 padded by 1\+0",
    ),
    "stride_of_the_wrong_length": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"stride": [1]},
        gd.AttributeValueError,
        "node 'conv_fprop_0': stride has 1 values for 2 spatial dims",
    ),
    "padding_of_the_wrong_length": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"padding": [1, 1, 1]},
        gd.AttributeValueError,
        "pre_padding has 3 values for 2 spatial dims",
    ),
    "negative_padding": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"pre_padding": [-1, 0], "post_padding": [0, 0]},
        gd.AttributeValueError,
        r"node 'conv_fprop_0': pre_padding \[-1, 0\] must be >= 0",
    ),
    "zero_stride": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"stride": [0, 1]},
        gd.AttributeValueError,
        r"stride \[0, 1\] must be >= 1",
    ),
    "zero_dilation": (
        [1, 2, 5, 5],
        [2, 2, 3, 3],
        {"dilation": [1, 0]},
        gd.AttributeValueError,
        r"dilation \[1, 0\] must be >= 1",
    ),
    "ranks_differ": (
        [1, 2, 5, 5],
        [2, 2, 3],
        {"padding": [0, 0]},
        gd.ShapeError,
        r"convolution needs tensors of equal rank 3 to 5 \(1-D to 3-D\); got image rank 4, weight rank 3",
    ),
    "rank_too_small": ([4, 2], [3, 2], {"padding": []}, gd.ShapeError, "got image rank 2, weight rank 2"),
}


@pytest.mark.parametrize("case", FPROP_ERRORS)
def test_fprop_errors(case: str) -> None:
    x_dim, w_dim, kw, error, message = FPROP_ERRORS[case]
    g = double_graph()
    with pytest.raises(error, match=message):
        g.conv_fprop(g.tensor(x_dim), g.tensor(w_dim), **kw)


def test_dgrad_errors() -> None:
    g = double_graph()
    w = g.tensor([4, 2, 3, 3], name="w")
    with pytest.raises(
        gd.ShapeError,
        match="node 'conv_dgrad_0', tensor 'dy5': loss has 5 channels but the filter has 4 output channels",
    ):
        g.conv_dgrad(g.tensor([1, 5, 3, 3], name="dy5"), w, image_dim=[1, 2, 5, 5])
    dy = g.tensor([1, 4, 3, 3], name="dy")
    with pytest.raises(
        gd.ShapeError,
        match=r"a convolution of dx \[1, 2, 9, 9\] gives spatial dims \[7, 7\], but loss has \[3, 3\]",
    ):
        g.conv_dgrad(dy, w, image_dim=[1, 2, 9, 9])
    with pytest.raises(gd.ShapeError, match=r"dx dims \[2, 2, 5, 5\] do not match loss dims \[1, 4, 3, 3\]"):
        g.conv_dgrad(dy, w, image_dim=[2, 2, 5, 5])
    with pytest.raises(
        gd.ShapeError, match=r"dx has 3 channels, not a multiple of the weight's 2 input channels per group"
    ):
        g.conv_dgrad(dy, w, image_dim=[1, 3, 5, 5])


@pytest.mark.parametrize(
    ("dy_dim", "padding", "message"),
    [
        (
            [1, 5, 3, 3],
            [0, 0],
            "node 'conv_dgrad_0', tensor 'dy': loss has 5 channels but the filter has 4 output channels",
        ),
        ([1, 4, 1, 1], [2, 2], r"node 'conv_dgrad_0': no input size gives loss dims \[1, 4, 1, 1\]"),
    ],
)
def test_dgrad_errors_without_image_dim_are_raised_by_the_op_call(
    dy_dim: list[int], padding: list[int], message: str
) -> None:
    g = double_graph()
    with pytest.raises(gd.ShapeError, match=message):
        g.conv_dgrad(g.tensor(dy_dim, name="dy"), g.tensor([4, 2, 3, 3], name="w"), padding=padding)


def test_wgrad_errors() -> None:
    g = double_graph()
    x, dy = g.tensor([2, 4, 5, 5], name="x"), g.tensor([2, 6, 3, 3], name="dy")
    with pytest.raises(gd.ShapeError, match=r"dw dims \[5, 2, 3, 3\] need rank 4 and 6 output channels \(from loss\)"):
        g.conv_wgrad(x, dy, filter_dim=[5, 2, 3, 3])
    with pytest.raises(gd.ShapeError, match=r"dw dims \[6, 3, 3, 3\] do not divide image's 4 channels into groups"):
        g.conv_wgrad(x, dy, filter_dim=[6, 3, 3, 3])
    with pytest.raises(
        gd.ShapeError,
        match=r"a convolution with filter \[6, 2, 2, 2\] gives spatial dims \[4, 4\], but loss has \[3, 3\]",
    ):
        g.conv_wgrad(x, dy, filter_dim=[6, 2, 2, 2])
    with pytest.raises(
        gd.ShapeError, match="node 'conv_wgrad_0', tensor 'dy1': image batch 2 differs from loss batch 1"
    ):
        g.conv_wgrad(x, g.tensor([1, 6, 3, 3], name="dy1"), filter_dim=[6, 2, 3, 3])
