"""``gd.torch.custom_op``: a graph as a ``torch.library.custom_op``, for eager code,
``torch.compile`` (fullgraph), ``torch.export`` and CUDA-graph capture.

The op's schema comes from :mod:`.op_schema`, its fake kernel computes the results' dims,
strides and types from the graph (symbolic sizes for a dynamic graph), and its real
kernel (:mod:`.kernels`) runs the reference backend on CPU tensors and a compiled plan on
CUDA ones. Given a backward graph, the op is differentiable: the backward graph becomes an
op of its own, wired to the forward one by the names of its inputs and outputs
(:mod:`.autograd`); without one, backward through the op raises a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import GraphError, UnsupportedError
from ..plan import Plan
from .arguments import check_arguments, device_of, empty_results, returned
from .autograd import wire_backward
from .kernels import GraphKernels
from .op_schema import OpSchema, op_schema

# gd.compile options that the op decides itself: the target is each call's device.
_OWN_OPTIONS = ("arch", "backend")


def custom_op(
    plan_or_graph: Any,
    name: str,
    *,
    inputs: Sequence[str] | None = None,
    backward: Any = None,
    **compile_options: Any,
) -> Any:
    """Register ``plan_or_graph`` as the torch operator ``name`` ("namespace::op_name") and
    return it (a ``torch.library.CustomOpDef``; also ``torch.ops.namespace.op_name``).

    ``plan_or_graph``: an OperationGraphSpec or a validated Graph, compiled on the first
    call on each CUDA device for that device's architecture (``compile_options`` are
    :func:`graphdnn.compile`'s other keywords: ``cache``, ``autotune``, ``disable``...);
    or a plan, a GPU plan serving every CUDA call as it is. CPU tensors run the
    reference backend. The op takes the graph's inputs in ``Graph.inputs`` order, or in
    the order ``inputs`` names them, and returns its outputs in ``Graph.outputs`` order
    (one tensor, or a tuple); :func:`op_schema` shows both. Inputs must have the graph's
    data types and dims; any strides are taken (on the GPU an input whose strides differ
    from the graph's is copied into them first). Results have the graph's strides.

    ``backward``: the backward graph (a plan, an OperationGraphSpec or a Graph), which makes
    the op differentiable. Its inputs are named after forward inputs, forward outputs and
    ``grad_<output>`` (the gradient of a forward output), its outputs ``grad_<input>`` (the
    gradient of a forward tensor input); :mod:`graphdnn.torch.autograd` has the rules. It is
    registered as the op ``name + "_backward"`` (compiled with the same ``compile_options``
    unless it is a plan).
    """
    try:
        import torch
    except ImportError as error:
        raise ImportError("gd.torch.custom_op needs PyTorch (torch.library); install torch") from error

    schema = op_schema(plan_or_graph, inputs)
    plan = plan_or_graph if isinstance(plan_or_graph, Plan) else None
    if plan is not None and compile_options:
        raise GraphError(f"compile options {sorted(compile_options)} are for graphs; the plan given is compiled")
    own = [key for key in _OWN_OPTIONS if key in compile_options]
    if own:
        raise GraphError(
            f"custom_op chooses {own[0]!r} itself: CPU tensors run the reference backend, CUDA tensors a plan "
            "compiled for their device's architecture"
        )
    wiring = None if backward is None else wire_backward(schema, backward)
    kernels = GraphKernels(schema, plan, compile_options)

    def run(*args: Any) -> Any:
        return kernels(*args)

    op = torch.library.custom_op(name, run, mutates_args=(), schema=schema.schema)

    def fake(*args: Any) -> Any:
        return returned(empty_results(schema, check_arguments(schema, args), device_of(schema, args)))

    op.register_fake(fake)
    if wiring is None:
        op.register_autograd(_not_differentiable(schema, name))
    else:
        backward_options = {} if isinstance(backward, Plan) else compile_options
        backward_op = custom_op(backward, f"{name}_backward", **backward_options)
        op.register_autograd(wiring.formula(backward_op, name), setup_context=wiring.setup_context)
    return op


def _not_differentiable(schema: OpSchema, name: str) -> Any:
    def backward(ctx: Any, *grads: Any) -> Any:
        raise UnsupportedError(
            f"torch op {name} (graph '{schema.graph.name}') has no backward: graphdnn runs the forward graph only. "
            "Call it on tensors that do not require grad (torch.no_grad(), .detach()), or pass the backward "
            "graph: gd.torch.custom_op(graph, name, backward=backward_graph)"
        )

    return backward
