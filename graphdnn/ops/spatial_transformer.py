"""The spatial transformer (cuDNN's ``cudnnSpatialTf*``): an affine grid generator, a bilinear
sampler, and their backward.

cuDNN's convention, which PyTorch follows where it calls cuDNN (``grid_sample`` goes to
cuDNN only for bilinear, zero padding and ``align_corners=True``): grid coordinates are
normalised to [-1, 1], -1 at the centre of the first pixel and +1 at the centre of the last
(``align_corners=True``); ``grid[..., 0]`` is the x (width) coordinate, ``grid[..., 1]`` the
y (height) one; samples outside the input read zeros. 2-D only, as cuDNN (nbDims 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, register, same_dims

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class GridAttributes(Attributes):
    size: tuple[int, ...]  # the output's [H, W]: cuDNN's transformer descriptor dims [N, C, H, W] past C


def base_coordinates(extent: int) -> np.ndarray:
    """The normalised coordinates of ``extent`` pixel centres: -1 .. 1 (0 for one pixel)."""
    return np.linspace(-1.0, 1.0, extent) if extent > 1 else np.zeros(1)


def _base_grid(height: int, width: int) -> np.ndarray:
    """[H, W, 3]: (x, y, 1) of every output pixel."""
    ys, xs = np.meshgrid(base_coordinates(height), base_coordinates(width), indexing="ij")
    return np.stack([xs, ys, np.ones_like(xs)], axis=-1)


def _tensor(node: Node, role: str, rank: int, what: str) -> Tensor:
    tensor = node.input(role)
    assert tensor is not None
    if len(tensor.dim) != rank:
        fail(node, f"{role} has dims {list(tensor.dim)}; {node.op} needs {what}", role=role)
    return tensor


def _grid(node: Node, role: str, batch: Extent) -> Tensor:
    grid = _tensor(node, role, 4, "a grid [N, H, W, 2]")
    if grid.dim[3] != 2 or grid.dim[0] != batch:
        fail(node, f"{role} has dims {list(grid.dim)}, expected [{batch}, H, W, 2]", role=role)
    return grid


@register
class SpatialTfGridGenerator(Op):
    """grid[n, h, w] = theta[n] @ (x_w, y_h, 1), with x_w, y_h the output pixel's normalised
    coordinates (cudnnSpatialTfGridGeneratorForward; PyTorch's ``affine_grid`` with
    ``align_corners=True``)."""

    kind = "spatial_tf_grid_generator"
    category = Category.POOLING
    inputs = (Role("theta", floating=True),)
    outputs = (Role("grid"),)
    attributes = GridAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        theta = _tensor(node, "theta", 3, "affine matrices [N, 2, 3]")
        if tuple(theta.dim[1:]) != (2, 3):
            fail(node, f"theta has dims {list(theta.dim)}; expected [N, 2, 3]", role="theta")
        size: tuple[int, ...] = node.attributes.size  # type: ignore[attr-defined]
        if len(size) != 2 or min(size) < 1:
            fail_attribute(node, f"size {list(size)} must be the output's [H, W], each >= 1")
        return {"grid": Inferred((theta.dim[0], *size, 2))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        base = _base_grid(*node.attributes.size)  # type: ignore[attr-defined]
        return {"grid": np.einsum("hwj,nkj->nhwk", base, x["theta"])}


@register
class SpatialTfGridGeneratorBackward(Op):
    """dtheta[n] = sum over the output pixels of dgrid[n, h, w] (x) (x_w, y_h, 1)
    (cudnnSpatialTfGridGeneratorBackward)."""

    kind = "spatial_tf_grid_generator_backward"
    category = Category.POOLING
    inputs = (Role("dgrid", floating=True),)
    outputs = (Role("dtheta"),)

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dgrid = _tensor(node, "dgrid", 4, "a grid gradient [N, H, W, 2]")
        _grid(node, "dgrid", dgrid.dim[0])
        return {"dtheta": Inferred((dgrid.dim[0], 2, 3))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        dgrid = x["dgrid"]
        return {"dtheta": np.einsum("nhwk,hwj->nkj", dgrid, _base_grid(*dgrid.shape[1:3]))}


def _sampler_tensors(node: Node) -> tuple[Tensor, Tensor]:
    x = _tensor(node, "x", 4, "an image [N, C, H, W] (2-D only, as cuDNN)")
    return x, _grid(node, "grid", x.dim[0])


@register
class SpatialTfSampler(Op):
    """y[n, c, h, w]: x[n, c] sampled bilinearly at grid[n, h, w], zeros outside
    (cudnnSpatialTfSamplerForward; PyTorch's ``grid_sample(x, grid, "bilinear", "zeros",
    align_corners=True)``). y has the grid's H, W and x's layout order."""

    kind = "spatial_tf_sampler"
    category = Category.POOLING
    inputs = (Role("x", floating=True), Role("grid", floating=True))
    outputs = (Role("y"),)

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, grid = _sampler_tensors(node)
        return {"y": Inferred((*x.dim[:2], *grid.dim[1:3]), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        image, grid = x["x"], x["grid"]
        y = np.zeros((*image.shape[:2], *grid.shape[1:3]))
        for corner in corners(image, grid):
            y += corner.weight[:, None] * corner.value
        return {"y": y}


@dataclasses.dataclass(frozen=True)
class Corner:
    """One of the four pixels around each sample point: where it is, its bilinear weight and
    the derivatives of that weight by the sample's pixel coordinates (all [N, H, W])."""

    n: np.ndarray
    row: np.ndarray
    column: np.ndarray
    valid: np.ndarray  # inside the image; the others read zero
    weight: np.ndarray
    d_weight_x: np.ndarray
    d_weight_y: np.ndarray
    value: np.ndarray  # [N, C, H, W]: x at the corner, 0 outside


