"""Buffers of other libraries, read through cuda.core's StridedMemoryView, on the CPU.

Host arrays (NumPy, DLPack-only objects over them) go through the real cuda.core; arrays
with ``__cuda_array_interface__`` go through the stand-in driver (tests/fake_gpu.py), whose
reading of the interface is cuda.core's without the driver's answer for the device. Every
bad buffer must be refused before any launch with a FeedError naming its tensor and what
is wrong; the GPU side (CuPy, a real interface-only object) is tests/test_strided_gpu.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.runtime import buffers, strided
from graphdnn.runtime.bind_cache import BindCache
from tests import fake_gpu, plan_graphs

ROWS, COLS = 8, 33  # add_relu: y = relu(x + b), x and y [8, 33], b [1, 33], float


class DLPackOnly:
    """An array seen through DLPack alone (no __cuda_array_interface__, no torch fast path)."""

    def __init__(self, array: Any, device: tuple[int, int] | None = None) -> None:
        self._array = array
        self._device = device

    def __dlpack__(self, stream: int | None = None) -> object:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device or self._array.__dlpack_device__()


class Refusing:
    """A CUDA producer whose export fails."""

    def __dlpack__(self, stream: int | None = None) -> object:
        raise BufferError("no")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (strided.CUDA, 0)


class DLPackWithoutDevice:
    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, stream: int | None = None) -> object:
        return self._array.__dlpack__()


@pytest.fixture(scope="module")
def compiled() -> gd.Plan:
    plan = gd.compile(plan_graphs.add_relu(dtype="float"), arch="sm_90", cache=None)
    assert isinstance(plan, gd.Plan)
    return plan


@pytest.fixture
def plan(compiled: gd.Plan) -> gd.Plan:
    compiled._bound = BindCache()  # no bindings of another test's fake driver
    return compiled


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_gpu.FakeDriver:
    return fake_gpu.install(monkeypatch)


def array(fake: fake_gpu.FakeDriver, shape: tuple[int, ...], **options: Any) -> fake_gpu.FakeArray:
    """A C-contiguous float32 FakeArray; ``strides`` (elements) and FakeArray's options change it."""
    strides = options.pop("strides", gd.packed_strides(list(shape)))
    typestr = options.pop("typestr", "<f4")
    return fake_gpu.FakeArray(fake.allocate(1 << 16), shape, tuple(strides), typestr, **options)


def pack(fake: fake_gpu.FakeDriver, **changes: Any) -> dict[str, Any]:
    values = {"x": array(fake, (ROWS, COLS)), "b": array(fake, (1, COLS)), "y": array(fake, (ROWS, COLS))}
    values.update(changes)
    return values


# -- host memory and DLPack, through the real cuda.core ----------------------------------------


def test_numpy_arrays_are_read_by_cuda_core_and_refused_as_host_memory(fake: Any, plan: gd.Plan) -> None:
    host = np.zeros((ROWS, 2 * COLS), dtype=np.float32)[:, ::2]
    described = buffers.describe(host, 0)
    assert (described.device, described.shape, described.strides) == (None, (ROWS, COLS), (2 * COLS, 2))
    assert described.data_type is gd.DataType.FLOAT and described.pointer == host.ctypes.data
    assert described.where == "CPU memory (a numpy.ndarray)"
    with pytest.raises(gd.FeedError, match=r"tensor 'x': is in CPU memory \(a numpy.ndarray\); it must be in GPU"):
        plan.execute(pack(fake, x=np.zeros((ROWS, COLS), dtype=np.float32)))
    bf16 = np.zeros((ROWS, COLS), dtype=gd.DataType.BFLOAT16.numpy)  # NumPy's DLPack refuses bf16: still host memory
    with pytest.raises(gd.FeedError, match=r"tensor 'b': is in CPU memory \(a numpy.ndarray\)"):
        plan.execute(pack(fake, b=bf16))
    assert fake.calls == []


def test_dlpack_only_objects_keep_their_strides_and_type() -> None:
    base = np.arange(2 * 3 * 4, dtype=np.float16).reshape(2, 3, 4)
    view = base.transpose(0, 2, 1)[:, 1:]
    described = buffers.describe(DLPackOnly(view), 0)
    assert (described.pointer, described.shape, described.strides) == (view.ctypes.data, (2, 3, 3), (12, 1, 4))
    assert described.data_type is gd.DataType.HALF and described.device is None
    assert described.where == "CPU memory (a tests.DLPackOnly)"
    reversed_view = buffers.describe(DLPackOnly(base[:, ::-1, ::2]), 0)
    assert reversed_view.strides == (12, -4, 2)


