"""gd.torch.custom_op(..., backward=graph): a graph op differentiated by its backward graph,
against torch's own autograd, torch.autograd.gradcheck and torch.library.opcheck (on CPU
tensors, the reference backend, here; on CUDA tensors in the `gpu` tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import graphdnn as gd
from graphdnn.compare import relative_error, tolerance
from graphdnn.errors import GraphError, UnsupportedError
from tests.test_torch_op import _name

Graphs = tuple[gd.OperationGraphSpec, gd.OperationGraphSpec]


def _layernorm(rows: int, n: int, dtype: str = "float") -> Graphs:
    """Training layer norm over rows -> (y, mean, inv_variance), and its backward graph."""
    compute = "double" if dtype == "double" else "float"
    g = gd.OperationGraphSpec("ln", io_data_type=dtype, compute_data_type=compute)
    x, scale, bias = g.tensor([rows, n], name="x"), g.tensor([1, n], name="scale"), g.tensor([1, n], name="bias")
    y, mean, inv_variance = g.layernorm("training", x, scale, bias, 1e-5, name="ln")
    for name, t in (("y", y), ("mean", mean), ("inv_variance", inv_variance)):
        assert t is not None
        t.set_name(name).set_output(True)
    back = gd.OperationGraphSpec("ln_backward", io_data_type=dtype, compute_data_type=compute)
    dy, x, scale = (
        back.tensor([rows, n], name="grad_y"),
        back.tensor([rows, n], name="x"),
        back.tensor([1, n], name="scale"),
    )
    stats = [back.tensor([rows, 1], name=name) for name in ("mean", "inv_variance")]
    for name, t in zip(
        ("grad_x", "grad_scale", "grad_bias"), back.layernorm_backward(dy, x, scale, *stats, name="lnb")
    ):
        assert t is not None
        t.set_name(name).set_output(True)
    return g, back


def _layernorm_torch(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    return F.layer_norm(x, (n,), scale.reshape(n), bias.reshape(n), 1e-5)


def _attention(b: int, h: int, sq: int, skv: int, d: int, dv: int, dtype: str = "float") -> Graphs:
    """Causal attention with a runtime scale -> (o, stats), and its backward graph (which takes
    the scale too: a forward scalar argument kept for backward)."""

    def declare(g: gd.OperationGraphSpec) -> list[gd.TensorSpec]:
        dims = {"q": [b, h, sq, d], "k": [b, h, skv, d], "v": [b, h, skv, dv]}
        tensors = [g.tensor(dim, name=name) for name, dim in dims.items()]
        return [*tensors, g.tensor([1, 1, 1, 1], name="attn_scale", is_pass_by_value=True, data_type="float")]

    g = gd.OperationGraphSpec("attention", io_data_type=dtype, compute_data_type="float")
    q, k, v, scale = declare(g)
    o, stats = g.sdpa(q, k, v, attn_scale=scale, use_causal_mask=True, generate_stats=True, name="sdpa")
    assert stats is not None
    o.set_name("o").set_output(True)
    stats.set_name("stats").set_output(True)
    back = gd.OperationGraphSpec("attention_backward", io_data_type=dtype, compute_data_type="float")
    q, k, v, scale = declare(back)
    o, d_o = back.tensor([b, h, sq, dv], name="o"), back.tensor([b, h, sq, dv], name="grad_o")
    stats = back.tensor([b, h, sq, 1], name="stats", data_type="float")
    grads = back.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=scale, use_causal_mask=True, name="sdpa_backward")
    for name, t in zip(("grad_q", "grad_k", "grad_v"), grads):
        t.set_name(name).set_output(True)
    return g, back


def _attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


@dataclass(frozen=True)
class Case:
    """A forward and backward graph, its torch twin, and how to make its arguments."""

    graphs: Callable[[str], Graphs]
    dims: tuple[tuple[int, ...], ...]  # of the tensor arguments, which all require grad
    scalars: tuple[float, ...]  # the scalar arguments, after the tensors
    torch_twin: Callable[..., torch.Tensor]  # the first result, by torch ops

    def arguments(self, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> list[Any]:
        torch.manual_seed(seed)
        tensors = [torch.randn(*dims, dtype=dtype, device=device).requires_grad_() for dims in self.dims]
        return [*tensors, *self.scalars]


CASES = {
    "layernorm": Case(lambda dtype: _layernorm(3, 7, dtype), ((3, 7), (1, 7), (1, 7)), (), _layernorm_torch),
    "attention": Case(
        lambda dtype: _attention(1, 2, 3, 5, 4, 3, dtype),
        ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)),
        (0.7,),
        _attention_torch,
    ),
}
GPU_CASES = {  # awkward sizes: odd rows and widths, a query block shorter than the keys
    "layernorm": Case(lambda dtype: _layernorm(37, 33, dtype), ((37, 33), (1, 33), (1, 33)), (), _layernorm_torch),
    "attention": Case(
        lambda dtype: _attention(2, 3, 7, 129, 64, 64, dtype),
        ((2, 3, 7, 64), (2, 3, 129, 64), (2, 3, 129, 64)),
        (0.125,),
        _attention_torch,
    ),
}


def _differentiable_op(case: Case, dtype: str) -> Any:
    forward, backward = case.graphs(dtype)
    return gd.torch.custom_op(forward, _name(), backward=backward)


def _grads_against_torch(case: Case, op: Any, args: list[Any], data_type: gd.DataType) -> None:
    """The op's gradients of sum(w * first result) against torch autograd's in double."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    first = op(*args)[0]
    w = torch.randn_like(first)
    got = torch.autograd.grad((first * w).sum(), tensors)
    twins = [t.detach().double().requires_grad_() for t in tensors]
    want = torch.autograd.grad((case.torch_twin(*twins, *case.scalars) * w.double()).sum(), twins)
    for i, (g, r) in enumerate(zip(got, want)):
        assert g.dtype == tensors[i].dtype and g.shape == tensors[i].shape and g.device == tensors[i].device
        error = relative_error(g.double().cpu().numpy(), r.cpu().numpy())
        assert error <= tolerance(data_type), f"gradient of argument {i}: relative error {error:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_torch_autograd(case: str) -> None:
    op = _differentiable_op(CASES[case], "float")
    args = CASES[case].arguments(torch.float32)
    _grads_against_torch(CASES[case], op, args, gd.DataType.FLOAT)
    first, statistics = op(*args)[0], op(*args)[1:]
    assert first.requires_grad and not any(s.requires_grad for s in statistics)  # no grad_<stat> input


