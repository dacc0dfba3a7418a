"""Local response normalisation across channels (cuDNN's ``CUDNN_LRN_CROSS_CHANNEL_DIM1``)
and its backward.

Tensors are ``[N, C, *spatial]`` with 1 to 3 spatial dims, any strides; outputs keep the
input's layout order. Each element is divided by a power of the sum of squares over a
window of ``lrn_n`` channels around it, the window placed as cuDNN places it: it starts
``floor((lrn_n - 1) / 2)`` channels before the centre (so an even window reaches one
channel further ahead than behind; PyTorch's ``local_response_norm`` reaches further
behind) and stops at the tensor's channels (zeros beyond, divided by ``lrn_n`` all the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, fail_attribute, register, same_dims

if TYPE_CHECKING:
    from ..ir import Node, Tensor
    from ..tensor import TensorSpec

# cuDNN's bounds (CUDNN_LRN_MIN_N / MAX_N / MIN_K / MIN_BETA): k and beta keep the power's base
# away from zero for non-negative alpha.
MIN_N, MAX_N, MIN_K, MIN_BETA = 1, 16, 1e-5, 0.01


@dataclasses.dataclass(frozen=True)
class LrnAttributes(Attributes):
    """cuDNN's lrnN, lrnAlpha, lrnBeta, lrnK, with cudnnCreateLRNDescriptor's defaults."""

    lrn_n: int = 5
    lrn_alpha: float = 1e-4
    lrn_beta: float = 0.75
    lrn_k: float = 2.0


def window(lrn_n: int) -> tuple[int, int]:
    """(behind, ahead): the channels the window of channel c spans are c - behind .. c + ahead."""
    behind = (lrn_n - 1) // 2
    return behind, lrn_n - behind - 1


def _checked(node: Node, role: str) -> Tensor:
    """The tensor bound to ``role`` (the [N, C, *spatial] one), after checking it and the attributes."""
    x = node.input(role)
    assert x is not None
    if not 3 <= len(x.dim) <= 5:
        fail(
            node, f"{role} has dims {list(x.dim)}; {node.op} needs [N, C, *spatial] with 1 to 3 spatial dims", role=role
        )
    a: LrnAttributes = node.attributes  # type: ignore[assignment]
    if not MIN_N <= a.lrn_n <= MAX_N:
        fail_attribute(node, f"lrn_n {a.lrn_n} must be in [{MIN_N}, {MAX_N}] (cuDNN's bounds)")
    if a.lrn_k < MIN_K:
        fail_attribute(node, f"lrn_k {a.lrn_k} must be >= {MIN_K} (cuDNN's bound)")
    if a.lrn_beta < MIN_BETA:
        fail_attribute(node, f"lrn_beta {a.lrn_beta} must be >= {MIN_BETA} (cuDNN's bound)")
    return x


def _base(x: np.ndarray, a: LrnAttributes) -> np.ndarray:
    """s = k + alpha / n * (sum of x^2 over each element's channel window), the power's base."""
    return a.lrn_k + a.lrn_alpha / a.lrn_n * _window_sum(x * x, *window(a.lrn_n))


def _window_sum(values: np.ndarray, behind: int, ahead: int) -> np.ndarray:
    """The sum of ``values`` over channels c - behind .. c + ahead (clipped to the channels)."""
    padded = np.pad(values, [(0, 0), (behind, ahead), *[(0, 0)] * (values.ndim - 2)])
    return sum(padded[:, tap : tap + values.shape[1]] for tap in range(behind + ahead + 1))  # type: ignore[return-value]


@register
class Lrn(Op):
    """y = x / (k + alpha / n * sum over the window of x^2)^beta."""

    kind = "lrn"
    category = Category.NORMALIZATION
    inputs = (Role("input", floating=True),)
    outputs = (Role("y"),)
    attributes = LrnAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = _checked(node, "input")
        return {"y": Inferred(x.dim, stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: LrnAttributes = node.attributes  # type: ignore[assignment]
        return {"y": x["input"] * _base(x["input"], a) ** -a.lrn_beta}


@register
class LrnBackward(Op):
    """dx of ``lrn`` from dy and the forward's input x (cuDNN's backward also takes y; the
    base s is recomputed from x instead, so no division by y's values is needed):

    dx_i = dy_i * s_i^-beta - 2 alpha beta / n * x_i * sum over the channels c whose window
    holds i of dy_c * x_c * s_c^(-beta - 1).
    """

    kind = "lrn_backward"
    category = Category.NORMALIZATION
    inputs = (Role("dy", floating=True), Role("x", floating=True))
    outputs = (Role("dx"),)
    attributes = LrnAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        x = _checked(node, "x")
        dy = node.input("dy")
        assert dy is not None
        same_dims(node, "dy", dy, x.dim, "the dims of x")
        return {"dx": Inferred(x.dim, stride_order(x.dim, x.stride))}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: LrnAttributes = node.attributes  # type: ignore[assignment]
        data, dy = x["x"], x["dy"]
        s = _base(data, a)
        behind, ahead = window(a.lrn_n)
        # Channel i lies in the windows of channels i - ahead .. i + behind: the mirrored window.
        spread = _window_sum(dy * data * s ** (-a.lrn_beta - 1.0), ahead, behind)
        scale = 2.0 * a.lrn_alpha * a.lrn_beta / a.lrn_n
        return {"dx": dy * s**-a.lrn_beta - scale * data * spread}


class LrnMethods:
    _add_node: Callable[..., list[Any]]

    def lrn(
        self,
        input: TensorSpec,
        lrn_n: int = 5,
        lrn_alpha: float = 1e-4,
        lrn_beta: float = 0.75,
        lrn_k: float = 2.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """Cross-channel local response normalisation, as cudnnLRNCrossChannelForward with
        lrnN, lrnAlpha, lrnBeta, lrnK (cuDNN's defaults)."""
        attrs = {"lrn_n": lrn_n, "lrn_alpha": lrn_alpha, "lrn_beta": lrn_beta, "lrn_k": lrn_k}
        return self._add_node("lrn", {"input": input}, attrs, name=name, compute_data_type=compute_data_type)[0]

    def lrn_backward(
        self,
        dy: TensorSpec,
        x: TensorSpec,
        lrn_n: int = 5,
        lrn_alpha: float = 1e-4,
        lrn_beta: float = 0.75,
        lrn_k: float = 2.0,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> TensorSpec:
        """dx of ``lrn(x, ...)`` from dy, as cudnnLRNCrossChannelBackward (which also takes y)."""
        attrs = {"lrn_n": lrn_n, "lrn_alpha": lrn_alpha, "lrn_beta": lrn_beta, "lrn_k": lrn_k}
        return self._add_node(
            "lrn_backward", {"dy": dy, "x": x}, attrs, name=name, compute_data_type=compute_data_type
        )[0]
