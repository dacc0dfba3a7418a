"""rnn: reference semantics against torch.nn.RNN / LSTM / GRU (same weights), shapes, errors, JSON."""

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.signature import signature

torch = pytest.importorskip("torch")

MODULES = {"relu": torch.nn.RNN, "tanh": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def torch_module(mode: str, inputs: int, hidden: int, layers: int, bidirectional: bool):
    kw = {"nonlinearity": mode} if MODULES[mode] is torch.nn.RNN else {}
    torch.manual_seed(0)
    return MODULES[mode](inputs, hidden, num_layers=layers, bidirectional=bidirectional, dtype=torch.float64, **kw)


def run(module, mode: str, x: np.ndarray, hx=None, cx=None, lengths=None):
    """rnn's outputs with the module's weights."""
    g = new_graph()
    feeds = {"x": x, **{f"w{i}": w.detach().numpy() for i, w in enumerate(module._flat_weights)}}
    if lengths is not None:
        feeds["seq_lengths"] = np.asarray(lengths, dtype=np.int32)
    if hx is not None:
        feeds["hx"] = hx
    if cx is not None:
        feeds["cx"] = cx
    t = {name: g.tensor_like(value, name=name) for name, value in feeds.items()}
    weights = [t[f"w{i}"] for i in range(len(module._flat_weights))]
    layers, bidirectional = module.num_layers, module.bidirectional
    outs = g.rnn(
        t["x"],
        weights,
        mode,
        module.hidden_size,
        layers,
        bidirectional,
        hx=t.get("hx"),
        cx=t.get("cx"),
        seq_lengths=t.get("seq_lengths"),
    )
    for out in outs:
        if out is not None:
            out.set_output(True)
    values = reference.execute(g, feeds)
    return [values[out.name] if out is not None else None for out in outs]


@pytest.mark.parametrize("mode", ["relu", "tanh", "lstm", "gru"])
@pytest.mark.parametrize(("layers", "bidirectional"), [(1, False), (1, True), (3, False), (2, True)])
def test_matches_torch(mode, layers, bidirectional, rng):
    module = torch_module(mode, 5, 4, layers, bidirectional)
    x = rng.standard_normal((6, 3, 5))
    state = (layers * (2 if bidirectional else 1), 3, 4)
    hx, cx = rng.standard_normal(state), rng.standard_normal(state)
    with torch.no_grad():
        initial = (torch.tensor(hx), torch.tensor(cx)) if mode == "lstm" else torch.tensor(hx)
        y, final = module(torch.tensor(x), initial)
    got = run(module, mode, x, hx, cx if mode == "lstm" else None)
    np.testing.assert_allclose(got[0], y.numpy(), rtol=1e-12, atol=1e-14)
    if mode == "lstm":
        np.testing.assert_allclose(got[1], final[0].numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[2], final[1].numpy(), rtol=1e-12, atol=1e-14)
    else:
        np.testing.assert_allclose(got[1], final.numpy(), rtol=1e-12, atol=1e-14)
        assert got[2] is None


@pytest.mark.parametrize("mode", ["lstm", "gru", "tanh"])
def test_variable_lengths_match_packed_sequences(mode, rng):
    module = torch_module(mode, 3, 4, 2, True)
    x, lengths = rng.standard_normal((6, 4, 3)), [6, 2, 5, 1]
    state = rng.standard_normal((4, 4, 4))
    pack = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths), enforce_sorted=False)
    with torch.no_grad():
        initial = (torch.tensor(state), torch.tensor(-state)) if mode == "lstm" else torch.tensor(state)
        packed, final = module(pack, initial)
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(packed, total_length=6)
    got = run(module, mode, x, state, -state if mode == "lstm" else None, lengths)
    np.testing.assert_allclose(got[0], y.numpy(), rtol=1e-12, atol=1e-14)
    for a, b in zip(got[1:], final if mode == "lstm" else (final,)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-14)


def test_a_zero_length_keeps_the_initial_state(rng):
    module = torch_module("gru", 3, 2, 1, True)
    x, hx = rng.standard_normal((4, 2, 3)), rng.standard_normal((2, 2, 2))
    y, hy, _ = run(module, "gru", x, hx, lengths=[0, 4])
    assert not y[:, 0].any() and np.array_equal(hy[:, 0], hx[:, 0]) and y[:, 1].all()


def test_unbound_initial_states_are_zeros(rng):
    module = torch_module("lstm", 3, 2, 1, True)
    x = rng.standard_normal((4, 2, 3))
    with torch.no_grad():
        y, (hy, cy) = module(torch.tensor(x))
    got = run(module, "lstm", x)
    for a, b in zip(got, (y, hy, cy)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-14)


