"""Recurrent layers (cuDNN's ``cudnnRNNForward`` in inference): RNN with ReLU or tanh, LSTM and
GRU, stacked and optionally bidirectional.

The data are sequence-major, ``x [T, N, I]`` (cuDNN's padded layout, PyTorch's default); a
sequence runs all T steps, or its own length from ``seq_lengths``. The weights are
PyTorch's list, in ``torch.nn.LSTM``'s order (``_flat_weights``): for each layer, for each
direction (forward then reverse), ``w_ih [G*H, in]``, ``w_hh [G*H, H]``, ``b_ih [G*H]``, ``b_hh [G*H]``, with
``in`` = I for layer 0 and D*H above, and the gates in cuDNN's and PyTorch's order (LSTM:
input, forget, cell, output; GRU: reset, update, new). The formulas are PyTorch's (which
calls cuDNN for them), including GRU's ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..dtypes import DataType
from ..symbolic import Extent
from .attributes import Attributes
from .base import (
    Category,
    Inferred,
    Op,
    Role,
    fail,
    fail_attribute,
    index_tensor,
    indices_in_range,
    register,
    same_dims,
)

if TYPE_CHECKING:
    from ..ir import Node
    from ..tensor import TensorSpec


class RnnMode(enum.Enum):
    RELU = "relu"  # CUDNN_RNN_RELU
    TANH = "tanh"  # CUDNN_RNN_TANH
    LSTM = "lstm"  # CUDNN_LSTM
    GRU = "gru"  # CUDNN_GRU


GATES = {RnnMode.RELU: 1, RnnMode.TANH: 1, RnnMode.LSTM: 4, RnnMode.GRU: 3}
WEIGHTS_PER_DIRECTION = 4  # w_ih, w_hh, b_ih, b_hh


@dataclasses.dataclass(frozen=True)
class RnnAttributes(Attributes):
    mode: RnnMode
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1


def weight_dims(a: RnnAttributes, input_size: Extent, layer: int) -> list[tuple[Extent, ...]]:
    """The dims of one direction's w_ih, w_hh, b_ih, b_hh in ``layer``."""
    rows = GATES[a.mode] * a.hidden_size
    width = input_size if layer == 0 else a.directions * a.hidden_size
    return [(rows, width), (rows, a.hidden_size), (rows,), (rows,)]


@register
class Rnn(Op):
    """y [T, N, D*H] (the last layer's hidden states, the directions side by side), hy and,
    for LSTM, cy [L*D, N, H] (the final states, layer-major), from x and the optional initial
    states hx, cx (zeros when unbound). With ``seq_lengths`` [N], sequence n has that many
    steps (PyTorch's packed sequences): the reverse direction starts at its last step, y is
    0 past it, and hy, cy are the states at the end of the steps it has."""

    kind = "rnn"
    category = Category.MATMUL
    inputs: ClassVar[tuple[Role, ...]] = (
        Role("x", floating=True),
        Role("weights", variadic=True, floating=True),
        Role("hx", optional=True, floating=True),
        Role("cx", optional=True, floating=True),
        Role("seq_lengths", optional=True),
    )
    outputs: ClassVar[tuple[Role, ...]] = (Role("y"), Role("hy"), Role("cy"))
    attributes = RnnAttributes

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        lstm = attributes.mode is RnnMode.LSTM  # type: ignore[attr-defined]
        return self.output_names if lstm else frozenset({"y", "hy"})

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        if a.hidden_size < 1 or a.num_layers < 1:
            fail_attribute(node, f"hidden_size {a.hidden_size} and num_layers {a.num_layers} must be >= 1")
        x = node.input("x")
        assert x is not None
        if len(x.dim) != 3:
            fail(node, f"x has dims {list(x.dim)}; rnn needs [T, N, I] (sequence-major)", role="x")
        steps, batch, width = x.dim
        weights = node.inputs_of("weights")
        expected = a.num_layers * a.directions * WEIGHTS_PER_DIRECTION
        if len(weights) != expected:
            fail(
                node,
                f"weights has {len(weights)} tensors; {a.num_layers} layers x {a.directions} directions need "
                f"{expected} (w_ih, w_hh, b_ih, b_hh each)",
            )
        names = ("w_ih", "w_hh", "b_ih", "b_hh")
        for index, tensor in enumerate(weights):
            layer, rest = divmod(index, a.directions * WEIGHTS_PER_DIRECTION)
            direction, which = divmod(rest, WEIGHTS_PER_DIRECTION)
            dims = weight_dims(a, width, layer)[which]
            if tuple(tensor.dim) != dims:
                fail(
                    node,
                    f"weights[{index}] '{tensor.name}' ({names[which]} of layer {layer}, direction {direction}) "
                    f"has dims {list(tensor.dim)}, expected {list(dims)}",
                )
        state = (a.num_layers * a.directions, batch, a.hidden_size)
        for role in ("hx", "cx"):
            initial = node.input(role)
            if initial is not None:
                if role == "cx" and a.mode is not RnnMode.LSTM:
                    fail_attribute(node, f"cx is LSTM's cell state; {a.mode.value} has none")
                same_dims(node, role, initial, state, "[layers * directions, N, hidden_size]")
        if node.input("seq_lengths") is not None:
            lengths = index_tensor(node, "seq_lengths")
            same_dims(node, "seq_lengths", lengths, (batch,), "one length per sequence")
        out = {"y": Inferred((steps, batch, a.directions * a.hidden_size)), "hy": Inferred(state)}
        return {**out, "cy": Inferred(state)} if a.mode is RnnMode.LSTM else out

    def value_range(self, node: Node, role: str) -> tuple[int, int] | None:
        x = node.input("x")
        assert x is not None
        return (0, x.static_dim[0]) if role == "seq_lengths" else None

    def value_scale(self, node: Node, role: str) -> float | None:
        """Weights of PyTorch's initial spread (1 / sqrt(H)): unit weights make the state chaotic."""
        return node.attributes.hidden_size**-0.5 if role == "weights" else None  # type: ignore[attr-defined]

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        y, hy, cy, _ = forward(a, x, sequence_lengths(node, x))
        result = {"y": y, "hy": hy}
        return {**result, "cy": cy} if a.mode is RnnMode.LSTM else result


