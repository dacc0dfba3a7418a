"""rnn_training and rnn_backward: reference semantics against torch.autograd through torch.nn.RNN /
LSTM / GRU (same weights, packed sequences for lengths) and against central finite differences
of the reference forward; the reserve's layout; shapes, errors, JSON."""

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.signature import signature
from tests.test_ops_rnn import new_graph, torch_module, weights_for

torch = pytest.importorskip("torch")

FIELDS = {"relu": 1, "tanh": 1, "lstm": 6, "gru": 5}


def training(mode, inputs, hidden, layers, bidirectional, feeds):
    """Forward (training) then backward of the graph's rnn, on the reference: the name of every
    output, by role, and their values."""
    g = new_graph()
    t = {name: g.tensor_like(value, name=name) for name, value in feeds.items()}
    weights = [t[name] for name in sorted((n for n in feeds if n.startswith("w")), key=lambda n: int(n[1:]))]
    common = {"hx": t.get("hx"), "cx": t.get("cx"), "seq_lengths": t.get("seq_lengths")}
    y, hy, cy, reserve = g.rnn_training(t["x"], weights, mode, hidden, layers, bidirectional, **common)
    reserve.set_data_type("double")
    grads = g.rnn_backward(
        t["x"],
        weights,
        reserve,
        t["dy"],
        mode,
        hidden,
        layers,
        bidirectional,
        dhy=t.get("dhy"),
        dcy=t.get("dcy"),
        **common,
    )
    named = dict(zip(("y", "hy", "cy", "reserve", "dx", "dhx", "dcx", "dweights"), (y, hy, cy, reserve, *grads)))
    for tensor in named.values():
        if tensor is not None:
            tensor.set_output(True)
    values = reference.execute(g, feeds)
    return {role: values[tensor.name] for role, tensor in named.items() if tensor is not None}


