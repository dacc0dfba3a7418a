"""reshape, transpose, slice and concatenate: semantics against loops, declared dims, layouts, errors."""

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference


def new_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(io_data_type="double", intermediate_data_type="double", compute_data_type="double")


def run(build, **arrays):
    """The output of the one-op graph ``build(g, **inputs)`` on float64 ``arrays``, and its tensor."""
    g = new_graph()
    tensors = {name: g.tensor_like(array, name=name) for name, array in arrays.items()}
    y = build(g, **tensors).set_output(True)
    return reference.execute(g, {tensors[name]: array for name, array in arrays.items()})[y.name], y


def nhwc_array(dim, rng):
    """Random values in logical dims [N, C, ...] whose memory is channels-last."""
    order = (0, *range(2, len(dim)), 1)
    stored = rng.standard_normal([dim[axis] for axis in order])
    return np.transpose(stored, np.argsort(order))


# -- reshape --------------------------------------------------------------------------------
def loop_reshape(x: np.ndarray, dim) -> np.ndarray:
    """Read the elements in row-major order of x's indices, write them in row-major order of y's."""
    values = [x[index] for index in np.ndindex(*x.shape)]
    y = np.empty(dim)
    for value, index in zip(values, np.ndindex(*dim), strict=True):
        y[index] = value
    return y


@pytest.mark.parametrize(
    ("dim", "shape"), [((2, 3, 4), (4, 6)), ((5, 1, 3), (3, 5)), ((2, 3, 2, 2), (1, 24, 1)), ((7,), (7, 1))]
)
def test_reshape_matches_loops(dim, shape, rng):
    x = rng.standard_normal(dim)
    y, spec = run(lambda g, x: g.reshape(x, shape=shape), x=x)
    np.testing.assert_array_equal(y, loop_reshape(x, shape))
    assert spec.stride == gd.packed_strides(shape)


def test_reshape_is_logical_whatever_the_input_layout(rng):
    x = nhwc_array((2, 3, 2, 2), rng)
    y, spec = run(lambda g, x: g.reshape(x, shape=[6, 4]), x=x)
    assert spec.graph.tensor_named("x").stride == gd.nhwc_strides([2, 3, 2, 2])
    np.testing.assert_array_equal(y, loop_reshape(x, (6, 4)))
    assert spec.stride == (4, 1)


def test_reshape_dims_are_declared_by_set_dim(rng):
    g = new_graph()
    x = g.tensor([3, 4], name="x")
    y = g.reshape(x, name="rs").set_output(True)
    assert y.dim is None
    with pytest.raises(gd.ShapeError, match=r"node 'rs'.*cannot be inferred: pass shape= or call set_dim on y"):
        g.validate()
    y.set_dim([2, 6])
    value = rng.standard_normal((3, 4))
    np.testing.assert_array_equal(reference.execute(g, {x: value})[y.name], value.reshape(2, 6))
    y.set_dim([4, 4])
    with pytest.raises(
        gd.ShapeError, match=r"node 'rs'.*y has dims \[4, 4\] \(16 elements\), but input \[3, 4\] has 12"
    ):
        g.validate()


def test_reshape_builder_checks_element_count():
    g = new_graph()
    with pytest.raises(
        gd.ShapeError, match=r"node 'rs'.*y has dims \[2, 5\] \(10 elements\), but input \[3, 4\] has 12"
    ):
        g.reshape(g.tensor([3, 4], name="x"), shape=[2, 5], name="rs")


# -- transpose ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dim", "permutation"), [((2, 3, 4), (2, 0, 1)), ((1, 3, 2, 5), (0, 2, 3, 1)), ((4, 3), (1, 0)), ((3,), (0,))]
)
def test_transpose_matches_loops(dim, permutation, rng):
    x = rng.standard_normal(dim)
    y, spec = run(lambda g, x: g.transpose(x, permutation), x=x)
    assert y.shape == tuple(dim[p] for p in permutation)
    for index in np.ndindex(*y.shape):
        source = [0] * len(dim)
        for out_axis, in_axis in enumerate(permutation):
            source[in_axis] = index[out_axis]
        assert y[index] == x[tuple(source)]
    assert spec.stride == gd.packed_strides(y.shape)


