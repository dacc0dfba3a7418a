"""A call's arguments checked against the graph, and the layout of its results.

The fake kernel (under ``torch.compile`` and ``torch.export``) and the real ones run the
same checks, so a mismatch is the same clear error at trace time and eagerly. While
tracing, sizes are torch ``SymInt``s: a symbol's value is one of them, the comparisons
below become guards on it, and the results' dims and strides are products of them, so
the results of a dynamic graph carry symbolic sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import FeedError
from ..runtime.frameworks import torch_dtype
from ..specialize import symbol_values
from ..symbolic import evaluate, show
from .op_schema import OpSchema


def check_arguments(schema: OpSchema, args: Sequence[Any]) -> dict[str, Any]:
    """Each symbol's value (empty for a static graph); a FeedError naming the argument and
    its tensor unless every tensor argument has its tensor's data type and dims, all on one device."""
    first: tuple[str, Any] | None = None
    shapes = {}
    for i in schema.tensor_inputs:
        t, name, value = schema.inputs[i], schema.arguments[i], args[i]
        expected = torch_dtype(t.data_type)
        if value.dtype != expected:
            raise FeedError(
                f"argument '{name}' has dtype {value.dtype}, the graph declares {t.data_type.value} ({expected})",
                tensor=t.name,
            )
        if value.dim() != len(t.dim):
            raise FeedError(
                f"argument '{name}' has {value.dim()} dims {list(value.shape)}, the graph declares {show(t.dim)}",
                tensor=t.name,
            )
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise FeedError(
                f"argument '{name}' is on {value.device}, argument '{first[0]}' on {first[1]}; "
                "every tensor argument must be on one device",
                tensor=t.name,
            )
        shapes[t.id] = tuple(value.shape)
    values = symbol_values(schema.graph, shapes) if schema.graph.is_dynamic else {}
    for i in schema.tensor_inputs:
        t = schema.inputs[i]
        if shapes[t.id] != tuple(evaluate(d, values) for d in t.dim):
            raise FeedError(
                f"argument '{schema.arguments[i]}' has dims {list(shapes[t.id])}, the graph declares {show(t.dim)}",
                tensor=t.name,
            )
    return values


def device_of(schema: OpSchema, args: Sequence[Any]) -> Any:
    """The device of the call: that of its tensor arguments (check_arguments holds them to one)."""
    return args[schema.tensor_inputs[0]].device


def empty_results(schema: OpSchema, values: dict[str, Any], device: Any) -> list[Any]:
    """Uninitialised result tensors from torch's allocator (fake ones while tracing) with the
    dims and strides of the graph's outputs for these symbol values."""
    import torch

    return [
        torch.empty_strided(
            tuple(evaluate(d, values) for d in t.dim),
            tuple(evaluate(s, values) for s in t.stride),
            dtype=torch_dtype(t.data_type),
            device=device,
        )
        for t in schema.outputs
    ]


def returned(results: list[Any]) -> Any:
    """What the op returns: its one result, or a tuple of them (the schema's ``-> (Tensor, ...)``)."""
    return results[0] if len(results) == 1 else tuple(results)
