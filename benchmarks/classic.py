"""Benchmark cases of the classic cuDNN operations (issue 13): LRN, the spatial transformer,
CTC loss and LSTM inference, each beside PyTorch, which calls cuDNN or its own CUDA kernels.

The LSTM case is smaller than the issue's target shape (2 layers, hidden 1024, batch 64, 512
steps), whose reference check takes minutes in NumPy; benchmarks/lstm_shapes.py times both
shapes beside torch.nn.LSTM with the outputs checked against torch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import graphdnn as gd

Tensors = dict[str, Any]


# -- LRN (AlexNet's first) -----------------------------------------------------------------------
def _lrn_graph(n: int, c: int, hw: int) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"lrn_{n}x{c}x{hw}", io_data_type="half")
        x = g.tensor(name="x", dim=[n, c, hw, hw])
        g.lrn(x, lrn_n=5, lrn_alpha=1e-4, lrn_beta=0.75, lrn_k=2.0).set_name("y").set_output(True)
        return g

    return build


def _lrn_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    return F.local_response_norm(t["x"], 5, alpha=1e-4, beta=0.75, k=2.0)  # odd n: cuDNN's window


# -- spatial transformer: grid generator + bilinear sampler -----------------------------------------
def _transformer_graph(n: int, c: int, hw: int, out: int) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"spatial_tf_{n}x{c}x{hw}", io_data_type="float")
        theta, x = g.tensor(name="theta", dim=[n, 2, 3]), g.tensor(name="x", dim=[n, c, hw, hw])
        grid = g.spatial_tf_grid_generator(theta, [out, out])
        g.spatial_tf_sampler(x, grid).set_name("y").set_output(True)
        return g

    return build


def _transformer_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    n, c = t["x"].shape[:2]
    out = _TRANSFORMER[3]
    grid = F.affine_grid(t["theta"], [n, c, out, out], align_corners=True)
    return F.grid_sample(t["x"], grid, mode="bilinear", padding_mode="zeros", align_corners=True)


# -- CTC loss, cost and gradient --------------------------------------------------------------------
def _ctc_graph(steps: int, batch: int, alphabet: int, width: int) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"ctc_{steps}x{batch}x{alphabet}", io_data_type="float")
        probs = g.tensor(name="probs", dim=[steps, batch, alphabet])
        labels = g.tensor(name="labels", dim=[batch, width], data_type="int32")
        label_lengths = g.tensor(name="label_lengths", dim=[batch], data_type="int32")
        input_lengths = g.tensor(name="input_lengths", dim=[batch], data_type="int32")
        loss, grad = g.ctc_loss(probs, labels, label_lengths, input_lengths)
        loss.set_name("loss").set_output(True)
        grad.set_name("grad").set_output(True)  # type: ignore[union-attr]
        return g

    return build


def _ctc_torch(t: Tensors) -> Any:
    """The per-sequence losses and their gradient by the activations, as graphdnn's op gives them."""
    import torch
    import torch.nn.functional as F

    x = t["probs"].detach().requires_grad_()
    lengths = (t["input_lengths"].long(), t["label_lengths"].long())
    loss = F.ctc_loss(x.log_softmax(-1), t["labels"].long(), *lengths, reduction="none", zero_infinity=True)
    return loss, torch.autograd.grad(loss.sum(), x)[0]


# -- LSTM inference ---------------------------------------------------------------------------------
def _lstm_weight_dims(inputs: int, hidden: int, layers: int) -> list[tuple[str, list[int]]]:
    dims = []
    for layer in range(layers):
        width = inputs if layer == 0 else hidden
        for name, shape in (("w_ih", [4 * hidden, width]), ("w_hh", [4 * hidden, hidden])):
            dims.append((f"{name}_{layer}", shape))
        dims += [(f"b_ih_{layer}", [4 * hidden]), (f"b_hh_{layer}", [4 * hidden])]
    return dims


def _lstm_graph(steps: int, batch: int, hidden: int, layers: int) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"lstm_{layers}x{hidden}_n{batch}_t{steps}", io_data_type="half")
        x = g.tensor(name="x", dim=[steps, batch, hidden])
        weights = [g.tensor(name=name, dim=dims) for name, dims in _lstm_weight_dims(hidden, hidden, layers)]
        y, _, _ = g.rnn(x, weights, "lstm", hidden, num_layers=layers)
        y.set_name("y").set_output(True)  # type: ignore[union-attr]
        return g

    return build


def _lstm_torch(t: Tensors) -> Any:
    """torch.nn.LSTM's own call (cuDNN's RNN on the GPU) with the graph's weights."""
    import torch

    batch, hidden = t["x"].shape[1:]
    layers = _LSTM[3]
    weights = [t[name] for name, _ in _lstm_weight_dims(hidden, hidden, layers)]
    state = torch.zeros(layers, batch, hidden, device=t["x"].device, dtype=t["x"].dtype)
    return torch._VF.lstm(t["x"], (state, state), weights, True, layers, 0.0, False, False, False)[0]


_TRANSFORMER = (32, 64, 64, 56)  # N, C, input extent, output extent
_CTC = (400, 32, 29, 80)  # steps, batch, alphabet, label width: character-level speech
_LSTM = (64, 32, 256, 2)  # steps, batch, hidden, layers


def classic_cases(case: Callable[..., Any]) -> list[Any]:
    """The cases, made with ``case`` (benchmarks.cases.Case)."""
    n, c, hw = 32, 96, 55
    steps, batch, alphabet, width = _CTC
    return [
        case(
            f"lrn n{n} c{c} {hw}²",
            _lrn_graph(n, c, hw),
            _lrn_torch,
            bytes=2 * 2 * n * c * hw * hw,
            target="faster than eager",
            group="classic",
        ),
        case(
            f"spatial transformer n{_TRANSFORMER[0]} c{_TRANSFORMER[1]} {_TRANSFORMER[2]}² -> {_TRANSFORMER[3]}²",
            _transformer_graph(*_TRANSFORMER),
            _transformer_torch,
            bytes=4 * _TRANSFORMER[0] * _TRANSFORMER[1] * (_TRANSFORMER[2] ** 2 + _TRANSFORMER[3] ** 2),
            target="faster than eager",
            group="classic",
        ),
        case(
            f"ctc loss + gradient t{steps} n{batch} a{alphabet} s{width}",
            _ctc_graph(*_CTC),
            _ctc_torch,
            bytes=2 * 4 * steps * batch * alphabet,
            target="≥ 0.8x torch ctc_loss",
            group="classic",
            # 400 float log-space alpha / beta steps: 1.8e-4 from the float64 reference on an H100
            # (tests/test_codegen_direct.py, GPU_TOLERANCES, says why)
            extra={"tolerance": 5e-4},
        ),
        case(
            f"lstm inference {_LSTM[3]}x{_LSTM[2]} n{_LSTM[1]} t{_LSTM[0]}",
            _lstm_graph(*_LSTM),
            _lstm_torch,
            bytes=2 * (_LSTM[0] * _LSTM[1] * _LSTM[2] * 2 + _LSTM[3] * 8 * _LSTM[2] ** 2),
            flops=2 * _LSTM[0] * _LSTM[1] * _LSTM[3] * 8 * _LSTM[2] ** 2,
            target="≥ 0.8x cuDNN (the issue: at 2x1024 n64 t512, benchmarks/lstm_shapes.py)",
            group="classic",
        ),
    ]
