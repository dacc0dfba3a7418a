"""ctc_loss: reference semantics against PyTorch's ctc_loss (losses, and the gradient with
respect to the activations before the softmax), hand-computed cases, shapes, errors, JSON."""

import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.signature import signature

torch = pytest.importorskip("torch")
F = torch.nn.functional


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def ctc(probs, labels, label_lengths, input_lengths, normalization="softmax"):
    g = new_graph()
    arrays = {
        "probs": probs,
        "labels": np.asarray(labels, dtype=np.int32),
        "label_lengths": np.asarray(label_lengths, dtype=np.int32),
        "input_lengths": np.asarray(input_lengths, dtype=np.int32),
    }
    tensors = {name: g.tensor_like(value, name=name) for name, value in arrays.items()}
    loss, grad = g.ctc_loss(**tensors, normalization=normalization)
    loss.set_output(True)
    grad.set_output(True)
    out = reference.execute(g, arrays)
    return out[loss.name], out[grad.name]


def torch_ctc(logits, labels, label_lengths, input_lengths):
    """Per-sequence losses (inf where no alignment fits) and d(sum of the finite losses) / d logits."""
    lt = torch.tensor(logits, requires_grad=True)
    args = (torch.tensor(labels, dtype=torch.long), torch.tensor(input_lengths), torch.tensor(label_lengths))
    loss = F.ctc_loss(lt.log_softmax(-1), *args, blank=0, reduction="none")
    F.ctc_loss(lt.log_softmax(-1), *args, blank=0, reduction="sum", zero_infinity=True).backward()
    return loss.detach().numpy(), lt.grad.numpy()


CASES = [
    # steps, batch, alphabet, label width, label lengths, input lengths
    (12, 4, 5, 4, [4, 0, 2, 3], [12, 5, 3, 1]),  # the last fits no alignment
    (6, 2, 3, 3, [3, 2], [6, 6]),  # repeats need blanks between them
    (1, 1, 2, 1, [1], [1]),
    (20, 3, 30, 7, [7, 5, 1], [20, 9, 2]),
]


@pytest.mark.parametrize("normalization", ["softmax", "none"])
@pytest.mark.parametrize(("steps", "batch", "alphabet", "width", "label_lengths", "input_lengths"), CASES)
def test_matches_torch(steps, batch, alphabet, width, label_lengths, input_lengths, normalization, rng):
    logits = rng.standard_normal((steps, batch, alphabet))
    labels = rng.integers(1, alphabet, (batch, width))
    if steps == 6:
        labels[0] = [2, 2, 1]  # a repeated label
    expected_loss, expected_grad = torch_ctc(logits, labels, label_lengths, input_lengths)
    # "none" takes probabilities; its gradient is still by the activations before the softmax (cuDNN's).
    probs = logits if normalization == "softmax" else torch.softmax(torch.tensor(logits), -1).numpy()
    loss, grad = ctc(probs, labels, label_lengths, input_lengths, normalization)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-11)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-9, atol=1e-12)


