"""The execution API on the GPU (`gpu` marker: skipped without an NVIDIA GPU and torch).

Buffers from torch, CuPy and a DLPack-only object; streams as ints and torch streams;
missing outputs allocated; bad buffers rejected before any launch; bind() and CUDA-graph
replay equal to execute(); the example graphs through ``graphdnn run --check``. Host
overhead is measured and printed, not asserted (speed targets live in benchmarks/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import cli, reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from graphdnn.runtime.frameworks import to_torch
from tests import plan_graphs
from tests.gpu_check import check_on_gpu, poisoned, to_numpy

pytestmark = pytest.mark.gpu
EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "graphs").glob("*.json"))


def torch_pack(graph: gd.OperationGraphSpec, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inputs on the GPU (scalars as numbers) and the reference outputs."""
    ir = graph.validate()
    feeds = random_inputs(ir, seed)
    pack = {t.name: float(feeds[t.name][0]) if t.is_pass_by_value else to_torch(feeds[t.name], t) for t in ir.inputs}
    return pack, reference.execute(ir, feeds)


def assert_matches(got: Any, want: np.ndarray, data_type: gd.DataType) -> None:
    error = relative_error(to_numpy(got) if hasattr(got, "detach") else np.asarray(got), want)
    assert error <= tolerance(data_type), f"relative error {error:.3g}"


@pytest.mark.parametrize(
    "graph", [plan_graphs.add_relu(), plan_graphs.scaled(), plan_graphs.sum_then_add()], ids=lambda g: g.name
)
def test_execute_with_torch_tensors_matches_the_reference(graph: gd.OperationGraphSpec) -> None:
    plan = check_on_gpu(graph)
    assert plan.arch == current_gpu_arch()


def test_outputs_are_written_in_place_and_missing_ones_allocated() -> None:
    import torch

    graph = plan_graphs.scaled()
    ir = graph.validate()
    pack, want = torch_pack(graph)
    plan = gd.compile(graph)
    outputs = plan.execute(pack)  # y left out: allocated as a torch tensor with the graph's strides
    torch.cuda.synchronize()
    y = outputs["y"]
    assert isinstance(y, torch.Tensor) and tuple(y.stride()) == ir.tensor("y").stride
    assert_matches(y, want["y"], gd.DataType.FLOAT)
    given = poisoned(ir.tensor("y"))
    assert plan.execute({**pack, "y": given})["y"] is given
    torch.cuda.synchronize()
    assert_matches(given, want["y"], gd.DataType.FLOAT)


def test_cupy_arrays() -> None:
    cupy = pytest.importorskip("cupy")
    graph = plan_graphs.add_relu(dtype="float")
    ir = graph.validate()
    feeds = random_inputs(ir, 1)
    pack = {name: cupy.asarray(values) for name, values in feeds.items()}
    outputs = gd.compile(graph).execute(pack)
    cupy.cuda.runtime.deviceSynchronize()
    assert isinstance(outputs["y"], cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(outputs["y"]), reference.execute(ir, feeds)["y"], rtol=1e-6)


class DLPackOnly:
    """Exposes a tensor through DLPack alone (no torch fast path, no __cuda_array_interface__)."""

    def __init__(self, tensor: Any) -> None:
        self._tensor = tensor

    def __dlpack__(self, stream: int | None = None) -> Any:
        return self._tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        device_type, ordinal = self._tensor.__dlpack_device__()
        return int(device_type), int(ordinal)


def test_a_dlpack_only_object() -> None:
    import torch

    graph = plan_graphs.add_relu(dtype="bf16")
    pack, want = torch_pack(graph)
    y = poisoned(graph.validate().tensor("y"))
    gd.compile(graph).execute({name: DLPackOnly(value) for name, value in {**pack, "y": y}.items()})
    torch.cuda.synchronize()
    assert_matches(y, want["y"], gd.DataType.BFLOAT16)


@pytest.mark.parametrize("as_int", [True, False], ids=["int handle", "torch stream"])
def test_streams(as_int: bool) -> None:
    import torch

    graph = plan_graphs.sum_then_add()
    pack, want = torch_pack(graph)
    y = poisoned(graph.validate().tensor("y"))
    stream = torch.cuda.Stream()
    torch.cuda.current_stream().synchronize()  # the inputs are ready before the side stream starts
    gd.compile(graph).execute({**pack, "y": y}, stream=stream.cuda_stream if as_int else stream)
    stream.synchronize()
    assert_matches(y, want["y"], gd.DataType.FLOAT)