def test_transpose_output_is_row_major_for_strided_input(rng):
    x = nhwc_array((2, 3, 4, 5), rng)
    y, spec = run(lambda g, x: g.transpose(x, [0, 2, 3, 1]), x=x)
    np.testing.assert_array_equal(y, np.transpose(x, (0, 2, 3, 1)))
    assert spec.dim == (2, 4, 5, 3)
    assert spec.stride == (60, 15, 3, 1)


@pytest.mark.parametrize(
    ("permutation", "message"),
    [
        ([0, 0, 1], r"permutation \[0, 0, 1\] is not a permutation of 0..2 \(input rank 3\)"),
        ([1, 0], r"permutation \[1, 0\] is not a permutation of 0..2"),
        ([0, 1, 3], r"permutation \[0, 1, 3\] is not a permutation of 0..2"),
    ],
)
def test_transpose_errors(permutation, message):
    g = new_graph()
    with pytest.raises(gd.AttributeValueError, match=f"node 'tr'.*{message}"):
        g.transpose(g.tensor([2, 3, 4], name="x"), permutation, name="tr")


# -- slice ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dim", "slices", "start", "stop", "step"),
    [
        ((10,), [slice(1, None, 3)], (1,), (10,), (3,)),
        ((5, 4, 3), [slice(-3, -1), (1, 4, 2)], (2, 1, 0), (4, 4, 3), (1, 2, 1)),  # trailing dim whole
        ((4, 6), [slice(None, 100), slice(2, 3, 7)], (0, 2), (4, 3), (1, 7)),
        ((3, 1, 5), [(0, 1), slice(None), (-4, None, 2)], (0, 0, 1), (1, 1, 5), (1, 1, 2)),
        ((2, 3), [], (0, 0), (2, 3), (1, 1)),
    ],
)
def test_slice_matches_loops_and_normalises(dim, slices, start, stop, step, rng):
    x = rng.standard_normal(dim)
    y, spec = run(lambda g, x: g.slice(x, slices), x=x)
    attributes = spec.graph.nodes[-1].attributes
    assert (attributes.start, attributes.stop, attributes.step) == (start, stop, step)
    assert y.shape == tuple(-(-(b - a) // s) for a, b, s in zip(start, stop, step))
    for index in np.ndindex(*y.shape):
        assert y[index] == x[tuple(a + i * s for a, i, s in zip(start, index, step))]
    assert spec.stride == gd.packed_strides(y.shape)


def test_slice_hand_computed():
    y, _ = run(lambda g, x: g.slice(x, [slice(1, None, 3)]), x=np.arange(10.0))
    np.testing.assert_array_equal(y, [1.0, 4.0, 7.0])
    y, _ = run(lambda g, x: g.slice(x, [(1, 3), slice(-1, None)]), x=np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(y, [[7.0], [11.0]])


@pytest.mark.parametrize(
    ("slices", "error", "message"),
    [
        ([slice(None, None, -1)], gd.AttributeValueError, r"slice 0 has step -1; only steps >= 1 are supported"),
        ([slice(None), (0, 3, 0)], gd.AttributeValueError, r"slice 1 has step 0"),
        ([slice(None)] * 3, gd.AttributeValueError, r"3 slices for input 'x' of rank 2"),
        ([3], gd.AttributeValueError, r"slice 0 is 3; give a slice or \(start, stop\[, step\]\) of integers"),
        ([slice(0, "a")], gd.AttributeValueError, r"slice 0 is slice\(0, 'a', None\); give a slice"),
        ([(3, 3)], gd.ShapeError, r"slice 3:3:1 of dim 0 is empty \(input \[5, 4\]\)"),
        ([slice(None), slice(3, 1)], gd.ShapeError, r"slice 3:3:1 of dim 1 is empty"),
        ([slice(7, None)], gd.ShapeError, r"slice 5:5:1 of dim 0 is empty"),
    ],
)
def test_slice_builder_errors(slices, error, message):
    g = new_graph()
    with pytest.raises(error, match=f"node 'sl'.*{message}"):
        g.slice(g.tensor([5, 4], name="x"), slices, name="sl")


def test_slice_needs_known_input_dims():
    g = new_graph()
    unsized = g.reshape(g.tensor([2, 6], name="x"))
    with pytest.raises(
        gd.ShapeError, match=r"node 'sl'.*slice needs the dims of 'reshape_0::y' when the node is added"
    ):
        g.slice(unsized, [slice(0, 1)], name="sl")


def test_slice_validation_rechecks_the_bounds():
    g = new_graph()
    x = g.tensor([5, 4], name="x")
    g.slice(x, [slice(1, 5)], name="sl").set_output(True)
    x.set_dim([3, 4])
    with pytest.raises(
        gd.ShapeError, match=r"node 'sl', tensor 'x': slice 1:5:1 of dim 0 needs 0 <= start <= stop <= 3"
    ):
        g.validate()
    x.set_dim([5, 4, 2])
    with pytest.raises(gd.AttributeValueError, match=r"node 'sl'.*start has 2 values for an input of rank 3"):
        g.validate()


def test_slice_validation_rejects_bad_steps():
    # As the JSON reader adds nodes: attributes as given, checked only by validation.
    g = new_graph()
    x = g.tensor([5], name="x")
    (y,) = g._add_node("slice", {"input": x}, {"start": [0], "stop": [5], "step": [0]}, name="sl", infer=False)
    y.set_output(True)
    with pytest.raises(gd.AttributeValueError, match=r"node 'sl'.*step \[0\] must be >= 1 in every dim"):
        g.validate()


# -- concatenate ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dims", "axis"),
    [
        (((2, 3, 4), (2, 1, 4), (2, 5, 4)), 1),
        (((2, 3), (2, 3)), -1),
        (((1, 2, 3), (4, 2, 3)), 0),
        (((3, 1, 2, 2),), 2),
        (((2, 2, 1), (2, 2, 3)), -1),
    ],
)
def test_concatenate_matches_loops(dims, axis, rng):
    arrays = {f"x{i}": rng.standard_normal(dim) for i, dim in enumerate(dims)}
    y, spec = run(lambda g, **xs: g.concatenate(list(xs.values()), axis=axis), **arrays)
    axis %= len(dims[0])
    offset = 0
    for x in arrays.values():
        for index in np.ndindex(*x.shape):
            at = list(index)
            at[axis] += offset
            assert y[tuple(at)] == x[index]
        offset += x.shape[axis]
    assert y.shape[axis] == offset
    assert spec.stride == gd.packed_strides(y.shape)


def test_concatenate_output_is_row_major_for_strided_inputs(rng):
    a, b = nhwc_array((1, 2, 3, 2), rng), nhwc_array((1, 3, 3, 2), rng)
    y, spec = run(lambda g, a, b: g.concatenate([a, b], axis=1), a=a, b=b)
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    assert spec.stride == gd.packed_strides([1, 5, 3, 2])


@pytest.mark.parametrize(
    ("b_dim", "axis", "error", "message"),
    [
        ((2, 4), 1, gd.ShapeError, r"inputs\[1\] 'b' has rank 2 \[2, 4\], inputs\[0\] rank 3"),
        (
            (2, 4, 5),
            1,
            gd.ShapeError,
            r"inputs\[1\] 'b' has dims \[2, 4, 5\], expected \[2, \*, 3\] \(as inputs\[0\] but on axis 1\)",
        ),
        ((3, 4, 3), -2, gd.ShapeError, r"inputs\[1\] 'b' has dims \[3, 4, 3\], expected \[2, \*, 3\]"),
        ((2, 4, 3), 3, gd.AttributeValueError, r"axis 3 is out of range for rank 3"),
    ],
)
def test_concatenate_errors(b_dim, axis, error, message):
    g = new_graph()
    a = g.tensor([2, 3, 3], name="a")
    with pytest.raises(error, match=f"node 'cat'.*{message}"):
        g.concatenate([a, g.tensor(b_dim, name="b")], axis=axis, name="cat")


def test_concatenate_needs_a_list_of_tensors():
    g = new_graph()
    with pytest.raises(gd.StructureError, match=r"node 'cat'.*input 'inputs' takes a non-empty list of tensors"):
        g.concatenate([], axis=0, name="cat")
