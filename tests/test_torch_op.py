"""gd.torch.custom_op: graphs as torch operators, eagerly, under torch.compile and torch.export,
checked by torch.library.opcheck; on CPU tensors (the reference backend) here, on CUDA
tensors (compiled plans, CUDA graphs) in the `gpu` tests."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphdnn as gd
from graphdnn.compare import relative_error, tolerance
from graphdnn.errors import FeedError, GraphError, UnsupportedError
from graphdnn.ir import Graph
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.frameworks import to_torch, torch_dtype, torch_host
from graphdnn.torch.arguments import empty_results
from graphdnn.torch.kernels import GraphKernels, _in_plan_layout
from tests.plan_graphs import add_relu_and_sigmoid, matmul_relu, scaled, sum_then_add

_NAMES = itertools.count()


def _name() -> str:
    """A fresh op name: torch's operator registry lives as long as the process."""
    return f"graphdnn_test::op{next(_NAMES)}"


def _mlp(rows: int = 5, k: int = 8, n: int = 12, dtype: str = "float") -> gd.OperationGraphSpec:
    """h = x @ w + b and y = gelu(h): two outputs, in that order."""
    g = gd.OperationGraphSpec("mlp", io_data_type=dtype)
    x, w, b = g.tensor([rows, k], name="x"), g.tensor([k, n], name="w"), g.tensor([1, n], name="b")
    h = g.add(g.matmul(x, w, name="mm"), b, name="bias").set_output(True)
    g.gelu(h, name="act").set_output(True)
    return g


def _mlp_torch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = (x.double() @ w.double() + b.double()).to(x.dtype)
    return h, F.gelu(h.double()).to(x.dtype)


def _dynamic_rows() -> gd.OperationGraphSpec:
    """A layernorm over rows of a symbolic batch, then a reshape that merges it: results
    [3*batch, 16] and [batch, 3, 16]."""
    g = gd.OperationGraphSpec("rows", io_data_type="float")
    batch = g.dim("batch", min=1, max=64)
    x = g.tensor([batch, 3, 16], name="x")
    gamma, beta = g.tensor([1, 1, 16], name="gamma"), g.tensor([1, 1, 16], name="beta")
    y = g.layernorm("inference", x, gamma, beta, 1e-5, name="ln")[0]
    g.reshape(y, shape=[batch * 3, 16], name="flat").set_output(True)
    g.relu(x, name="act").set_output(True)
    return g


