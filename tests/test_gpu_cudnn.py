"""Frontend programs through ``graphdnn.cudnn`` on the GPU (`gpu` marker): the programs of
tests/cudnn_programs.py with CUDA torch tensors, run on the compiled plan."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cudnn_programs import PROGRAMS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_program_runs_on_the_gpu(program: str) -> None:
    import torch

    results = PROGRAMS[program]("cuda")
    torch.cuda.synchronize()
    for result in results:
        result.check()


def _matmul_bias_relu(in_place: bool) -> tuple[Any, dict[str, Any]]:
    """The frontend cudagraphs sample's graph, matmul + pass-by-value bias (+ relu), built for
    buffers where D is written over A when ``in_place`` (so the plan copies A first)."""
    import graphdnn.cudnn as cudnn

    batch, m, k = 2, 48, 40
    n = k if in_place else 24
    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    tensors = {
        "A": graph.tensor(name="A", dim=[batch, m, k], stride=[m * k, k, 1], data_type=cudnn.data_type.HALF),
        "B": graph.tensor(name="B", dim=[batch, k, n], stride=[k * n, n, 1], data_type=cudnn.data_type.HALF),
        "bias": graph.tensor(
            name="bias", dim=[1, 1, 1], stride=[1, 1, 1], data_type=cudnn.data_type.FLOAT, is_pass_by_value=True
        ),
    }
    product = graph.matmul(name="matmul", A=tensors["A"], B=tensors["B"])
    tensors["D"] = graph.relu(name="relu", input=graph.add(name="bias_add", a=product, b=tensors["bias"]))
    tensors["D"].set_output(True).set_data_type(cudnn.data_type.HALF)
    graph.build([cudnn.heur_mode.A])
    return graph, tensors


def _buffers(tensors: dict[str, Any], in_place: bool, bias: float) -> tuple[dict[Any, Any], Any, Any]:
    """A variant pack of raw pointers (a CPU tensor for the pass-by-value bias), the output
    buffer (NaN-poisoned, or A itself) and the expected output in float64."""
    import torch

    a = torch.randn(tensors["A"].get_dim(), dtype=torch.half, device="cuda")
    b = torch.randn(tensors["B"].get_dim(), dtype=torch.half, device="cuda")
    d = a if in_place else torch.full(tensors["D"].get_dim(), float("nan"), dtype=torch.half, device="cuda")
    want = torch.relu(a.double() @ b.double() + bias)
    pack = {
        tensors["A"]: a.data_ptr(),
        tensors["B"]: b.data_ptr(),
        tensors["bias"]: torch.full((1, 1, 1), bias),
        tensors["D"]: d.data_ptr(),
    }
    return pack, d, want


def _checked(result: tuple[Any, ...]) -> Any:
    """A cuda-bindings call's values after its status, which must be success."""
    assert not result[0], f"CUDA driver call failed: {result[0]}"
    return result[1] if len(result) == 2 else result[1:] or None


@pytest.mark.parametrize("in_place", [False, True], ids=["separate", "D_over_A"])
def test_populate_and_update_a_cuda_graph_as_the_frontend_sample_does(in_place: bool) -> None:
    """The frontend's cudagraphs sample: populate an empty CUDA graph, add it to a main graph
    as a child graph node, instantiate and launch; then point the child at new buffers with
    update_cuda_graph and apply it with cudaGraphExecChildGraphNodeSetParams."""
    import torch
    from cuda.bindings import driver

    import graphdnn.cudnn as cudnn

    graph, tensors = _matmul_bias_relu(in_place)
    torch.manual_seed(7)
    handle = cudnn.create_handle()
    stream = torch.cuda.current_stream()
    cudnn.set_stream(handle, stream.cuda_stream)
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
    first, d1, want1 = _buffers(tensors, in_place, 0.5)

    child = _checked(driver.cuGraphCreate(0))
    graph.populate_cuda_graph(handle, first, workspace.data_ptr(), int(child))
    nodes, count = _checked(driver.cuGraphGetNodes(child, 8))
    kinds = [_checked(driver.cuGraphNodeGetType(node)) for node in nodes[:count]]
    assert kinds.count(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY) == int(in_place), kinds

    main = _checked(driver.cuGraphCreate(0))
    node = _checked(driver.cuGraphAddChildGraphNode(main, None, 0, child))
    _checked(driver.cuGraphDestroy(child))
    executable = _checked(driver.cuGraphInstantiate(main, 0))
    cu_stream = driver.CUstream(stream.cuda_stream)
    _checked(driver.cuGraphLaunch(executable, cu_stream))
    torch.cuda.synchronize()
    torch.testing.assert_close(d1.double(), want1, rtol=1e-2, atol=1e-2)

    second, d2, want2 = _buffers(tensors, in_place, -0.25)
    d1_before = d1.clone()
    cloned = _checked(driver.cuGraphChildGraphNodeGetGraph(node))
    graph.update_cuda_graph(handle, second, workspace.data_ptr(), int(cloned))
    _checked(driver.cuGraphExecChildGraphNodeSetParams(executable, node, cloned))
    _checked(driver.cuGraphLaunch(executable, cu_stream))
    torch.cuda.synchronize()
    torch.testing.assert_close(d2.double(), want2, rtol=1e-2, atol=1e-2)
    assert torch.equal(d1, d1_before), "the updated graph still wrote the first buffers"

    other, other_tensors = _matmul_bias_relu(not in_place)
    with pytest.raises(Exception, match="update_cuda_graph takes a graph that this graph's populate_cuda_graph"):
        other.update_cuda_graph(handle, _buffers(other_tensors, not in_place, 1.0)[0], None, int(cloned))
    full = _checked(driver.cuGraphCreate(0))
    graph.populate_cuda_graph(handle, first, workspace.data_ptr(), int(full))
    with pytest.raises(Exception, match="populate_cuda_graph takes an empty CUDA graph; this one holds"):
        graph.populate_cuda_graph(handle, first, workspace.data_ptr(), int(full))
    for owned in (full, main):
        _checked(driver.cuGraphDestroy(owned))
    _checked(driver.cuGraphExecDestroy(executable))
