"""Pointwise ops: every kind against a scalar textbook formula, broadcasting, output layout."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.ops.pointwise import BINARY_KINDS, UNARY_KINDS

# kind -> (builder keyword arguments, scalar formula, input range)
UNARY: dict[str, tuple[dict[str, float], Callable[[float], float], tuple[float, float]]] = {
    "identity": ({}, lambda v: v, (-3, 3)),
    "neg": ({}, lambda v: -v, (-3, 3)),
    "abs": ({}, math.fabs, (-3, 3)),
    "exp": ({}, math.exp, (-3, 3)),
    "log": ({}, math.log, (0.05, 5)),
    "sqrt": ({}, math.sqrt, (0.05, 5)),
    "rsqrt": ({}, lambda v: 1 / math.sqrt(v), (0.05, 5)),
    "reciprocal": ({}, lambda v: 1 / v, (0.2, 5)),
    "sin": ({}, math.sin, (-7, 7)),
    "cos": ({}, math.cos, (-7, 7)),
    "tan": ({}, math.tan, (-1.5, 1.5)),
    "erf": ({}, math.erf, (-4, 4)),
    "floor": ({}, math.floor, (-3, 3)),
    "ceil": ({}, math.ceil, (-3, 3)),
    "logical_not": ({}, lambda v: 0.0 if v else 1.0, (-3, 3)),
    "relu": ({}, lambda v: v if v > 0 else 0.0, (-3, 3)),
    "leaky_relu": ({"negative_slope": 0.2}, lambda v: v if v > 0 else 0.2 * v, (-3, 3)),
    "elu": ({"alpha": 0.7}, lambda v: v if v > 0 else 0.7 * math.expm1(v), (-3, 3)),
    "gelu": ({}, lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), (-4, 4)),
    "gelu_approx_tanh": (
        {},
        lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))),
        (-4, 4),
    ),
    "swish": ({"swish_beta": 1.5}, lambda v: v / (1 + math.exp(-1.5 * v)), (-4, 4)),
    "sigmoid": ({}, lambda v: 1 / (1 + math.exp(-v)), (-5, 5)),
    "tanh": ({}, math.tanh, (-3, 3)),
    "softplus": ({"softplus_beta": 2.0}, lambda v: math.log1p(math.exp(2 * v)) / 2, (-4, 4)),
}

# kind -> (scalar formula, range of the first input, range of the second)
BINARY: dict[str, tuple[Callable[[float, float], float], tuple[float, float], tuple[float, float]]] = {
    "add": (lambda a, b: a + b, (-3, 3), (-3, 3)),
    "sub": (lambda a, b: a - b, (-3, 3), (-3, 3)),
    "mul": (lambda a, b: a * b, (-3, 3), (-3, 3)),
    "div": (lambda a, b: a / b, (-3, 3), (0.5, 3)),
    "max": (max, (-3, 3), (-3, 3)),
    "min": (min, (-3, 3), (-3, 3)),
    "pow": (math.pow, (0.1, 3), (-2, 2)),
    "mod": (math.fmod, (-7, 7), (-3, 3)),
    "add_square": (lambda a, b: a + b * b, (-3, 3), (-3, 3)),
    "logical_and": (lambda a, b: 1.0 if a and b else 0.0, (-3, 3), (-3, 3)),
    "logical_or": (lambda a, b: 1.0 if a or b else 0.0, (-3, 3), (-3, 3)),
    "scale": (lambda a, b: a * b, (-3, 3), (-3, 3)),
    "bias": (lambda a, b: a + b, (-3, 3), (-3, 3)),
}

COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "cmp_eq": lambda a, b: a == b,
    "cmp_neq": lambda a, b: a != b,
    "cmp_gt": lambda a, b: a > b,
    "cmp_ge": lambda a, b: a >= b,
    "cmp_lt": lambda a, b: a < b,
    "cmp_le": lambda a, b: a <= b,
}


def test_every_pointwise_kind_is_tested_here() -> None:
    assert set(UNARY) == UNARY_KINDS
    assert set(BINARY) | set(COMPARISONS) == BINARY_KINDS


def double_graph() -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(name="pw", io_data_type="double", intermediate_data_type="double")


def elementwise(formula: Callable[..., float], out_dim: tuple[int, ...], *arrays: np.ndarray) -> np.ndarray:
    """Apply a scalar formula at every output index, broadcasting by explicit index arithmetic."""
    out = np.empty(out_dim)
    for index in np.ndindex(*out_dim):
        args = []
        for a in arrays:
            tail = index[len(out_dim) - a.ndim :]
            args.append(float(a[tuple(i if d > 1 else 0 for i, d in zip(tail, a.shape))]))
        out[index] = formula(*args)
    return out


@pytest.mark.parametrize("kind", sorted(UNARY))
def test_unary_reference_matches_the_formula(kind: str, run_random) -> None:
    kwargs, formula, (low, high) = UNARY[kind]
    g = double_graph()
    x = g.tensor([3, 1, 5, 2], name="x")
    y = getattr(g, kind)(x, **kwargs).set_output(True)
    assert y.dim == (3, 1, 5, 2)
    out, feeds = run_random(g, low, high)
    np.testing.assert_allclose(out[y.name], elementwise(formula, y.dim, feeds["x"]), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", sorted(BINARY))
def test_binary_reference_matches_the_formula_with_broadcasting(kind: str, rng: np.random.Generator) -> None:
    formula, range_a, range_b = BINARY[kind]
    g = double_graph()
    a = g.tensor([2, 1, 5], name="a")
    b = g.tensor([3, 1], name="b")
    y = getattr(g, kind)(a, b).set_output(True)
    assert y.dim == (2, 3, 5)
    feeds = {"a": rng.uniform(*range_a, (2, 1, 5)), "b": rng.uniform(*range_b, (3, 1))}
    out = gd.reference.execute(g, feeds)[y.name]
    np.testing.assert_allclose(out, elementwise(formula, y.dim, feeds["a"], feeds["b"]), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", sorted(COMPARISONS))
def test_comparisons_give_one_where_true_and_zero_where_false(kind: str, rng: np.random.Generator) -> None:
    g = double_graph()
    a, b = g.tensor([4, 6], name="a"), g.tensor([1, 6], name="b")
    y = getattr(g, kind)(a, b).set_output(True)
    feeds = {"a": rng.integers(-1, 2, (4, 6)).astype(np.float64), "b": rng.integers(-1, 2, (1, 6)).astype(np.float64)}
    out = gd.reference.execute(g, feeds)[y.name]
    expected = elementwise(lambda u, v: 1.0 if COMPARISONS[kind](u, v) else 0.0, (4, 6), feeds["a"], feeds["b"])
    np.testing.assert_array_equal(out, expected)
    assert set(np.unique(out)) == {0.0, 1.0}  # both outcomes occur in this case


def one_input(build: Callable[..., gd.TensorSpec], x: list[float], *more: float) -> np.ndarray:
    """``build(g, x, *more)`` on the double values ``x``, by the reference."""
    g = double_graph()
    y = build(g, g.tensor([len(x)], name="x"), *more).set_output(True)
    return gd.reference.execute(g, {"x": np.array(x)})[y.name]


def test_floor_and_ceil_of_halves_signed_zeros_nan_and_inf() -> None:
    x = [-0.5, 0.5, -1.5, 2.0, -0.0, math.nan, math.inf, -math.inf]
    floor, ceil = one_input(lambda g, t: g.floor(t), x), one_input(lambda g, t: g.ceil(t), x)
    np.testing.assert_array_equal(floor, [-1, 0, -2, 2, 0, math.nan, math.inf, -math.inf])
    np.testing.assert_array_equal(ceil, [0, 1, -1, 2, 0, math.nan, math.inf, -math.inf])
    assert math.copysign(1, ceil[0]) == -1 and math.copysign(1, floor[4]) == -1  # ceil(-0.5) is -0.0, as in C


def test_mod_is_c_fmod_sign_of_the_dividend_and_nan_for_a_zero_divisor() -> None:
    pairs = [
        (7.0, 3.0),
        (-7.0, 3.0),
        (7.0, -3.0),
        (-7.0, -3.0),
        (5.5, 2.0),
        (1.0, 0.0),
        (math.inf, 2.0),
        (3.0, math.inf),
    ]
    g = double_graph()
    a, b = g.tensor([len(pairs)], name="a"), g.tensor([len(pairs)], name="b")
    y = g.mod(a, b).set_output(True)
    out = gd.reference.execute(g, {"a": np.array([p[0] for p in pairs]), "b": np.array([p[1] for p in pairs])})[y.name]
    np.testing.assert_array_equal(out[:5], [1, -1, 1, -1, 1.5])
    assert math.isnan(out[5]) and math.isnan(out[6]) and out[7] == 3.0  # fmod(1, 0) and fmod(inf, 2) are NaN
    np.testing.assert_array_equal(one_input(lambda g, t, v: g.mod(t, v), [-7.0, 7.0], 3.0), [-1, 1])


def test_logical_ops_take_non_zero_and_nan_as_true() -> None:
    x = [0.0, -0.0, 2.0, math.nan, -math.inf]
    np.testing.assert_array_equal(one_input(lambda g, t: g.logical_not(t), x), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(one_input(lambda g, t, v: g.logical_and(t, v), x, math.nan), [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(one_input(lambda g, t, v: g.logical_and(t, v), x, 0.0), [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(one_input(lambda g, t, v: g.logical_or(t, v), x, 0.0), [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(one_input(lambda g, t, v: g.logical_or(t, v), x, -1.0), [1, 1, 1, 1, 1])


def test_erf_matches_scipy_at_its_edges() -> None:
    from scipy.special import erf

    x = [0.0, -0.0, 1e-8, -6.0, 30.0, math.inf, -math.inf, math.nan]
    np.testing.assert_array_equal(one_input(lambda g, t: g.erf(t), x), erf(np.array(x)))


ELEMENTARY = ("sin", "cos", "erf", "floor", "ceil", "logical_not", "mod", "logical_and", "logical_or")


def elementary_graph(swap: dict[str, str]) -> gd.OperationGraphSpec:
    """Every elementary op in one DAG on a matmul; ``swap`` renames op kinds (same roles)."""
    g = gd.OperationGraphSpec(name="elementary", io_data_type="half", intermediate_data_type="float")
    a, w, b = g.tensor([2, 8, 16], name="a"), g.tensor([2, 16, 12], name="w"), g.tensor([1, 1, 12], name="b")
    h = g.matmul(a, w)
    unary = [getattr(g, swap.get(k, k))(h) for k in ELEMENTARY[:6]]
    h = getattr(g, swap.get("mod", "mod"))(unary[0], b)
    h = getattr(g, swap.get("logical_and", "logical_and"))(h, unary[1])
    h = getattr(g, swap.get("logical_or", "logical_or"))(h, unary[2])
    for u in unary[3:]:
        h = g.add(h, u)
    h.set_name("y").set_output(True)
    return g


def test_elementary_ops_round_trip_through_json_and_fuse_as_an_epilogue(rng: np.random.Generator) -> None:
    g = elementary_graph({})
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert again.to_json() == g.to_json() and again.signature() == g.signature()
    assert sorted({n.op for n in again.validate().nodes}) == sorted({*ELEMENTARY, "matmul", "add"})
    shapes = {"a": (2, 8, 16), "w": (2, 16, 12), "b": (1, 1, 12)}
    feeds = {name: rng.standard_normal(shape).astype(np.float16) for name, shape in shapes.items()}
    np.testing.assert_array_equal(gd.reference.execute(again, feeds)["y"], gd.reference.execute(g, feeds)["y"])
    (fused,) = gd.fuse(g).nodes  # the matmul and every elementary op: one kernel
    assert fused.anchor.op == "matmul" and {n.op for n in fused.epilogue} == {*ELEMENTARY, "add"}


@pytest.mark.parametrize(
    "swap", [{"sin": "cos"}, {"floor": "ceil"}, {"erf": "tanh"}, {"mod": "div"}, {"logical_and": "logical_or"}]
)
def test_the_signature_tells_elementary_op_kinds_apart(swap: dict[str, str]) -> None:
    assert elementary_graph(swap).signature() != elementary_graph({}).signature()


def test_comparison_against_a_python_number() -> None:
    g = double_graph()
    x = g.tensor([5], name="x")
    y = g.cmp_ge(x, 0.5).set_output(True)
    out = gd.reference.execute(g, {"x": np.array([-1.0, 0.5, 0.49, 2.0, np.nan])})[y.name]
    np.testing.assert_array_equal(out, [0, 1, 0, 1, 0])


def test_binary_select_takes_input0_where_mask_is_non_zero(rng: np.random.Generator) -> None:
    g = double_graph()
    a, b, mask = g.tensor([3, 4], name="a"), g.tensor([1, 4], name="b"), g.tensor([3, 1], name="mask")
    y = g.binary_select(a, b, mask).set_output(True)
    feeds = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(1, 4)), "mask": np.array([[0.0], [2.0], [-0.5]])}
    out = gd.reference.execute(g, feeds)[y.name]
    expected = elementwise(lambda u, v, m: u if m != 0 else v, (3, 4), feeds["a"], feeds["b"], feeds["mask"])
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out[0], feeds["b"][0])
    np.testing.assert_array_equal(out[1:], feeds["a"][1:])


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, [0.0, 0.0, 0.2, 0.7, 3.0]),
        ({"negative_slope": 0.1}, [-0.2, -0.01, 0.2, 0.7, 3.0]),
        ({"lower_clip": 0.5}, [0.5, 0.5, 0.5, 0.7, 3.0]),
        ({"upper_clip": 1.0}, [0.0, 0.0, 0.2, 0.7, 1.0]),
        # below the lower clip: lower_clip + negative_slope * (x - lower_clip)
        ({"negative_slope": 0.25, "lower_clip": 0.5, "upper_clip": 1.5}, [-0.125, 0.35, 0.425, 0.7, 1.5]),
    ],
)
def test_relu_slope_and_clips_by_hand(kwargs: dict[str, float], expected: list[float]) -> None:
    g = double_graph()
    x = g.tensor([5], name="x")
    y = g.relu(x, **kwargs).set_output(True)
    out = gd.reference.execute(g, {"x": np.array([-2.0, -0.1, 0.2, 0.7, 3.0])})[y.name]
    np.testing.assert_allclose(out, expected, rtol=1e-15, atol=1e-15)


def test_activation_attributes_by_hand() -> None:
    g = double_graph()
    x = g.tensor([3], name="x")
    outs = {
        "leaky": g.leaky_relu(x, negative_slope=0.3),
        "elu": g.elu(x, alpha=2.0),
        "swish": g.swish(x, swish_beta=2.0),
        "silu": g.silu(x),
        "softplus": g.softplus(x, softplus_beta=3.0),
    }
    for t in outs.values():
        t.set_output(True)
    values = np.array([-1.0, 0.0, 2.0])
    out = gd.reference.execute(g, {"x": values})
    got = {key: out[t.name] for key, t in outs.items()}
    e = math.e
    np.testing.assert_allclose(got["leaky"], [-0.3, 0.0, 2.0])
    np.testing.assert_allclose(got["elu"], [2.0 * (1 / e - 1), 0.0, 2.0])
    np.testing.assert_allclose(got["swish"], [-1 / (1 + e**2), 0.0, 2 / (1 + e**-4)])
    np.testing.assert_allclose(got["silu"], [-1 / (1 + e), 0.0, 2 / (1 + e**-2)])
    np.testing.assert_allclose(got["softplus"], [math.log(1 + e**-3) / 3, math.log(2) / 3, math.log(1 + e**6) / 3])


def test_python_number_operands_are_constants(rng: np.random.Generator) -> None:
    g = double_graph()
    x = g.tensor([2, 3], name="x")
    outs = [g.add(x, 2.5), g.pow(x, 2), g.scale(x, -0.5), g.bias(x, 1)]
    for t in outs:
        t.set_output(True)
    values = rng.normal(size=(2, 3))
    out = gd.reference.execute(g, {"x": values})
    np.testing.assert_allclose(out[outs[0].name], values + 2.5)
    np.testing.assert_allclose(out[outs[1].name], values * values)
    np.testing.assert_allclose(out[outs[2].name], values * -0.5)
    np.testing.assert_allclose(out[outs[3].name], values + 1)


def test_non_finite_results_are_values_not_errors() -> None:
    g = double_graph()
    x = g.tensor([3], name="x")
    ys = [g.log(x).set_output(True), g.reciprocal(x).set_output(True), g.sqrt(x).set_output(True)]
    out = gd.reference.execute(g, {"x": np.array([0.0, -1.0, 4.0])})
    np.testing.assert_array_equal(out[ys[0].name], [-np.inf, np.nan, math.log(4)])
    np.testing.assert_array_equal(out[ys[1].name], [np.inf, -1.0, 0.25])
    np.testing.assert_array_equal(out[ys[2].name], [0.0, np.nan, 2.0])


# -- output dims and layout -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ([2, 1, 4], [3, 1], [2, 3, 4]),
        ([5], [2, 3, 5], [2, 3, 5]),
        ([1, 1], [1], [1, 1]),
        ([4, 1, 1, 3], [1, 2, 1, 1], [4, 2, 1, 3]),
        ([1], [7, 1, 6], [7, 1, 6]),
    ],
)
def test_broadcast_dims_and_row_major_strides(a: list[int], b: list[int], out: list[int]) -> None:
    g = double_graph()
    y = g.add(g.tensor(a), g.tensor(b))
    assert y.dim == tuple(out)
    assert y.stride == gd.packed_strides(out)


def test_output_takes_the_layout_of_the_first_full_size_input() -> None:
    dim = [2, 3, 4, 5]
    g = double_graph()
    x = g.tensor(dim, stride=gd.nhwc_strides(dim), name="x")
    nchw = g.tensor(dim, name="nchw")
    per_channel = g.tensor([1, 3, 1, 1], name="per_channel")
    assert g.relu(x).stride == gd.nhwc_strides(dim)
    assert g.bias(x, per_channel).stride == gd.nhwc_strides(dim)
    assert g.add(per_channel, x).stride == gd.nhwc_strides(dim)  # the first input is not full size
    assert g.mul(x, 2.0).stride == gd.nhwc_strides(dim)
    assert g.add(nchw, x).stride == gd.nchw_strides(dim)
    assert g.add(x, nchw).stride == gd.nhwc_strides(dim)
    transposed = g.tensor([3, 4], stride=[1, 3], name="t")
    assert g.exp(transposed).stride == (1, 3)


def test_layout_does_not_change_values(rng: np.random.Generator) -> None:
    dim = [2, 3, 2, 4]
    g = double_graph()
    x = g.tensor(dim, stride=gd.nhwc_strides(dim), name="x")
    b = g.tensor([1, 3, 1, 1], name="b")
    y = g.bias(x, b).set_output(True)
    feeds = {"x": rng.normal(size=dim), "b": rng.normal(size=(1, 3, 1, 1))}
    np.testing.assert_array_equal(gd.reference.execute(g, feeds)[y.name], feeds["x"] + feeds["b"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda g, a, b, m: g.add(a, b),
            r"node 'add_0', tensor 'b': cannot broadcast a \[2, 3\], b \[4\]: dim 1 is 3 and 4",
        ),
        (
            lambda g, a, b, m: g.sub(b, a),
            r"node 'sub_0', tensor 'a': cannot broadcast a \[4\], b \[2, 3\]: dim 1 is 4 and 3",
        ),
        (
            lambda g, a, b, m: g.binary_select(a, a, m),
            r"node 'binary_select_0', tensor 'm': cannot broadcast input0 \[2, 3\], input1 \[2, 3\], mask \[5, 3, 1\]: "
            "dim 1 is 2 and 3",
        ),
    ],
)
def test_broadcast_errors_name_the_node_the_tensor_and_the_dims(call, message: str) -> None:
    g = double_graph()
    a, b, m = g.tensor([2, 3], name="a"), g.tensor([4], name="b"), g.tensor([5, 3, 1], name="m")
    with pytest.raises(gd.ShapeError, match=message):
        call(g, a, b, m)


def test_attribute_errors() -> None:
    g = double_graph()
    x = g.tensor([2], name="x")
    with pytest.raises(gd.AttributeValueError, match="node 'elu_0': attribute 'alpha' must be a number, got 'big'"):
        g.elu(x, alpha="big")
    with pytest.raises(gd.AttributeValueError, match="attribute 'alpha' must be a finite number, got inf"):
        g.elu(x, alpha=math.inf)
    with pytest.raises(gd.AttributeValueError, match=r"node 'exp_0': unknown attribute 'alpha' \(expected: none\)"):
        g._add_node("exp", {"input": x}, {"alpha": 1.0})


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["float", "half", "bfloat16"])
def test_elementary_ops_on_the_gpu_match_the_reference(io: str) -> None:
    """sin ... logical_not, each an output of its own, on an odd-sized transposed input and a
    broadcast operand; the logical ops read floor/ceil so that zeros occur."""
    from tests.gpu_check import check_on_gpu

    g = gd.OperationGraphSpec(name=f"elementary_{io}", io_data_type=io, intermediate_data_type="float")
    x = g.tensor([3, 5, 33], stride=[165, 1, 5], name="x")
    b = g.tensor([1, 5, 1], name="b")
    for kind in ("sin", "cos", "erf", "floor", "ceil", "logical_not"):
        getattr(g, kind)(x).set_name(kind).set_output(True)
    g.mod(x, b).set_name("mod").set_output(True)
    g.logical_and(g.floor(x), g.ceil(b)).set_name("and").set_output(True)
    g.logical_or(g.floor(x), g.floor(b)).set_name("or").set_output(True)
    check_on_gpu(g)