def random_case(rng, mode, inputs, hidden, layers, bidirectional, steps, batch, lengths=None, module=None):
    """Feeds for :func:`training` (weights from ``module`` or PyTorch's initialisation)."""
    module = module or torch_module(mode, inputs, hidden, layers, bidirectional)
    state = (layers * (2 if bidirectional else 1), batch, hidden)
    feeds = {
        "x": rng.standard_normal((steps, batch, inputs)),
        "hx": rng.standard_normal(state),
        "dy": rng.standard_normal((steps, batch, state[0] // layers * hidden)),
        "dhy": rng.standard_normal(state),
        **{f"w{i}": w.detach().numpy() for i, w in enumerate(module._flat_weights)},
    }
    if mode == "lstm":
        feeds.update(cx=rng.standard_normal(state), dcy=rng.standard_normal(state))
    if lengths is not None:
        feeds["seq_lengths"] = np.asarray(lengths, dtype=np.int32)
    return module, feeds


@pytest.mark.parametrize("mode", ["relu", "tanh", "lstm", "gru"])
@pytest.mark.parametrize(
    ("layers", "bidirectional", "lengths"),
    [(1, False, None), (2, True, None), (3, False, [6, 2, 5]), (2, True, [1, 6, 3])],
)
def test_gradients_match_torch_autograd(mode, layers, bidirectional, lengths, rng):
    module, feeds = random_case(rng, mode, 5, 4, layers, bidirectional, 6, 3, lengths)
    got = training(mode, 5, 4, layers, bidirectional, feeds)
    lstm = mode == "lstm"
    x, hx, cx = (torch.tensor(feeds[name], requires_grad=True) for name in ("x", "hx", "cx" if lstm else "hx"))
    data = x
    if lengths is not None:
        data = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    y, final = module(data, (hx, cx) if lstm else hx)
    if lengths is not None:
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=6)
    finals = final if lstm else (final,)
    loss = sum((out * torch.tensor(feeds[grad])).sum() for out, grad in zip((y, *finals), ("dy", "dhy", "dcy")))
    wanted = [x, hx, *([cx] if lstm else []), *module._flat_weights]
    grads = [g.numpy() for g in torch.autograd.grad(loss, wanted)]
    np.testing.assert_allclose(got["y"], y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got["dx"], grads[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["dhx"], grads[1], rtol=1e-10, atol=1e-12)
    if lstm:
        np.testing.assert_allclose(got["dcx"], grads[2], rtol=1e-10, atol=1e-12)
    flat = np.concatenate([g.ravel() for g in grads[3 if lstm else 2 :]])
    np.testing.assert_allclose(got["dweights"], flat, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["tanh", "lstm", "gru"])
def test_gradients_match_central_differences(mode, rng):
    """d(sum of y dy + hy dhy (+ cy dcy)) / d(input), by central differences of the reference
    forward, for a sample of every input's elements (two layers, both directions, lengths)."""
    _, feeds = random_case(rng, mode, 3, 2, 2, True, 4, 2, [4, 2])
    got = training(mode, 3, 2, 2, True, feeds)
    lstm = mode == "lstm"

    def loss(values):
        out = training(mode, 3, 2, 2, True, values)
        pairs = [("y", "dy"), ("hy", "dhy"), *([("cy", "dcy")] if lstm else [])]
        return sum(float((out[o] * values[g]).sum()) for o, g in pairs)

    step = 1e-6
    weights = [name for name in feeds if name.startswith("w")]
    offsets = np.cumsum([0] + [feeds[w].size for w in weights])
    checks = [("x", "dx", 0), ("hx", "dhx", 0), *([("cx", "dcx", 0)] if lstm else [])]
    checks += [(w, "dweights", int(offset)) for w, offset in zip(weights, offsets)]
    for name, grad, offset in checks:
        for flat in rng.choice(feeds[name].size, size=min(4, feeds[name].size), replace=False):
            up, down = dict(feeds), dict(feeds)
            up[name], down[name] = feeds[name].copy(), feeds[name].copy()
            up[name].flat[flat] += step
            down[name].flat[flat] -= step
            numeric = (loss(up) - loss(down)) / (2 * step)
            assert got[grad].flat[offset + flat] == pytest.approx(numeric, rel=1e-6, abs=1e-8), (name, flat)


def test_reserve_layout(rng):
    """[L, T, N, D, R*H]: LSTM's i, f, g, o, c, h per unit; h is y, 0 past a sequence's length."""
    _, feeds = random_case(rng, "lstm", 3, 2, 2, True, 4, 2, [4, 1])
    got = training("lstm", 3, 2, 2, True, feeds)
    reserve = got["reserve"].reshape(2, 4, 2, 2, 6, 2)
    assert got["reserve"].shape == (2, 4, 2, 2, 12)
    np.testing.assert_array_equal(reserve[1, :, :, :, 5].reshape(4, 2, 4), got["y"])
    assert not reserve[:, 1:, 1].any()  # sequence 1 has one step
    gates = reserve[:, :1, :, :, :4]
    assert ((gates[..., [0, 1, 3], :] > 0) & (gates[..., [0, 1, 3], :] < 1)).all()  # sigmoids
    np.testing.assert_allclose(reserve[..., 5, :], reserve[..., 3, :] * np.tanh(reserve[..., 4, :]))


def test_unbound_gradients_and_states_are_zeros(rng):
    module, feeds = random_case(rng, "gru", 3, 2, 1, False, 4, 2)
    del feeds["hx"], feeds["dhy"]
    got = training("gru", 3, 2, 1, False, feeds)
    x = torch.tensor(feeds["x"], requires_grad=True)
    y, _ = module(x)
    grads = torch.autograd.grad(y, [x, *module._flat_weights], torch.tensor(feeds["dy"]))
    np.testing.assert_allclose(got["dx"], grads[0].numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["dweights"], np.concatenate([g.numpy().ravel() for g in grads[1:]]), rtol=1e-10)
    assert "dcx" not in got


def test_dims():
    g = new_graph()
    weights = weights_for(g, "gru", 5, 4, 2, True)
    x = g.tensor([7, 3, 5])
    y, hy, cy, reserve = g.rnn_training(x, weights, "gru", 4, 2, True)
    assert reserve.dim == (2, 7, 3, 2, 20) and cy is None and reserve.data_type is gd.DataType.FLOAT
    dx, dhx, dcx, dweights = g.rnn_backward(x, weights, reserve, y, "gru", 4, 2, True, dhy=hy)
    sizes = sum(int(np.prod(w.dim)) for w in weights)
    assert dx.dim == (7, 3, 5) and dhx.dim == (4, 3, 4) and dcx is None and dweights.dim == (sizes,)


def backward(g, reserve_dims=(1, 7, 3, 1, 24), dy_dims=(7, 3, 4), mode="lstm", **kw):
    weights = weights_for(g, "lstm", 5, 4, 1, False)
    reserve, dy = g.tensor(list(reserve_dims), name="reserve"), g.tensor(list(dy_dims), name="dy")
    return g.rnn_backward(g.tensor([7, 3, 5]), weights, reserve, dy, mode, 4, name="n", **kw)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda g: backward(g, reserve_dims=(1, 7, 3, 1, 16)),
            gd.ShapeError,
            r"reserve has dims \[1, 7, 3, 1, 16\], expected \[1, 7, 3, 1, 24\] \(rnn_training's reserve",
        ),
        (lambda g: backward(g, dy_dims=(7, 3, 8)), gd.ShapeError, r"dy has dims \[7, 3, 8\], expected \[7, 3, 4\]"),
        (
            lambda g: backward(g, dhy=g.tensor([2, 3, 4])),
            gd.ShapeError,
            r"dhy has dims \[2, 3, 4\], expected \[1, 3, 4\]",
        ),
        (
            lambda g: backward(g, mode="gru", dcy=g.tensor([1, 3, 4])),
            gd.ShapeError,
            r"weights\[0\] 'w0' \(w_ih of layer 0, direction 0\) has dims \[16, 5\], expected \[12, 5\]",
        ),
        (
            lambda g: g.rnn_backward(
                g.tensor([7, 3, 5]),
                weights_for(g, "gru", 5, 4, 1, False),
                g.tensor([1, 7, 3, 1, 20]),
                g.tensor([7, 3, 4]),
                "gru",
                4,
                dcy=g.tensor([1, 3, 4]),
                name="n",
            ),
            gd.AttributeValueError,
            "dcy is the gradient of LSTM's final cell state; gru has none",
        ),
        (
            lambda g: g.rnn_training(g.tensor([7, 3]), weights_for(g, "lstm", 5, 4, 1, False), "lstm", 4, name="n"),
            gd.ShapeError,
            r"x has dims \[7, 3\]; rnn needs \[T, N, I\]",
        ),
    ],
)
def test_errors(build, error, message):
    with pytest.raises(error, match=f"node 'n'.*{message}"):
        build(new_graph())


def test_reserve_types():
    g = new_graph()
    *_, reserve = g.rnn_training(g.tensor([7, 3, 5]), weights_for(g, "tanh", 5, 4, 1, False), "tanh", 4, name="n")
    reserve.set_data_type("int8").set_output(True)
    with pytest.raises(gd.DataTypeError, match="reserve"):
        g.validate()


def test_round_trip_through_json():
    g = new_graph()
    weights = weights_for(g, "lstm", 5, 4, 2, True)
    x = g.tensor([7, 3, 5], name="x")
    y, hy, cy, reserve = g.rnn_training(x, weights, "lstm", 4, 2, True)
    for t in g.rnn_backward(x, weights, reserve, y, "lstm", 4, 2, True, dhy=hy, dcy=cy):
        t.set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert signature(again.validate()) == signature(g.validate()) and '"op": "rnn_backward"' in text
