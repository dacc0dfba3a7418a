"""Pooling (max and average over windows) and resampling (nearest and linear interpolation).

Tensors are ``[N, C, *spatial]`` with 1 to 3 spatial dims, any strides; the output keeps
the input's layout order, so NHWC in gives NHWC out.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..errors import AttributeValueError
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, register
from .conv import output_extent
from .shape import known_dims

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec


class PoolingMode(enum.Enum):
    MAX = "max"  # padded positions never win: every window holds a real element
    AVG_INCLUDE_PADDING = "avg_include_padding"  # sum / window size
    AVG_EXCLUDE_PADDING = "avg_exclude_padding"  # sum / number of real elements in the window


@dataclasses.dataclass(frozen=True)
class PoolingAttributes(Attributes):
    mode: PoolingMode
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]


# The most a resample may enlarge a spatial dim: enough for segmentation heads (x32), and it
# keeps a tiny graph from asking for a huge output (a 1-element input for billions).
MAX_UPSCALE = 64


class ResampleMode(enum.Enum):
    NEAREST = "nearest"
    LINEAR = "linear"  # in every spatial dim: bilinear in 2-D, trilinear in 3-D


@dataclasses.dataclass(frozen=True)
class ResampleAttributes(Attributes):
    mode: ResampleMode
    size: tuple[int, ...]  # output spatial extents
    align_corners: bool = False


def _spatial_rank(node: Node, kind: str) -> tuple[Tensor, int]:
    x = node.input("input")
    assert x is not None
    if not 3 <= len(x.dim) <= 5:
        fail(
            node, f"input has dims {list(x.dim)}; {kind} needs [N, C, *spatial] with 1 to 3 spatial dims", role="input"
        )
    return x, len(x.dim) - 2


def _check_lengths(node: Node, spatial: int, **values: tuple[int, ...]) -> None:
    for name, items in values.items():
        if len(items) != spatial:
            fail_attribute(node, f"{name} has {len(items)} values for {spatial} spatial dims")


@register
class Pooling(Op):
    kind = "pooling"
    category = Category.POOLING
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = PoolingAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, spatial = _spatial_rank(node, "pooling")
        a: PoolingAttributes = node.attributes  # type: ignore[assignment]
        _check_lengths(
            node, spatial, window=a.window, stride=a.stride, pre_padding=a.pre_padding, post_padding=a.post_padding
        )
        for name, low in (("window", 1), ("stride", 1), ("pre_padding", 0), ("post_padding", 0)):
            if any(v < low for v in getattr(a, name)):
                fail_attribute(node, f"{name} {list(getattr(a, name))} must be >= {low}")
        out = []
        for axis, (extent, w, lo, hi, s) in enumerate(
            zip(x.dim[2:], a.window, a.pre_padding, a.post_padding, a.stride)
        ):
            if lo >= w or hi >= w:
                fail_attribute(node, f"padding {lo}+{hi} of spatial dim {axis} must be smaller than the window {w}")
            if max(lo, hi) > extent:
                # Windows wholly in the padding see no input; a small graph could ask for a huge padded image.
                fail_attribute(node, f"padding {lo}+{hi} of spatial dim {axis} is over the input extent {extent}")
            size = output_extent(extent, w, lo, hi, s, 1)
            if size < 1:
                fail(
                    node,
                    f"spatial dim {axis}: window {w} does not fit input extent {extent} padded by {lo}+{hi}",
                    role="input",
                )
            out.append(size)
        return {"y": Inferred((*x.dim[:2], *out), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: PoolingAttributes = node.attributes  # type: ignore[assignment]
        value = x["input"]
        over = tuple(range(-len(a.window), 0))  # the window axes, last in the windows view
        if a.mode is PoolingMode.MAX:
            return {"y": np.max(_windows(value, a, -np.inf), axis=over)}
        total = np.sum(_windows(value, a, 0.0), axis=over)
        if a.mode is PoolingMode.AVG_INCLUDE_PADDING:
            return {"y": total / math.prod(a.window)}
        count = np.sum(_windows(np.ones((1, 1, *value.shape[2:])), a, 0.0), axis=over)
        return {"y": total / count}


def _windows(value: np.ndarray, a: PoolingAttributes, fill: float) -> np.ndarray:
    """View [N, C, *out, *window]: the padded input under each output position's window."""
    padded = np.pad(value, [(0, 0), (0, 0), *zip(a.pre_padding, a.post_padding)], constant_values=fill)
    view = sliding_window_view(padded, a.window, axis=tuple(range(2, value.ndim)))
    return view[(slice(None), slice(None), *(slice(None, None, s) for s in a.stride))]


