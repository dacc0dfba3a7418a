"""Buffers of other libraries on the GPU, read through cuda.core's StridedMemoryView (`gpu`).

CuPy arrays with the strides the graph declares (gaps, a column-major input), an object
with nothing but ``__cuda_array_interface__`` (its producer stream honoured), a DLPack-only
object, the same array as two inputs and as input and output: each run compared with the
NumPy reference. Bad buffers (reversed views, zero rows, a wrong type, host memory, a
read-only output) are refused before any launch, naming the tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from tests.test_gpu_execution import DLPackOnly  # a legacy producer: no max_version argument

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

ROWS, COLS = 7, 33


class InterfaceOnly:
    """A GPU array seen through ``__cuda_array_interface__`` alone (as Numba or PyCUDA arrays are)."""

    def __init__(self, array: Any, *, stream: int | None = None, readonly: bool = False) -> None:
        interface = dict(array.__cuda_array_interface__)
        interface["stream"] = stream
        interface["data"] = (interface["data"][0], readonly)
        self.__cuda_array_interface__ = interface
        self._array = array  # keeps the memory alive


def strided_graph() -> gd.OperationGraphSpec:
    """y = relu(x * w + b): x every other column of a wider array, w column-major, b broadcast."""
    g = gd.OperationGraphSpec(name="strided_cupy", io_data_type="float")
    x = g.tensor(name="x", dim=[ROWS, COLS], stride=[2 * COLS + 4, 2])
    w = g.tensor(name="w", dim=[ROWS, COLS], stride=[1, ROWS])
    b = g.tensor(name="b", dim=[1, COLS])
    g.relu(g.add(g.mul(x, w), b)).set_name("y").set_output(True)
    return g


def inputs(seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """CuPy arrays with the graph's strides, and their values for the reference."""
    rng = np.random.default_rng(seed)
    values = {
        "x": rng.standard_normal((ROWS, COLS)).astype(np.float32),
        "w": rng.standard_normal((ROWS, COLS)).astype(np.float32),
        "b": rng.standard_normal((1, COLS)).astype(np.float32),
    }
    wide = cupy.zeros((ROWS, 2 * COLS + 4), dtype=cupy.float32)
    x = wide[:, : 2 * COLS : 2]
    x[...] = cupy.asarray(values["x"])
    w = cupy.asfortranarray(cupy.asarray(values["w"]))
    return {"x": x, "w": w, "b": cupy.asarray(values["b"])}, values


def assert_matches(got: Any, want: np.ndarray) -> None:
    error = relative_error(cupy.asnumpy(got), want)
    assert error <= tolerance(gd.DataType.FLOAT), f"relative error {error:.3g}"


@pytest.fixture(scope="module")
def plan() -> gd.Plan:
    plan = gd.compile(strided_graph())
    assert isinstance(plan, gd.Plan)
    return plan


def want(values: dict[str, np.ndarray]) -> np.ndarray:
    return reference.execute(strided_graph().validate(), values)["y"]


def test_cupy_arrays_with_the_graphs_strides(plan: gd.Plan) -> None:
    pack, values = inputs()
    assert pack["x"].strides == ((2 * COLS + 4) * 4, 8) and not pack["w"].flags.c_contiguous
    allocated = plan.execute(pack)["y"]  # left out: a CuPy array
    given = cupy.full((ROWS, COLS), cupy.nan, dtype=cupy.float32)
    assert plan.execute({**pack, "y": given})["y"] is given
    cupy.cuda.runtime.deviceSynchronize()
    assert isinstance(allocated, cupy.ndarray)
    assert_matches(allocated, want(values))
    assert_matches(given, want(values))


def test_an_interface_only_object_from_another_stream(plan: gd.Plan) -> None:
    side = cupy.cuda.Stream(non_blocking=True)
    pack, values = inputs(1)
    cupy.cuda.runtime.deviceSynchronize()  # the inputs are ready before the side stream reads them
    with side:
        x = pack["x"] * 1  # written on the side stream, still in flight when the plan is launched
        x_wide = cupy.zeros((ROWS, 2 * COLS + 4), dtype=cupy.float32)
        x_wide[:, : 2 * COLS : 2] = x
    y = cupy.full((ROWS, COLS), cupy.nan, dtype=cupy.float32)
    objects = {
        "x": InterfaceOnly(x_wide[:, : 2 * COLS : 2], stream=side.ptr),
        "w": InterfaceOnly(pack["w"]),
        "b": InterfaceOnly(pack["b"], readonly=True),  # a read-only input is fine
        "y": InterfaceOnly(y),
    }
    for _ in range(2):  # another stream than the plan's: ordered at every call
        plan.execute(objects)
    cupy.cuda.runtime.deviceSynchronize()
    assert_matches(y, want(values))


def test_a_dlpack_only_object(plan: gd.Plan) -> None:
    pack, values = inputs(2)
    y = cupy.full((ROWS, COLS), cupy.nan, dtype=cupy.float32)
    plan.execute({name: DLPackOnly(value) for name, value in {**pack, "y": y}.items()})
    cupy.cuda.runtime.deviceSynchronize()
    assert_matches(y, want(values))


def test_one_array_as_two_inputs_and_in_place() -> None:
    g = gd.OperationGraphSpec(name="mul_add_cupy", io_data_type="float")
    a, c = g.tensor(name="a", dim=[ROWS, COLS]), g.tensor(name="c", dim=[ROWS, COLS])
    g.add(g.mul(a, c), a).set_name("y").set_output(True)
    plan = gd.compile(g)
    values = np.random.default_rng(3).standard_normal((ROWS, COLS)).astype(np.float32)
    expected = reference.execute(g.validate(), {"a": values, "c": values})["y"]
    shared = cupy.asarray(values)
    plan.execute({"a": shared, "c": shared, "y": shared})  # y = a * a + a, written over a
    cupy.cuda.runtime.deviceSynchronize()
    assert_matches(shared, expected)


@pytest.mark.parametrize(
    ("name", "make", "message"),
    [
        ("x", lambda p: p["x"][:, ::-1], r"tensor 'x': has strides \[70, -2\]: a reversed view"),
        ("x", lambda p: p["x"][:0], r"tensor 'x': has dims \[0, 33\], the graph declares \[7, 33\]"),
        ("b", lambda p: p["b"].astype(cupy.float16), "tensor 'b': has data type float16, the graph declares float"),
        ("w", lambda p: cupy.ascontiguousarray(p["w"]), r"tensor 'w': has strides \[33, 1\], the graph declares"),
        ("b", lambda p: cupy.asnumpy(p["b"]), r"tensor 'b': is in CPU memory \(a numpy.ndarray\)"),
        ("y", lambda p: InterfaceOnly(cupy.empty((ROWS, COLS), "f"), readonly=True), "tensor 'y': is read-only"),
    ],
    ids=["reversed", "zero rows", "half", "row major w", "numpy", "read-only output"],
)  # fmt: skip
def test_bad_buffers_are_refused(plan: gd.Plan, name: str, make: Any, message: str) -> None:
    pack, _ = inputs()
    with pytest.raises(gd.FeedError, match=message):
        plan.execute({**pack, name: make(pack)})
