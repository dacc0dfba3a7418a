"""matmul, reduction, softmax (log, backward) and genstats: reference semantics against loops and
finite differences, shapes, errors."""

import itertools
import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.ops.reduction import ReductionMode


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def run(build, **arrays):
    """Outputs of the one-op graph ``build(g, **inputs)`` on float64 ``arrays``, in output order."""
    g = new_graph()
    tensors = {name: g.tensor_like(array, name=name) for name, array in arrays.items()}
    outputs = build(g, **tensors)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    for t in outputs:
        t.set_output(True)
    results = reference.execute(g, {tensors[name]: array for name, array in arrays.items()})
    return [results[t.name] for t in outputs]


# -- matmul ---------------------------------------------------------------------------------
def loop_matmul(a: np.ndarray, b: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """Textbook triple loop; each operand's size-1 batch dims are read at index 0."""

    def operand_index(index: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
        aligned = index[len(index) - len(dims) :]
        return tuple(0 if d == 1 else i for i, d in zip(aligned, dims))

    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    c = np.zeros((*batch, m, n))
    for index in np.ndindex(*batch):
        ab, bb = a[operand_index(index, a.shape[:-2])], b[operand_index(index, b.shape[:-2])]
        for i, j in itertools.product(range(m), range(n)):
            c[(*index, i, j)] = math.fsum(ab[i, p] * bb[p, j] for p in range(k))
    return c


@pytest.mark.parametrize(
    ("a_dim", "b_dim", "c_dim"),
    [
        ((3, 5), (5, 2), (3, 2)),
        ((1, 1), (1, 7), (1, 7)),
        ((2, 1, 3, 4), (5, 4, 1), (2, 5, 3, 1)),  # ranks differ; both sides stretch a 1
        ((3, 2, 4), (4, 3), (3, 2, 3)),  # B has no batch dims
        ((1, 3, 2), (4, 1, 2, 5), (4, 1, 3, 5)),
        ((3, 1, 2, 2), (4, 2, 1), (3, 4, 2, 1)),
    ],
)
def test_matmul_matches_loops(a_dim, b_dim, c_dim, rng):
    a, b = rng.standard_normal(a_dim), rng.standard_normal(b_dim)
    (c,) = run(lambda g, A, B: g.matmul(A, B), A=a, B=b)
    assert c.shape == c_dim
    np.testing.assert_allclose(c, loop_matmul(a, b, c_dim[:-2]), rtol=1e-12, atol=1e-12)


def test_matmul_hand_computed():
    (c,) = run(lambda g, A, B: g.matmul(A, B), A=np.array([[1.0, 2.0], [3.0, 4.0]]), B=np.array([[5.0], [6.0]]))
    np.testing.assert_array_equal(c, [[17.0], [39.0]])


def test_matmul_output_is_row_major_whatever_the_input_layout():
    g = new_graph()
    a = g.tensor([2, 3, 4], stride=[1, 2, 6], name="a")  # column-major
    b = g.tensor([2, 4, 5], name="b")
    c = g.matmul(a, b)
    assert c.dim == (2, 3, 5)
    assert c.stride == (15, 5, 1)


@pytest.mark.parametrize(
    ("a_dim", "b_dim", "message"),
    [
        ((2, 3), (4, 5), r"node 'mm'.*A \[2, 3\] has K = 3 columns but B \[4, 5\] has K = 4 rows"),
        (
            (2, 3, 4),
            (3, 4, 5),
            r"node 'mm'.*batch dims \[2\] of A \[2, 3, 4\] and \[3\] of B \[3, 4, 5\] do not broadcast",
        ),
        ((3,), (3, 2), r"node 'mm'.*A has dims \[3\]; matmul needs rank >= 2"),
        ((2, 3), (3,), r"node 'mm'.*B has dims \[3\]; matmul needs rank >= 2"),
    ],
)
def test_matmul_errors(a_dim, b_dim, message):
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=message):
        g.matmul(g.tensor(a_dim, name="a"), g.tensor(b_dim, name="b"), name="mm")


# -- reduction ------------------------------------------------------------------------------
def product(values) -> float:
    result = 1.0
    for v in values:
        result *= v
    return result


LOOP_MODES = {
    "add": math.fsum,
    "mul": product,
    "min": min,
    "max": max,
    "amax": lambda v: max(abs(e) for e in v),
    "avg": lambda v: math.fsum(v) / len(v),
    "norm1": lambda v: math.fsum(abs(e) for e in v),
    "norm2": lambda v: math.sqrt(math.fsum(e * e for e in v)),
    "mul_no_zeros": lambda v: product(e for e in v if e != 0),
}


def loop_reduce(x: np.ndarray, out_dim: tuple[int, ...], mode: str) -> np.ndarray:
    """Group the elements by output position (reduced axes read as 0), then reduce each group."""
    groups: dict[tuple[int, ...], list[float]] = {}
    for index in np.ndindex(*x.shape):
        key = tuple(0 if o == 1 else i for i, o in zip(index, out_dim))
        groups.setdefault(key, []).append(float(x[index]))
    y = np.empty(out_dim)
    for key, values in groups.items():
        y[key] = LOOP_MODES[mode](values)
    return y


@pytest.mark.parametrize("mode", list(LOOP_MODES))
@pytest.mark.parametrize(
    ("axes", "out_dim"),
    [
        ([0], (1, 1, 4, 2)),
        ([2, -1], (3, 1, 1, 1)),
        ([0, 1, 2, 3], (1, 1, 1, 1)),
        ([1], (3, 1, 4, 2)),
        ([], (3, 1, 4, 2)),
    ],
)
def test_reduction_matches_loops(mode, axes, out_dim, rng):
    x = rng.standard_normal((3, 1, 4, 2))
    x[0, 0, 1, :] = 0.0  # zeros for mul_no_zeros
    (y,) = run(lambda g, x: g.reduction(x, mode, axes=axes), x=x)
    assert y.shape == out_dim
    np.testing.assert_allclose(y, loop_reduce(x, out_dim, mode), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("mul_no_zeros", [[1.0], [-6.0]]),  # all zeros give 1
        ("mul", [[0.0], [0.0]]),
        ("amax", [[0.0], [3.0]]),
        ("norm2", [[0.0], [math.sqrt(13.0)]]),
        ("avg", [[0.0], [-1.0 / 3.0]]),
    ],
)
def test_reduction_hand_computed(mode, expected):
    x = np.array([[0.0, 0.0, 0.0], [2.0, 0.0, -3.0]])
    (y,) = run(lambda g, x: g.reduction(x, mode, axes=[1]), x=x)
    np.testing.assert_allclose(y, expected, rtol=1e-15)