def test_dims():
    g = new_graph()
    module = torch_module("gru", 5, 4, 2, True)
    weights = [g.tensor(list(w.shape)) for w in module._flat_weights]
    y, hy, cy = g.rnn(g.tensor([7, 3, 5]), weights, "gru", 4, 2, True)
    assert y.dim == (7, 3, 8) and hy.dim == (4, 3, 4) and cy is None


def weights_for(g, mode, inputs, hidden, layers, bidirectional):
    return [
        g.tensor(list(w.shape), name=f"w{i}")
        for i, w in enumerate(torch_module(mode, inputs, hidden, layers, bidirectional)._flat_weights)
    ]


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda g: g.rnn(g.tensor([7, 5]), weights_for(g, "lstm", 5, 4, 1, False), "lstm", 4, name="n"),
            gd.ShapeError,
            r"x has dims \[7, 5\]; rnn needs \[T, N, I\]",
        ),
        (
            lambda g: g.rnn(g.tensor([7, 3, 5]), weights_for(g, "lstm", 5, 4, 1, False)[:3], "lstm", 4, name="n"),
            gd.ShapeError,
            "weights has 3 tensors; 1 layers x 1 directions need 4",
        ),
        (
            lambda g: g.rnn(g.tensor([7, 3, 5]), weights_for(g, "gru", 5, 4, 1, False), "lstm", 4, name="n"),
            gd.ShapeError,
            r"weights\[0\] 'w0' \(w_ih of layer 0, direction 0\) has dims \[12, 5\], expected \[16, 5\]",
        ),
        (
            lambda g: g.rnn(g.tensor([7, 3, 6]), weights_for(g, "tanh", 5, 4, 2, True), "tanh", 4, 2, True, name="n"),
            gd.ShapeError,
            r"weights\[0\] 'w0' \(w_ih of layer 0, direction 0\) has dims \[4, 5\], expected \[4, 6\]",
        ),
        (
            lambda g: g.rnn(
                g.tensor([7, 3, 5]),
                weights_for(g, "gru", 5, 4, 1, False),
                "gru",
                4,
                hx=g.tensor([1, 3, 4]),
                cx=g.tensor([1, 3, 4]),
                name="n",
            ),
            gd.AttributeValueError,
            "cx is LSTM's cell state; gru has none",
        ),
        (
            lambda g: g.rnn(
                g.tensor([7, 3, 5]), weights_for(g, "gru", 5, 4, 1, False), "gru", 4, hx=g.tensor([2, 3, 4]), name="n"
            ),
            gd.ShapeError,
            r"hx has dims \[2, 3, 4\], expected \[1, 3, 4\]",
        ),
        (
            lambda g: g.rnn(g.tensor([7, 3, 5]), weights_for(g, "gru", 5, 4, 1, False), "gru", 0, name="n"),
            gd.AttributeValueError,
            "hidden_size 0 and num_layers 1 must be >= 1",
        ),
        (
            lambda g: g.rnn(g.tensor([7, 3, 5]), weights_for(g, "gru", 5, 4, 1, False), "sru", 4, name="n"),
            gd.AttributeValueError,
            "attribute 'mode' must be one of 'relu', 'tanh', 'lstm', 'gru'",
        ),
    ],
)
def test_errors(build, error, message):
    with pytest.raises(error, match=f"node 'n'.*{message}"):
        build(new_graph())


def test_round_trip_through_json():
    g = new_graph()
    weights = weights_for(g, "lstm", 5, 4, 2, True)
    y, hy, cy = g.rnn(g.tensor([7, 3, 5], name="x"), weights, "lstm", 4, 2, True, hx=g.tensor([4, 3, 4], name="hx"))
    for t in (y, hy, cy):
        t.set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert signature(again.validate()) == signature(g.validate()) and '"bidirectional": true' in text


def test_a_length_past_the_steps_is_refused():
    module = torch_module("tanh", 3, 2, 1, False)
    with pytest.raises(gd.FeedError, match=r"seq_lengths 'seq_lengths' holds 5 .* must be in \[0, 5\)"):
        run(module, "tanh", np.zeros((4, 1, 3)), lengths=[5])


def test_random_weights_take_pytorchs_spread():
    """Unit weights make the state chaotic (a rounding difference grows to O(1) over the steps):
    random test inputs draw the weights with standard deviation 1 / sqrt(H), the rest with 1."""
    from graphdnn.random_inputs import random_inputs

    g = new_graph()
    weights = weights_for(g, "lstm", 64, 100, 1, False)
    y, _, _ = g.rnn(g.tensor([50, 8, 64], name="x"), weights, "lstm", 100)
    y.set_output(True)
    feeds = random_inputs(g.validate(), 0)
    assert np.std(feeds["w1"]) == pytest.approx(0.1, rel=0.05) and np.std(feeds["x"]) == pytest.approx(1, rel=0.05)
