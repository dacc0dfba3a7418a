"""pooling and resample: reference semantics against loops and hand-computed cases, shapes, errors."""

import itertools
import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.ops.pooling import AdaptivePoolingMode, PoolingMode, ResampleMode
from graphdnn.signature import signature


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def run(build, x: np.ndarray) -> np.ndarray:
    """The output of the one-op graph ``build(g, x)`` on the float64 array ``x``."""
    g = new_graph()
    t = g.tensor_like(x, name="x")
    y = build(g, t).set_output(True)
    return reference.execute(g, {t: x})[y.name]


# -- pooling --------------------------------------------------------------------------------
def loop_pool(x, mode, window, stride, pre, post):
    """Each output element from the real input positions its window covers."""
    spatial = x.shape[2:]
    out = [(d + lo + hi - w) // s + 1 for d, w, s, lo, hi in zip(spatial, window, stride, pre, post)]
    y = np.empty((*x.shape[:2], *out))
    for n, c in np.ndindex(*x.shape[:2]):
        for o in np.ndindex(*out):
            values = []
            for tap in itertools.product(*map(range, window)):
                at = tuple(oi * s - lo + t for oi, s, lo, t in zip(o, stride, pre, tap))
                if all(0 <= a < d for a, d in zip(at, spatial)):
                    values.append(float(x[(n, c, *at)]))
            if mode == "max":
                y[(n, c, *o)] = max(values)
            elif mode == "avg_include_padding":
                y[(n, c, *o)] = math.fsum(values) / math.prod(window)
            else:
                y[(n, c, *o)] = math.fsum(values) / len(values)
    return y


POOL_CASES = [
    # input dims, window, stride, pre_padding, post_padding
    ((2, 3, 7), [3], [2], [1], [2]),
    ((1, 2, 5, 4), [2, 3], [1, 2], [1, 0], [0, 2]),
    ((2, 1, 6, 5), [3, 3], [3, 1], [2, 1], [1, 1]),
    ((1, 2, 3, 4, 5), [2, 3, 2], [2, 1, 3], [1, 0, 1], [0, 2, 1]),
    ((1, 1, 1, 1), [1, 1], [1, 1], [0, 0], [0, 0]),
]


@pytest.mark.parametrize("mode", ["max", "avg_include_padding", "avg_exclude_padding"])
@pytest.mark.parametrize(("dim", "window", "stride", "pre", "post"), POOL_CASES)
def test_pooling_matches_loops(mode, dim, window, stride, pre, post, rng):
    x = rng.standard_normal(dim)
    y = run(lambda g, t: g.pooling(t, mode, window, stride=stride, pre_padding=pre, post_padding=post), x)
    np.testing.assert_allclose(y, loop_pool(x, mode, window, stride, pre, post), rtol=1e-13)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("max", [1.0, 3.0, 5.0]), ("avg_include_padding", [0.5, 2.5, 4.5]), ("avg_exclude_padding", [1.0, 2.5, 4.5])],
)
def test_pooling_hand_computed(mode, expected):
    x = np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]])
    y = run(lambda g, t: g.pooling(t, mode, [2], stride=[2], pre_padding=[1], post_padding=[0]), x)
    np.testing.assert_allclose(y, [[expected]], rtol=1e-15)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("max", [-3.0, -2.0, -1.0, -1.0, -1.0]),  # never the padding's 0
        ("avg_include_padding", [-1.0, -5.0 / 3.0, -2.0, -1.0, -1.0 / 3.0]),
        ("avg_exclude_padding", [-3.0, -2.5, -2.0, -1.5, -1.0]),
    ],
)
def test_pooling_padding_on_negative_inputs(mode, expected):
    x = np.array([[[-3.0, -2.0, -1.0]]])
    y = run(lambda g, t: g.pooling(t, mode, [3], stride=[1], padding=[2]), x)
    np.testing.assert_allclose(y, [[expected]], rtol=1e-15)


