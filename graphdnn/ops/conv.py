"""Convolutions: forward, data gradient and weight gradient, 1-D to 3-D, grouped.

Tensors are in logical order: image/dx ``[N, C, *spatial]``, weight/dw
``[K, C/groups, *filter]``, y/loss ``[N, K, *out]``; any strides. The group count is
``C // weight.dim[1]``, as cuDNN infers it from the weight shape.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, need_declared, register

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec


class ConvMode(enum.Enum):
    CROSS_CORRELATION = "cross_correlation"
    CONVOLUTION = "convolution"  # the filter is flipped in every spatial dim


@dataclasses.dataclass(frozen=True)
class ConvAttributes(Attributes):
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    convolution_mode: ConvMode = ConvMode.CROSS_CORRELATION


def output_extent(extent: Extent, filt: int, pre: int, post: int, stride: int, dilation: int) -> int:
    """Forward-convolution output size along one spatial dim (may be < 1 if invalid)."""
    return (extent + pre + post - dilation * (filt - 1) - 1) // stride + 1


def conv_attrs(node: Node) -> ConvAttributes:
    assert isinstance(node.attributes, ConvAttributes)
    return node.attributes


def _check_attributes(node: Node, spatial: int) -> ConvAttributes:
    a = conv_attrs(node)
    for name in ("pre_padding", "post_padding", "stride", "dilation"):
        values = getattr(a, name)
        if len(values) != spatial:
            fail_attribute(node, f"{name} has {len(values)} values for {spatial} spatial dims")
        low = 0 if name.endswith("padding") else 1
        if any(v < low for v in values):
            fail_attribute(node, f"{name} {list(values)} must be >= {low}")
    return a


def _check_ranks(node: Node, **tensors: Tensor) -> int:
    ranks = {role: len(t.dim) for role, t in tensors.items()}
    rank = next(iter(ranks.values()))
    if not 3 <= rank <= 5 or any(r != rank for r in ranks.values()):
        shown = ", ".join(f"{role} rank {r}" for role, r in ranks.items())
        fail(node, f"convolution needs tensors of equal rank 3 to 5 (1-D to 3-D); got {shown}")
    return rank - 2


def _groups(node: Node, channels: Extent, weight: Tensor, what: str) -> int:
    per_group = weight.dim[1]
    if channels % per_group:
        fail(
            node,
            f"{what} has {channels} channels, not a multiple of the weight's {per_group} input channels per group",
        )
    groups = channels // per_group
    if weight.dim[0] % groups:
        fail(node, f"weight has {weight.dim[0]} output channels, not divisible into {groups} groups")
    return groups


def _spatial_out(
    node: Node, a: ConvAttributes, in_spatial: Sequence[Extent], filt: Sequence[Extent]
) -> tuple[int, ...]:
    """Output spatial dims; padding on either side is at most the larger of the input extent
    and the dilated filter extent, so a small graph cannot ask for a huge padded image."""
    out = []
    for axis, (x, f, lo, hi, s, d) in enumerate(
        zip(in_spatial, filt, a.pre_padding, a.post_padding, a.stride, a.dilation)
    ):
        reach = d * (f - 1) + 1
        if max(lo, hi) > max(x, reach):
            fail_attribute(
                node,
                f"spatial dim {axis}: padding {lo}+{hi} is over the limit of {max(x, reach)}, the larger of the "
                f"input extent {x} and the dilated filter extent {reach} (more pads only zeros)",
            )
        extent = output_extent(x, f, lo, hi, s, d)
        if extent < 1:
            fail(node, f"spatial dim {axis}: filter {f} (dilation {d}) does not fit input {x} padded by {lo}+{hi}")
        out.append(extent)
    return tuple(out)


@register
class ConvFprop(Op):
    kind = "conv_fprop"
    category = Category.CONVOLUTION
    inputs = (Role("image", floating=True), Role("weight", floating=True))
    outputs = (Role("y"),)
    attributes = ConvAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, w = node.input("image"), node.input("weight")
        assert x is not None and w is not None
        spatial = _check_ranks(node, image=x, weight=w)
        a = _check_attributes(node, spatial)
        _groups(node, x.dim[1], w, "image")
        out = _spatial_out(node, a, x.dim[2:], w.dim[2:])
        return {"y": Inferred((x.dim[0], w.dim[0], *out), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        image, weight = x["image"], _oriented(node, x["weight"])
        y_dim = node.output("y").static_dim  # type: ignore[union-attr]
        groups = image.shape[1] // weight.shape[1]
        padded = _pad(image, conv_attrs(node))
        y = np.zeros(y_dim)
        for tap, window in _taps(conv_attrs(node), weight.shape[2:], y_dim[2:]):
            xs = _grouped(padded[window], groups)  # [N, G, Cg, *out]
            ws = weight[(slice(None), slice(None), *tap)].reshape(groups, -1, weight.shape[1])  # [G, Kg, Cg]
            y += np.einsum("ngc...,gkc->ngk...", xs, ws, optimize=True).reshape(y_dim)
        return {"y": y}


@register
class ConvDgrad(Op):
    """dx of a convolution. dx dims default to the smallest input that gives loss's dims."""

    kind = "conv_dgrad"
    category = Category.CONVOLUTION
    inputs = (Role("loss", floating=True), Role("filter", floating=True))
    outputs = (Role("dx"),)
    attributes = ConvAttributes
    declared_outputs = frozenset({"dx"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        dy, w = node.input("loss"), node.input("filter")
        assert dy is not None and w is not None
        spatial = _check_ranks(node, loss=dy, filter=w)
        a = _check_attributes(node, spatial)
        if dy.dim[1] != w.dim[0]:
            fail(node, f"loss has {dy.dim[1]} channels but the filter has {w.dim[0]} output channels", role="loss")
        dx = declared.get("dx")
        if dx is None:
            in_spatial = [
                (o - 1) * s - lo - hi + d * (f - 1) + 1
                for o, f, lo, hi, s, d in zip(
                    dy.dim[2:], w.dim[2:], a.pre_padding, a.post_padding, a.stride, a.dilation
                )
            ]
            if any(extent < 1 for extent in in_spatial):
                fail(node, f"no input size gives loss dims {list(dy.dim)} with these padding and filter sizes")
            dx = (dy.dim[0], w.dim[1], *in_spatial)
        if len(dx) != len(dy.dim) or dx[0] != dy.dim[0]:
            fail(node, f"dx dims {list(dx)} do not match loss dims {list(dy.dim)}")
        _groups(node, dx[1], w, "dx")
        out = _spatial_out(node, a, dx[2:], w.dim[2:])
        if out != tuple(dy.dim[2:]):
            fail(
                node, f"a convolution of dx {list(dx)} gives spatial dims {list(out)}, but loss has {list(dy.dim[2:])}"
            )
        return {"dx": Inferred(tuple(dx), stride_order(dy.dim, dy.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        dy, weight = x["loss"], _oriented(node, x["filter"])
        dx_dim = node.output("dx").dim  # type: ignore[union-attr]
        a = conv_attrs(node)
        groups = dx_dim[1] // weight.shape[1]
        padded_dim = [d + lo + hi for d, lo, hi in zip(dx_dim[2:], a.pre_padding, a.post_padding)]
        dx_padded = np.zeros((dx_dim[0], dx_dim[1], *padded_dim))
        dys = _grouped(dy, groups)  # [N, G, Kg, *out]
        for tap, window in _taps(a, weight.shape[2:], dy.shape[2:]):
            ws = weight[(slice(None), slice(None), *tap)].reshape(groups, -1, weight.shape[1])  # [G, Kg, Cg]
            contribution = np.einsum("ngk...,gkc->ngc...", dys, ws, optimize=True)
            dx_padded[window] += contribution.reshape(dx_padded[window].shape)
        crop = tuple(slice(lo, lo + d) for lo, d in zip(a.pre_padding, dx_dim[2:]))
        return {"dx": dx_padded[(slice(None), slice(None), *crop)]}


@register
class ConvWgrad(Op):
    """dw of a convolution. Its dims [K, C/groups, *filter] are declared by the user."""

    kind = "conv_wgrad"
    category = Category.CONVOLUTION
    inputs = (Role("image", floating=True), Role("loss", floating=True))
    outputs = (Role("dw"),)
    attributes = ConvAttributes
    declared_outputs = frozenset({"dw"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, dy = node.input("image"), node.input("loss")
        assert x is not None and dy is not None
        spatial = _check_ranks(node, image=x, loss=dy)
        a = _check_attributes(node, spatial)
        dw = declared.get("dw")
        if dw is None:
            need_declared(
                node, "the filter dims of conv_wgrad cannot be inferred: pass filter_dim= or call set_dim on dw"
            )
        if len(dw) != len(x.dim) or dw[0] != dy.dim[1]:
            fail(node, f"dw dims {list(dw)} need rank {len(x.dim)} and {dy.dim[1]} output channels (from loss)")
        if x.dim[0] != dy.dim[0]:
            fail(node, f"image batch {x.dim[0]} differs from loss batch {dy.dim[0]}", role="loss")
        groups = x.dim[1] // dw[1] if dw[1] and x.dim[1] % dw[1] == 0 else 0
        if not groups or dw[0] % groups:
            fail(node, f"dw dims {list(dw)} do not divide image's {x.dim[1]} channels into groups")
        out = _spatial_out(node, a, x.dim[2:], dw[2:])
        if out != tuple(dy.dim[2:]):
            fail(
                node,
                f"a convolution with filter {list(dw)} gives spatial dims {list(out)}, but loss has {list(dy.dim[2:])}",
            )
        return {"dw": Inferred(tuple(dw), stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        image, dy = x["image"], x["loss"]
        dw_dim = node.output("dw").static_dim  # type: ignore[union-attr]
        groups = image.shape[1] // dw_dim[1]
        padded = _pad(image, conv_attrs(node))
        dys = _grouped(dy, groups)  # [N, G, Kg, *out]
        dw = np.zeros(dw_dim)
        for tap, window in _taps(conv_attrs(node), dw_dim[2:], dy.shape[2:]):
            xs = _grouped(padded[window], groups)  # [N, G, Cg, *out]
            dw[(slice(None), slice(None), *tap)] = np.einsum("ngk...,ngc...->gkc", dys, xs, optimize=True).reshape(
                dw_dim[0], dw_dim[1]
            )
        return {"dw": _oriented(node, dw)}


# -- reference helpers -------------------------------------------------------------------
def _oriented(node: Node, weight: np.ndarray) -> np.ndarray:
    """The filter as cross-correlation uses it (flipped for true convolution)."""
    if conv_attrs(node).convolution_mode is ConvMode.CONVOLUTION:
        return weight[(slice(None), slice(None), *[slice(None, None, -1)] * (weight.ndim - 2))]
    return weight


def _pad(image: np.ndarray, a: ConvAttributes) -> np.ndarray:
    return np.pad(image, [(0, 0), (0, 0), *zip(a.pre_padding, a.post_padding)])


def _taps(a: ConvAttributes, filt: Sequence[int], out: Sequence[int]) -> Any:
    """For each filter position: its index and the strided window of the padded input it sees."""
    for tap in itertools.product(*(range(f) for f in filt)):
        window = tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(tap, a.dilation, a.stride, out))
        yield tap, (slice(None), slice(None), *window)


def _grouped(t: np.ndarray, groups: int) -> np.ndarray:
    """[N, C, ...] -> [N, G, C/G, ...]."""
    return t.reshape(t.shape[0], groups, t.shape[1] // groups, *t.shape[2:])


# -- builder methods ----------------------------------------------------------------------
def conv_attributes(
    spatial: int | None,
    padding: Sequence[int] | None,
    pre_padding: Sequence[int] | None,
    post_padding: Sequence[int] | None,
    stride: Sequence[int] | None,
    dilation: Sequence[int] | None,
    convolution_mode: Any,
) -> dict[str, Any]:
    """Fill cuDNN-style defaults: zero padding, unit stride and dilation."""
    given = [v for v in (padding, pre_padding, post_padding, stride, dilation) if v is not None]
    if spatial is None:
        spatial = len(given[0]) if given else 2
    pre = pre_padding if pre_padding is not None else padding
    post = post_padding if post_padding is not None else padding
    return {
        "pre_padding": list(pre) if pre is not None else [0] * spatial,
        "post_padding": list(post) if post is not None else [0] * spatial,
        "stride": list(stride) if stride is not None else [1] * spatial,
        "dilation": list(dilation) if dilation is not None else [1] * spatial,
        "convolution_mode": convolution_mode,
    }


def _spatial_rank(t: TensorSpec) -> int | None:
    return None if t.dim is None else max(len(t.dim) - 2, 1)


class ConvMethods:
    _add_node: Callable[..., list[Any]]

    def conv_fprop(
        self,
        image: TensorSpec,
        weight: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """y = image (*) weight. ``padding`` sets both sides; pre/post override it."""
        attrs = conv_attributes(
            _spatial_rank(weight), padding, pre_padding, post_padding, stride, dilation, convolution_mode
        )
        return self._add_node(
            "conv_fprop", {"image": image, "weight": weight}, attrs, name=name, compute_data_type=compute_data_type
        )[0]

    def conv_dgrad(
        self,
        loss: TensorSpec,
        filter: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        image_dim: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """dx from dy. ``image_dim`` picks dx's dims where the stride makes them ambiguous."""
        attrs = conv_attributes(
            _spatial_rank(filter), padding, pre_padding, post_padding, stride, dilation, convolution_mode
        )
        declared = {"dx": image_dim} if image_dim is not None else None
        return self._add_node(
            "conv_dgrad",
            {"loss": loss, "filter": filter},
            attrs,
            name=name,
            compute_data_type=compute_data_type,
            declared=declared,
        )[0]

    def conv_wgrad(
        self,
        image: TensorSpec,
        loss: TensorSpec,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        convolution_mode: Any = ConvMode.CROSS_CORRELATION,
        filter_dim: Sequence[int] | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """dw from x and dy. Give ``filter_dim`` here or call ``set_dim`` on the result."""
        attrs = conv_attributes(
            _spatial_rank(image), padding, pre_padding, post_padding, stride, dilation, convolution_mode
        )
        declared = {"dw": filter_dim} if filter_dim is not None else None
        return self._add_node(
            "conv_wgrad",
            {"image": image, "loss": loss},
            attrs,
            name=name,
            compute_data_type=compute_data_type,
            declared=declared,
        )[0]
