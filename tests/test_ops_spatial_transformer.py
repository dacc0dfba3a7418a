"""The spatial transformer ops: reference semantics against PyTorch (affine_grid and grid_sample
with align_corners=True, cuDNN's convention), gradients, shapes, errors, JSON."""

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.signature import signature

torch = pytest.importorskip("torch")
F = torch.nn.functional


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def execute(build, **arrays: np.ndarray) -> list[np.ndarray]:
    """The outputs of ``build(g, **tensors)`` on the float64 ``arrays``."""
    g = new_graph()
    tensors = {name: g.tensor_like(value, name=name) for name, value in arrays.items()}
    result = build(g, **tensors)
    outs = result if isinstance(result, list) else [result]
    for t in outs:
        t.set_output(True)
    values = reference.execute(g, dict(arrays))
    return [values[t.name] for t in outs]


@pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid behavior has changed for unit-size grids")
@pytest.mark.parametrize("size", [(4, 5), (1, 6), (3, 1), (1, 1)])
def test_grid_generator_matches_affine_grid(size, rng):
    """A one-pixel axis has coordinate 0, as PyTorch's (its warning says so)."""
    theta = rng.standard_normal((3, 2, 3))
    (grid,) = execute(lambda g, theta: g.spatial_tf_grid_generator(theta, size), theta=theta)
    expected = F.affine_grid(torch.tensor(theta), (3, 1, *size), align_corners=True).numpy()
    np.testing.assert_allclose(grid, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("image", "out"), [((2, 3, 6, 7), (4, 5)), ((1, 2, 1, 5), (3, 2)), ((2, 1, 4, 1), (2, 3))])
def test_sampler_and_its_gradients_match_grid_sample(image, out, rng):
    x = rng.standard_normal(image)
    grid = rng.uniform(-1.4, 1.4, (image[0], *out, 2))  # past the edges: zero padding
    dy = rng.standard_normal((*image[:2], *out))
    y, dx, dgrid = execute(
        lambda g, x, grid, dy: [g.spatial_tf_sampler(x, grid), *g.spatial_tf_sampler_backward(x, grid, dy)],
        x=x,
        grid=grid,
        dy=dy,
    )
    xt, gt = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    yt = F.grid_sample(xt, gt, mode="bilinear", padding_mode="zeros", align_corners=True)
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dgrid, gt.grad.numpy(), rtol=1e-11, atol=1e-13)


def test_grid_generator_backward_matches_autograd(rng):
    theta, dgrid = rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 4, 3, 2))
    (dtheta,) = execute(lambda g, dgrid: g.spatial_tf_grid_generator_backward(dgrid), dgrid=dgrid)
    tt = torch.tensor(theta, requires_grad=True)
    F.affine_grid(tt, (2, 1, 4, 3), align_corners=True).backward(torch.tensor(dgrid))
    np.testing.assert_allclose(dtheta, tt.grad.numpy(), rtol=1e-12, atol=1e-13)


def test_sampler_grid_gradient_matches_finite_differences(rng):
    x, dy = rng.standard_normal((1, 2, 4, 5)), rng.standard_normal((1, 2, 2, 3))
    grid = rng.uniform(-0.9, 0.9, (1, 2, 3, 2))
    (dgrid,) = execute(lambda g, x, grid, dy: g.spatial_tf_sampler_backward(x, grid, dy)[1], x=x, grid=grid, dy=dy)
    step, numeric = 1e-6, np.zeros_like(grid)
    for i in np.ndindex(grid.shape):
        bump = np.zeros_like(grid)
        bump[i] = step
        high, low = (
            execute(lambda g, x, grid: g.spatial_tf_sampler(x, grid), x=x, grid=grid + s)[0] for s in (bump, -bump)
        )
        numeric[i] = np.sum(dy * (high - low)) / (2 * step)
    np.testing.assert_allclose(dgrid, numeric, rtol=1e-6, atol=1e-8)