def test_pooling_defaults_and_layout():
    g = new_graph()
    x = g.tensor([2, 3, 5, 4], stride=gd.nhwc_strides([2, 3, 5, 4]), name="x")
    y = g.pooling(x, "max", [2, 2], name="pool")  # stride = window, no padding
    assert y.dim == (2, 3, 2, 2)
    assert y.stride == gd.nhwc_strides([2, 3, 2, 2])
    attributes = g.nodes[-1].attributes
    assert (attributes.stride, attributes.pre_padding, attributes.post_padding) == ((2, 2), (0, 0), (0, 0))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"window": [2, 2], "padding": [2, 0]},
            gd.AttributeValueError,
            r"padding 2\+2 of spatial dim 0 must be smaller than the window 2",
        ),
        (
            {"window": [3, 3], "post_padding": [0, 3], "pre_padding": [0, 0]},
            gd.AttributeValueError,
            r"padding 0\+3 of spatial dim 1 must be smaller than the window 3",
        ),
        ({"window": [2, 5]}, gd.ShapeError, r"spatial dim 1: window 5 does not fit input extent 4 padded by 0\+0"),
        ({"window": [2, 2], "stride": [1]}, gd.AttributeValueError, r"stride has 1 values for 2 spatial dims"),
        ({"window": [2]}, gd.AttributeValueError, r"window has 1 values for 2 spatial dims"),
        ({"window": [2, 2], "stride": [0, 1]}, gd.AttributeValueError, r"stride \[0, 1\] must be >= 1"),
        ({"window": [0, 2]}, gd.AttributeValueError, r"window \[0, 2\] must be >= 1"),
        ({"window": [2, 2], "padding": [-1, 0]}, gd.AttributeValueError, r"pre_padding \[-1, 0\] must be >= 0"),
        ({"window": [2, 2], "mode": "average"}, gd.AttributeValueError, r"attribute 'mode' must be one of 'max'"),
    ],
)
def test_pooling_errors(kwargs, error, message):
    g = new_graph()
    x = g.tensor([1, 2, 5, 4], name="x")
    kwargs = {"mode": "max", **kwargs}
    with pytest.raises(error, match=f"node 'pool'.*{message}"):
        g.pooling(x, name="pool", **kwargs)


def test_pooling_rank_error():
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=r"node 'pool'.*input has dims \[4, 5\]; pooling needs \[N, C, \*spatial\]"):
        g.pooling(g.tensor([4, 5], name="x"), "max", [2], name="pool")


# -- pooling_backward -------------------------------------------------------------------------
def pooled(x, mode, window, stride, pre, post):
    return run(lambda g, t: g.pooling(t, mode, window, stride=stride, pre_padding=pre, post_padding=post), x)


def pooling_dx(dy, mode, window, stride, pre, post, x=None, dx_dim=None):
    g = new_graph()
    tdy = g.tensor_like(dy, name="dy")
    tx = g.tensor_like(x, name="x") if x is not None else None
    dx = g.pooling_backward(
        tdy, mode, window, stride=stride, pre_padding=pre, post_padding=post, x=tx, dx_dim=dx_dim
    ).set_output(True)
    feeds = {tdy: dy} if x is None else {tdy: dy, tx: x}
    return reference.execute(g, feeds)[dx.name]


def finite_differences(x, dy, forward, h):
    """d sum(dy * forward(x)) / dx, element by element, by central differences."""
    grad = np.empty_like(x)
    for i in np.ndindex(*x.shape):
        step = np.zeros_like(x)
        step[i] = h
        grad[i] = (np.sum(dy * forward(x + step)) - np.sum(dy * forward(x - step))) / (2 * h)
    return grad


@pytest.mark.parametrize("mode", ["max", "avg_include_padding", "avg_exclude_padding"])
@pytest.mark.parametrize(("dim", "window", "stride", "pre", "post"), POOL_CASES)
def test_pooling_backward_matches_finite_differences(mode, dim, window, stride, pre, post, rng):
    # Distinct values 1 apart: a step of 1/4 never reorders a window, so max is linear around x.
    x = rng.permutation(math.prod(dim)).reshape(dim).astype(np.float64)
    dy = rng.standard_normal(pooled(x, mode, window, stride, pre, post).shape)
    expected = finite_differences(x, dy, lambda v: pooled(v, mode, window, stride, pre, post), 0.25)
    got = pooling_dx(dy, mode, window, stride, pre, post, x=x)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    if mode != "max":  # averages need only dx's dims
        np.testing.assert_allclose(pooling_dx(dy, mode, window, stride, pre, post, dx_dim=dim), expected, atol=1e-12)