def _dynamic_rows_torch(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = F.layer_norm(x.double(), (16,), gamma.double().reshape(16), beta.double().reshape(16), 1e-5)
    return y.reshape(-1, 16).float(), x.relu()


def _close(got: torch.Tensor, want: torch.Tensor, data_type: gd.DataType = gd.DataType.FLOAT) -> None:
    error = relative_error(got.detach().cpu().double().numpy(), want.detach().cpu().double().numpy())
    assert error <= tolerance(data_type), f"relative error {error:.3g}"


def _inputs(ir: Graph, seed: int, device: str = "cpu") -> list[Any]:
    """Random arguments in the op's order: tensors with the graph's strides on ``device``, scalars as floats."""
    feeds = random_inputs(ir, seed)
    return [
        float(feeds[t.name].reshape(-1)[0])
        if t.is_pass_by_value
        else (to_torch(feeds[t.name], t) if device == "cuda" else torch_host(feeds[t.name], t).reshape(t.dim))
        for t in ir.inputs
    ]


def _reference(ir: Graph, args: Sequence[Any]) -> list[np.ndarray]:
    feeds = {t.name: a if t.is_pass_by_value else _host(a, t.data_type) for t, a in zip(ir.inputs, args)}
    results = gd.reference.execute(ir, feeds)
    return [results[t.name].astype(np.float64) for t in ir.outputs]


def _host(value: torch.Tensor, data_type: gd.DataType) -> np.ndarray:
    return value.detach().cpu().double().numpy().astype(data_type.numpy)


def _results(value: Any) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


# -- the interface ---------------------------------------------------------------------


def test_arguments_follow_the_graph_inputs_and_results_its_outputs() -> None:
    schema = gd.torch.op_schema(_mlp())
    assert schema.schema == "(Tensor x, Tensor w, Tensor b) -> (Tensor, Tensor)"
    assert [t.name for t in schema.outputs] == ["bias::y", "act::y"]
    assert "result 1: 'act::y' [5, 12] float" in str(schema)
    op = gd.torch.custom_op(_mlp(), _name())
    assert str(op._opoverload._schema).endswith(schema.schema)
    x, w, b = torch.randn(5, 8), torch.randn(8, 12), torch.randn(1, 12)
    h, y = op(x, w, b)
    for got, want in zip((h, y), _mlp_torch(x, w, b)):
        _close(got, want)
    by_keyword = op(b=b, x=x, w=w)
    assert all(torch.equal(a, c) for a, c in zip(by_keyword, (h, y)))


def test_argument_names_are_identifiers_and_inputs_reorders_them() -> None:
    """y = sum over the inputs of (declaration position + 1) * input: a value given to the
    wrong argument changes it."""
    declared = ("conv::X", "a.b", "a_b", "2d", "lambda", "self")
    g = gd.OperationGraphSpec("names", io_data_type="float")
    terms = [g.mul(g.tensor([2, 3], name=n), float(i + 1)) for i, n in enumerate(declared)]
    total = terms[0]
    for term in terms[1:]:
        total = g.add(total, term)
    total.set_output(True)
    assert gd.torch.op_schema(g).arguments == ("conv__X", "a_b", "a_b_2", "_2d", "lambda_", "self_")
    order = ["self", "2d", "conv::X", "lambda", "a.b", "a_b"]
    reordered = gd.torch.op_schema(g, inputs=order)
    assert [t.name for t in reordered.inputs] == order
    assert reordered.arguments == ("self_", "_2d", "conv__X", "lambda_", "a_b", "a_b_2")
    op = gd.torch.custom_op(g, _name(), inputs=order)
    values = {name: torch.full((2, 3), 10.0**j) for j, name in enumerate(order)}
    want = sum((i + 1) * values[n] for i, n in enumerate(declared))
    assert torch.equal(op(*(values[n] for n in order)), want)
    by_keyword = dict(zip(reordered.arguments, (values[n] for n in order)))
    assert torch.equal(op(**dict(reversed(by_keyword.items()))), want)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["x", "w", "nope"], r"'nope', which is not an input of graph 'mlp' \('x', 'w', 'b'\)"),
        (["x", "w", "b", "x"], r"names 'x' more than once"),
        (["x", "b"], r"leaves out graph input 'w'"),
        ("xwb", r"a list of tensor names"),
    ],
)
def test_bad_input_orders_are_named(inputs: Any, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        gd.torch.custom_op(_mlp(), _name(), inputs=inputs)


def test_graphs_it_cannot_make_an_op_of_and_options_it_decides_itself() -> None:
    g = gd.OperationGraphSpec("scalars_only", io_data_type="float")
    g.add(g.tensor([1], name="s", is_pass_by_value=True), 1.0).set_output(True)
    with pytest.raises(GraphError, match="no tensor inputs"):
        gd.torch.custom_op(g, _name())
    with pytest.raises(GraphError, match="chooses 'arch' itself"):
        gd.torch.custom_op(_mlp(), _name(), arch="sm_90")
    with pytest.raises(GraphError, match="expected a plan, an OperationGraphSpec or a validated Graph"):
        gd.torch.custom_op(object(), _name())


def test_without_torch_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ImportError, match=r"gd\.torch\.custom_op needs PyTorch"):
        gd.torch.custom_op(_mlp(), _name())


# -- running it on CPU tensors ----------------------------------------------------------