@pytest.mark.parametrize("case", CASES)
def test_gradcheck_in_double(case: str) -> None:
    op = _differentiable_op(CASES[case], "double")
    args = CASES[case].arguments(torch.float64)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert torch.autograd.gradcheck(lambda *t: op(*t, *CASES[case].scalars)[0], tensors)


@pytest.mark.parametrize("case", CASES)
def test_opcheck_with_autograd(case: str) -> None:
    """opcheck's aot_dispatch test runs the forward and the backward op through AOTAutograd."""
    op = _differentiable_op(CASES[case], "float")
    torch.library.opcheck(op, tuple(CASES[case].arguments(torch.float32)))


def test_a_compiled_training_step() -> None:
    case = CASES["layernorm"]
    op = _differentiable_op(case, "float")

    def loss(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y, mean, _ = op(x * 2, scale, bias)
        return (y * y).sum() + mean.sum()

    args = case.arguments(torch.float32)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(*args), args)
    want = torch.autograd.grad(loss(*args), args)
    for g, r in zip(got, want):
        assert relative_error(g.numpy(), r.numpy()) <= tolerance(gd.DataType.FLOAT)


def test_backward_ops_are_ops_of_their_own() -> None:
    forward, backward = _layernorm(3, 7)
    name = _name()
    gd.torch.custom_op(forward, name, backward=backward)
    namespace, op_name = name.split("::")
    backward_op = getattr(getattr(torch.ops, namespace), f"{op_name}_backward")
    assert "Tensor grad_y, Tensor x, Tensor scale, Tensor mean, Tensor inv_variance" in str(backward_op.default._schema)


def test_an_input_without_a_gradient_output_refuses_backward_only_when_it_requires_grad() -> None:
    forward, _ = _layernorm(3, 7)
    partial = gd.OperationGraphSpec("ln_backward_no_bias", io_data_type="float", compute_data_type="float")
    dy, x, scale = (
        partial.tensor([3, 7], name="grad_y"),
        partial.tensor([3, 7], name="x"),
        partial.tensor([1, 7], name="scale"),
    )
    stats = [partial.tensor([3, 1], name=name) for name in ("mean", "inv_variance")]
    dx, dscale, _ = partial.layernorm_backward(dy, x, scale, *stats, name="lnb")
    assert dx is not None and dscale is not None
    dx.set_name("grad_x").set_output(True)
    dscale.set_name("grad_scale").set_output(True)
    op = gd.torch.custom_op(forward, _name(), backward=partial)
    x_value, scale_value, bias_value = CASES["layernorm"].arguments(torch.float32)
    with pytest.raises(
        UnsupportedError,
        match=r"argument 'bias' requires grad, but backward graph 'ln_backward_no_bias' has no output 'grad_bias'",
    ):
        op(x_value, scale_value, bias_value)[0].sum().backward()
    op(x_value, scale_value, bias_value.detach())[0].sum().backward()
    assert x_value.grad is not None and scale_value.grad is not None


def _backward_with(rename: tuple[str, str] | None = None, rows: int = 3, **changes: Any) -> gd.OperationGraphSpec:
    """The layer-norm backward graph of ``rows`` rows, with one input or output renamed or one input's type changed."""
    n = 7
    back = gd.OperationGraphSpec("ln_backward", io_data_type="float", compute_data_type="float")
    declared = {"grad_y": [rows, n], "x": [rows, n], "scale": [1, n], "mean": [rows, 1], "inv_variance": [rows, 1]}
    names = {"grad_x": "grad_x", "grad_scale": "grad_scale", "grad_bias": "grad_bias"} | dict(
        [rename] if rename else []
    )
    inputs = [
        back.tensor(dim, name=names.get(name, name), data_type=changes.get(f"{name}_type"))
        for name, dim in declared.items()
    ]
    for name, t in zip(("grad_x", "grad_scale", "grad_bias"), back.layernorm_backward(*inputs, name="lnb")):
        assert t is not None
        t.set_name(names[name]).set_output(True)
    return back