@register
class RnnTraining(Rnn):
    """The forward pass in training (cuDNN's ``cudnnRNNForward`` with CUDNN_FWD_MODE_TRAINING):
    rnn's outputs and ``reserve``, what ``rnn_backward`` needs of the forward pass (cuDNN's
    reserve space), float32 unless set to double, half or bfloat16. Its layout, [L, T, N, D, R*H]: for each
    layer, step, sequence and direction, R fields of H values, the step's activated gates and
    what the gradient needs besides: RNN h (R 1); LSTM i, f, g, o, c, h (R 6); GRU r, z, n,
    W_hn h_{t-1} + b_hn, h (R 5). The last field is always h, so a layer's input to the
    next is its h fields side by side; every field is 0 past a sequence's length."""

    kind = "rnn_training"
    outputs = (*Rnn.outputs, Role("reserve"))

    def present_outputs(self, attributes: Attributes, bound_inputs: frozenset[str]) -> frozenset[str]:
        return super().present_outputs(attributes, bound_inputs) | {"reserve"}

    def infer(self, node: Node, declared: Mapping[str, tuple[Extent, ...] | None]) -> dict[str, Inferred]:
        out = super().infer(node, declared)
        steps, batch = out["y"].dim[:2]
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        reserve = Inferred(reserve_dims(a, steps, batch), data_type=DataType.FLOAT, allowed=RESERVE_TYPES)
        return {**out, "reserve": reserve}

    def reference(self, node: Node, x: Mapping[str, Any]) -> dict[str, np.ndarray]:
        a: RnnAttributes = node.attributes  # type: ignore[assignment]
        y, hy, cy, reserve = forward(a, x, sequence_lengths(node, x))
        result = {"y": y, "hy": hy, "reserve": reserve}
        return {**result, "cy": cy} if a.mode is RnnMode.LSTM else result


# What rnn_training's reserve may be stored in besides float32 (cuDNN keeps it in the data type).
RESERVE_TYPES = frozenset({DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16})

# The fields of one step and unit in rnn_training's reserve, h (the state it leaves) last.
RESERVE_FIELDS = {RnnMode.RELU: 1, RnnMode.TANH: 1, RnnMode.LSTM: 6, RnnMode.GRU: 5}
LSTM_CELL_FIELD = 4  # c, after the gates i, f, g, o


def reserve_dims(a: RnnAttributes, steps: Extent, batch: Extent) -> tuple[Extent, ...]:
    """rnn_training's reserve: [L, T, N, D, R*H] (RnnTraining says what the fields are)."""
    return (a.num_layers, steps, batch, a.directions, RESERVE_FIELDS[a.mode] * a.hidden_size)


def sequence_lengths(node: Node, x: Mapping[str, Any]) -> np.ndarray:
    """Each sequence's length: seq_lengths, checked to lie in [0, T], or T for all."""
    steps, batch, _ = x["x"].shape
    if "seq_lengths" not in x:
        return np.full(batch, steps)
    return indices_in_range(node, "seq_lengths", x["seq_lengths"], steps + 1, "sequence lengths")