@pytest.mark.parametrize("build", [add_relu_and_sigmoid, scaled, sum_then_add, matmul_relu, lambda: _mlp(dtype="half")])
def test_cpu_results_are_the_reference(build: Callable[[], gd.OperationGraphSpec]) -> None:
    ir = build().validate()
    op = gd.torch.custom_op(ir, _name())
    args = _inputs(ir, seed=3)
    results = _results(op(*args))
    assert len(results) == len(ir.outputs)
    for got, t, want in zip(results, ir.outputs, _reference(ir, args)):
        assert got.dtype == torch_dtype(t.data_type)
        assert tuple(got.shape) == t.dim and tuple(got.stride()) == t.stride
        assert np.array_equal(_host(got, t.data_type).astype(np.float64), want)


def test_a_pass_by_value_scalar_is_a_float_argument() -> None:
    ir = scaled().validate()
    assert gd.torch.op_schema(ir).schema == "(Tensor x, float alpha) -> Tensor"
    op = gd.torch.custom_op(ir, _name())
    x = torch.randn(2, 3, 4, 5)
    y = op(x, 2.5)
    _close(y, x * 2.5 + 1)
    assert y.stride() == tuple(gd.nhwc_strides([2, 3, 4, 5]))  # the graph's NHWC output


def test_inputs_of_any_strides() -> None:
    op = gd.torch.custom_op(_mlp(), _name())
    x = torch.randn(8, 5).t()  # transposed
    w = torch.randn(8, 24)[:, ::2]  # every other column
    b = torch.randn(12).expand(1, 12)  # a broadcast view
    for got, want in zip(op(x, w, b), op(x.contiguous(), w.contiguous(), b.contiguous())):
        assert torch.equal(got, want)
    assert scaled().validate().inputs[0].stride != (60, 20, 5, 1)
    op = gd.torch.custom_op(scaled(), _name())
    x = torch.randn(2, 3, 4, 5)  # contiguous NCHW for an NHWC input
    _close(op(x, -1.0), 1 - x)


def test_bf16_and_fp8_cross_by_their_bits() -> None:
    g = gd.OperationGraphSpec("cast", io_data_type="bf16")
    x = g.tensor([4, 6], name="x")
    g.mul(x, 2.0, name="twice").set_output(True)
    g.relu(x, name="r").set_data_type("fp8_e4m3").set_output(True)
    op = gd.torch.custom_op(g, _name())
    value = torch.randn(4, 6).bfloat16()
    twice, r = op(value)
    assert twice.dtype == torch.bfloat16 and r.dtype == torch.float8_e4m3fn
    assert torch.equal(twice, value * 2)
    assert torch.equal(r, value.relu().float().to(torch.float8_e4m3fn))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda: (torch.randn(5, 8).half(), torch.randn(8, 12), torch.randn(1, 12)),
         r"argument 'x' has dtype torch.float16, the graph declares float \(torch.float32\)"),
        (lambda: (torch.randn(5, 8), torch.randn(8, 11), torch.randn(1, 12)),
         r"argument 'w' has dims \[8, 11\], the graph declares \[8, 12\]"),
        (lambda: (torch.randn(5, 8), torch.randn(8, 12), torch.randn(12)),
         r"argument 'b' has 1 dims \[12\], the graph declares \[1, 12\]"),
        (lambda: (torch.randn(5, 8), torch.randn(8, 12, device="meta"), torch.randn(1, 12)),
         r"argument 'w' is on meta, argument 'x' on cpu"),
    ],
)  # fmt: skip
def test_mismatched_arguments_are_named(args: Callable[[], tuple[torch.Tensor, ...]], message: str) -> None:
    op = gd.torch.custom_op(_mlp(), _name())
    with pytest.raises(FeedError, match=message):
        op(*args())
    compiled = torch.compile(lambda *a: op(*a), fullgraph=True, backend="eager", dynamic=False)
    with pytest.raises(Exception, match=message):  # the fake kernel checks alike (torch wraps the error)
        compiled(*args())


def test_an_argument_named_differently_from_its_tensor_names_both() -> None:
    g = gd.OperationGraphSpec("named", io_data_type="float")
    g.relu(g.tensor([3], name="conv::X")).set_output(True)
    op = gd.torch.custom_op(g, _name())
    with pytest.raises(FeedError, match=r"tensor 'conv::X': argument 'conv__X' has dims \[4\]"):
        op(torch.randn(4))