@pytest.mark.parametrize(
    ("backward", "message"),
    [
        (lambda: _backward_with(("x", "input")),
         r"input 'input' names no forward input, output or output gradient; its inputs are named after forward "
         r"inputs \('x', 'scale', 'bias'\), forward outputs \('y', 'mean', 'inv_variance'\) and grad_<output>"),
        (lambda: _backward_with(("grad_y", "dy")), r"input 'dy' names no forward input"),
        (lambda: _backward_with(("grad_x", "dx")),
         r"output 'dx' names no forward tensor input; its outputs are grad_<input> for inputs of \('x', 'scale', 'bias'\)"),
        (lambda: _backward_with(("grad_x", "grad_mean")), r"output 'grad_mean' names no forward tensor input"),
        (lambda: _backward_with(grad_y_type="half"),
         r"'grad_y' has dims \[3, 7\] half, the gradient of forward output 'y' has \[3, 7\] float"),
        (lambda: _backward_with(rows=4), r"'grad_y' has dims \[4, 7\] float, the gradient of forward output 'y' has \[3, 7\] float"),
        (lambda: _backward_with(mean_type="half"), r"'mean' has dims \[3, 1\] half, forward output 'mean' has \[3, 1\] float"),
    ],
)  # fmt: skip
def test_backward_graphs_that_break_the_naming_rules_are_named(
    backward: Callable[[], gd.OperationGraphSpec], message: str
) -> None:
    forward, _ = _layernorm(3, 7)
    with pytest.raises(GraphError, match=r"backward graph 'ln_backward': " + message):
        gd.torch.custom_op(forward, _name(), backward=backward())


def test_a_backward_graph_without_gradients_a_mismatched_scalar_and_an_ambiguous_name() -> None:
    forward, _ = _layernorm(3, 7)
    none = gd.OperationGraphSpec("stats_only", io_data_type="float")
    none.mul(none.tensor([3, 1], name="mean"), 2.0).set_name("grad_x").set_output(True)
    with pytest.raises(GraphError, match=r"backward graph 'stats_only' takes no gradient: name an input grad_<output>"):
        gd.torch.custom_op(forward, _name(), backward=none)

    attention, _ = _attention(1, 1, 2, 2, 4, 4)
    as_tensor = gd.OperationGraphSpec("scale_as_tensor", io_data_type="float")
    d_o = as_tensor.tensor([1, 1, 2, 4], name="grad_o")
    as_tensor.mul(d_o, as_tensor.tensor([1, 1, 1, 1], name="attn_scale", data_type="float")).set_name(
        "grad_v"
    ).set_output(True)
    with pytest.raises(
        GraphError, match=r"'attn_scale' is a tensor, forward input 'attn_scale' is a pass-by-value scalar"
    ):
        gd.torch.custom_op(attention, _name(), backward=as_tensor)

    twice = gd.OperationGraphSpec("twice", io_data_type="float")
    twice.mul(twice.tensor([2], name="grad_x"), 2.0).set_name("x").set_output(True)  # output 'x', input 'grad_x'
    back = gd.OperationGraphSpec("back", io_data_type="float")
    back.mul(back.tensor([2], name="grad_x"), 2.0).set_name("grad_grad_x").set_output(True)
    with pytest.raises(
        GraphError, match=r"input 'grad_x' could be forward input 'grad_x' or the gradient of forward output 'x'"
    ):
        gd.torch.custom_op(twice, _name(), backward=back)


# -- on the GPU -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "dtype"), [("layernorm", "float"), ("layernorm", "half"), ("attention", "bfloat16")])
def test_gpu_gradients_match_torch_autograd_and_the_cpu_op(case: str, dtype: str) -> None:
    data_type = gd.DataType(dtype)
    torch_type = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    op = _differentiable_op(GPU_CASES[case], dtype)
    args = GPU_CASES[case].arguments(torch_type, device="cuda", seed=1)
    _grads_against_torch(GPU_CASES[case], op, args, data_type)
    on_gpu = torch.autograd.grad(op(*args)[0].float().square().sum(), [a for a in args if isinstance(a, torch.Tensor)])
    cpu_args = [a.detach().cpu().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    on_cpu = torch.autograd.grad(
        op(*cpu_args)[0].float().square().sum(), [a for a in cpu_args if isinstance(a, torch.Tensor)]
    )
    for g, c in zip(on_gpu, on_cpu):
        assert g.is_cuda and relative_error(g.double().cpu().numpy(), c.double().numpy()) <= tolerance(data_type)
    torch.library.opcheck(op, tuple(GPU_CASES[case].arguments(torch_type, device="cuda", seed=2)))
