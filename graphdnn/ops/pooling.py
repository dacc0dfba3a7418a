"""Pooling (max and average over windows, its backward, adaptive pooling) and resampling
(nearest and linear interpolation).

Tensors are ``[N, C, *spatial]`` with 1 to 3 spatial dims, any strides; the output keeps
the input's layout order, so NHWC in gives NHWC out.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..dtypes import DataType
from ..errors import AttributeValueError
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import (
    INDEX_TYPES,
    Category,
    Inferred,
    Op,
    Role,
    fail,
    fail_attribute,
    index_tensor,
    indices_in_range,
    register,
)
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
    # Max pooling's training output (the cuDNN frontend's generate_index): where each window's
    # maximum is, for pooling_backward. Backward ignores it.
    generate_index: bool = False


class AdaptivePoolingMode(enum.Enum):
    MAX = "max"
    AVG = "avg"


@dataclasses.dataclass(frozen=True)
class AdaptivePoolingAttributes(Attributes):
    mode: AdaptivePoolingMode
    size: tuple[int, ...]  # output spatial extents


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


def _checked_window(node: Node, spatial: int) -> PoolingAttributes:
    """The node's pooling attributes, each list one value per spatial dim and in range."""
    a: PoolingAttributes = node.attributes  # type: ignore[assignment]
    _check_lengths(
        node, spatial, window=a.window, stride=a.stride, pre_padding=a.pre_padding, post_padding=a.post_padding
    )
    for name, low in (("window", 1), ("stride", 1), ("pre_padding", 0), ("post_padding", 0)):
        if any(v < low for v in getattr(a, name)):
            fail_attribute(node, f"{name} {list(getattr(a, name))} must be >= {low}")
    return a


def _pooled_extents(node: Node, a: PoolingAttributes, extents: Sequence[Extent], role: str) -> list[int]:
    """The output's spatial extents for input ``extents`` (the tensor bound to ``role``), or fail."""
    out = []
    for axis, (extent, w, lo, hi, s) in enumerate(zip(extents, a.window, a.pre_padding, a.post_padding, a.stride)):
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
                role=role,
            )
        out.append(size)
    return out