def test_backward_raises_and_a_backward_graph_can_be_attached() -> None:
    g = gd.OperationGraphSpec("act", io_data_type="float")
    g.relu(g.tensor([3, 4], name="x"), name="relu").set_output(True)
    op = gd.torch.custom_op(g, _name())
    x = torch.randn(3, 4, requires_grad=True)
    y = op(x)
    with pytest.raises(UnsupportedError, match=r"has no backward: graphdnn runs the forward graph only"):
        y.sum().backward()
    with torch.no_grad():
        _close(op(x), x.relu())

    back = gd.OperationGraphSpec("act_backward", io_data_type="float")
    back.relu_backward(back.tensor([3, 4], name="dy"), back.tensor([3, 4], name="x")).set_output(True)
    backward_op = gd.torch.custom_op(back, _name())

    def setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        ctx.save_for_backward(inputs[0])

    op.register_autograd(lambda ctx, dy: backward_op(dy, *ctx.saved_tensors), setup_context=setup_context)
    op(x).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, (x > 0).float())


# -- torch.compile, torch.export, opcheck -----------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend: str) -> None:
    op = gd.torch.custom_op(_mlp(), _name())

    def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h, y = op(x * 2, w, b)
        return y + h.sum()

    x, w, b = torch.randn(5, 8), torch.randn(8, 12), torch.randn(1, 12)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    _close(compiled(x, w, b), block(x, w, b))


