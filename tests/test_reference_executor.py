"""The reference executor: binding feeds, rounding every tensor to its type, outputs."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import graphdnn as gd
from graphdnn.dtypes import DataType, round_to
from graphdnn.reference import execute


def scaled_sum_graph(io: str = "float") -> tuple[gd.OperationGraphSpec, gd.TensorSpec]:
    """y = (x + b) * s with s a runtime scalar; inputs x [2, 3], b [1, 3], s [1]."""
    g = gd.OperationGraphSpec(name="g", io_data_type=io)
    x = g.tensor([2, 3], name="x")
    b = g.tensor([1, 3], name="b")
    s = g.tensor([1], is_pass_by_value=True, name="s")
    y = g.mul(g.add(x, b), s, name="y").set_output(True)
    return g, y


def test_feeds_by_tensor_spec_name_uid_or_ir_tensor(rng: np.random.Generator) -> None:
    g, y = scaled_sum_graph()
    ir = g.validate()
    x, b = (rng.normal(size=d).astype(np.float32) for d in ((2, 3), (1, 3)))
    s = np.array([1.5], np.float32)
    expected = (x + b) * np.float32(1.5)  # the float intermediate x + b is rounded too
    by_spec = execute(g, {g.tensor_named("x"): x, g.tensor_named("b"): b, g.tensor_named("s"): s})
    by_name = execute(g, {"x": x, "b": b, "s": s})
    by_uid = execute(ir, {ir.tensor("x").uid: x, ir.tensor("b").uid: b, ir.tensor("s").uid: s})
    by_ir_tensor = execute(ir, {ir.tensor("x"): x, "b": b, g.tensor_named("s").uid: s})
    for out in (by_spec, by_name, by_uid, by_ir_tensor):
        assert list(out) == [y.name]
        assert out[y.name].dtype == np.float32
        np.testing.assert_array_equal(out[y.name], expected)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": "X", "b": "B"}, r"graph input 's' has no feed"),
        ({"x": "X", "b": "B", "s": 1.0, "nope": "X"}, r"graph 'g' has no tensor named 'nope'"),
        ({"x": "X", "b": "B", "s": 1.0, 99: "X"}, r"no tensor of graph 'g' has uid 99"),
        (
            {"x": "X", "b": "B", "s": 1.0, "y::y": "X"},
            r"tensor 'y::y' is not a graph input; only inputs are fed",
        ),
        ({"x": "X", "b": "B", "s": 1.0, "add_0::y": "X"}, r"tensor 'add_0::y' is not a graph input"),
        ({"x": "X", "b": "X", "s": 1.0}, r"feed for 'b' has shape \[2, 3\], expected \[1, 3\]"),
        ({"x": "X", "b": "B", "s": np.ones((1, 1), np.float32)}, r"feed for 's' has shape \[1, 1\], expected \[1\]"),
        ({"x": "X64", "b": "B", "s": 1.0}, r"feed for 'x' has dtype float64, expected float32 \(float\)"),
        ({"x": [[0.0] * 3] * 2, "b": "B", "s": 1.0}, r"feed for 'x' is a list; give a NumPy array"),
        ({"x": "X", "b": "B", "s": "1"}, r"feed for 's' is a str; give a NumPy array"),
        ({"x": "X", "b": "B", "s": True}, r"feed for 's' is a bool; give a NumPy array"),
        (
            {"x": "X", "b": "B", "s": 1.0, 2.5: "X"},
            r"cannot use float 2\.5 as a tensor key; use a TensorSpec, a name or a uid",
        ),
    ],
)
def test_bad_feeds_are_feed_errors_naming_the_tensor(feeds: dict, message: str) -> None:
    g, _ = scaled_sum_graph()
    arrays = {
        "X": np.zeros((2, 3), np.float32),
        "B": np.zeros((1, 3), np.float32),
        "X64": np.zeros((2, 3), np.float64),
    }
    feeds = {key: arrays.get(value, value) if isinstance(value, str) else value for key, value in feeds.items()}
    with pytest.raises(gd.FeedError, match=message):
        execute(g, feeds)


def test_a_tensor_fed_twice() -> None:
    g, _ = scaled_sum_graph()
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(gd.FeedError, match="tensor 'x' is fed twice"):
        execute(g, {"x": x, g.tensor_named("x"): x, "b": np.zeros((1, 3), np.float32), "s": 1.0})


def test_constants_are_not_fed() -> None:
    g = gd.OperationGraphSpec(name="g", io_data_type="float")
    y = g.add(g.tensor([2], name="x"), 0.25).set_output(True)
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(execute(g, {"x": x})[y.name], [1.25, 2.25])
    with pytest.raises(gd.FeedError, match="tensor 'add_0::b' is not a graph input"):
        execute(g, {"x": x, "add_0::b": np.array([1.0], np.float32)})


def test_pass_by_value_scalar_fed_as_a_python_number_is_rounded_to_its_type() -> None:
    g = gd.OperationGraphSpec(name="g", io_data_type="double", intermediate_data_type="double")
    x = g.tensor([3], name="x")
    s = g.tensor([1], is_pass_by_value=True, data_type="half", name="s")
    y = g.mul(x, s).set_output(True)
    ones = np.ones(3)
    np.testing.assert_array_equal(execute(g, {"x": ones, "s": 3})[y.name], [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(execute(g, {"x": ones, s: 0.1})[y.name], [float(np.float16(0.1))] * 3)
    np.testing.assert_array_equal(execute(g, {"x": ones, "s": np.array([0.5], np.float16)})[y.name], [0.5] * 3)


def test_bf16_outputs_are_rounded_like_ml_dtypes(rng: np.random.Generator) -> None:
    g = gd.OperationGraphSpec(name="g", io_data_type="bf16")
    x = g.tensor([4, 33], name="x")
    y = g.gelu(x).set_output(True)
    values = rng.normal(size=(4, 33)).astype(ml_dtypes.bfloat16)
    out = execute(g, {"x": values})[y.name]
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    v = values.astype(np.float64)
    exact = np.array([0.5 * a * (1 + math.erf(a / math.sqrt(2))) for a in v.ravel()]).reshape(v.shape)
    np.testing.assert_array_equal(out, exact.astype(ml_dtypes.bfloat16))


def test_every_tensor_is_rounded_to_its_own_type_between_nodes() -> None:
    # (x + 1/3) * 3 in bf16 intermediates differs from the exact value; in double it does not
    def run(intermediate: str) -> np.ndarray:
        g = gd.OperationGraphSpec(name="g", io_data_type="double", intermediate_data_type=intermediate)
        x = g.tensor([3], name="x")
        y = g.mul(g.add(x, g.tensor([1], name="third")), 3.0).set_output(True)
        return execute(g, {"x": np.array([1.0, 10.0, 100.0]), "third": np.array([1 / 3])})[y.name]

    bf16 = ml_dtypes.bfloat16
    expected = [float(bf16(v + 1 / 3)) * 3 for v in (1.0, 10.0, 100.0)]
    np.testing.assert_array_equal(run("bf16"), expected)
    np.testing.assert_allclose(run("double"), [4.0, 31.0, 301.0], rtol=1e-15)
    assert not np.allclose(run("bf16"), run("double"), rtol=1e-4)


@pytest.mark.parametrize(
    ("data_type", "values", "expected"),
    [
        (
            "int8",
            [1.9, -1.9, 0.5, -0.5, 1.5, 2.5, -2.5, 126.7, 127.9, 300.0, -128.9, -1e9, math.nan],
            [2, -2, 0, 0, 2, 2, -2, 127, 127, 127, -128, -128, 0],
        ),
        ("uint8", [1.9, -0.9, -5.0, 254.5, 254.99, 256.0, math.nan], [2, 0, 0, 254, 255, 255, 0]),
        (
            "int32",
            [2.0**31, -(2.0**31) - 5, -7.99, -7.5, math.inf, -math.inf],
            [2**31 - 1, -(2**31), -8, -8, 2**31 - 1, -(2**31)],
        ),
        ("boolean", [0.0, -0.0, 0.1, -3.0, math.nan], [0, 0, 1, 1, 0]),
    ],
)
def test_round_to_integer_types_rounds_half_to_even_and_saturates(
    data_type: str, values: list[float], expected: list[int]
) -> None:
    np.testing.assert_array_equal(round_to(DataType(data_type), np.array(values)), expected)


def test_round_to_int64_saturates_to_values_that_convert_back() -> None:
    """int64's maximum is no float64: the limit is the largest float64 below 2**63, which
    converts back to int64 exactly (2**63 itself would wrap to the minimum)."""
    rounded = round_to(DataType.INT64, np.array([1e30, math.inf, -1e30])).astype(np.int64)
    np.testing.assert_array_equal(rounded, [2**63 - 1024, 2**63 - 1024, -(2**63)])


def test_round_to_floating_types_matches_numpy_and_ml_dtypes() -> None:
    values = np.array([0.1, 1 / 3, 1e5, -2.5e-8, 70000.0, 1e40])
    for data_type in (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2):
        with np.errstate(over="ignore"):
            expected = values.astype(data_type.numpy).astype(np.float64)
        np.testing.assert_array_equal(round_to(data_type, values), expected)
    assert round_to(DataType.HALF, np.array([70000.0]))[0] == math.inf  # fp16 overflows to inf
    np.testing.assert_array_equal(round_to(DataType.DOUBLE, values), values)


def test_integer_outputs_saturate_and_round_half_to_even() -> None:
    g = gd.OperationGraphSpec(name="g", io_data_type="float")
    x = g.tensor([7], name="x")
    y = g.mul(x, 0.5).set_output(True).set_data_type("int8")
    u = g.mul(x, 0.5).set_output(True).set_data_type("uint8")
    feeds = {"x": np.array([3.98, -3.98, 314.0, -599.98, 5.0, 3.0, np.nan], np.float32)}  # x / 2: 2.5 and 1.5 tie
    out = execute(g, feeds)
    assert out[y.name].dtype == np.int8 and out[u.name].dtype == np.uint8
    np.testing.assert_array_equal(out[y.name], [2, -2, 127, -128, 2, 2, 0])
    np.testing.assert_array_equal(out[u.name], [2, 0, 157, 0, 2, 2, 0])


def test_outputs_only_virtual_tensors_stay_inside() -> None:
    g, y = scaled_sum_graph()
    feeds = {"x": np.ones((2, 3), np.float32), "b": np.ones((1, 3), np.float32), "s": 2.0}
    extra = g.tensor_named("add_0::y").set_output(True)
    out = execute(g, feeds)
    assert set(out) == {y.name, extra.name}
    np.testing.assert_array_equal(out[extra.name], np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(out[y.name], np.full((2, 3), 4.0, np.float32))
