"""Normalizations: batch, layer, RMS, instance, group and adaptive layer norm, forward and backward.

Every normalization standardises sets of input elements (a channel across the batch, a
row, a sample's channel, a sample's channel group) with the set's own statistics, then
applies a per-feature scale and bias. A :class:`Grouping` says how an op splits its input
into those sets; one forward reference serves every op, and one backward reference
(in :mod:`.norm_backward`) every gradient. Variances are biased (divided by the set size)
and ``inv_variance = 1 / sqrt(var + epsilon)``. Statistics tensors are row-major; ``y``
and ``dx`` follow the input's layout.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import StructureError
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes, NoAttributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, register, same_dims

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec


class NormForwardPhase(enum.Enum):
    """Training also outputs the statistics that the backward pass reads."""

    TRAINING = "training"
    INFERENCE = "inference"


@dataclasses.dataclass(frozen=True)
class NormAttributes(Attributes):
    norm_forward_phase: NormForwardPhase


@dataclasses.dataclass(frozen=True)
class GroupNormAttributes(Attributes):
    groups: int
    norm_forward_phase: NormForwardPhase = NormForwardPhase.INFERENCE


@dataclasses.dataclass(frozen=True)
class Grouping:
    """How a norm splits its input into the sets it standardises.

    The input reshaped to ``view`` holds one set per index of the axes not in ``axes``;
    the statistics of the sets, one value each, have dims ``stats`` (``what`` in words).
    """

    view: tuple[Extent, ...]
    axes: tuple[int, ...]
    stats: tuple[Extent, ...]
    what: str

    @property
    def kept(self) -> tuple[Extent, ...]:
        """The view's dims with the reduced axes set to 1: statistics that broadcast over it."""
        return tuple(1 if axis in self.axes else extent for axis, extent in enumerate(self.view))


# -- groupings (and the checks of input, scale and bias that go with them) -----------------
def _check_rank(node: Node, x: Tensor, low: int, high: int) -> None:
    if not low <= len(x.dim) <= high:
        fail(node, f"input has dims {list(x.dim)}, expected [N, C, *spatial] of rank {low} to {high}", role="input")


def _channel_dims(x: Tensor) -> tuple[Extent, ...]:
    return (1, x.dim[1], *[1] * (len(x.dim) - 2))


def _check_affine(node: Node, expected: tuple[Extent, ...], what: str) -> None:
    for role in ("scale", "bias"):
        tensor = node.input(role)
        if tensor is not None:
            same_dims(node, role, tensor, expected, what)


def per_channel(node: Node, x: Tensor) -> Grouping:
    """Batch norm: one set per channel, across the batch and the spatial dims."""
    _check_rank(node, x, 2, 5)
    channel = _channel_dims(x)
    _check_affine(node, channel, "one value per channel")
    return Grouping(x.dim, (0, *range(2, len(x.dim))), channel, "one value per channel")


def per_instance(node: Node, x: Tensor) -> Grouping:
    """Instance norm: one set per sample and channel, across the spatial dims."""
    _check_rank(node, x, 3, 5)
    _check_affine(node, _channel_dims(x), "one value per channel")
    stats = (*x.dim[:2], *[1] * (len(x.dim) - 2))
    return Grouping(x.dim, tuple(range(2, len(x.dim))), stats, "one value per sample and channel")