def test_pooling_backward_max_ties_go_to_the_first_maximum():
    # windows [pad, 2, 2] [2, 1, 5] [5, 5, pad]: the first 2 and the first 5 win their ties
    x = np.array([[[2.0, 2.0, 1.0, 5.0, 5.0]]])
    dy = np.array([[[1.0, 10.0, 100.0]]])
    dx = pooling_dx(dy, "max", [3], [2], [1], [1], x=x)
    np.testing.assert_array_equal(dx, [[[1.0, 0.0, 0.0, 110.0, 0.0]]])


def test_pooling_backward_max_takes_a_real_minus_infinity_and_the_first_nan():
    x = np.array([[[-np.inf, -np.inf, np.nan, 3.0, np.nan]]])
    dy = np.array([[[1.0, 10.0]]])
    dx = pooling_dx(dy, "max", [3], [3], [1], [0], x=x)  # windows [pad, -inf, -inf] and [nan, 3, nan]
    np.testing.assert_array_equal(dx, [[[1.0, 0.0, 10.0, 0.0, 0.0]]])


def test_pooling_backward_stride_over_window_leaves_gaps():
    dy = np.array([[[1.0, 2.0]]])
    dx = pooling_dx(dy, "avg_include_padding", [2], [3], [0], [0], dx_dim=[1, 1, 6])
    np.testing.assert_allclose(dx, [[[0.5, 0.5, 0.0, 1.0, 1.0, 0.0]]], rtol=1e-15)


def test_pooling_backward_dims_and_layout():
    g = new_graph()
    x = g.tensor([2, 3, 9, 8], stride=gd.nhwc_strides([2, 3, 9, 8]), name="x")
    dy = g.tensor([2, 3, 4, 4], name="dy")
    dx = g.pooling_backward(dy, "max", [3, 2], stride=[2, 2], x=x)
    assert dx.dim == (2, 3, 9, 8) and dx.stride == gd.nhwc_strides([2, 3, 9, 8])  # x's layout
    assert g.pooling_backward(dy, "avg_include_padding", [3, 2], stride=[2, 2]).dim == (2, 3, 9, 8)  # smallest
    assert g.pooling_backward(dy, "avg_include_padding", [3, 2], stride=[2, 2], dx_dim=[2, 3, 10, 9]).dim == (
        2,
        3,
        10,
        9,
    )
    assert g.nodes[-1].attributes.mode is PoolingMode.AVG_INCLUDE_PADDING


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"mode": "max", "x": None},
            gd.AttributeValueError,
            "max pooling backward needs where each window's maximum is: bind x or index",
        ),
        (
            {"dx_dim": [1, 2, 6, 4]},
            gd.ShapeError,
            r"dx dims \[1, 2, 6, 4\] differ from x's \[1, 2, 5, 4\]",
        ),
        (
            {"dy": [1, 2, 3, 2]},
            gd.ShapeError,
            r"pooling dx \[1, 2, 5, 4\] gives spatial dims \[2, 2\], but dy has \[3, 2\]",
        ),
        ({"dy": [1, 3, 2, 2]}, gd.ShapeError, r"dx dims \[1, 2, 5, 4\] do not match dy dims \[1, 3, 2, 2\]"),
        ({"dy": [1, 2, 2]}, gd.AttributeValueError, "window has 2 values for 1 spatial dims"),
        ({"dy": [2, 2]}, gd.ShapeError, r"dy has dims \[2, 2\]; pooling_backward needs \[N, C, \*spatial\]"),
        (
            {"padding": [2, 0]},
            gd.AttributeValueError,
            r"padding 2\+2 of spatial dim 0 must be smaller than the window 2",
        ),
        (
            {"x": None, "mode": "avg_exclude_padding", "window": [3, 3], "padding": [2, 2], "dy": [1, 2, 1, 1]},
            gd.ShapeError,
            r"no input size gives dy dims \[1, 2, 1, 1\] with this window and padding",
        ),
    ],
)
def test_pooling_backward_errors(kwargs, error, message):
    g = new_graph()
    x = g.tensor([1, 2, 5, 4], name="x")
    dy = g.tensor(kwargs.pop("dy", [1, 2, 2, 2]), name="dy")
    kwargs = {"mode": "max", "window": [2, 2], "x": x, **kwargs}
    with pytest.raises(error, match=f"node 'pb'.*{message}"):
        g.pooling_backward(dy, name="pb", **kwargs)