def direction_weights(a: RnnAttributes, weights: Sequence[np.ndarray], index: int) -> Sequence[np.ndarray]:
    """w_ih, w_hh, b_ih, b_hh of layer-direction ``index`` (layer * D + direction)."""
    first = index * WEIGHTS_PER_DIRECTION
    return weights[first : first + WEIGHTS_PER_DIRECTION]


def forward(
    a: RnnAttributes, x: Mapping[str, Any], lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """y, hy, cy (zeros but for LSTM) and the reserve of the forward pass over x's inputs."""
    data, weights = x["x"], x["weights"]
    steps, batch, _ = data.shape
    state = (a.num_layers * a.directions, batch, a.hidden_size)
    hx, cx = x.get("hx", np.zeros(state)), x.get("cx", np.zeros(state))
    hy, cy = np.zeros(state), np.zeros(state)
    fields = RESERVE_FIELDS[a.mode]
    reserve = np.zeros((a.num_layers, steps, batch, a.directions, fields, a.hidden_size))
    for layer in range(a.num_layers):
        for direction in range(a.directions):
            index = layer * a.directions + direction
            w_ih, w_hh, b_ih, b_hh = direction_weights(a, weights, index)
            h, c = hx[index], cx[index]
            for t in range(steps) if direction == 0 else range(steps - 1, -1, -1):
                h_next, c_next, gates = _cell(a.mode, data[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh, h, c)
                within = (t < lengths)[:, None]  # a sequence's state stays put past its length
                h, c = np.where(within, h_next, h), np.where(within, c_next, c)
                reserve[layer, t, :, direction] = np.where(within[:, :, None], np.stack([*gates, h_next], 1), 0.0)
            hy[index], cy[index] = h, c
        data = reserve[layer, :, :, :, -1].reshape(steps, batch, -1)  # the directions' h side by side
    return data, hy, cy, reserve.reshape(reserve_dims(a, steps, batch))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _cell(
    mode: RnnMode, from_x: np.ndarray, from_h: np.ndarray, h: np.ndarray, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(h', c', the reserve fields before h') of one step from the two projections
    W_ih x + b_ih and W_hh h + b_hh."""
    if mode is RnnMode.RELU:
        return np.maximum(from_x + from_h, 0.0), c, []
    if mode is RnnMode.TANH:
        return np.tanh(from_x + from_h), c, []
    if mode is RnnMode.LSTM:
        i, f, g, o = np.split(from_x + from_h, 4, axis=-1)
        i, f, g, o = _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)
        c = f * c + i * g
        return o * np.tanh(c), c, [i, f, g, o, c]
    xr, xz, xn = np.split(from_x, 3, axis=-1)
    hr, hz, hn = np.split(from_h, 3, axis=-1)
    r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h, c, [r, z, n, hn]


class RnnMethods:
    _add_node: Callable[..., list[Any]]

    def rnn(
        self,
        x: TensorSpec,
        weights: Sequence[TensorSpec],
        mode: Any,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        hx: TensorSpec | None = None,
        cx: TensorSpec | None = None,
        seq_lengths: TensorSpec | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """[y, hy, cy] (cy None unless LSTM) of a stacked RNN / LSTM / GRU over x [T, N, I] in
        inference, with PyTorch's weight list (``torch.nn.LSTM(...)._flat_weights``) and,
        optionally, each sequence's length."""
        return self._recurrent("rnn", locals())

    def rnn_training(
        self,
        x: TensorSpec,
        weights: Sequence[TensorSpec],
        mode: Any,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = False,
        hx: TensorSpec | None = None,
        cx: TensorSpec | None = None,
        seq_lengths: TensorSpec | None = None,
        compute_data_type: Any = None,
        name: str | None = None,
    ) -> list[TensorSpec | None]:
        """[y, hy, cy, reserve]: :meth:`rnn`'s outputs and the reserve that ``rnn_backward``
        takes (float32 unless set to double, half or bfloat16; its layout in docs/ops.md)."""
        return self._recurrent("rnn_training", locals())

    def _recurrent(self, kind: str, arguments: Mapping[str, Any]) -> list[TensorSpec | None]:
        """An rnn or rnn_training node from its builder's arguments."""
        attrs = {key: arguments[key] for key in ("mode", "hidden_size", "num_layers", "bidirectional")}
        return self._add_node(
            kind,
            {key: arguments[key] for key in ("x", "weights", "hx", "cx", "seq_lengths")},
            attrs,
            name=arguments["name"],
            compute_data_type=arguments["compute_data_type"],
        )
