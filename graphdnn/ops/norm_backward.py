"""Backward normalizations: batch, layer, RMS, instance, group and adaptive layer norm gradients.

From the saved statistics, each is the exact gradient of its training-phase forward op (statistics treated as
functions of the input), evaluated with the mean and inv_variance that the forward pass
saved. They build on :mod:`.norms`' definitions; the package imports both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..layout import stride_order
from .attributes import Attributes
from .base import Inferred, Role, register
from .norms import (
    GRAD,
    INPUT,
    INV_VARIANCE,
    MEAN,
    SCALE,
    Grouping,
    NormOp,
    per_channel,
    per_group,
    per_instance,
    per_row,
    per_sample_row,
)

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class RmsNormBackwardAttributes(Attributes):
    has_dbias: bool


class _NormBackward(NormOp):
    """dx, dscale and dbias of a forward norm.

    With xhat the standardised input and g = grad * scale, both in the grouped view,
    dx = inv_variance * (g - mean(g) - xhat * mean(g * xhat)), means taken over each set
    (RMS norm, which has no mean input, drops the mean(g) term); dscale and dbias sum
    grad * xhat and grad over the axes where scale broadcasts.
    """

    outputs: ClassVar[tuple[Role, ...]] = (Role("dx"), Role("dscale"), Role("dbias"))

    def side_output(self, node: Node, grouping: Grouping) -> Inferred:
        scale = node.input("scale")
        assert scale is not None
        return Inferred(scale.dim, stride_order(scale.dim, scale.stride))

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        grad, data, scale = x["grad"], x["input"], x["scale"]
        grouping = self.checked(node)[1]
        centered = "mean" in x
        inv = x["inv_variance"].reshape(grouping.kept)
        mean = x["mean"].reshape(grouping.kept) if centered else 0.0
        xhat = (data.reshape(grouping.view) - mean) * inv
        g = (grad * scale).reshape(grouping.view)
        g_mean = g.mean(axis=grouping.axes, keepdims=True) if centered else 0.0
        dx = inv * (g - g_mean - xhat * (g * xhat).mean(axis=grouping.axes, keepdims=True))
        xhat = xhat.reshape(data.shape)
        return {
            "dx": dx.reshape(data.shape),
            "dscale": _sum_to(grad * xhat, scale.shape),
            "dbias": _sum_to(grad, scale.shape),
        }


def _sum_to(values: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    """Sum over the axes where ``dims`` (right-aligned) is 1: the adjoint of broadcasting to ``values``."""
    padded = (1,) * (values.ndim - len(dims)) + tuple(dims)
    axes = tuple(axis for axis, extent in enumerate(padded) if extent == 1)
    return values.sum(axis=axes, keepdims=True).reshape(dims)


@register
class BatchnormBackward(_NormBackward):
    kind = "batchnorm_backward"
    inputs = (GRAD, INPUT, SCALE, MEAN, INV_VARIANCE)
    grouping = staticmethod(per_channel)


@register
class LayernormBackward(_NormBackward):
    kind = "layernorm_backward"
    inputs = (GRAD, INPUT, SCALE, MEAN, INV_VARIANCE)
    grouping = staticmethod(per_row)


@register
class InstancenormBackward(_NormBackward):
    kind = "instancenorm_backward"
    inputs = (GRAD, INPUT, SCALE, MEAN, INV_VARIANCE)
    grouping = staticmethod(per_instance)


@dataclasses.dataclass(frozen=True)
class GroupNormBackwardAttributes(Attributes):
    groups: int


@register
class GroupnormBackward(_NormBackward):
    kind = "groupnorm_backward"
    inputs = (GRAD, INPUT, SCALE, MEAN, INV_VARIANCE)
    attributes = GroupNormBackwardAttributes
    grouping = staticmethod(per_group)


@register
class AdalayernormBackward(_NormBackward):
    """dscale and dbias are per sample ([B, 1, D]): sums over each sample's rows."""

    kind = "adalayernorm_backward"
    inputs = (GRAD, INPUT, SCALE, MEAN, INV_VARIANCE)
    grouping = staticmethod(per_sample_row)


@register
class RmsnormBackward(_NormBackward):
    kind = "rmsnorm_backward"
    inputs = (GRAD, INPUT, SCALE, INV_VARIANCE)
    attributes = RmsNormBackwardAttributes
    grouping = staticmethod(per_row)

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        has_dbias = attributes.has_dbias  # type: ignore[attr-defined]
        return frozenset({"dx", "dscale", "dbias"} if has_dbias else {"dx", "dscale"})


class NormBackwardMethods:
    """Builder methods of the backward norms (mixed into the graph)."""

    _add_node: Callable[..., list[Any]]

    def batchnorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of training batch norm, from its saved mean and inv_variance."""
        inputs = {"grad": grad, "input": input, "scale": scale, "mean": mean, "inv_variance": inv_variance}
        return self._add_node("batchnorm_backward", inputs, name=name, compute_data_type=compute_data_type)

    def layernorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of layer norm, from its saved mean and inv_variance; dscale has scale's dims."""
        inputs = {"grad": grad, "input": input, "scale": scale, "mean": mean, "inv_variance": inv_variance}
        return self._add_node("layernorm_backward", inputs, name=name, compute_data_type=compute_data_type)

    def instancenorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of instance norm, from its saved [N, C, 1, ...] mean and inv_variance."""
        inputs = {"grad": grad, "input": input, "scale": scale, "mean": mean, "inv_variance": inv_variance}
        return self._add_node("instancenorm_backward", inputs, name=name, compute_data_type=compute_data_type)

    def groupnorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        groups: int,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of group norm, from its saved [N, groups, 1, ...] mean and inv_variance."""
        inputs = {"grad": grad, "input": input, "scale": scale, "mean": mean, "inv_variance": inv_variance}
        attrs = {"groups": groups}
        return self._add_node("groupnorm_backward", inputs, attrs, name=name, compute_data_type=compute_data_type)

    def adalayernorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of adaptive layer norm; dscale and dbias are per sample, as scale ([B, 1, D])."""
        inputs = {"grad": grad, "input": input, "scale": scale, "mean": mean, "inv_variance": inv_variance}
        return self._add_node("adalayernorm_backward", inputs, name=name, compute_data_type=compute_data_type)

    def rmsnorm_backward(
        self,
        grad: TensorSpec,
        input: TensorSpec,
        scale: TensorSpec,
        inv_variance: TensorSpec,
        has_dbias: bool,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [dx, dscale, dbias] of RMS norm from its saved inv_variance; dbias is None unless has_dbias."""
        inputs = {"grad": grad, "input": input, "scale": scale, "inv_variance": inv_variance}
        attrs = {"has_dbias": has_dbias}
        return self._add_node("rmsnorm_backward", inputs, attrs, name=name, compute_data_type=compute_data_type)