def test_pooling_index_is_the_first_maximum_in_its_window():
    # windows [pad, 2, 2] [2, 1, 5] [5, 5, pad]: positions 1, 2, 0 (padding counted)
    g = new_graph()
    t = g.tensor([1, 1, 5], name="x")
    y, index = g.pooling(t, "max", [3], stride=[2], padding=[1], generate_index=True)
    assert index.data_type is gd.DataType.INT32 and index.dim == y.dim
    index.set_output(True)
    out = reference.execute(g, {"x": np.array([[[2.0, 2.0, 1.0, 5.0, 5.0]]])})
    np.testing.assert_array_equal(out[index.name], [[[1, 2, 0]]])


@pytest.mark.parametrize(("dim", "window", "stride", "pre", "post"), POOL_CASES)
def test_pooling_backward_from_the_index_matches_the_recomputed_maximum(dim, window, stride, pre, post, rng):
    x = rng.integers(0, 3, dim).astype(np.float64)  # many ties
    g = new_graph()
    tx = g.tensor_like(x, name="x")
    y, index = g.pooling(tx, "max", window, stride=stride, pre_padding=pre, post_padding=post, generate_index=True)
    dy = g.tensor(list(y.dim), name="dy")
    kw = {"stride": stride, "pre_padding": pre, "post_padding": post}
    from_index = g.pooling_backward(dy, "max", window, index=index, dx_dim=dim, **kw).set_output(True)
    from_x = g.pooling_backward(dy, "max", window, x=tx, **kw).set_output(True)
    out = reference.execute(g, {"x": x, "dy": rng.standard_normal(y.dim)})
    np.testing.assert_array_equal(out[from_index.name], out[from_x.name])


def test_pooling_backward_refuses_an_index_outside_the_window():
    g = new_graph()
    dy, index = g.tensor([1, 1, 2], name="dy"), g.tensor([1, 1, 2], name="idx", data_type="int32")
    g.pooling_backward(dy, "max", [3], stride=[2], index=index, name="pb").set_output(True)
    with pytest.raises(gd.FeedError, match=r"node 'pb'.*index 'idx' holds 3 at flat position 1; window positions"):
        reference.execute(g, {"dy": np.ones((1, 1, 2)), "idx": np.array([[[0, 3]]], dtype=np.int32)})


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda g, x, dy, i: g.pooling(x, "avg_include_padding", [2, 2], generate_index=True, name="pb"),
            gd.AttributeValueError,
            "generate_index applies to max pooling only, not avg_include_padding",
        ),
        (
            lambda g, x, dy, i: g.pooling_backward(dy, "avg_exclude_padding", [2, 2], index=i, name="pb"),
            gd.AttributeValueError,
            "index applies to max pooling only, not avg_exclude_padding",
        ),
        (
            lambda g, x, dy, i: g.pooling_backward(
                dy, "max", [2, 2], index=g.tensor([1, 2, 2, 1], data_type="int32"), name="pb"
            ),
            gd.ShapeError,
            r"index has dims \[1, 2, 2, 1\], expected dy's \[1, 2, 2, 2\]",
        ),
        (
            lambda g, x, dy, i: g.pooling_backward(dy, "max", [2, 2], index=x, name="pb"),
            gd.DataTypeError,
            "index 'x' is double; pooling_backward takes int32 or int64 indices",
        ),
    ],
)
def test_pooling_index_errors(build, error, message):
    g = new_graph()
    x, dy = g.tensor([1, 2, 5, 4], name="x"), g.tensor([1, 2, 2, 2], name="dy")
    with pytest.raises(error, match=f"node 'pb'.*{message}"):
        build(g, x, dy, g.tensor([1, 2, 2, 2], name="i", data_type="int32"))