def per_group(node: Node, x: Tensor) -> Grouping:
    """Group norm: one set per sample and group of C/groups consecutive channels, with their spatial dims."""
    _check_rank(node, x, 2, 5)
    groups, channels = node.attributes.groups, x.dim[1]  # type: ignore[attr-defined]
    if groups < 1 or channels % groups:
        fail_attribute(node, f"groups is {groups}; it must be at least 1 and divide the input's {channels} channels")
    _check_affine(node, _channel_dims(x), "one value per channel")
    spatial = x.dim[2:]
    view = (x.dim[0], groups, channels // groups, *spatial)
    stats = (x.dim[0], groups, *[1] * len(spatial))
    return Grouping(view, tuple(range(2, len(view))), stats, "one value per sample and group")


def per_row(node: Node, x: Tensor) -> Grouping:
    """Layer and RMS norm: the normalized axes are where scale (right-aligned) is not 1.

    A scale that is 1 on every axis normalizes over every axis but the first.
    """
    if len(x.dim) < 2:
        fail(node, f"input has dims {list(x.dim)}, expected rank 2 or more", role="input")
    scale = node.input("scale")
    assert scale is not None
    rank = len(x.dim)
    padded = (1,) * (rank - len(scale.dim)) + scale.dim
    if len(scale.dim) > rank or any(s not in (1, d) for s, d in zip(padded, x.dim)):
        fail(
            node,
            f"scale has dims {list(scale.dim)}, expected 1 or the input's extent on each axis "
            f"(input has dims {list(x.dim)})",
            role="scale",
        )
    bias = node.input("bias")
    if bias is not None:
        same_dims(node, "bias", bias, scale.dim, "the same dims as scale")
    axes = tuple(axis for axis, extent in enumerate(padded) if extent > 1) or tuple(range(1, rank))
    stats = tuple(1 if axis in axes else extent for axis, extent in enumerate(x.dim))
    return Grouping(x.dim, axes, stats, "the input's dims with the normalized axes set to 1")


def per_sample_row(node: Node, x: Tensor) -> Grouping:
    """Adaptive layer norm: rows as layer norm's, with a scale and bias of their own per sample.

    Scale and bias have the input's rank and its batch extent first ([B, 1, D] for an input
    [B, S, D]); the normalized axes are the others where the scale is not 1 (the last axis
    when there are none).
    """
    if len(x.dim) < 2:
        fail(node, f"input has dims {list(x.dim)}, expected [B, ..., D] of rank 2 or more", role="input")
    scale = node.input("scale")
    assert scale is not None
    if (
        len(scale.dim) != len(x.dim)
        or scale.dim[0] != x.dim[0]
        or any(s not in (1, d) for s, d in zip(scale.dim[1:], x.dim[1:]))
    ):
        fail(
            node,
            f"scale has dims {list(scale.dim)}, expected one row of scales per sample: the input's batch "
            f"extent first, then 1 or the input's extent on each axis (input has dims {list(x.dim)}, "
            f"e.g. [{x.dim[0]}, 1, ..., {x.dim[-1]}])",
            role="scale",
        )
    bias = node.input("bias")
    if bias is not None:
        same_dims(node, "bias", bias, scale.dim, "the same dims as scale")
    rank = len(x.dim)
    axes = tuple(axis for axis in range(1, rank) if scale.dim[axis] != 1) or (rank - 1,)
    stats = tuple(1 if axis in axes else extent for axis, extent in enumerate(x.dim))
    return Grouping(x.dim, axes, stats, "the input's dims with the normalized axes set to 1")


# -- op definitions ---------------------------------------------------------------------------
# Roles that norm_backward shares.
INPUT: Role = Role("input", floating=True)
GRAD: Role = Role("grad", floating=True)
SCALE: Role = Role("scale", floating=True)
MEAN: Role = Role("mean", floating=True)
INV_VARIANCE: Role = Role("inv_variance", floating=True, positive=True)
EPSILON = Role("epsilon", scalar=True)
_STAT_INPUTS = ("mean", "inv_variance", "in_running_mean", "in_running_var")


class NormOp(Op):
    """A normalization: its grouping, the checks of every tensor bound to it, its output dims.

    The first output (y or dx) has the input's dims and layout; the others are statistics
    (forward) or parameter gradients (backward), whose dims :meth:`side_output` gives.
    """

    category = Category.NORMALIZATION
    grouping: ClassVar[staticmethod[[Node, Tensor], Grouping]]

    def checked(self, node: Node) -> tuple[Tensor, Grouping]:
        x = node.input("input")
        assert x is not None
        grouping = self.grouping(node, x)
        grad = node.input("grad")
        if grad is not None:
            same_dims(node, "grad", grad, x.dim, "the input's dims")
        for role in _STAT_INPUTS:
            tensor = node.input(role)
            if tensor is not None:
                same_dims(node, role, tensor, grouping.stats, grouping.what)
        return x, grouping

    def side_output(self, node: Node, grouping: Grouping) -> Inferred:
        return Inferred(grouping.stats)

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x, grouping = self.checked(node)
        main = Inferred(x.dim, stride_order(x.dim, x.stride))
        side = self.side_output(node, grouping)
        present = self.present_outputs(node.attributes, frozenset(role for role, _ in node.inputs))
        return {role.name: main if i == 0 else side for i, role in enumerate(self.outputs) if role.name in present}


class _ForwardNorm(NormOp):
    """Standardise each set with its own statistics; output them in the training phase."""

    inputs: ClassVar[tuple[Role, ...]] = (INPUT, SCALE, Role("bias", floating=True), EPSILON)
    outputs: ClassVar[tuple[Role, ...]] = (Role("y"), Role("mean"), Role("inv_variance"))
    attributes: ClassVar[type[Attributes]] = NormAttributes
    centered = True  # subtract the mean (False: RMS norm)

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        if attributes.norm_forward_phase is NormForwardPhase.TRAINING:  # type: ignore[attr-defined]
            return super().present_outputs(attributes, bound_inputs)
        return frozenset({"y"})

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.standardize(node, x)[0]

    def standardize(self, node: Node, x: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """y and the statistics, plus each set's biased variance (mean square for RMS norm)."""
        data = x["input"]
        grouping = self.checked(node)[1]
        view = data.reshape(grouping.view)
        mean = view.mean(axis=grouping.axes, keepdims=True) if self.centered else np.zeros(grouping.kept)
        var = ((view - mean) ** 2).mean(axis=grouping.axes, keepdims=True)
        inv = 1.0 / np.sqrt(var + x["epsilon"])
        y = ((view - mean) * inv).reshape(data.shape) * x["scale"] + x.get("bias", 0.0)
        outputs = {"y": y, "mean": mean.reshape(grouping.stats), "inv_variance": inv.reshape(grouping.stats)}
        return outputs, var.reshape(grouping.stats)


@register
class Batchnorm(_ForwardNorm):
    """Training batch norm; with running statistics, also their momentum update.

    ``next_running_var`` takes the unbiased variance (var * n / (n - 1), n elements per
    channel; the biased one when n is 1), as PyTorch and cuDNN do.
    """

    kind = "batchnorm"
    inputs = (
        *_ForwardNorm.inputs[:3],
        Role("in_running_mean", optional=True, floating=True),
        Role("in_running_var", optional=True, floating=True, positive=True),
        EPSILON,
        Role("momentum", optional=True, scalar=True),
    )
    outputs = (*_ForwardNorm.outputs, Role("next_running_mean"), Role("next_running_var"))
    attributes = NoAttributes
    grouping = staticmethod(per_channel)

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        running = {"next_running_mean", "next_running_var"} if "in_running_mean" in bound_inputs else set()
        return frozenset({"y", "mean", "inv_variance", *running})

    def checked(self, node: Node) -> tuple[Tensor, Grouping]:
        bound = {role for role, _ in node.inputs}
        running = bound & {"in_running_mean", "in_running_var"}
        if len(running) == 1:
            given = running.pop()
            raise StructureError(
                f"{given} is given alone; give in_running_mean and in_running_var, or neither", node=node.name
            )
        if running and "momentum" not in bound:
            raise StructureError("momentum is needed to update the running statistics", node=node.name)
        if not running and "momentum" in bound:
            raise StructureError("momentum is given but there are no running statistics to update", node=node.name)
        return super().checked(node)

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        outputs, var = self.standardize(node, x)
        if "in_running_mean" in x:
            n = x["input"].size // x["input"].shape[1]
            unbiased = var * n / (n - 1) if n > 1 else var
            momentum = x["momentum"]
            outputs["next_running_mean"] = (1 - momentum) * x["in_running_mean"] + momentum * outputs["mean"]
            outputs["next_running_var"] = (1 - momentum) * x["in_running_var"] + momentum * unbiased
        return outputs


@register
class Layernorm(_ForwardNorm):
    kind = "layernorm"
    grouping = staticmethod(per_row)


@register
class Rmsnorm(_ForwardNorm):
    """y = x * inv_variance * scale (+ bias), inv_variance = 1 / sqrt(mean(x^2) + epsilon)."""

    kind = "rmsnorm"
    inputs = (INPUT, SCALE, Role("bias", optional=True, floating=True), EPSILON)
    outputs = (Role("y"), Role("inv_variance"))
    grouping = staticmethod(per_row)
    centered = False


@register
class Adalayernorm(_ForwardNorm):
    """Layer norm whose scale and bias are per sample ([B, 1, D]: DiT's adaptive layer norm)."""

    kind = "adalayernorm"
    inputs = (INPUT, SCALE, Role("bias", optional=True, floating=True), EPSILON)
    grouping = staticmethod(per_sample_row)


@register
class Instancenorm(_ForwardNorm):
    kind = "instancenorm"
    grouping = staticmethod(per_instance)


@register
class Groupnorm(_ForwardNorm):
    kind = "groupnorm"
    attributes = GroupNormAttributes
    grouping = staticmethod(per_group)


@register
class BatchnormInference(NormOp):
    """y = (x - mean) * inv_variance * scale + bias, with given per-channel statistics."""

    kind = "batchnorm_inference"
    inputs = (INPUT, MEAN, INV_VARIANCE, SCALE, Role("bias", floating=True))
    outputs = (Role("y"),)
    grouping = staticmethod(per_channel)

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": (x["input"] - x["mean"]) * x["inv_variance"] * x["scale"] + x["bias"]}


# -- builder methods ----------------------------------------------------------------------
class NormMethods:
    """cuDNN-frontend-style builder methods for normalizations (mixed into the graph).

    Multi-output methods return every output role in order, None where the node has none
    (statistics outside training, running averages without running statistics).
    """

    _add_node: Callable[..., list[Any]]

    def batchnorm(
        self,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        in_running_mean: TensorSpec | None = None,
        in_running_var: TensorSpec | None = None,
        epsilon: TensorSpec | float | None = None,
        momentum: TensorSpec | float | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """Training batch norm -> [y, mean, inv_variance, next_running_mean, next_running_var]; epsilon is required."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon, "momentum": momentum}
        inputs |= {"in_running_mean": in_running_mean, "in_running_var": in_running_var}
        return self._add_node("batchnorm", inputs, name=name, compute_data_type=compute_data_type)

    def batchnorm_inference(
        self,
        input: TensorSpec,
        mean: TensorSpec,
        inv_variance: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Batch norm with known per-channel statistics (e.g. running averages)."""
        inputs = {"input": input, "mean": mean, "inv_variance": inv_variance, "scale": scale, "bias": bias}
        return self._add_node("batchnorm_inference", inputs, name=name, compute_data_type=compute_data_type)[0]

    def layernorm(
        self,
        norm_forward_phase: NormForwardPhase | str,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        epsilon: TensorSpec | float,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [y, mean, inv_variance] over the axes where scale is not 1."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon}
        attrs = {"norm_forward_phase": norm_forward_phase}
        return self._add_node("layernorm", inputs, attrs, name=name, compute_data_type=compute_data_type)

    def rmsnorm(
        self,
        norm_forward_phase: NormForwardPhase | str,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec | None = None,
        epsilon: TensorSpec | float | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [y, inv_variance] over the axes where scale is not 1; epsilon is required."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon}
        attrs = {"norm_forward_phase": norm_forward_phase}
        return self._add_node("rmsnorm", inputs, attrs, name=name, compute_data_type=compute_data_type)

    def adalayernorm(
        self,
        norm_forward_phase: NormForwardPhase | str,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec | None = None,
        epsilon: TensorSpec | float | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [y, mean, inv_variance]: layer norm with scale and bias per sample ([B, 1, D]); epsilon is required."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon}
        attrs = {"norm_forward_phase": norm_forward_phase}
        return self._add_node("adalayernorm", inputs, attrs, name=name, compute_data_type=compute_data_type)

    def instancenorm(
        self,
        norm_forward_phase: NormForwardPhase | str,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        epsilon: TensorSpec | float,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [y, mean, inv_variance], statistics per sample and channel."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon}
        attrs = {"norm_forward_phase": norm_forward_phase}
        return self._add_node("instancenorm", inputs, attrs, name=name, compute_data_type=compute_data_type)

    def groupnorm(
        self,
        input: TensorSpec,
        scale: TensorSpec,
        bias: TensorSpec,
        epsilon: TensorSpec | float,
        groups: int,
        norm_forward_phase: NormForwardPhase | str = NormForwardPhase.INFERENCE,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """-> [y, mean, inv_variance], statistics per sample and group of C/groups channels."""
        inputs = {"input": input, "scale": scale, "bias": bias, "epsilon": epsilon}
        attrs = {"groups": groups, "norm_forward_phase": norm_forward_phase}
        return self._add_node("groupnorm", inputs, attrs, name=name, compute_data_type=compute_data_type)
