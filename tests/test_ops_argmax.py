"""argmax / argmin: the reference (first index on ties, NaN first), shapes, index types, errors,
JSON; kernels on both mappings compile for every target; on the GPU, ties, NaN and infinities
against the reference with poisoned outputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import graphdnn as gd
from codegen import emit_partition
from fusion_rules import Family

from .compile_check import compile_graphs


def graph(io: str = "double") -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(name=f"arg_{io}", io_data_type=io, intermediate_data_type="float")


def loop_arg(x: np.ndarray, axis: int, better: Callable[[float, float], bool]) -> np.ndarray:
    """The first index whose value no other beats, scanning the axis in order; NaN beats all."""
    moved = np.moveaxis(x, axis, -1)
    out = np.empty((*moved.shape[:-1], 1))
    for index in np.ndindex(*moved.shape[:-1]):
        row = moved[index]
        best = 0
        for i, v in enumerate(row):
            if np.isnan(row[best]):
                break
            if np.isnan(v) or better(v, row[best]):
                best = i
        out[index] = best
    return np.moveaxis(out, -1, axis)


KINDS: dict[str, Callable[[float, float], bool]] = {"argmax": lambda a, b: a > b, "argmin": lambda a, b: a < b}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reference_is_the_first_best_index_with_ties_nan_and_infinities(
    kind: str, axis: int, rng: np.random.Generator
) -> None:
    x = rng.integers(-2, 3, (4, 6, 5)).astype(np.float64)  # many ties
    x[0, 2, 3], x[1, 4, 0], x[2, 0, 0], x[3, 5, 4] = np.nan, np.nan, np.inf, -np.inf
    g = graph()
    y = getattr(g, kind)(g.tensor([4, 6, 5], name="x"), axis=axis).set_output(True)
    assert y.dim == tuple(1 if a == axis % 3 else d for a, d in enumerate((4, 6, 5)))
    got = gd.reference.execute(g, {"x": x})[y.name]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, loop_arg(x, axis, KINDS[kind]))


def test_index_types_layout_and_json() -> None:
    g = graph()
    x = g.tensor([2, 3, 4], stride=gd.nhwc_strides([2, 3, 4]), name="x")
    small = g.argmin(x, axis=1, index_data_type="int32").set_output(True)
    assert small.data_type is gd.DataType.INT32 and small.stride == gd.nhwc_strides([2, 1, 4])
    big = g.argmax(x, axis=0).set_output(True)
    assert big.data_type is gd.DataType.INT64
    text = g.to_json()
    assert '"attributes": {"axis": 1, "index_data_type": "int32"}' in text
    assert gd.OperationGraphSpec.from_json(text).signature() == g.signature()


def test_errors_name_the_node() -> None:
    g = graph()
    x = g.tensor([2, 3], name="x")
    with pytest.raises(gd.AttributeValueError, match=r"node 'far'.*axis 2 is out of range for rank 2"):
        g.argmax(x, axis=2, name="far")
    with pytest.raises(gd.AttributeValueError, match=r"node 'wide'.*'index_data_type' must be one of 'int32', 'int64'"):
        g.argmax(x, index_data_type="float", name="wide")
    with pytest.raises(gd.DataTypeError, match=r"node 'typed'.*'idx' is float; argmin writes it as int64"):
        g.argmin(x, name="typed").set_name("idx").set_data_type("float").set_output(True)
        g.validate()
    huge = graph()
    long_rows = huge.tensor([2, 2**31 + 2], name="long")
    with pytest.raises(gd.ShapeError, match=r"node 'i32'.*2147483650 elements: its indices need index_data_type int64"):
        huge.argmax(long_rows, index_data_type="int32", name="i32")


def arg_graph(io: str, dims: list[int], axis: int, stride: list[int] | None = None) -> gd.OperationGraphSpec:
    """argmax alone, and argmin + 1 (an epilogue on the index) into an int32 output."""
    g = gd.OperationGraphSpec(name=f"arg_{io}_{len(dims)}_{axis}", io_data_type=io, intermediate_data_type="float")
    x = g.tensor(dims, stride, name="x")
    g.argmax(x, axis=axis, name="amax").set_name("imax").set_output(True)
    shifted = g.add(g.argmin(x, axis=axis, index_data_type="int32", name="amin"), 1.0, name="plus1")
    shifted.set_name("imin_plus_1").set_data_type("int32").set_output(True)
    return g


# name -> (dims, axis, strides): rows (axis innermost) and columns mappings, long rows, odd sizes
CASES = {
    "rows": ([5, 6, 33], -1, None),
    "long_rows": ([2, 40000], 1, None),
    "columns": ([5, 40, 33], 1, None),
    "columns_strided": ([3, 7, 9], 2, [63, 1, 7]),
    "outer": ([64, 24], 0, None),
    "extent_one": ([3, 1, 4], 1, None),
}


@pytest.mark.parametrize("io", ["float", "half", "bfloat16", "fp8_e4m3", "int8", "int32", "double"])
def test_kernels_compile_for_every_target(io: str) -> None:
    graphs = [arg_graph(io, dims, axis, stride).validate() for dims, axis, stride in CASES.values()]
    report = compile_graphs(graphs)
    assert report.failures == [], "\n\n".join(report.failures)


def test_mappings_and_fusion() -> None:
    for name, label in [("rows", "rows"), ("long_rows", "rows"), ("columns", "columns"), ("outer", "columns")]:
        dims, axis, stride = CASES[name]
        partition = gd.fuse(arg_graph("float", dims, axis, stride).validate())
        assert [f.family for f in partition.nodes] == [Family.REDUCTION, Family.REDUCTION]
        assert sorted(n.name for n in partition.nodes[1].nodes) == ["amin", "plus1"]
        for program in emit_partition(partition, 90):
            (kernel,) = program.kernels
            assert kernel.name.rsplit("_", 2)[-2] == label, (name, kernel.name)


def tied_inputs(dims: list[int], io: str, seed: int) -> np.ndarray:
    """Small integers (ties everywhere), with a NaN, +inf and -inf for floating types."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, dims).astype(np.float64)
    if gd.DataType(io).is_floating:
        flat = x.reshape(-1)
        for value, at in zip((np.nan, np.inf, -np.inf), rng.choice(flat.size, 3, replace=False)):
            flat[at] = value
    return x.astype(gd.DataType(io).numpy)


@pytest.mark.gpu
@pytest.mark.parametrize("io", ["float", "half", "bfloat16", "fp8_e4m3", "int8", "int32", "double"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_matches_the_reference_exactly(case: str, io: str) -> None:
    """Indices are exact: the first tied index and the first NaN, on both mappings."""
    import torch

    from tests.gpu_check import poisoned, to_device, to_numpy

    dims, axis, stride = CASES[case]
    ir = arg_graph(io, dims, axis, stride).validate()
    x = ir.tensor("x")
    feeds = {"x": tied_inputs(dims, io, seed=len(dims) + axis)}
    expected = gd.reference.execute(ir, feeds)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    gd.compile(ir).execute({"x": to_device(feeds["x"], x), **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        np.testing.assert_array_equal(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64), err_msg=t.name)