def test_an_explicit_workspace() -> None:
    import torch

    graph = plan_graphs.sum_then_add()
    plan = gd.compile(graph)
    assert plan.workspace_size > 0
    pack, want = torch_pack(graph)
    workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    y = plan.execute(pack, workspace=workspace)["y"]
    torch.cuda.synchronize()
    assert_matches(y, want["y"], gd.DataType.FLOAT)
    with pytest.raises(gd.FeedError, match=f"workspace has 8 bytes; the plan needs {plan.workspace_size}"):
        plan.execute(pack, workspace=workspace[:8])


def test_unaligned_buffers_take_the_element_path() -> None:
    import torch

    graph = plan_graphs.add_relu(dtype="half")
    ir = graph.validate()
    pack, want = torch_pack(graph)
    storage = torch.empty(8 * 33 + 1, dtype=torch.float16, device="cuda")
    x = storage[1:].view(8, 33)  # 2 bytes past a 16-byte boundary: element-aligned, not vector-aligned
    x.copy_(pack["x"])
    y = poisoned(ir.tensor("y"))
    bound = gd.compile(graph).bind({**pack, "x": x, "y": y})
    (launch,) = bound.launches
    aligned_slot = next(i for i, a in enumerate(launch.args) if a.kind.value == "aligned")
    assert int(bound._slots[0][aligned_slot]) == 0
    bound()
    torch.cuda.synchronize()
    assert_matches(y, want["y"], gd.DataType.HALF)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda x: x.t().contiguous().t(), r"tensor 'x': has strides \[1, 8\], the graph declares \[33, 1\]"),
        (lambda x: x.float(), "tensor 'x': has data type float32, the graph declares half"),
        (lambda x: x[:, :32], r"tensor 'x': has dims \[8, 32\], the graph declares \[8, 33\]"),
        (lambda x: x.cpu(), "tensor 'x': is in cpu memory \\(a torch tensor\\); it must be in GPU memory"),
    ],
    ids=["stride", "dtype", "shape", "device"],
)
def test_bad_buffers_are_rejected_before_launch(make: Any, message: str) -> None:
    graph = plan_graphs.add_relu(dtype="half")
    pack, _ = torch_pack(graph)
    y = poisoned(graph.validate().tensor("y"))
    with pytest.raises(gd.FeedError, match=message):
        gd.compile(graph).execute({**pack, "x": make(pack["x"]), "y": y})
    assert bool(y.isnan().all())  # nothing ran


def test_a_plan_for_another_architecture_is_refused() -> None:
    device_arch = current_gpu_arch()
    other = "sm_80" if device_arch // 10 != 8 else "sm_90"
    graph = plan_graphs.add_relu()
    pack, _ = torch_pack(graph)
    with pytest.raises(gd.UnsupportedError, match=f"was compiled for {other}"):
        gd.compile(graph, arch=other).execute(pack)


def test_bind_and_cuda_graph_replay_equal_execute() -> None:
    import torch

    from graphdnn.runtime.timing import host_us_per_call

    graph = plan_graphs.sum_then_add()
    plan = gd.compile(graph)
    pack, want = torch_pack(graph)
    results = {}
    for mode in ("execute", "bind", "cuda_graph"):
        y = poisoned(graph.validate().tensor("y"))
        if mode == "execute":
            plan.execute({**pack, "y": y})
        else:
            bound = plan.bind({**pack, "y": y}, cuda_graph=mode == "cuda_graph")
            bound()
            bound()
            print(f"\n{mode}: host time per call {host_us_per_call(bound):.1f} µs ({len(plan.kernels)} kernels)")
        torch.cuda.synchronize()
        results[mode] = to_numpy(y)
        assert_matches(y, want["y"], gd.DataType.FLOAT)
    np.testing.assert_array_equal(results["bind"], results["execute"])
    np.testing.assert_array_equal(results["cuda_graph"], results["execute"])


def test_one_kernel_host_overhead_is_reported() -> None:
    from graphdnn.runtime.timing import host_us_per_call

    graph = plan_graphs.add_relu()
    pack, _ = torch_pack(graph)
    bound = gd.compile(graph).bind(pack)
    print(f"\none-kernel plan: host time per pre-bound call {host_us_per_call(bound, 5000):.2f} µs")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_graphdnn_run_check_passes_on_every_example(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(path), "--check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "backend gpu (a GPU is present)" in out and "check: passed" in out