@register
class Resample(Op):
    """Interpolation to ``size``, as PyTorch's ``F.interpolate(input, size=size, ...)``."""

    kind = "resample"
    category = Category.POOLING
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = ResampleAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, spatial = _spatial_rank(node, "resample")
        a: ResampleAttributes = node.attributes  # type: ignore[assignment]
        _check_lengths(node, spatial, size=a.size)
        if any(s < 1 for s in a.size):
            fail_attribute(node, f"size {list(a.size)} must be >= 1 in every spatial dim")
        for axis, (extent, size) in enumerate(zip(x.dim[2:], a.size)):
            if size > MAX_UPSCALE * extent:
                fail_attribute(
                    node,
                    f"size {size} of spatial dim {axis} is over {MAX_UPSCALE} x its input extent {extent} "
                    f"(at most {MAX_UPSCALE * extent})",
                )
        if a.align_corners and a.mode is ResampleMode.NEAREST:
            fail_attribute(node, "align_corners applies to linear resampling only, not nearest")
        return {"y": Inferred((*x.dim[:2], *a.size), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: ResampleAttributes = node.attributes  # type: ignore[assignment]
        y = x["input"]
        # Both modes are separable: resample one spatial axis at a time.
        for axis, out in enumerate(a.size, start=2):
            y = _nearest(y, axis, out) if a.mode is ResampleMode.NEAREST else _linear(y, axis, out, a.align_corners)
        return {"y": y}


def _nearest(y: np.ndarray, axis: int, out: int) -> np.ndarray:
    """src = floor(dst * in / out), in exact integer arithmetic."""
    return np.take(y, np.arange(out) * y.shape[axis] // out, axis=axis)


def _linear(y: np.ndarray, axis: int, out: int, align_corners: bool) -> np.ndarray:
    """Blend the two neighbours of each source coordinate (clamped at the edges)."""
    extent = y.shape[axis]
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        src = dst * ((extent - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        src = np.maximum((dst + 0.5) * (extent / out) - 0.5, 0.0)
    low = np.floor(src).astype(np.int64)
    high = np.minimum(low + 1, extent - 1)
    weight = (src - low).reshape(-1, *[1] * (y.ndim - axis - 1))
    return np.take(y, low, axis=axis) * (1.0 - weight) + np.take(y, high, axis=axis) * weight


# -- builder helpers ----------------------------------------------------------------------
def _resample_mode(mode: Any) -> Any:
    """Take PyTorch's spellings too: "bilinear" and "trilinear" are linear."""
    if isinstance(mode, str) and mode.lower() in ("bilinear", "trilinear"):
        return ResampleMode.LINEAR
    return mode


def _scaled_size(input: TensorSpec, scale_factor: float | Sequence[float], node: str | None) -> list[int]:
    """floor(in * factor) per spatial dim, as PyTorch sizes the output."""
    spatial = known_dims(input, "resample scale_factor=", node)[2:]
    factors = list(scale_factor) if isinstance(scale_factor, Sequence) else [scale_factor] * len(spatial)
    if len(factors) != len(spatial):
        raise AttributeValueError(
            f"scale_factor has {len(factors)} values for {len(spatial)} spatial dims of '{input.name}'", node=node
        )
    return [math.floor(extent * factor) for extent, factor in zip(spatial, factors)]


class PoolingMethods:
    _add_node: Callable[..., list[Any]]

    def pooling(
        self,
        input: TensorSpec,
        mode: Any,
        window: Sequence[int],
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Max or average over windows. ``stride`` defaults to the window; ``padding`` sets both sides."""
        if padding is None and isinstance(window, Sequence):
            padding = [0] * len(window)
        attrs = {
            "mode": mode,
            "window": window,
            "stride": window if stride is None else stride,
            "pre_padding": padding if pre_padding is None else pre_padding,
            "post_padding": padding if post_padding is None else post_padding,
        }
        return self._add_node("pooling", {"input": input}, attrs, name=name, compute_data_type=compute_data_type)[0]

    def resample(
        self,
        input: TensorSpec,
        mode: Any,
        size: Sequence[int] | None = None,
        scale_factor: float | Sequence[float] | None = None,
        align_corners: bool = False,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Interpolate to ``size`` or to floor(in * ``scale_factor``), with PyTorch's semantics."""
        if (size is None) == (scale_factor is None):
            raise AttributeValueError("resample needs exactly one of size= and scale_factor=", node=name)
        if size is None:
            size = _scaled_size(input, scale_factor, name)  # type: ignore[arg-type]
        attrs = {"mode": _resample_mode(mode), "size": size, "align_corners": align_corners}
        return self._add_node("resample", {"input": input}, attrs, name=name, compute_data_type=compute_data_type)[0]