def pixel_coordinates(grid: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The grid's normalised coordinates as pixel coordinates (align_corners=True)."""
    return (grid[..., 0] + 1.0) * 0.5 * (width - 1), (grid[..., 1] + 1.0) * 0.5 * (height - 1)


def corners(image: np.ndarray, grid: np.ndarray) -> list[Corner]:
    height, width = image.shape[2:]
    ix, iy = pixel_coordinates(grid, height, width)
    x0, y0 = np.floor(ix), np.floor(iy)
    fx, fy = ix - x0, iy - y0
    n = np.arange(grid.shape[0])[:, None, None] * np.ones(grid.shape[1:3], dtype=np.int64)
    found = []
    for dy_, dx_ in ((0, 0), (0, 1), (1, 0), (1, 1)):
        row, column = y0 + dy_, x0 + dx_
        valid = (row >= 0) & (row < height) & (column >= 0) & (column < width)
        r, c = np.where(valid, row, 0).astype(np.int64), np.where(valid, column, 0).astype(np.int64)
        wx, wy = (fx if dx_ else 1 - fx), (fy if dy_ else 1 - fy)
        sx, sy = (1.0 if dx_ else -1.0), (1.0 if dy_ else -1.0)
        value = np.where(valid[:, None], np.moveaxis(image[n, :, r, c], -1, 1), 0.0)
        weight = np.where(valid, wx * wy, 0.0)
        found.append(
            Corner(n, r, c, valid, weight, np.where(valid, sx * wy, 0.0), np.where(valid, sy * wx, 0.0), value)
        )
    return found


@register
class SpatialTfSamplerBackward(Op):
    """dx and dgrid of ``spatial_tf_sampler`` from dy (cudnnSpatialTfSamplerBackward): each dy
    goes to the four pixels around its sample point, weighted as the forward weighs them; the
    grid's gradient is the bilinear blend's slope times dy, summed over channels."""

    kind = "spatial_tf_sampler_backward"
    category = Category.POOLING
    inputs = (Role("x", floating=True), Role("grid", floating=True), Role("dy", floating=True))
    outputs = (Role("dx"), Role("dgrid"))

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, grid = _sampler_tensors(node)
        dy = node.input("dy")
        assert dy is not None
        same_dims(node, "dy", dy, (*x.dim[:2], *grid.dim[1:3]), "x's N, C and the grid's H, W")
        return {
            "dx": Inferred(x.dim, stride_order(x.dim, x.stride)),
            "dgrid": Inferred(grid.dim, stride_order(grid.dim, grid.stride)),
        }

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        image, grid, dy = x["x"], x["grid"], x["dy"]
        height, width = image.shape[2:]
        dx = np.zeros_like(image)
        slope_x, slope_y = np.zeros(grid.shape[:3]), np.zeros(grid.shape[:3])
        for corner in corners(image, grid):
            spread = np.moveaxis(corner.weight[:, None] * dy, 1, -1)  # [N, H, W, C]
            at: Any = (corner.n, slice(None), corner.row, corner.column)  # numpy's stubs take no slice here
            np.add.at(dx, at, spread)
            through = np.sum(dy * corner.value, axis=1)
            slope_x += through * corner.d_weight_x
            slope_y += through * corner.d_weight_y
        dgrid = np.stack([slope_x * 0.5 * (width - 1), slope_y * 0.5 * (height - 1)], axis=-1)
        return {"dx": dx, "dgrid": dgrid}


class SpatialTransformerMethods:
    _add_node: Callable[..., list[Any]]

    def spatial_tf_grid_generator(
        self, theta: TensorSpec, size: Sequence[int], compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """The sampling grid [N, H, W, 2] of the affine maps ``theta`` [N, 2, 3] for an output
        of spatial ``size`` [H, W] (cudnnSpatialTfGridGeneratorForward)."""
        return self._add_node(
            "spatial_tf_grid_generator",
            {"theta": theta},
            {"size": size},
            name=name,
            compute_data_type=compute_data_type,
        )[0]

    def spatial_tf_grid_generator_backward(
        self, dgrid: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """dtheta [N, 2, 3] from the grid's gradient (cudnnSpatialTfGridGeneratorBackward)."""
        return self._add_node(
            "spatial_tf_grid_generator_backward", {"dgrid": dgrid}, name=name, compute_data_type=compute_data_type
        )[0]

    def spatial_tf_sampler(
        self, x: TensorSpec, grid: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """x [N, C, H, W] sampled bilinearly at ``grid`` [N, H', W', 2] (cudnnSpatialTfSamplerForward)."""
        return self._add_node(
            "spatial_tf_sampler", {"x": x, "grid": grid}, name=name, compute_data_type=compute_data_type
        )[0]

    def spatial_tf_sampler_backward(
        self, x: TensorSpec, grid: TensorSpec, dy: TensorSpec, compute_data_type: Any = None, name: str | None = None
    ) -> list[TensorSpec]:
        """[dx, dgrid] of ``spatial_tf_sampler(x, grid)`` from dy (cudnnSpatialTfSamplerBackward)."""
        return self._add_node(
            "spatial_tf_sampler_backward",
            {"x": x, "grid": grid, "dy": dy},
            name=name,
            compute_data_type=compute_data_type,
        )