def test_what_no_protocol_reads_is_refused_with_the_reason() -> None:
    with pytest.raises(gd.FeedError, match="is a str; give a torch tensor, a CuPy array"):
        buffers.describe("nope", 0)
    with pytest.raises(gd.FeedError, match="with __dlpack__ but no __dlpack_device__"):
        buffers.describe(DLPackWithoutDevice(np.zeros(3)), 0)
    with pytest.raises(gd.FeedError, match=r"is in ROCm memory \(a tests.DLPackOnly\); it must be in GPU memory"):
        buffers.describe(DLPackOnly(np.zeros(3), device=(10, 0)), 0)
    with pytest.raises(gd.FeedError, match=r"is a tests.Refusing that cannot be read through DLPack: BufferError: no"):
        buffers.describe(Refusing(), 0)


# -- __cuda_array_interface__ objects, bound on the stand-in driver ---------------------------------


def test_an_interface_only_object_binds_and_launches(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> None:
    values = pack(fake)
    values["b"].__cuda_array_interface__["strides"] = None  # C-contiguous, as the interface allows
    assert plan.execute(values) == {"y": values["y"]}
    assert fake.calls == [("launch", plan.program.launches[0].name)]
    assert {view.stream_ptr for view in fake_gpu.VIEWS} == {1}  # the legacy default stream, as the protocol says it


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x": {"typestr": "<f2"}}, "tensor 'x': has data type float16, the graph declares float"),
        ({"x": {"typestr": "<c8"}}, "tensor 'x': has data type complex64, the graph declares float"),
        ({"x": {"shape": (COLS, ROWS)}}, r"tensor 'x': has dims \[33, 8\], the graph declares \[8, 33\]"),
        ({"x": {"shape": (0, COLS)}}, r"tensor 'x': has dims \[0, 33\], the graph declares \[8, 33\]"),
        ({"b": {"shape": (COLS,)}}, r"tensor 'b': has dims \[33\], the graph declares \[1, 33\]"),
        ({"x": {"strides": (2 * COLS, 2)}}, r"tensor 'x': has strides \[66, 2\], the graph declares \[33, 1\]"),
        ({"x": {"strides": (1, ROWS)}}, r"tensor 'x': has strides \[1, 8\], the graph declares \[33, 1\]"),
        ({"x": {"strides": (COLS, -1)}}, r"tensor 'x': has strides \[33, -1\]: a reversed view"),
        ({"x": {"strides": (COLS, (1 << 62) - 2)}}, r"tensor 'x': has strides \[33, -2\]: a reversed view"),
        ({"y": {"readonly": True}}, "tensor 'y': is read-only .*; the plan writes it"),
        ({"x": {"device": 1}}, "tensor 'x': is on cuda:1, the plan runs on cuda:0"),
    ],
    ids=["half", "complex", "transposed dims", "zero rows", "missing dim", "odd strides", "column major",
         "negative stride", "negative stride as cuda.core 1.2.0 reads it", "read-only output", "other device"],
)  # fmt: skip
def test_bad_interface_buffers_are_refused_before_any_launch(
    fake: fake_gpu.FakeDriver, plan: gd.Plan, changes: dict[str, dict[str, Any]], message: str
) -> None:
    ((name, given),) = changes.items()
    options = dict(given)
    shape = options.pop("shape", (1, COLS) if name == "b" else (ROWS, COLS))
    if "strides" not in options:
        options["strides"] = gd.packed_strides(list(shape))
    with pytest.raises(gd.FeedError, match=message):
        plan.execute(pack(fake, **{name: array(fake, shape, **options)}))
    assert fake.calls == []