def test_reduction_output_dims_are_declared_by_set_dim(rng):
    g = new_graph()
    x = g.tensor([3, 4, 5], name="x")
    y = g.reduction(x, "add", name="r")
    assert y.dim is None
    y.set_output(True)
    with pytest.raises(gd.ShapeError, match=r"node 'r'.*cannot be inferred: pass axes= or call set_dim on y"):
        g.validate()
    y.set_dim([1, 4, 1])
    ir = g.validate()
    assert ir.tensor(y.name).dim == (1, 4, 1)
    value = rng.standard_normal((3, 4, 5))
    out = reference.execute(g, {x: value})[y.name]
    np.testing.assert_allclose(out, value.sum(axis=(0, 2), keepdims=True), rtol=1e-12)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ([4], r"node 'r'.*y has dims \[4\], expected rank 3 with each dim equal to input \[3, 4, 5\]'s or 1"),
        ([2, 4, 1], r"node 'r'.*y has dims \[2, 4, 1\]: dim 0 is 2, expected rank 3 with each dim equal to input"),
    ],
)
def test_reduction_bad_declared_dims(declared, message):
    g = new_graph()
    y = g.reduction(g.tensor([3, 4, 5], name="x"), "max", name="r").set_output(True)
    y.set_dim(declared)
    with pytest.raises(gd.ShapeError, match=message):
        g.validate()


def test_reduction_builder_errors():
    g = new_graph()
    x = g.tensor([3, 4, 5], name="x")
    with pytest.raises(
        gd.AttributeValueError, match=r"node 'r'.*reduction axis 3 is out of range for input 'x' of rank 3"
    ):
        g.reduction(x, "add", axes=[3], name="r")
    with pytest.raises(gd.AttributeValueError, match=r"attribute 'mode' must be one of 'add', 'mul'"):
        g.reduction(x, "sum", axes=[0])
    undeclared = g.reduction(x, "add")
    with pytest.raises(gd.ShapeError, match=r"reduction axes= needs the dims of 'reduction_0::y'"):
        g.reduction(undeclared, "add", axes=[0])


def test_reduction_mode_enum_is_accepted():
    (y,) = run(lambda g, x: g.reduction(x, ReductionMode.NORM1, axes=[0]), x=np.array([[1.0, -2.0], [-3.0, 4.0]]))
    np.testing.assert_array_equal(y, [[4.0, 6.0]])


def test_reduction_output_follows_the_input_layout():
    g = new_graph()
    x = g.tensor([2, 3, 4, 5], stride=gd.nhwc_strides([2, 3, 4, 5]), name="x")
    y = g.reduction(x, "avg", axes=[2, 3])
    assert y.dim == (2, 3, 1, 1)
    assert y.stride == gd.nhwc_strides([2, 3, 1, 1])


# -- softmax --------------------------------------------------------------------------------
def loop_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(x, axis, -1)
    y = np.empty_like(moved)
    for index in np.ndindex(*moved.shape[:-1]):
        e = [math.exp(v) for v in moved[index]]
        y[index] = [v / math.fsum(e) for v in e]
    return np.moveaxis(y, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_softmax_matches_loops(axis, rng):
    x = rng.standard_normal((2, 1, 3, 5))
    (y,) = run(lambda g, x: g.softmax(x, axis=axis), x=x)
    np.testing.assert_allclose(y, loop_softmax(x, axis), rtol=1e-13)


def test_softmax_is_stable_for_large_inputs():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1000.0, -1e308]])
    (y,) = run(lambda g, x: g.softmax(x), x=x)
    total = 1.0 + math.exp(-1.0) + math.exp(-2.0)
    np.testing.assert_allclose(y, [[math.exp(-2.0) / total, math.exp(-1.0) / total, 1.0 / total], [0.5, 0.5, 0.0]])