def test_torch_export_keeps_the_op() -> None:
    op = gd.torch.custom_op(_mlp(), _name())

    class Block(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            h, y = op(x, w, b)
            return h + y

    args = (torch.randn(5, 8), torch.randn(8, 12), torch.randn(1, 12))
    program = torch.export.export(Block(), args)
    calls = [n for n in program.graph.nodes if n.op == "call_function" and n.target == op._opoverload]
    assert len(calls) == 1
    assert [tuple(v.shape) for v in calls[0].meta["val"]] == [(5, 12), (5, 12)]
    _close(program.module()(*args), Block()(*args))


def test_fake_results_have_the_graph_strides() -> None:
    op = gd.torch.custom_op(scaled(), _name())
    program = torch.export.export(_Call(op), (torch.randn(2, 3, 4, 5), 2.0))
    (call,) = [n for n in program.graph.nodes if n.op == "call_function" and n.target == op._opoverload]
    assert call.meta["val"].stride() == tuple(gd.nhwc_strides([2, 3, 4, 5]))


class _Call(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, *args: Any) -> Any:
        return self.op(*args)


@pytest.mark.parametrize("build", [_mlp, scaled, sum_then_add, add_relu_and_sigmoid])
def test_opcheck(build: Callable[[], gd.OperationGraphSpec]) -> None:
    ir = build().validate()
    op = gd.torch.custom_op(ir, _name())
    torch.library.opcheck(op, tuple(_inputs(ir, seed=1)))


# -- symbolic dims ----------------------------------------------------------------------


def test_a_dynamic_graph_runs_each_extent_and_checks_the_range() -> None:
    op = gd.torch.custom_op(_dynamic_rows(), _name())
    gamma, beta = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    for batch in (1, 5, 64):
        x = torch.randn(batch, 3, 16)
        flat, act = op(x, gamma, beta)
        assert flat.shape == (3 * batch, 16) and act.shape == (batch, 3, 16)
        for got, want in zip((flat, act), _dynamic_rows_torch(x, gamma, beta)):
            _close(got, want)
    with pytest.raises(FeedError, match=r"dim 0 is 65, outside the range 1..64 of symbol 'batch'"):
        op(torch.randn(65, 3, 16), gamma, beta)
    torch.library.opcheck(op, (torch.randn(7, 3, 16), gamma, beta))


def test_a_dynamic_graph_gives_symbolic_sizes_under_compile_and_export() -> None:
    op = gd.torch.custom_op(_dynamic_rows(), _name())
    gamma, beta = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    compiled = torch.compile(lambda x, g, b: op(x, g, b)[0] * 2, fullgraph=True, backend="eager", dynamic=True)
    for batch in (3, 9):
        x = torch.randn(batch, 3, 16)
        _close(compiled(x, gamma, beta), 2 * _dynamic_rows_torch(x, gamma, beta)[0])
    batch_dim = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(
        _Call(op), (torch.randn(5, 3, 16), gamma, beta), dynamic_shapes=(({0: batch_dim}, None, None),)
    )
    (call,) = [n for n in program.graph.nodes if n.op == "call_function" and n.target == op._opoverload]
    flat, act = call.meta["val"]
    assert isinstance(flat.shape[0], torch.SymInt) and str(flat.shape[0]) == f"3*{act.shape[0]}"
    x = torch.randn(11, 3, 16)
    for got, want in zip(program.module()(x, gamma, beta), _dynamic_rows_torch(x, gamma, beta)):
        _close(got, want)


def test_exporting_beyond_a_symbol_range_is_refused() -> None:
    op = gd.torch.custom_op(_dynamic_rows(), _name())
    wide = torch.export.Dim("batch", min=1, max=100)
    with pytest.raises(Exception, match=r"Constraints violated \(batch\)(?s:.*)max=64"):
        torch.export.export(
            _Call(op),
            (torch.randn(5, 3, 16), torch.randn(1, 1, 16), torch.randn(1, 1, 16)),
            dynamic_shapes=(({0: wide}, None, None),),
        )


# -- the CUDA kernel's plumbing, on CPU tensors ------------------------------------------


def test_inputs_are_copied_into_the_plan_layout_only_when_they_must_be() -> None:
    t = scaled().validate().inputs[0]  # NHWC
    nhwc = torch.empty_strided(t.dim, t.stride)
    assert _in_plan_layout(nhwc, t, read_by_tma=False) is nhwc
    nchw = torch.randn(t.dim)
    copy = _in_plan_layout(nchw, t, read_by_tma=False)
    assert copy.stride() == t.stride and torch.equal(copy, nchw)
    mid_row = torch.randn(t.numel + 1)[1:].as_strided(t.dim, t.stride)  # 4 bytes past a 16-byte boundary
    assert mid_row.data_ptr() % 16 and _in_plan_layout(mid_row, t, read_by_tma=False) is mid_row
    moved = _in_plan_layout(mid_row, t, read_by_tma=True)
    assert moved.data_ptr() % 16 == 0 and moved.stride() == t.stride and torch.equal(moved, mid_row)


class _RecordingPlan:
    """Stands in for a GPU plan: records what the op hands to ``execute``, runs the reference."""

    def __init__(self, ir: Graph, workspace_size: int) -> None:
        self.graph = ir
        self.workspace_size = workspace_size
        self.program = SimpleNamespace(launches=())
        self.calls: list[tuple[dict[str, Any], Any, Any]] = []

    def execute(self, pack: dict[str, Any], workspace: Any, stream: Any) -> None:
        self.calls.append((dict(pack), workspace, stream))
        feeds = {
            t.name: pack[t.name] if t.is_pass_by_value else _host(pack[t.name], t.data_type) for t in self.graph.inputs
        }
        for name, value in gd.reference.execute(self.graph, feeds).items():
            pack[name].copy_(torch_host(value, self.graph.tensor(name)))


@pytest.mark.parametrize("workspace_size", [0, 4096])
def test_the_cuda_kernel_hands_the_plan_torch_buffers_and_the_current_stream(
    workspace_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0x5EED))
    ir = scaled().validate()
    plan = _RecordingPlan(ir, workspace_size)
    kernels = GraphKernels(gd.torch.op_schema(ir), cast(gd.Plan, plan), {})
    x = torch.randn(2, 3, 4, 5)  # NCHW; the graph's x is NHWC
    (y,) = results = empty_results(kernels.schema, {}, x.device)
    kernels._gpu((x, 0.5), {}, results, x.device)
    ((pack, workspace, stream),) = plan.calls
    assert stream == 0x5EED and pack["alpha"] == 0.5 and pack["y"] is y
    assert pack["x"].stride() == ir.inputs[0].stride and torch.equal(pack["x"], x)
    if workspace_size:
        assert workspace.dtype == torch.uint8 and workspace.numel() == workspace_size
    else:
        assert workspace is None
    _close(y, x * 0.5 + 1)