def test_identity_transform_samples_every_pixel():
    x = np.arange(12.0).reshape(1, 1, 3, 4)
    theta = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    (y,) = execute(
        lambda g, x, theta: g.spatial_tf_sampler(x, g.spatial_tf_grid_generator(theta, [3, 4])), x=x, theta=theta
    )
    np.testing.assert_allclose(y, x, atol=1e-12)


def test_dims_and_layouts():
    g = new_graph()
    x = g.tensor([2, 5, 6, 7], stride=gd.nhwc_strides([2, 5, 6, 7]), name="x")
    grid = g.spatial_tf_grid_generator(g.tensor([2, 2, 3], name="theta"), [3, 4])
    assert grid.dim == (2, 3, 4, 2)
    y = g.spatial_tf_sampler(x, grid)
    assert y.dim == (2, 5, 3, 4) and y.stride == gd.nhwc_strides([2, 5, 3, 4])
    dx, dgrid = g.spatial_tf_sampler_backward(x, grid, g.tensor([2, 5, 3, 4], name="dy"))
    assert dx.dim == x.dim and dx.stride == x.stride and dgrid.dim == (2, 3, 4, 2)
    assert g.spatial_tf_grid_generator_backward(dgrid).dim == (2, 2, 3)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda g: g.spatial_tf_grid_generator(g.tensor([2, 3, 2]), [3, 3], name="n"),
            gd.ShapeError,
            r"theta has dims \[2, 3, 2\]; expected \[N, 2, 3\]",
        ),
        (
            lambda g: g.spatial_tf_grid_generator(g.tensor([2, 2, 3]), [3], name="n"),
            gd.AttributeValueError,
            r"size \[3\] must be the output's \[H, W\]",
        ),
        (
            lambda g: g.spatial_tf_grid_generator(g.tensor([2, 2, 3]), [0, 3], name="n"),
            gd.AttributeValueError,
            "each >= 1",
        ),
        (
            lambda g: g.spatial_tf_sampler(g.tensor([2, 3, 4]), g.tensor([2, 3, 3, 2]), name="n"),
            gd.ShapeError,
            r"x has dims \[2, 3, 4\]; spatial_tf_sampler needs an image \[N, C, H, W\]",
        ),
        (
            lambda g: g.spatial_tf_sampler(g.tensor([2, 3, 4, 4]), g.tensor([3, 3, 3, 2]), name="n"),
            gd.ShapeError,
            r"grid has dims \[3, 3, 3, 2\], expected \[2, H, W, 2\]",
        ),
        (
            lambda g: g.spatial_tf_sampler(g.tensor([2, 3, 4, 4]), g.tensor([2, 3, 3, 3]), name="n"),
            gd.ShapeError,
            r"grid has dims \[2, 3, 3, 3\]",
        ),
        (
            lambda g: g.spatial_tf_sampler_backward(
                g.tensor([2, 3, 4, 4]), g.tensor([2, 3, 3, 2]), g.tensor([2, 3, 4, 4]), name="n"
            ),
            gd.ShapeError,
            r"dy has dims \[2, 3, 4, 4\], expected \[2, 3, 3, 3\]",
        ),
        (
            lambda g: g.spatial_tf_grid_generator_backward(g.tensor([2, 3, 3]), name="n"),
            gd.ShapeError,
            r"dgrid has dims \[2, 3, 3\]; spatial_tf_grid_generator_backward needs a grid gradient",
        ),
    ],
)
def test_errors(build, error, message):
    with pytest.raises(error, match=f"node 'n'.*{message}"):
        build(new_graph())


def test_round_trip_through_json():
    g = new_graph()
    theta, x = g.tensor([2, 2, 3], name="theta"), g.tensor([2, 3, 5, 5], name="x")
    grid = g.spatial_tf_grid_generator(theta, [4, 3], name="grid_gen")
    g.spatial_tf_sampler(x, grid).set_output(True)
    dx, dgrid = g.spatial_tf_sampler_backward(x, grid, g.tensor([2, 3, 4, 3], name="dy"))
    dx.set_output(True)
    g.spatial_tf_grid_generator_backward(dgrid).set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert signature(again.validate()) == signature(g.validate()) and '"size": [4, 3]' in text