def test_softmax_keeps_layout_and_rejects_bad_axis():
    g = new_graph()
    x = g.tensor([2, 3, 4], stride=gd.nhwc_strides([2, 3, 4]), name="x")
    assert g.softmax(x, axis=1).stride == x.stride
    with pytest.raises(gd.AttributeValueError, match=r"node 'sm'.*axis 3 is out of range for rank 3"):
        g.softmax(x, axis=3, name="sm")
    with pytest.raises(gd.AttributeValueError, match=r"node 'sm2'.*axis -4 is out of range for rank 3"):
        g.softmax(x, axis=-4, name="sm2")


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_log_softmax_is_the_log_of_softmax(axis, rng):
    x = rng.standard_normal((2, 1, 3, 5))
    (y,) = run(lambda g, x: g.log_softmax(x, axis=axis), x=x)
    np.testing.assert_allclose(y, np.log(loop_softmax(x, axis)), rtol=1e-13, atol=1e-15)


def test_log_softmax_is_finite_where_softmax_underflows():
    """log(softmax) would be log(0) = -inf for x - max below -745; log_softmax is x - max - log(sum)."""
    x = np.array([[0.0, -800.0, -1e300], [1000.0, 1000.0, 999.0]])
    (y,) = run(lambda g, x: g.log_softmax(x), x=x)
    lse = math.log(2.0 + math.exp(-1.0))
    np.testing.assert_allclose(y, [[0.0, -800.0, -1e300], [-lse, -lse, -1 - lse]])


def softmax_loss(x: np.ndarray, dy: np.ndarray, axis: int) -> float:
    """sum(dy * softmax(x)): its gradient in x is softmax_backward(dy, softmax(x))."""
    (y,) = run(lambda g, x: g.softmax(x, axis=axis), x=x)
    return float(np.sum(dy * y))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_backward_is_the_central_difference_of_softmax(axis, rng):
    x, dy = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5))
    (y,) = run(lambda g, x: g.softmax(x, axis=axis), x=x)
    (dx,) = run(lambda g, dy, y: g.softmax_backward(dy, y, axis=axis), dy=dy, y=y)
    step, numeric = 1e-6, np.empty_like(x)
    for index in np.ndindex(*x.shape):
        bump = np.zeros_like(x)
        bump[index] = step
        numeric[index] = (softmax_loss(x + bump, dy, axis) - softmax_loss(x - bump, dy, axis)) / (2 * step)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-9)


def test_softmax_backward_shapes_layout_json_and_errors():
    g = new_graph()
    nhwc = gd.nhwc_strides([2, 3, 4, 5])
    dy, y = g.tensor([2, 3, 4, 5], stride=nhwc, name="dy"), g.tensor([2, 3, 4, 5], name="y")
    dx = g.softmax_backward(dy, y, axis=1).set_output(True)
    assert dx.dim == (2, 3, 4, 5) and dx.stride == nhwc  # dy's layout
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert '"op": "softmax_backward"' in g.to_json() and again.signature() == g.signature()
    message = r"node 'bad', tensor 'y2': dy has dims \[2, 3, 4, 5\] and y \[2, 3, 4, 1\]; they must be equal"
    with pytest.raises(gd.ShapeError, match=message):
        g.softmax_backward(dy, g.tensor([2, 3, 4, 1], name="y2"), name="bad")
    with pytest.raises(gd.AttributeValueError, match=r"node 'far'.*axis 4 is out of range for rank 4"):
        g.softmax_backward(dy, y, axis=4, name="far")


# -- genstats -------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [(3, 2, 4, 1), (5, 3), (1, 4, 2, 1, 3)])
def test_genstats_matches_loops(dim, rng):
    x = rng.standard_normal(dim)
    total, squares = run(lambda g, x: g.genstats(x), x=x)
    stats_dim = tuple(d if axis == 1 else 1 for axis, d in enumerate(dim))
    assert total.shape == squares.shape == stats_dim
    for c in range(dim[1]):
        values = [float(x[index]) for index in np.ndindex(*dim) if index[1] == c]
        at = (0, c) + (0,) * (len(dim) - 2)
        assert total[at] == pytest.approx(math.fsum(values), rel=1e-12)
        assert squares[at] == pytest.approx(math.fsum(v * v for v in values), rel=1e-12)


def test_genstats_hand_computed_and_rank_error():
    total, squares = run(lambda g, x: g.genstats(x), x=np.array([[1.0, -2.0], [3.0, 4.0]]))
    np.testing.assert_array_equal(total, [[4.0, 2.0]])
    np.testing.assert_array_equal(squares, [[10.0, 20.0]])
    g = new_graph()
    with pytest.raises(gd.ShapeError, match=r"node 'gs'.*input has dims \[6\]; genstats needs rank >= 2"):
        g.genstats(g.tensor([6], name="x"), name="gs")
