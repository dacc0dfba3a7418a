"""CTC loss (cuDNN's ``cudnnCTCLoss``): the per-sequence connectionist temporal classification
cost and its gradient, blank label 0.

The gradient is with respect to the activations *before* a softmax over the alphabet, as
cuDNN returns it in both of its normalization modes: with ``softmax`` (cuDNN's
``CUDNN_LOSS_NORMALIZATION_SOFTMAX``, what PyTorch's cuDNN path uses) the input is those
activations (logits, or log-probabilities: a softmax gives the same probabilities) and the
op applies the softmax; with ``none`` the input is already probabilities (softmax output),
so the gradient skips the softmax that produced them, cuDNN's documented inconsistency.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..layout import stride_order
from ..symbolic import Extent
from .attributes import Attributes
from .base import Category, Inferred, Op, Role, fail, index_tensor, indices_in_range, register

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec

BLANK = 0


class CtcNormalization(enum.Enum):
    SOFTMAX = "softmax"  # the input is pre-softmax activations: log p = log_softmax(input)
    NONE = "none"  # the input is probabilities: log p = log(input)


@dataclasses.dataclass(frozen=True)
class CtcAttributes(Attributes):
    normalization: CtcNormalization = CtcNormalization.SOFTMAX


@register
class CtcLoss(Op):
    """loss[n] = -log p(labels[n, :label_lengths[n]] | the first input_lengths[n] steps of
    sequence n); grad[t, n, a] = softmax(input)[t, n, a] - (the posterior that step t emits a),
    0 past the sequence's input length and for sequences no alignment fits (loss +inf)."""

    kind = "ctc_loss"
    category = Category.REDUCTION
    inputs = (Role("probs", floating=True, positive=True), Role("labels"), Role("label_lengths"), Role("input_lengths"))
    outputs = (Role("loss"), Role("grad"))
    attributes = CtcAttributes

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        probs = node.input("probs")
        assert probs is not None
        if len(probs.dim) != 3:
            fail(
                node,
                f"probs has dims {list(probs.dim)}; ctc_loss needs [T, N, A] (steps, batch, alphabet)",
                role="probs",
            )
        batch, alphabet = probs.dim[1:]
        if alphabet == 1:
            fail(node, "probs has an alphabet of 1: the blank (label 0) alone, no label to read", role="probs")
        labels = index_tensor(node, "labels")
        if len(labels.dim) != 2 or labels.dim[0] != batch:
            fail(node, f"labels has dims {list(labels.dim)}, expected [{batch}, S] (padded label rows)", role="labels")
        for role in ("label_lengths", "input_lengths"):
            lengths = index_tensor(node, role)
            if tuple(lengths.dim) != (batch,):
                fail(node, f"{role} has dims {list(lengths.dim)}, expected [{batch}]", role=role)
        return {"loss": Inferred((batch,)), "grad": Inferred(probs.dim, stride_order(probs.dim, probs.stride))}

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        probs, labels = node.input("probs"), node.input("labels")
        assert probs is not None and labels is not None
        steps, _, alphabet = probs.static_dim
        return {
            "labels": (1, alphabet - 1),
            "label_lengths": (0, labels.static_dim[1]),
            "input_lengths": (1, steps),
        }.get(role)

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: CtcAttributes = node.attributes  # type: ignore[assignment]
        probs = x["probs"]
        steps, batch, alphabet = probs.shape
        with np.errstate(divide="ignore", invalid="ignore"):
            if a.normalization is CtcNormalization.SOFTMAX:
                top = np.max(probs, axis=-1, keepdims=True)
                log_p = probs - top - np.log(np.sum(np.exp(probs - top), axis=-1, keepdims=True))
            else:
                log_p = np.log(probs)
        labels = indices_in_range(node, "labels", x["labels"], alphabet, "labels (0 is the blank)")
        label_lengths = indices_in_range(
            node, "label_lengths", x["label_lengths"], labels.shape[1] + 1, "label lengths"
        )
        input_lengths = indices_in_range(node, "input_lengths", x["input_lengths"], steps + 1, "input lengths")
        loss, grad = np.zeros(batch), np.zeros_like(probs)
        for n in range(batch):
            length, count = int(input_lengths[n]), int(label_lengths[n])
            if length == 0:
                fail(node, f"input_lengths[{n}] is 0; every sequence needs at least one step", role="input_lengths")
            if np.any(labels[n, :count] == BLANK):
                fail(node, f"labels of sequence {n} hold the blank (0) within its length", role="labels")
            loss[n], grad[:length, n] = _sequence(log_p[:length, n], labels[n, :count])
        return {"loss": loss, "grad": grad}


def _sequence(log_p: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(-log p, gradient) of one sequence: log_p [T, A], labels [L]."""
    extended = np.zeros(2 * len(labels) + 1, dtype=np.int64)
    extended[1::2] = labels
    states = len(extended)
    # A state may be entered from two back when it is a label different from the one two back.
    skip = np.zeros(states, dtype=bool)
    skip[2:] = (extended[2:] != BLANK) & (extended[2:] != extended[:-2])
    emit = log_p[:, extended]  # [T, states]
    steps = len(log_p)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.full((steps, states), -np.inf)
        alpha[0, : min(2, states)] = emit[0, : min(2, states)]
        for t in range(1, steps):
            alpha[t] = _from_neighbours(alpha[t - 1], skip, forward=True) + emit[t]
        beta = np.full((steps, states), -np.inf)  # without the emission at t
        beta[-1, max(0, states - 2) :] = 0.0
        for t in range(steps - 2, -1, -1):
            beta[t] = _from_neighbours(beta[t + 1] + emit[t + 1], skip, forward=False)
        log_likelihood = np.logaddexp.reduce(alpha[-1, max(0, states - 2) :])
        if not np.isfinite(log_likelihood):
            return float(-log_likelihood), np.zeros_like(log_p)
        posterior = np.zeros_like(log_p)
        np.add.at(posterior.T, extended, np.exp(alpha + beta - log_likelihood).T)  # by state's entry
        return float(-log_likelihood), np.exp(log_p) - posterior


def _from_neighbours(values: np.ndarray, skip: np.ndarray, *, forward: bool) -> np.ndarray:
    """log-sum-exp of each state's predecessors (forward: s, s-1, s-2 where skip[s]) or
    successors (s, s+1, s+2 where skip[s+2]) in ``values``."""
    one, two = np.full_like(values, -np.inf), np.full_like(values, -np.inf)
    if forward:
        one[1:], two[2:] = values[:-1], np.where(skip[2:], values[:-2], -np.inf)
    else:
        one[:-1], two[:-2] = values[1:], np.where(skip[2:], values[2:], -np.inf)
    return np.logaddexp(np.logaddexp(values, one), two)


class CtcMethods:
    _add_node: Callable[..., list[Any]]

    def ctc_loss(
        self,
        probs: TensorSpec,
        labels: TensorSpec,
        label_lengths: TensorSpec,
        input_lengths: TensorSpec,
        normalization: Any = CtcNormalization.SOFTMAX,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec]:
        """[loss, grad] of CTC over ``probs`` [T, N, A] and padded ``labels`` [N, S] (blank 0),
        as cudnnCTCLoss returns its costs and gradients."""
        return self._add_node(
            "ctc_loss",
            {"probs": probs, "labels": labels, "label_lengths": label_lengths, "input_lengths": input_lengths},
            {"normalization": normalization},
            name=name,
            compute_data_type=compute_data_type,
        )
