"""Top-k selection: ``topk`` along an axis, and ``moe_router``, the mixture-of-experts router
(scores, top-k experts, renormalised weights) as one op.

Order: larger values first; equal values by lower index first; NaN ranks above every
number (as ``torch.topk`` ranks it), so a NaN is always selected. The indices are int32
unless their tensor is set to int64.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DataType
from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import INDEX_TYPES, Category, Inferred, Op, Role, check_axis, fail, fail_attribute, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@dataclasses.dataclass(frozen=True)
class TopkAttributes(Attributes):
    k: int
    axis: int = -1


class RouterScore(enum.Enum):
    SOFTMAX = "softmax"  # Mixtral: softmax over every expert
    SIGMOID = "sigmoid"  # DeepSeek-V3: an independent sigmoid per expert


@dataclasses.dataclass(frozen=True)
class MoeRouterAttributes(Attributes):
    k: int
    score_function: RouterScore = RouterScore.SOFTMAX
    renormalize: bool = True  # divide the k weights by their sum
    scaling_factor: float = 1.0  # DeepSeek-V3's routed_scaling_factor, applied last


def top_indices(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k first elements of each row (last axis) in the documented order."""
    nan = np.isnan(key)
    position = np.broadcast_to(np.arange(key.shape[-1]), key.shape)
    # lexsort: the last key is primary. NaN first, then larger values, then lower indices.
    order = np.lexsort((position, -np.where(nan, 0.0, key), ~nan), axis=-1)
    return order[..., :k]


def _check_k(node: Node, k: int, extent: int, what: str) -> None:
    if not 1 <= k <= extent:
        fail_attribute(node, f"k must be in [1, {extent}] ({what}), got {k}")


@register
class Topk(Op):
    kind = "topk"
    category = Category.REDUCTION
    inputs = (Role("input"),)
    outputs = (Role("values"), Role("indices"))
    attributes = TopkAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = node.input("input")
        assert x is not None
        a = node.attributes
        assert isinstance(a, TopkAttributes)
        axis = check_axis(node, a.axis, len(x.dim))
        _check_k(node, a.k, int(x.dim[axis]), f"the extent of axis {axis} of input {list(x.dim)}")
        dims = tuple(a.k if i == axis else extent for i, extent in enumerate(x.dim))
        order = stride_order(x.dim, x.stride)
        return {"values": Inferred(dims, order), "indices": Inferred(dims, order, DataType.INT32, INDEX_TYPES)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a = node.attributes
        assert isinstance(a, TopkAttributes)
        value = np.moveaxis(x["input"], a.axis, -1)
        indices = top_indices(value, a.k)
        values = np.take_along_axis(value, indices, axis=-1)
        return {
            "values": np.moveaxis(values, -1, a.axis),
            "indices": np.moveaxis(indices.astype(np.float64), -1, a.axis),
        }


@register
class MoeRouter(Op):
    """Router scores -> top-k experts -> weights, per token (the last axis holds the experts)."""

    kind = "moe_router"
    category = Category.REDUCTION
    inputs = (Role("logits", floating=True), Role("bias", optional=True, floating=True))
    outputs = (Role("weights"), Role("indices"))
    attributes = MoeRouterAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        logits, bias = node.input("logits"), node.input("bias")
        assert logits is not None
        a = node.attributes
        assert isinstance(a, MoeRouterAttributes)
        experts = logits.dim[-1]
        _check_k(node, a.k, int(experts), f"the number of experts, the last dim of logits {list(logits.dim)}")
        if bias is not None and tuple(bias.dim) != (experts,):
            fail(node, f"bias has dims {list(bias.dim)}, expected [{experts}] (one per expert)", role="bias")
        dims = (*logits.dim[:-1], a.k)
        return {"weights": Inferred(dims), "indices": Inferred(dims, None, DataType.INT32, INDEX_TYPES)}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a = node.attributes
        assert isinstance(a, MoeRouterAttributes)
        logits = x["logits"]
        if a.score_function is RouterScore.SOFTMAX:
            e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
            scores = e / np.sum(e, axis=-1, keepdims=True)
        else:
            scores = 1.0 / (1.0 + np.exp(-logits))
        # The bias steers the choice only (DeepSeek-V3's load balancing); without it the
        # logits choose, which order the experts as the scores do, without their rounding.
        key = logits if x.get("bias") is None else scores + x["bias"]
        indices = top_indices(key, a.k)
        weights = np.take_along_axis(scores, indices, axis=-1)
        if a.renormalize:
            weights = weights / np.sum(weights, axis=-1, keepdims=True)
        return {"weights": weights * a.scaling_factor, "indices": indices.astype(np.float64)}


class TopkMethods:
    _add_node: Callable[..., list[Any]]

    def topk(
        self, input: TensorSpec, k: int, axis: int = -1, compute_data_type: Any = None, name: str | None = None
    ) -> list[TensorSpec]:
        """[values, indices] of the k largest elements along ``axis``, largest first."""
        return self._add_node(
            "topk", {"input": input}, {"k": k, "axis": axis}, name=name, compute_data_type=compute_data_type
        )

    def moe_router(
        self,
        logits: TensorSpec,
        k: int,
        score_function: Any = "softmax",
        bias: TensorSpec | None = None,
        renormalize: bool = True,
        scaling_factor: float = 1.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec]:
        """[weights, indices] of each token's k chosen experts (``logits``' last dim)."""
        inputs = {"logits": logits} if bias is None else {"logits": logits, "bias": bias}
        attributes = {
            "k": k,
            "score_function": score_function,
            "renormalize": renormalize,
            "scaling_factor": scaling_factor,
        }
        return self._add_node("moe_router", inputs, attributes, name=name, compute_data_type=compute_data_type)