# -- adaptive_pooling ---------------------------------------------------------------------------
def loop_adaptive(x, mode, size):
    """Each output element over its box: PyTorch's start floor(i * n / s), end ceil((i + 1) * n / s)."""
    spatial = x.shape[2:]
    y = np.empty((*x.shape[:2], *size))
    for n, c in np.ndindex(*x.shape[:2]):
        for o in np.ndindex(*size):
            box = tuple(slice(i * e // s, math.ceil((i + 1) * e / s)) for i, e, s in zip(o, spatial, size))
            values = x[(n, c, *box)]
            y[(n, c, *o)] = values.max() if mode == "max" else math.fsum(values.ravel()) / values.size
    return y


ADAPTIVE_CASES = [
    ((2, 3, 7), [3]),
    ((1, 2, 5, 4), [5, 4]),
    ((2, 1, 7, 5), [3, 8]),
    ((1, 2, 3, 4, 5), [2, 1, 3]),
    ((1, 1, 10, 6), [1, 1]),
]


@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize(("dim", "size"), ADAPTIVE_CASES)
def test_adaptive_pooling_matches_loops(mode, dim, size, rng):
    x = rng.standard_normal(dim)
    y = run(lambda g, t: g.adaptive_pooling(t, mode, size), x)
    np.testing.assert_allclose(y, loop_adaptive(x, mode, size), rtol=1e-13)


@pytest.mark.parametrize(
    ("mode", "size", "expected"),
    [
        ("avg", 2, [2.0, 4.0]),  # [1, 2, 3], [3, 4, 5]: the bins overlap
        ("avg", 3, [1.5, 3.0, 4.5]),  # [1, 2], [2, 3, 4], [4, 5]
        ("max", 3, [2.0, 4.0, 5.0]),
        ("max", 7, [1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0]),  # [1] [1, 2] [2, 3] [3] [3, 4] [4, 5] [5]
    ],
)
def test_adaptive_pooling_hand_computed(mode, size, expected):
    y = run(lambda g, t: g.adaptive_pooling(t, mode, [size]), np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]]))
    np.testing.assert_allclose(y, [[expected]], rtol=1e-15)


def test_adaptive_pooling_layout_and_mode():
    g = new_graph()
    x = g.tensor([2, 3, 9, 8], stride=gd.nhwc_strides([2, 3, 9, 8]), name="x")
    y = g.adaptive_pooling(x, "AVG", [4, 4])
    assert y.dim == (2, 3, 4, 4) and y.stride == gd.nhwc_strides([2, 3, 4, 4])
    assert g.nodes[-1].attributes.mode is AdaptivePoolingMode.AVG


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"size": [4]}, gd.AttributeValueError, "size has 1 values for 2 spatial dims"),
        ({"size": [0, 3]}, gd.AttributeValueError, r"size \[0, 3\] must be >= 1 in every spatial dim"),
        ({"size": [2, 257]}, gd.AttributeValueError, r"size 257 of spatial dim 1 is over 64 x its input extent 4"),
        ({"mode": "avg_include_padding"}, gd.AttributeValueError, "attribute 'mode' must be one of 'max', 'avg'"),
    ],
)
def test_adaptive_pooling_errors(kwargs, error, message):
    g = new_graph()
    x = g.tensor([1, 2, 5, 4], name="x")
    kwargs = {"mode": "max", "size": [2, 2], **kwargs}
    with pytest.raises(error, match=f"node 'ap'.*{message}"):
        g.adaptive_pooling(x, name="ap", **kwargs)


def test_adaptive_pooling_rank_error():
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=r"node 'ap'.*adaptive_pooling needs \[N, C, \*spatial\]"):
        g.adaptive_pooling(g.tensor([4, 5], name="x"), "avg", [2], name="ap")


