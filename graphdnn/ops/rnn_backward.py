"""The gradients of a recurrent layer (cuDNN's ``cudnnRNNBackwardData_v8`` and
``cudnnRNNBackwardWeights_v8`` in one op): from the forward's inputs, the reserve that
``rnn_training`` left and the gradients of its outputs (dy, dhy, dcy), the gradients of its
inputs: dx, dhx, dcx and every weight's, in one flat tensor ``dweights`` (cuDNN's weight-space
gradient, PyTorch's ``_flat_weights`` flattened one after the other).

Backpropagation through time, step by step from each direction's last step, one layer at a
time from the top: the gradient reaching a step's state is the layer output's gradient plus
what the next step sends back through W_hh; each cell's backward turns it into the gradients
of the gate pre-activations (from the activated gates the reserve holds), which give the
weight gradients (summed over steps and sequences), the input's gradient (through W_ih, the
layer below's output gradient) and the previous state's. Past a sequence's length a step
passes the state's gradient through unchanged and contributes nothing, as PyTorch's packed
sequences do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..symbolic import Extent
from .attributes import Attributes
from .base import Inferred, Role, fail_attribute, register, same_dims
from .rnn import (
    LSTM_CELL_FIELD,
    RESERVE_FIELDS,
    Rnn,
    RnnAttributes,
    RnnMode,
    direction_weights,
    reserve_dims,
    sequence_lengths,
    weight_dims,
)

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


@register
class RnnBackward(Rnn):
    """dx [T, N, I], dhx and, for LSTM, dcx [L*D, N, H], and ``dweights`` (every weight's
    gradient flattened, in the weight list's order) of ``rnn_training`` with the same inputs,
    given ``reserve`` (its output) and the gradients dy, dhy, dcy of y, hy, cy (dhy, dcy zero
    when unbound). dy is ignored past a sequence's length, where y does not depend on anything."""

    kind = "rnn_backward"
    inputs = (
        *Rnn.inputs,
        Role("reserve", floating=True),
        Role("dy", floating=True),
        Role("dhy", optional=True, floating=True),
        Role("dcy", optional=True, floating=True),
    )
    outputs = (Role("dx"), Role("dhx"), Role("dcx"), Role("dweights"))

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        lstm = attributes.mode is RnnMode.LSTM  # type: ignore[attr-defined]
        return self.output_names if lstm else frozenset({"dx", "dhx", "dweights"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        forward = super().infer(node, declared)
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        x = node.input("x")
        reserve, dy = node.input("reserve"), node.input("dy")
        assert x is not None and reserve is not None and dy is not None
        steps, batch, width = x.dim
        same_dims(node, "reserve", reserve, reserve_dims(a, steps, batch), "rnn_training's reserve [L, T, N, D, R*H]")
        same_dims(node, "dy", dy, forward["y"].dim, "y's dims [T, N, directions * hidden_size]")
        for role, like in (("dhy", "hy"), ("dcy", "cy")):
            grad = node.input(role)
            if grad is not None:
                if like not in forward:
                    fail_attribute(node, f"{role} is the gradient of LSTM's final cell state; {a.mode.value} has none")
                same_dims(node, role, grad, forward[like].dim, "[layers * directions, N, hidden_size]")
        out = {
            "dx": Inferred((steps, batch, width)),
            "dhx": forward["hy"],
            "dweights": Inferred((weight_count(a, width),)),
        }
        return {**out, "dcx": forward["cy"]} if "cy" in forward else out

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        dx, dhx, dcx, dweights = backward(a, x, sequence_lengths(node, x))
        out = {"dx": dx, "dhx": dhx, "dweights": dweights}
        return {**out, "dcx": dcx} if a.mode is RnnMode.LSTM else out


def weight_count(a: RnnAttributes, input_size: Extent) -> Extent:
    """Elements of the whole weight list (the length of ``dweights``)."""
    total: Extent = 0
    for layer in range(a.num_layers):
        for dims in weight_dims(a, input_size, layer):
            size: Extent = 1
            for extent in dims:
                size = size * extent
            total = total + a.directions * size
    return total


def backward(
    a: RnnAttributes, x: Mapping[str, Any], lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """dx, dhx, dcx (zeros but for LSTM) and the flat dweights (see :class:`RnnBackward`)."""
    data, weights = x["x"], x["weights"]
    steps, batch, _ = data.shape
    hidden, fields, directions = a.hidden_size, RESERVE_FIELDS[a.mode], a.directions
    state = (a.num_layers * directions, batch, hidden)
    hx, cx = x.get("hx", np.zeros(state)), x.get("cx", np.zeros(state))
    dhy, dcy = x.get("dhy", np.zeros(state)), x.get("dcy", np.zeros(state))
    reserve = x["reserve"].reshape(a.num_layers, steps, batch, directions, fields, hidden)
    dweights = [np.zeros_like(w) for w in weights]
    dhx, dcx = np.zeros(state), np.zeros(state)
    grad = x["dy"]  # of the layer's output sequence
    for layer in reversed(range(a.num_layers)):
        inputs = data if layer == 0 else reserve[layer - 1, :, :, :, -1].reshape(steps, batch, -1)
        d_inputs = np.zeros(inputs.shape)
        for direction in range(directions):
            index = layer * directions + direction
            w_ih, w_hh, _, _ = direction_weights(a, weights, index)
            dw_ih, dw_hh, db_ih, db_hh = direction_weights(a, dweights, index)
            saved = reserve[layer, :, :, direction]  # [T, N, R, H]
            dh, dc = dhy[index], dcy[index]
            for t in range(steps - 1, -1, -1) if direction == 0 else range(steps):
                within = (t < lengths)[:, None]
                before = t - 1 if direction == 0 else t + 1  # the step that ran before t
                started = (before < lengths if direction else np.full(batch, before >= 0))[:, None]
                earlier = saved[min(max(before, 0), steps - 1)]
                h_prev = np.where(started, earlier[:, -1], hx[index])
                lstm = a.mode is RnnMode.LSTM
                c_prev = np.where(started, earlier[:, LSTM_CELL_FIELD], cx[index]) if lstm else cx[index]
                dh_step = dh + grad[t, :, direction * hidden : (direction + 1) * hidden]
                d_from_x, d_from_h, carry_h, carry_c = CELL_BACKWARD[a.mode](saved[t], dh_step, dc, h_prev, c_prev)
                d_from_x, d_from_h = np.where(within, d_from_x, 0.0), np.where(within, d_from_h, 0.0)
                dh = np.where(within, carry_h + d_from_h @ w_hh, dh)
                dc = np.where(within, carry_c, dc)
                dw_ih += d_from_x.T @ inputs[t]
                dw_hh += d_from_h.T @ h_prev
                db_ih += d_from_x.sum(0)
                db_hh += d_from_h.sum(0)
                d_inputs[t] += d_from_x @ w_ih
            dhx[index], dcx[index] = dh, dc
        grad = d_inputs
    return grad, dhx, dcx, np.concatenate([d.ravel() for d in dweights])


# One step's backward: (the step's reserve fields [N, R, H], the gradient of the state it
# left (dh) and of its cell (dc), the state before it) -> the gradients of W_ih x + b_ih and of
# W_hh h + b_hh [N, G*H], and the parts of dh_prev (besides through W_hh) and dc_prev.
CellBackward = Callable[
    [np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
]


def _relu_backward(saved: np.ndarray, dh: np.ndarray, dc: np.ndarray, h_prev: np.ndarray, c_prev: np.ndarray) -> Any:
    d_pre = dh * (saved[:, 0] > 0)
    return d_pre, d_pre, np.zeros_like(dh), dc


def _tanh_backward(saved: np.ndarray, dh: np.ndarray, dc: np.ndarray, h_prev: np.ndarray, c_prev: np.ndarray) -> Any:
    d_pre = dh * (1.0 - saved[:, 0] ** 2)
    return d_pre, d_pre, np.zeros_like(dh), dc


def _lstm_backward(saved: np.ndarray, dh: np.ndarray, dc: np.ndarray, h_prev: np.ndarray, c_prev: np.ndarray) -> Any:
    i, f, g, o, c = (saved[:, k] for k in range(5))
    tanh_c = np.tanh(c)
    dc = dc + dh * o * (1.0 - tanh_c**2)
    d_pre = np.concatenate(
        [dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g**2), dh * tanh_c * o * (1.0 - o)], -1
    )
    return d_pre, d_pre, np.zeros_like(dh), dc * f


def _gru_backward(saved: np.ndarray, dh: np.ndarray, dc: np.ndarray, h_prev: np.ndarray, c_prev: np.ndarray) -> Any:
    r, z, n, hn = (saved[:, k] for k in range(4))
    d_new = dh * (1.0 - z) * (1.0 - n**2)  # of W_in x + b_in + r * (W_hn h + b_hn)
    d_reset = d_new * hn * r * (1.0 - r)
    d_update = dh * (h_prev - n) * z * (1.0 - z)
    from_x = np.concatenate([d_reset, d_update, d_new], -1)
    from_h = np.concatenate([d_reset, d_update, d_new * r], -1)
    return from_x, from_h, dh * z, dc


CELL_BACKWARD: dict[RnnMode, CellBackward] = {
    RnnMode.RELU: _relu_backward,
    RnnMode.TANH: _tanh_backward,
    RnnMode.LSTM: _lstm_backward,
    RnnMode.GRU: _gru_backward,
}


class RnnBackwardMethods:
    _add_node: Callable[..., list[Any]]

    def rnn_backward(
        self,
        x: TensorSpec,
        weights: Sequence[TensorSpec],
        reserve: TensorSpec,
        dy: TensorSpec,
        mode: Any,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        hx: TensorSpec | None = None,
        cx: TensorSpec | None = None,
        seq_lengths: TensorSpec | None = None,
        dhy: TensorSpec | None = None,
        dcy: TensorSpec | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """[dx, dhx, dcx, dweights] (dcx None unless LSTM) of ``rnn_training`` with these
        inputs, from its ``reserve`` and the gradients dy, dhy, dcy of its outputs; dweights
        holds every weight's gradient flattened, in the weight list's order."""
        attrs = {"mode": mode, "hidden_size": hidden_size, "num_layers": num_layers, "bidirectional": bidirectional}
        bound = {"x": x, "weights": weights, "hx": hx, "cx": cx, "seq_lengths": seq_lengths}
        return self._add_node(
            "rnn_backward",
            {**bound, "reserve": reserve, "dy": dy, "dhy": dhy, "dcy": dcy},
            attrs,
            name=name,
            compute_data_type=compute_data_type,
        )