def test_log_probabilities_give_the_same_result_as_logits(rng):
    logits = rng.standard_normal((7, 2, 4))
    log_probs = torch.log_softmax(torch.tensor(logits), -1).numpy()
    args = ([[1, 3], [2, 2]], [2, 2], [7, 6])
    for a, b in zip(ctc(logits, *args), ctc(log_probs, *args)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_hand_computed():
    """Two steps, label [1], uniform probabilities over {blank, 1}: the alignments 1-, -1, 11
    give p = 3/4; the posterior of emitting 1 at step 0 is (1/4 + 1/4) / (3/4) = 2/3."""
    probs = np.full((2, 1, 2), 0.5)
    loss, grad = ctc(probs, [[1]], [1], [2], "none")
    assert loss[0] == pytest.approx(-math.log(0.75))
    np.testing.assert_allclose(grad[:, 0], [[0.5 - 1 / 3, 0.5 - 2 / 3], [0.5 - 1 / 3, 0.5 - 2 / 3]])


def test_gradient_matches_finite_differences(rng):
    logits = rng.standard_normal((5, 1, 3))
    args = ([[1, 2]], [2], [5])
    _, grad = ctc(logits, *args)
    numeric, step = np.zeros_like(logits), 1e-6
    for i in np.ndindex(logits.shape):
        bump = np.zeros_like(logits)
        bump[i] = step
        numeric[i] = (ctc(logits + bump, *args)[0][0] - ctc(logits - bump, *args)[0][0]) / (2 * step)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_steps_past_the_length_and_unfit_sequences_get_no_gradient(rng):
    logits = rng.standard_normal((6, 2, 4))
    loss, grad = ctc(logits, [[1, 2, 3], [1, 1, 1]], [3, 3], [4, 4])  # [1, 1, 1] needs 5 steps
    assert np.isfinite(loss[0]) and loss[1] == np.inf
    assert not grad[4:, 0].any() and not grad[:, 1].any() and grad[:4, 0].any()


def test_dims():
    g = new_graph()
    probs = g.tensor([9, 3, 5], name="probs")
    labels = g.tensor([3, 4], data_type="int32", name="labels")
    lengths = [g.tensor([3], data_type="int64", name=f"l{i}") for i in range(2)]
    loss, grad = g.ctc_loss(probs, labels, *lengths)
    assert loss.dim == (3,) and grad.dim == (9, 3, 5) and grad.stride == probs.stride


@pytest.mark.parametrize(
    ("dims", "error", "message"),
    [
        ({"probs": [9, 3]}, gd.ShapeError, r"probs has dims \[9, 3\]; ctc_loss needs \[T, N, A\]"),
        ({"probs": [9, 3, 1]}, gd.ShapeError, "an alphabet of 1"),
        ({"labels": [2, 4]}, gd.ShapeError, r"labels has dims \[2, 4\], expected \[3, S\]"),
        ({"input_lengths": [3, 1]}, gd.ShapeError, r"input_lengths has dims \[3, 1\], expected \[3\]"),
        ({"label_type": "float"}, gd.DataTypeError, "labels 'labels' is float; ctc_loss takes int32 or int64"),
    ],
)
def test_errors(dims, error, message):
    g = new_graph()
    probs = g.tensor(dims.get("probs", [9, 3, 5]), name="probs")
    labels = g.tensor(dims.get("labels", [3, 4]), data_type=dims.get("label_type", "int32"), name="labels")
    label_lengths = g.tensor([3], data_type="int32", name="label_lengths")
    input_lengths = g.tensor(dims.get("input_lengths", [3]), data_type="int32", name="input_lengths")
    with pytest.raises(error, match=f"node 'ctc'.*{message}"):
        g.ctc_loss(probs, labels, label_lengths, input_lengths, name="ctc")


@pytest.mark.parametrize(
    ("labels", "label_lengths", "input_lengths", "message"),
    [
        (
            [[1, 5]],
            [2],
            [3],
            r"labels 'labels' holds 5 at flat position 1; labels \(0 is the blank\) must be in \[0, 5\)",
        ),
        ([[1, 0]], [2], [3], "labels of sequence 0 hold the blank"),
        ([[1, 2]], [3], [3], r"label_lengths 'label_lengths' holds 3 .* must be in \[0, 3\)"),
        ([[1, 2]], [2], [0], "input_lengths\\[0\\] is 0"),
    ],
)
def test_bad_values_are_refused(labels, label_lengths, input_lengths, message):
    with pytest.raises(gd.GraphError, match=message):
        ctc(np.zeros((3, 1, 5)), labels, label_lengths, input_lengths)


def test_round_trip_through_json():
    g = new_graph()
    probs = g.tensor([9, 3, 5], name="probs")
    ints = [g.tensor(d, data_type="int32", name=n) for d, n in (([3, 4], "labels"), ([3], "ll"), ([3], "il"))]
    loss, grad = g.ctc_loss(probs, *ints, normalization="none", name="ctc")
    loss.set_output(True)
    grad.set_output(True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert signature(again.validate()) == signature(g.validate()) and '"normalization": "none"' in text