def test_pooling_backward_and_adaptive_pooling_round_trip_through_json(rng):
    g = new_graph()
    x, dy = g.tensor([1, 2, 7, 6], name="x"), g.tensor([1, 2, 4, 3], name="dy")
    g.pooling_backward(dy, "max", [3, 2], stride=[2, 2], padding=[1, 0], x=x, name="dmax").set_output(True)
    g.pooling_backward(dy, "avg_exclude_padding", [3, 2], stride=[2, 2], padding=[1, 0], name="davg").set_output(True)
    g.adaptive_pooling(x, "max", [3, 4], name="adaptive").set_output(True)
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert signature(again.validate()) == signature(g.validate())
    assert '"mode": "avg_exclude_padding"' in g.to_json() and '"size": [3, 4]' in g.to_json()
    feeds = {"x": rng.standard_normal((1, 2, 7, 6)), "dy": rng.standard_normal((1, 2, 4, 3))}
    for name, value in reference.execute(g, feeds).items():
        np.testing.assert_array_equal(reference.execute(again, feeds)[name], value)


# -- resample -------------------------------------------------------------------------------
def source(dst: int, extent: int, out: int, align_corners: bool) -> float:
    """PyTorch's source coordinate of output index ``dst`` for linear interpolation."""
    if align_corners:
        return dst * (extent - 1) / (out - 1) if out > 1 else 0.0
    return max((dst + 0.5) * extent / out - 0.5, 0.0)


def loop_resample(x, mode, size, align_corners=False):
    """Nearest: the floor source index. Linear: the weighted sum over the 2**d corners of the source cell."""
    spatial = x.shape[2:]
    y = np.empty((*x.shape[:2], *size))
    for n, c in np.ndindex(*x.shape[:2]):
        for o in np.ndindex(*size):
            if mode == "nearest":
                at = tuple(math.floor(d * e / s) for d, e, s in zip(o, spatial, size))
                y[(n, c, *o)] = x[(n, c, *at)]
                continue
            total = 0.0
            cell = []
            for d, e, s in zip(o, spatial, size):
                src = source(d, e, s, align_corners)
                low = int(src)
                cell.append(((low, 1.0 - (src - low)), (min(low + 1, e - 1), src - low)))
            for corner in itertools.product(*cell):
                total += math.prod(w for _, w in corner) * x[(n, c, *(i for i, _ in corner))]
            y[(n, c, *o)] = total
    return y


RESAMPLE_CASES = [
    # input dims, output size
    ((2, 1, 5), [8]),
    ((1, 2, 7), [3]),
    ((1, 1, 1), [4]),
    ((1, 2, 3, 4), [5, 2]),
    ((2, 1, 4, 3), [1, 7]),
    ((1, 1, 3, 2, 4), [4, 3, 3]),
]


@pytest.mark.parametrize(("dim", "size"), RESAMPLE_CASES)
@pytest.mark.parametrize(("mode", "align_corners"), [("nearest", False), ("linear", False), ("linear", True)])
def test_resample_matches_loops(dim, size, mode, align_corners, rng):
    x = rng.standard_normal(dim)
    y = run(lambda g, t: g.resample(t, mode, size=size, align_corners=align_corners), x)
    np.testing.assert_allclose(y, loop_resample(x, mode, size, align_corners), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("values", "mode", "size", "align_corners", "expected"),
    [
        ([10.0, 20.0, 30.0], "nearest", 5, False, [10.0, 10.0, 20.0, 20.0, 30.0]),
        ([1.0, 2.0, 3.0, 4.0, 5.0], "nearest", 2, False, [1.0, 3.0]),
        ([0.0, 10.0], "linear", 4, False, [0.0, 2.5, 7.5, 10.0]),
        ([0.0, 10.0], "linear", 5, True, [0.0, 2.5, 5.0, 7.5, 10.0]),
        ([3.0, 7.0, 9.0], "linear", 1, True, [3.0]),
        ([3.0, 7.0, 9.0], "linear", 1, False, [7.0]),
        ([0.0, 6.0, 12.0], "linear", 2, False, [1.5, 10.5]),
    ],
)
def test_resample_hand_computed_1d(values, mode, size, align_corners, expected):
    y = run(lambda g, t: g.resample(t, mode, size=[size], align_corners=align_corners), np.array([[values]]))
    np.testing.assert_allclose(y, [[expected]], rtol=1e-15)