# -- on the GPU -------------------------------------------------------------------------


def _gpu_against_reference_and_cpu(ir: Graph, op: Any, seed: int) -> tuple[torch.Tensor, ...]:
    args = _inputs(ir, seed, device="cuda")
    results = _results(op(*args))
    torch.cuda.synchronize()
    on_cpu = _results(op(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)))
    for got, cpu, want, t in zip(results, on_cpu, _reference(ir, args), ir.outputs):
        assert got.is_cuda and tuple(got.stride()) == t.stride
        error = relative_error(_host(got, t.data_type).astype(np.float64), want)
        assert error <= tolerance(t.data_type), f"'{t.name}' against the reference: {error:.3g}"
        error = relative_error(_host(got, t.data_type).astype(np.float64), _host(cpu, t.data_type).astype(np.float64))
        assert error <= tolerance(t.data_type), f"'{t.name}' against the CPU op: {error:.3g}"
    return results


def _awkward_mlp() -> gd.OperationGraphSpec:
    return _mlp(rows=37, k=24, n=33, dtype="half")


@pytest.mark.gpu
@pytest.mark.parametrize("build", [add_relu_and_sigmoid, scaled, sum_then_add, matmul_relu, _awkward_mlp])
def test_gpu_matches_the_reference_and_the_cpu_op(build: Callable[[], gd.OperationGraphSpec]) -> None:
    ir = build().validate()
    op = gd.torch.custom_op(ir, _name())
    _gpu_against_reference_and_cpu(ir, op, seed=5)
    torch.library.opcheck(op, tuple(_inputs(ir, seed=6, device="cuda")))


@pytest.mark.gpu
def test_gpu_takes_a_compiled_plan_and_inputs_of_other_strides() -> None:
    ir = _awkward_mlp().validate()
    op = gd.torch.custom_op(gd.compile(ir), _name())
    _gpu_against_reference_and_cpu(ir, op, seed=6)
    x = torch.randn(24, 37, device="cuda").half().t()
    w = torch.randn(24, 66, device="cuda").half()[:, ::2]
    b = torch.randn(33, device="cuda").half().expand(1, 33)
    for got, want in zip(op(x, w, b), _mlp_torch(x, w, b)):
        _close(got, want, gd.DataType.HALF)