def test_unreadable_interfaces_say_why(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> None:
    misstrided = array(fake, (ROWS, COLS))
    misstrided.__cuda_array_interface__["strides"] = (4 * COLS, 6)  # 1.5 elements
    old = array(fake, (ROWS, COLS))
    old.__cuda_array_interface__["version"] = 2
    masked = array(fake, (ROWS, COLS))
    masked.__cuda_array_interface__["mask"] = array(fake, (ROWS, COLS), typestr="|b1")
    for bad, reason in [
        (misstrided, "ValueError: strides must be divisible by itemsize"),
        (old, "BufferError: only CUDA Array Interface v3"),
        (masked, "BufferError: mask is not supported"),
    ]:
        with pytest.raises(gd.FeedError, match=f"tensor 'x': is a tests.FakeArray that cannot be read through "
                           f"__cuda_array_interface__: {reason}"):  # fmt: skip
            plan.execute(pack(fake, x=bad))
    misaligned = array(fake, (ROWS, COLS))
    misaligned.__cuda_array_interface__["data"] = (misaligned.args[0] + 2, False)
    with pytest.raises(gd.FeedError, match=r"tensor 'x': starts at address 0x.*2, not aligned to its element size"):
        plan.execute(pack(fake, x=misaligned))
    assert fake.calls == []


def test_a_read_only_input_is_fine(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> None:
    plan.execute(pack(fake, x=array(fake, (ROWS, COLS), readonly=True)))
    assert len(fake.calls) == 1


def test_a_read_only_workspace_is_refused(fake: fake_gpu.FakeDriver) -> None:
    summed = gd.compile(plan_graphs.sum_then_add(), arch="sm_90", cache=None)
    values = {t.name: array(fake, t.dim, strides=t.stride) for t in (*summed.inputs, *summed.outputs)}
    workspace = array(fake, (summed.workspace_size // 4,), readonly=True)
    with pytest.raises(gd.FeedError, match="workspace is read-only"):
        summed.execute(values, workspace=workspace)


# -- aliasing: what the runtime promised before still holds for interface buffers ------------------


def test_one_buffer_as_two_inputs_and_as_input_and_output(fake: fake_gpu.FakeDriver) -> None:
    g = gd.OperationGraphSpec(name="mul_add", io_data_type="float")
    a, c = g.tensor(name="a", dim=[ROWS, COLS]), g.tensor(name="c", dim=[ROWS, COLS])
    g.add(g.mul(a, c), a).set_name("y").set_output(True)
    plan = gd.compile(g, arch="sm_90", cache=None)
    shared = array(fake, (ROWS, COLS))
    bound = plan.bind({"a": shared, "c": shared, "y": array(fake, (ROWS, COLS))})  # inputs may share memory
    assert bound.copies == () and len(bound.launches) == 1
    in_place = plan.bind({"a": shared, "c": shared, "y": shared})  # an elementwise kernel over its own input
    assert in_place.copies == () and len(in_place.launches) == 1
    shifted = fake_gpu.FakeArray(shared.args[0] + 4, (ROWS, COLS), (COLS, 1), "<f4")  # y one element past a
    (copy,) = plan.bind({"a": shared, "c": array(fake, (ROWS, COLS)), "y": shifted}).copies
    assert copy.source == shared.args[0]  # a is read from a copy made before the kernel writes over it


def test_outputs_sharing_memory_are_still_refused(fake: fake_gpu.FakeDriver) -> None:
    plan = gd.compile(plan_graphs.add_relu_and_sigmoid(), arch="sm_90", cache=None)
    y = array(fake, (ROWS, COLS))
    s = fake_gpu.FakeArray(y.args[0], (4, 5), (5, 1), "<f2")
    values = {"x": array(fake, (ROWS, COLS), typestr="<f2"), "b": array(fake, (1, COLS), typestr="<f2")}
    values.update(y=fake_gpu.FakeArray(y.args[0], (ROWS, COLS), (COLS, 1), "<f2"), z=array(fake, (4, 5)), s=s)
    with pytest.raises(gd.FeedError, match="shares memory with output"):
        plan.execute(values)
    assert fake.calls == []


# -- streams: the interface's producer stream is waited for on every call ---------------------------


def test_the_plans_stream_is_the_consumer_stream(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> None:
    plan.execute(pack(fake), stream=0x55)
    assert {view.stream_ptr for view in fake_gpu.VIEWS} == {0x55}


def test_interface_buffers_of_another_stream_are_read_on_every_call(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> None:
    same_stream = pack(fake, x=array(fake, (ROWS, COLS), stream=1))  # CuPy's legacy default stream
    for _ in range(3):
        plan.execute(same_stream)
    assert len(fake_gpu.VIEWS) == 3 and len(plan._bound) == 1  # read once, then the binding is reused
    fake_gpu.VIEWS.clear()
    other_stream = pack(fake, x=array(fake, (ROWS, COLS), stream=0x77))
    for _ in range(3):
        plan.execute(other_stream)
    assert len(fake_gpu.VIEWS) == 3 * 3  # cuda.core orders stream 0x77 before the plan's at every call
    assert len(fake.calls) == 6