def test_resample_bilinear_hand_computed():
    x = np.array([[[[0.0, 1.0], [2.0, 3.0]]]])
    y = run(lambda g, t: g.resample(t, "bilinear", size=[3, 3], align_corners=True), x)
    np.testing.assert_allclose(y, [[[[0.0, 0.5, 1.0], [1.0, 1.5, 2.0], [2.0, 2.5, 3.0]]]], rtol=1e-15)


def test_resample_scale_factor_spellings_and_layout():
    g = new_graph()
    x = g.tensor([1, 2, 5, 4], stride=gd.nhwc_strides([1, 2, 5, 4]), name="x")
    y = g.resample(x, "bilinear", scale_factor=1.5)
    assert y.dim == (1, 2, 7, 6)
    assert y.stride == gd.nhwc_strides([1, 2, 7, 6])
    assert g.nodes[-1].attributes.mode is ResampleMode.LINEAR
    assert g.resample(x, "nearest", scale_factor=[2, 0.6]).dim == (1, 2, 10, 2)
    v = g.tensor([1, 1, 2, 3, 2], name="v")
    assert g.resample(v, "TRILINEAR", size=[4, 6, 4]).dim == (1, 1, 4, 6, 4)
    assert g.nodes[-1].attributes.mode is ResampleMode.LINEAR


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"size": [4, 4], "scale_factor": 2},
            gd.AttributeValueError,
            "resample needs exactly one of size= and scale_factor=",
        ),
        ({}, gd.AttributeValueError, "resample needs exactly one of size= and scale_factor="),
        ({"size": [4]}, gd.AttributeValueError, "size has 1 values for 2 spatial dims"),
        ({"size": [0, 3]}, gd.AttributeValueError, r"size \[0, 3\] must be >= 1 in every spatial dim"),
        ({"scale_factor": 0.1}, gd.AttributeValueError, r"size \[0, 0\] must be >= 1 in every spatial dim"),
        (
            {"size": [320, 257]},
            gd.AttributeValueError,
            r"size 257 of spatial dim 1 is over 64 x its input extent 4 \(at most 256\)",
        ),
        ({"scale_factor": 65}, gd.AttributeValueError, "size 325 of spatial dim 0 is over 64 x its input extent 5"),
        ({"scale_factor": [2, 2, 2]}, gd.AttributeValueError, "scale_factor has 3 values for 2 spatial dims of 'x'"),
        (
            {"size": [4, 4], "align_corners": True, "mode": "nearest"},
            gd.AttributeValueError,
            "align_corners applies to linear resampling only",
        ),
        (
            {"size": [4, 4], "mode": "cubic"},
            gd.AttributeValueError,
            "attribute 'mode' must be one of 'nearest', 'linear'",
        ),
    ],
)
def test_resample_errors(kwargs, error, message):
    g = new_graph()
    x = g.tensor([1, 2, 5, 4], name="x")
    kwargs = {"mode": "linear", **kwargs}
    with pytest.raises(error, match=f"node 'rs'.*{message}"):
        g.resample(x, name="rs", **kwargs)


def test_resample_shape_errors():
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=r"node 'rs'.*input has dims \[4, 5\]; resample needs \[N, C, \*spatial\]"):
        g.resample(g.tensor([4, 5], name="x"), "nearest", size=[2], name="rs")
    unsized = g.reshape(g.tensor([1, 2, 6], name="y"))  # dims declared later
    with pytest.raises(gd.ShapeError, match=r"node 'rs2'.*resample scale_factor= needs the dims of 'reshape_0::y'"):
        g.resample(unsized, "nearest", scale_factor=2, name="rs2")