@pytest.mark.gpu
def test_gpu_dynamic_graph_compiles_each_extent() -> None:
    op = gd.torch.custom_op(_dynamic_rows(), _name())
    gamma, beta = torch.randn(1, 1, 16, device="cuda"), torch.randn(1, 1, 16, device="cuda")
    for batch in (1, 7, 64, 7):
        x = torch.randn(batch, 3, 16, device="cuda")
        for got, want in zip(op(x, gamma, beta), _dynamic_rows_torch(x, gamma, beta)):
            _close(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_gpu_inside_torch_compile(mode: str | None) -> None:
    op = gd.torch.custom_op(_awkward_mlp(), _name())

    def block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h, y = op(torch.sin(x), w, b)
        return y * 2 + h

    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for seed in range(3):  # reduce-overhead: warm-up, record, replay
        torch.manual_seed(seed)
        x, w, b = (torch.randn(*dims, device="cuda").half() for dims in ((37, 24), (24, 33), (1, 33)))
        got = compiled(x, w, b).clone()
        h, y = _mlp_torch(torch.sin(x), w, b)
        _close(got, y * 2 + h, gd.DataType.HALF)


def _captured(op: Any, args: Sequence[torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """``op(*args)`` captured in a CUDA graph after a warm-up on a side stream (which builds the
    plan and loads its kernels), as torch's CUDA-graph recipe does."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capture_error_mode "global": an allocation or sync outside torch fails
        results = _results(op(*args))
    return graph, results


@pytest.mark.gpu
@pytest.mark.parametrize("build", [sum_then_add, _awkward_mlp, add_relu_and_sigmoid])
def test_gpu_cuda_graph_capture_and_replay(build: Callable[[], gd.OperationGraphSpec]) -> None:
    """sum_then_add needs a workspace: torch's allocator gives it, from the capture's pool."""
    ir = build().validate()
    op = gd.torch.custom_op(ir, _name())
    args = _inputs(ir, seed=0, device="cuda")
    graph, results = _captured(op, args)
    for seed in (1, 2):
        for static, new in zip(args, _inputs(ir, seed, device="cuda")):
            static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        for got, want, t in zip(results, _reference(ir, args), ir.outputs):
            error = relative_error(_host(got, t.data_type).astype(np.float64), want)
            assert error <= tolerance(t.data_type), f"'{t.name}' after replay {seed}: {error:.3g}"


@pytest.mark.gpu
def test_gpu_tensor_map_operands_off_alignment_are_copied_by_torch() -> None:
    """A TMA-fed matmul (sm_90's warp-specialised engine) on operands that start mid-row: the
    op copies them with torch, so even under capture nothing is allocated outside torch."""
    from graphdnn.runtime.driver import current_gpu_arch
    from graphdnn.torch.kernels import _tensor_map_operands
    from tests.test_codegen_gemm_sm90 import gemm_node
    from tests.test_codegen_gemm_ws import ws_choices

    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    m, k, n = 150, 200, 136
    g = gd.OperationGraphSpec(name="mid_row", io_data_type="bf16")
    g.matmul(g.tensor(name="A", dim=[m, k]), g.tensor(name="B", dim=[k, n]), name="mm").set_name("C").set_output(True)
    _, fused = gemm_node(g)
    plan = gd.compile(g, tuning={fused.name: ws_choices(g)[0]})
    assert isinstance(plan, gd.Plan) and _tensor_map_operands(plan)
    op = gd.torch.custom_op(plan, _name())
    a = torch.randn(m * k + 3, dtype=torch.bfloat16, device="cuda")[3:].view(m, k)
    b = torch.randn(k * n + 1, dtype=torch.bfloat16, device="cuda")[1:].view(k, n)
    assert a.data_ptr() % 16 and b.data_ptr() % 16
    graph, (c,) = _captured(op, (a, b))
    graph.replay()
    torch.cuda.synchronize()
    _close(c, a.double() @ b.double(), gd.DataType.BFLOAT16)


@pytest.mark.gpu
def test_gpu_imported_block_compiled_and_replayed_from_a_cuda_graph() -> None:
    """Issue 14's acceptance case: a torch.compile'd function (mode 'reduce-overhead': CUDA
    graphs) calling the op of a Hugging Face-style block imported with gd.from_torch."""
    from tests.test_from_torch import Block

    torch.manual_seed(0)
    block = Block(64, 4).to(torch.bfloat16).eval()
    graph = gd.from_torch(block, (torch.randn(2, 16, 64, dtype=torch.bfloat16),))
    op = gd.torch.custom_op(graph, _name())
    block = block.cuda()
    state = {name: value for name, value in block.state_dict().items()}
    names = [t.name for t in graph.validate().inputs]

    @torch.compile(fullgraph=True, mode="reduce-overhead")
    def layer(hidden: torch.Tensor) -> torch.Tensor:
        return op(*[hidden if name == "hidden_states" else state[name] for name in names]) * 2

    for seed in range(4):  # warm-up, record, replays
        torch.manual_seed(seed)
        hidden = torch.randn(2, 16, 64, dtype=torch.bfloat16, device="cuda")
        got = layer(hidden).clone()
        with torch.no_grad():
            want = 2 * block(hidden)
        error = relative_error(got.double().cpu().numpy(), want.double().cpu().numpy())
        assert error < 2e-2, f"call {seed}: relative error {error:.3g}"