@register
class Pooling(Op):
    """Max or average over windows; with ``generate_index`` (max only) also ``index``: the
    row-major position, within its window (padding counted), of each window's first maximum."""

    kind = "pooling"
    category = Category.POOLING
    inputs = (Role("input"),)
    outputs = (Role("y"), Role("index"))
    attributes = PoolingAttributes

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        return self.output_names if attributes.generate_index else frozenset({"y"})  # type: ignore[attr-defined]

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, spatial = _spatial_rank(node, "pooling")
        a = _checked_window(node, spatial)
        y = Inferred((*x.dim[:2], *_pooled_extents(node, a, x.dim[2:], "input")), stride_order(x.dim, x.stride))
        if not a.generate_index:
            return {"y": y}
        if a.mode is not PoolingMode.MAX:
            fail_attribute(node, f"generate_index applies to max pooling only, not {a.mode.value}")
        return {"y": y, "index": dataclasses.replace(y, data_type=DataType.INT32, allowed=INDEX_TYPES)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: PoolingAttributes = node.attributes  # type: ignore[assignment]
        value = x["input"]
        over = tuple(range(-len(a.window), 0))  # the window axes, last in the windows view
        if a.mode is PoolingMode.MAX:
            y = np.max(_windows(value, a, -np.inf), axis=over)
            return {"y": y, "index": _first_maximum(value, a)} if a.generate_index else {"y": y}
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
class PoolingBackward(Op):
    """dx of ``pooling``: each dy element flows back to its window, as the forward read it.

    Average modes spread dy over the window's real elements (divided as the forward
    divides); max gives it to the window's first maximum: the forward's ``index`` output
    where it is bound, else recomputed from ``x`` (the forward's input) with the forward's
    tie rule. dx has ``x``'s dims and layout; without ``x``, the declared dims, else the
    smallest input that gives dy's dims.
    """

    kind = "pooling_backward"
    category = Category.POOLING
    inputs = (Role("dy", floating=True), Role("x", optional=True, floating=True), Role("index", optional=True))
    outputs = (Role("dx"),)
    attributes = PoolingAttributes
    declared_outputs = frozenset({"dx"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dy, x = node.input("dy"), node.input("x")
        assert dy is not None
        if not 3 <= len(dy.dim) <= 5:
            fail(node, f"dy has dims {list(dy.dim)}; pooling_backward needs [N, C, *spatial]", role="dy")
        a = _checked_window(node, len(dy.dim) - 2)
        if a.generate_index:
            fail_attribute(node, "generate_index is pooling's (the forward's) attribute; bind its index here instead")
        dx, layout = declared.get("dx"), dy
        if x is not None:
            if dx is not None and tuple(dx) != tuple(x.dim):
                fail(node, f"dx dims {list(dx)} differ from x's {list(x.dim)}", role="x")
            dx, layout = x.dim, x
        if a.mode is PoolingMode.MAX and x is None and node.input("index") is None:
            fail_attribute(node, "max pooling backward needs where each window's maximum is: bind x or index")
        if node.input("index") is not None:
            index = index_tensor(node, "index")
            if a.mode is not PoolingMode.MAX:
                fail_attribute(node, f"index applies to max pooling only, not {a.mode.value}")
            if tuple(index.dim) != tuple(dy.dim):
                fail(node, f"index has dims {list(index.dim)}, expected dy's {list(dy.dim)}", role="index")
        if dx is None:
            axes = zip(dy.dim[2:], a.window, a.stride, a.pre_padding, a.post_padding)
            dx = (*dy.dim[:2], *((o - 1) * s + w - lo - hi for o, w, s, lo, hi in axes))
            if any(extent < 1 for extent in dx[2:]):
                fail(node, f"no input size gives dy dims {list(dy.dim)} with this window and padding", role="dy")
        if len(dx) != len(dy.dim) or tuple(dx[:2]) != tuple(dy.dim[:2]):
            fail(node, f"dx dims {list(dx)} do not match dy dims {list(dy.dim)} in rank, batch or channels", role="dy")
        out = _pooled_extents(node, a, dx[2:], "x" if x is not None else "dy")
        if tuple(out) != tuple(dy.dim[2:]):
            fail(node, f"pooling dx {list(dx)} gives spatial dims {out}, but dy has {list(dy.dim[2:])}", role="dy")
        return {"dx": Inferred(tuple(dx), stride_order(layout.dim, layout.stride))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        return (0, math.prod(node.attributes.window) - 1) if role == "index" else None  # type: ignore[attr-defined]

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: PoolingAttributes = node.attributes  # type: ignore[assignment]
        dy, dx_dim = x["dy"], node.output("dx").dim  # type: ignore[union-attr]
        padded = np.zeros((*dx_dim[:2], *(d + lo + hi for d, lo, hi in zip(dx_dim[2:], a.pre_padding, a.post_padding))))
        if a.mode is PoolingMode.MAX:
            if "index" in x:
                first = indices_in_range(node, "index", x["index"], math.prod(a.window), "window positions")
            else:
                first = _first_maximum(x["x"], a)
        else:
            count: Any = math.prod(a.window)
            if a.mode is PoolingMode.AVG_EXCLUDE_PADDING:
                count = np.sum(_windows(np.ones((1, 1, *dx_dim[2:])), a, 0.0), axis=tuple(range(-len(a.window), 0)))
            spread = dy / count
        # Tap by tap: the dy of every window lands on that tap's element of it.
        for tap, position in enumerate(itertools.product(*map(range, a.window))):
            covered = tuple(slice(t, t + s * (o - 1) + 1, s) for t, s, o in zip(position, a.stride, dy.shape[2:]))
            share = np.where(first == tap, dy, 0.0) if a.mode is PoolingMode.MAX else spread
            padded[(slice(None), slice(None), *covered)] += share
        crop = tuple(slice(lo, lo + d) for lo, d in zip(a.pre_padding, dx_dim[2:]))
        return {"dx": padded[(slice(None), slice(None), *crop)]}


def _first_maximum(value: np.ndarray, a: PoolingAttributes) -> np.ndarray:
    """[N, C, *out]: the row-major tap of each window's first maximum among its real elements
    (a NaN is the maximum, the first NaN wins), as the forward's running maximum keeps it."""
    windows = _windows(value, a, -np.inf)
    out = windows.shape[2 : 2 + len(a.window)]
    windows = windows.reshape(*windows.shape[: 2 + len(a.window)], -1)
    real = _windows(np.ones((1, 1, *value.shape[2:]), dtype=bool), a, False).reshape(1, 1, *out, -1)
    best = np.max(np.where(real, windows, -np.inf), axis=-1, keepdims=True)
    winner = real & ((windows == best) | (np.isnan(windows) & np.isnan(best)))
    return np.argmax(winner, axis=-1)


@register
class AdaptivePooling(Op):
    """Max or average pooling to ``size``, as PyTorch's ``adaptive_{max,avg}_pool``: output i
    of an axis of extent ``n`` pools inputs floor(i * n / size) to ceil((i + 1) * n / size)."""

    kind = "adaptive_pooling"
    category = Category.POOLING
    inputs = (Role("input"),)
    outputs = (Role("y"),)
    attributes = AdaptivePoolingAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, spatial = _spatial_rank(node, "adaptive_pooling")
        a: AdaptivePoolingAttributes = node.attributes  # type: ignore[assignment]
        _check_size(node, spatial, a.size, x.dim[2:])
        return {"y": Inferred((*x.dim[:2], *a.size), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: AdaptivePoolingAttributes = node.attributes  # type: ignore[assignment]
        reduce = np.max if a.mode is AdaptivePoolingMode.MAX else np.mean
        y = x["input"]
        # A box's max (mean) is the max (mean) along one axis of the max (mean) along the others.
        for axis, out in enumerate(a.size, start=2):
            extent = y.shape[axis]
            bins = [np.take(y, range(i * extent // out, -(-(i + 1) * extent // out)), axis=axis) for i in range(out)]
            y = np.stack([reduce(b, axis=axis) for b in bins], axis=axis)
        return {"y": y}


def _check_size(node: Node, spatial: int, size: tuple[int, ...], extents: Sequence[Extent]) -> None:
    """``size`` has one extent per spatial dim, each >= 1 and at most MAX_UPSCALE x its input's."""
    _check_lengths(node, spatial, size=size)
    if any(s < 1 for s in size):
        fail_attribute(node, f"size {list(size)} must be >= 1 in every spatial dim")
    for axis, (extent, out) in enumerate(zip(extents, size)):
        if out > MAX_UPSCALE * extent:
            fail_attribute(
                node,
                f"size {out} of spatial dim {axis} is over {MAX_UPSCALE} x its input extent {extent} "
                f"(at most {MAX_UPSCALE * extent})",
            )


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
        _check_size(node, spatial, a.size, x.dim[2:])
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


def _pooling_attributes(
    mode: Any,
    window: Sequence[int],
    stride: Sequence[int] | None,
    padding: Sequence[int] | None,
    pre_padding: Sequence[int] | None,
    post_padding: Sequence[int] | None,
) -> dict[str, Any]:
    """``stride`` defaults to the window, ``padding`` (both sides) to 0; the sides override it."""
    if padding is None and isinstance(window, Sequence):
        padding = [0] * len(window)
    return {
        "mode": mode,
        "window": window,
        "stride": window if stride is None else stride,
        "pre_padding": padding if pre_padding is None else pre_padding,
        "post_padding": padding if post_padding is None else post_padding,
    }


class PoolingMethods:
    _add_node: Callable[..., list[Any]]

    @overload
    def pooling(
        self,
        input: TensorSpec,
        mode: Any,
        window: Sequence[int],
        stride: Sequence[int] | None = ...,
        padding: Sequence[int] | None = ...,
        pre_padding: Sequence[int] | None = ...,
        post_padding: Sequence[int] | None = ...,
        generate_index: Literal[False] = ...,
        compute_data_type: Any = ...,
        name: str | None = ...,
    ) -> TensorSpec: ...

    @overload
    def pooling(
        self,
        input: TensorSpec,
        mode: Any,
        window: Sequence[int],
        stride: Sequence[int] | None = ...,
        padding: Sequence[int] | None = ...,
        pre_padding: Sequence[int] | None = ...,
        post_padding: Sequence[int] | None = ...,
        *,
        generate_index: Literal[True],
        compute_data_type: Any = ...,
        name: str | None = ...,
    ) -> list[TensorSpec]: ...

    def pooling(
        self,
        input: TensorSpec,
        mode: Any,
        window: Sequence[int],
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        generate_index: bool = False,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec | list[TensorSpec]:
        """Max or average over windows. ``stride`` defaults to the window; ``padding`` sets both
        sides. With ``generate_index`` (max only), ``[y, index]`` as the cuDNN frontend returns them."""
        attrs = _pooling_attributes(mode, window, stride, padding, pre_padding, post_padding)
        y, index = self._add_node(
            "pooling",
            {"input": input},
            {**attrs, "generate_index": generate_index},
            name=name,
            compute_data_type=compute_data_type,
        )
        return [y, index] if generate_index else y

    def pooling_backward(
        self,
        dy: TensorSpec,
        mode: Any,
        window: Sequence[int],
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        x: TensorSpec | None = None,
        index: TensorSpec | None = None,
        dx_dim: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """dx of ``pooling(x, mode, window, ...)`` from dy. Max needs the forward's ``index``
        or ``x``; without ``x``, dx has ``dx_dim``, or the smallest input dims that give dy's."""
        return self._add_node(
            "pooling_backward",
            {"dy": dy, "x": x, "index": index},
            _pooling_attributes(mode, window, stride, padding, pre_padding, post_padding),
            name=name,
            compute_data_type=compute_data_type,
            declared={"dx": dx_dim} if dx_dim is not None else None,
        )[0]

    def adaptive_pooling(
        self, input: TensorSpec, mode: Any, size: Sequence[int], compute_data_type: Any = None, name: str | None = None
    ) -> TensorSpec:
        """Max or average pooling of ``input`` to the spatial extents ``size``, as PyTorch's
        ``adaptive_max_pool`` / ``adaptive_avg_pool``."""
        attrs = {"mode": mode, "size": size}
        return self._add_node(
            "adaptive_pooling", {"input": input}, attrs, name=name, compute_data_type=compute_data_type
        )[0]

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
