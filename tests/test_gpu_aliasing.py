"""Outputs sharing memory with inputs, and inputs with overlapping strides, on the GPU (`gpu`).

Every result is compared with the reference computed from copies of the inputs taken
before the run (the run writes over them). Host costs are printed, not asserted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.runtime.frameworks import empty_torch, torch_dtype
from tests import plan_graphs
from tests.gpu_check import check_on_gpu, to_numpy
from tests.test_aliasing import broadcast_add, mixed_precision_matmul, rope

pytestmark = pytest.mark.gpu


def random_torch(t: gd.Tensor, seed: int) -> Any:
    import torch

    generator = torch.Generator(device="cuda").manual_seed(seed)
    out = empty_torch(t)
    out.copy_(torch.randn(t.dim, generator=generator, device="cuda", dtype=torch.float32))
    return out


def expected(ir: gd.Graph, pack: dict[str, Any]) -> dict[str, np.ndarray]:
    """The reference outputs from the inputs as they are now (before the run writes over them)."""
    feeds = {t.name: to_numpy(pack[t.name]).astype(t.data_type.numpy) for t in ir.inputs}
    return reference.execute(ir, feeds)


def assert_close(got: Any, want: np.ndarray, data_type: gd.DataType, what: str) -> None:
    error = relative_error(to_numpy(got), want.astype(np.float64))
    assert error <= tolerance(data_type), f"{what}: relative error {error:.3g}"


@pytest.mark.parametrize("dtype", ["float", "half"])
def test_relu_written_into_its_input(dtype: str) -> None:
    import torch

    g = gd.OperationGraphSpec(name="relu_in_place", io_data_type=dtype)
    g.relu(g.tensor(name="x", dim=[8, 1000])).set_name("y").set_output(True)
    ir = g.validate()
    x = random_torch(ir.tensor("x"), 0)
    want = expected(ir, {"x": x})
    outputs = gd.compile(g).execute({"x": x, "y": x})
    torch.cuda.synchronize()
    assert outputs["y"] is x
    assert_close(x, want["y"], ir.tensor("y").data_type, "y over x")


@pytest.mark.parametrize("over", ["x", "b"], ids=["into x", "into the broadcast b's memory"])
def test_add_written_into_an_input(over: str) -> None:
    import torch

    graph = plan_graphs.add_relu(dtype="float")
    ir = graph.validate()
    x, b = random_torch(ir.tensor("x"), 1), random_torch(ir.tensor("b"), 2)
    want = expected(ir, {"x": x, "b": b})
    if over == "x":
        y = x
    else:  # y's first row is b's memory: b is copied before the kernel writes over it
        storage = torch.empty(8 * 33, dtype=torch.float32, device="cuda")
        storage[:33].copy_(b.view(-1))
        b, y = storage[:33].view(1, 33), storage.view(8, 33)
    gd.compile(graph).execute({"x": x, "b": b, "y": y})
    torch.cuda.synchronize()
    assert_close(y, want["y"], gd.DataType.FLOAT, f"y over {over}")


def test_an_output_partially_over_its_input() -> None:
    import torch

    graph = plan_graphs.add_relu(dtype="half")
    ir = graph.validate()
    storage = torch.randn(8 * 33 + 40, device="cuda").half()
    x, y = storage[:264].view(8, 33), storage[40:304].view(8, 33)  # y starts 40 elements into x
    b = random_torch(ir.tensor("b"), 3)
    want = expected(ir, {"x": x, "b": b})
    bound = gd.compile(graph).bind({"x": x, "b": b, "y": y})
    assert len(bound.copies) == 1
    bound()
    torch.cuda.synchronize()
    assert_close(y, want["y"], gd.DataType.HALF, "y partly over x")


@pytest.mark.parametrize("mode", ["execute", "bind", "cuda_graph"])
@pytest.mark.parametrize("dtype", ["float", "half"])
def test_rope_in_place(dtype: str, mode: str) -> None:
    """The frontend's in-place RoPE sample: Y1 into X1's memory, Y2 into X2's (issue 8:
    Y2 came out with relative error 0.95)."""
    import torch

    graph = rope(dtype)
    ir = graph.validate()
    pack = {t.name: random_torch(t, i) for i, t in enumerate(ir.inputs)}
    want = expected(ir, pack)
    plan = gd.compile(graph)
    in_place = {**pack, "y1": pack["x1"], "y2": pack["x2"]}
    if mode == "execute":
        plan.execute(in_place)
    else:
        bound = plan.bind(in_place, cuda_graph=mode == "cuda_graph")
        bound()
    torch.cuda.synchronize()
    for name, memory in (("y1", "x1"), ("y2", "x2")):
        assert_close(pack[memory], want[name], ir.tensor(name).data_type, f"{name} over {memory}")


def test_rope_outputs_sharing_memory_are_refused() -> None:
    graph = rope()
    ir = graph.validate()
    pack = {t.name: random_torch(t, 0) for t in ir.inputs}
    y = empty_torch(ir.tensor("y1"))
    with pytest.raises(gd.FeedError, match="tensor 'y1': shares memory with output 'y2'"):
        gd.compile(graph).execute({**pack, "y1": y, "y2": y})


@pytest.mark.parametrize("make", [mixed_precision_matmul, broadcast_add], ids=lambda f: f.__name__)
def test_inputs_with_overlapping_strides(make: Any) -> None:
    import torch

    graph = make()
    ir = graph.validate()
    pack = {}
    for i, t in enumerate(ir.inputs):
        extent = 1 + sum((d - 1) * s for d, s in zip(t.dim, t.stride))
        storage = torch.randn(extent, device="cuda", generator=torch.Generator(device="cuda").manual_seed(i))
        pack[t.name] = storage.to(torch_dtype(t.data_type)).as_strided(t.dim, t.stride)
    want = expected(ir, pack)
    (out,) = ir.outputs
    got = gd.compile(graph).execute(pack)[out.name]
    torch.cuda.synchronize()
    assert_close(got, want[out.name], out.data_type, out.name)


@pytest.mark.parametrize("make", [mixed_precision_matmul, broadcast_add], ids=lambda f: f.__name__)
def test_overlapping_inputs_through_check_on_gpu(make: Any) -> None:
    """random_inputs draws values for the memory, to_torch lays them out through as_strided."""
    check_on_gpu(make())


def test_execute_rebinds_when_a_tensor_changes_storage() -> None:
    import torch

    graph = plan_graphs.add_relu(dtype="float")
    ir = graph.validate()
    pack = {t.name: random_torch(t, i) for i, t in enumerate((*ir.inputs, *ir.outputs))}
    plan = gd.compile(graph)
    plan.execute(pack)
    x = pack["x"]
    new = random_torch(ir.tensor("x"), 9)
    x.set_(new.untyped_storage(), 0, new.size(), new.stride())  # the same object over new memory
    want = expected(ir, pack)
    plan.execute(pack)
    torch.cuda.synchronize()
    assert_close(pack["y"], want["y"], gd.DataType.FLOAT, "y after x changed storage")


def test_execute_host_cost_is_reported() -> None:
    from benchmarks.measure import host_us_per_call

    graph = plan_graphs.add_relu()
    ir = graph.validate()
    pack = {t.name: random_torch(t, i) for i, t in enumerate((*ir.inputs, *ir.outputs))}
    plan = gd.compile(graph)
    bound = plan.bind(pack)
    print(
        f"\none-kernel plan: bound call {host_us_per_call(bound):.2f} µs, "
        f"execute {host_us_per_call(lambda: plan.execute(pack)):.2f} µs, "
        f"execute in place {host_us_per_call(lambda: plan.execute({**pack, 'y': pack['x']})):.2f} µs per call"
    )
