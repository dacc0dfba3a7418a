"""lrn and lrn_backward: reference semantics against PyTorch and loops, finite differences, shapes, errors."""

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.signature import signature

torch = pytest.importorskip("torch")
F = torch.nn.functional

PARAMS = {"lrn_alpha": 0.3, "lrn_beta": 0.6, "lrn_k": 1.5}


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def forward(x: np.ndarray, **kw) -> np.ndarray:
    g = new_graph()
    t = g.tensor_like(x, name="x")
    y = g.lrn(t, **kw).set_output(True)
    return reference.execute(g, {t: x})[y.name]


def backward(dy: np.ndarray, x: np.ndarray, **kw) -> np.ndarray:
    g = new_graph()
    tdy, tx = g.tensor_like(dy, name="dy"), g.tensor_like(x, name="x")
    dx = g.lrn_backward(tdy, tx, **kw).set_output(True)
    return reference.execute(g, {tdy: dy, tx: x})[dx.name]


def torch_lrn_cudnn_window(x, n: int):
    """PyTorch's LRN with cuDNN's window: torch's window reaches n // 2 channels behind and
    (n - 1) // 2 ahead, cuDNN's the mirror of that, so LRN of the channel-reversed input,
    reversed back, is cuDNN's (the same for odd n)."""
    return F.local_response_norm(x.flip(1), n, PARAMS["lrn_alpha"], PARAMS["lrn_beta"], PARAMS["lrn_k"]).flip(1)


@pytest.mark.parametrize("n", [1, 3, 5, 7, 15])
@pytest.mark.parametrize("dims", [(2, 7, 5), (2, 9, 3, 4), (1, 3, 2, 3, 2)])
def test_odd_windows_match_torch(n, dims, rng):
    x = rng.standard_normal(dims)
    expected = F.local_response_norm(torch.tensor(x), n, **{k[4:]: v for k, v in PARAMS.items()}).numpy()
    np.testing.assert_allclose(forward(x, lrn_n=n, **PARAMS), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("n", [2, 4, 6, 16])
def test_even_windows_reach_further_ahead_as_cudnn_places_them(n, rng):
    x = rng.standard_normal((2, 20, 3, 2))  # more channels than the widest window
    expected = torch_lrn_cudnn_window(torch.tensor(x), n).numpy()
    np.testing.assert_allclose(forward(x, lrn_n=n, **PARAMS), expected, rtol=1e-12, atol=1e-14)
    plain = F.local_response_norm(torch.tensor(x), n, 0.3, 0.6, 1.5).numpy()
    assert not np.allclose(forward(x, lrn_n=n, **PARAMS), plain)  # torch's even window differs


def test_window_by_loops():
    """n = 4 over 6 channels: channel c sums channels c - 1 .. c + 2, clipped to 0 .. 5."""
    x = np.arange(1.0, 7.0).reshape(1, 6, 1)
    y = forward(x, lrn_n=4, lrn_alpha=2.0, lrn_beta=1.0, lrn_k=1.0)
    for c in range(6):
        window = [x[0, j, 0] ** 2 for j in range(max(0, c - 1), min(5, c + 2) + 1)]
        assert y[0, c, 0] == pytest.approx(x[0, c, 0] / (1.0 + 2.0 / 4 * sum(window)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9])
def test_backward_matches_torch_autograd(n, rng):
    x, dy = rng.standard_normal((2, 7, 3, 2)), rng.standard_normal((2, 7, 3, 2))
    xt = torch.tensor(x, requires_grad=True)
    torch_lrn_cudnn_window(xt, n).backward(torch.tensor(dy))
    np.testing.assert_allclose(backward(dy, x, lrn_n=n, **PARAMS), xt.grad.numpy(), rtol=1e-11, atol=1e-13)


def test_backward_matches_finite_differences(rng):
    x, dy = rng.standard_normal((1, 6, 2)), rng.standard_normal((1, 6, 2))
    kw = {"lrn_n": 4, **PARAMS}
    numeric = np.zeros_like(x)
    step = 1e-6
    for i in np.ndindex(x.shape):
        bump = np.zeros_like(x)
        bump[i] = step
        numeric[i] = np.sum(dy * (forward(x + bump, **kw) - forward(x - bump, **kw))) / (2 * step)
    np.testing.assert_allclose(backward(dy, x, **kw), numeric, rtol=1e-6, atol=1e-8)


def test_defaults_are_cudnns_and_layout_is_kept():
    g = new_graph()
    dims = [2, 5, 4, 3]
    x = g.tensor(dims, stride=gd.nhwc_strides(dims), name="x")
    y = g.lrn(x)
    assert y.dim == tuple(dims) and y.stride == gd.nhwc_strides(dims)
    a = g.nodes[-1].attributes
    assert (a.lrn_n, a.lrn_alpha, a.lrn_beta, a.lrn_k) == (5, 1e-4, 0.75, 2.0)
    dx = g.lrn_backward(g.tensor(dims, name="dy"), x)
    assert dx.dim == tuple(dims) and dx.stride == gd.nhwc_strides(dims)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lrn_n": 0}, gd.AttributeValueError, r"lrn_n 0 must be in \[1, 16\]"),
        ({"lrn_n": 17}, gd.AttributeValueError, r"lrn_n 17 must be in \[1, 16\]"),
        ({"lrn_k": 0.0}, gd.AttributeValueError, "lrn_k 0.0 must be >= 1e-05"),
        ({"lrn_beta": 0.001}, gd.AttributeValueError, "lrn_beta 0.001 must be >= 0.01"),
        ({"lrn_alpha": float("nan")}, gd.AttributeValueError, "attribute 'lrn_alpha' must be a finite number"),
    ],
)
def test_attribute_errors(kwargs, error, message):
    g = new_graph()
    with pytest.raises(error, match=f"node 'norm'.*{message}"):
        g.lrn(g.tensor([1, 4, 3], name="x"), name="norm", **kwargs)


def test_shape_errors():
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=r"node 'norm'.*input has dims \[4, 5\]; lrn needs \[N, C, \*spatial\]"):
        g.lrn(g.tensor([4, 5], name="x"), name="norm")
    with pytest.raises(gd.ShapeError, match=r"node 'back'.*dy has dims \[1, 4, 2\], expected \[1, 4, 3\]"):
        g.lrn_backward(g.tensor([1, 4, 2], name="dy"), g.tensor([1, 4, 3], name="x2"), name="back")
    with pytest.raises(gd.DataTypeError, match="node 'int'"):
        g.lrn(g.tensor([1, 4, 3], data_type="int32", name="i"), name="int")


def test_round_trip_through_json():
    g = new_graph()
    x, dy = g.tensor([1, 6, 4, 3], name="x"), g.tensor([1, 6, 4, 3], name="dy")
    g.lrn(x, lrn_n=4, lrn_alpha=0.5, name="norm").set_output(True)
    g.lrn_backward(dy, x, lrn_n=3, lrn_k=1.0, name="back").set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert signature(again.validate()) == signature(g.validate())
    assert '"lrn_n": 4' in text and '"lrn_alpha": 0.5' in text and '"lrn_k": 1.0' in text
