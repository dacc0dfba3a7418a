"""The NumPy reference backend: the definition of what every graph computes.

Each node runs its op's float64 reference; every tensor it writes is then rounded to
the tensor's own data type (so a bf16 intermediate is bf16, as on the GPU), and
outputs are returned in their declared types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .dtypes import round_to
from .errors import FeedError, UnsupportedError
from .ir import FeedKey, Graph, Node, Tensor, resolve_tensor
from .packing import unpack
from .specialize import specialize_for

# The reference holds every tensor in float64: 2**31 elements is 16 GiB. Dims may reach
# 2**48 elements (the GPU's bound), so a small file could otherwise ask for petabytes.
MAX_REFERENCE_ELEMENTS = 2**31


def execute(graph: Any, feeds: Mapping[FeedKey, Any]) -> dict[str, np.ndarray]:
    """Run ``graph`` (an OperationGraphSpec or a validated Graph) on NumPy inputs.

    ``feeds`` maps every graph input (by TensorSpec, name or uid) to an array of its
    logical dims and data type (bf16/fp8 as ml_dtypes arrays); pass-by-value scalars
    also take Python numbers. Returns ``{output name: array}`` in the outputs' types.
    A dynamic graph takes its symbols' values from the arrays' shapes (checked against
    the ranges) and runs as the static graph of those values.
    """
    ir: Graph = graph if isinstance(graph, Graph) else graph.validate()
    return output_arrays(ir, evaluate(ir, feeds))


def evaluate(ir: Graph, feeds: Mapping[FeedKey, Any]) -> dict[int, np.ndarray]:
    """Every tensor's float64 value by tensor id (feeds, constants, each node's outputs),
    for callers that check intermediates too, such as the fused-partition reference."""
    ir = specialize_for(ir, feeds)
    values = bind_feeds(ir, feeds)
    run_nodes(ir.nodes, values)
    return values


def output_arrays(ir: Graph, values: Mapping[int, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs from ``values``, by name, in their declared data types."""
    return {t.name: values[t.id].astype(t.data_type.numpy) for t in ir.outputs}


def check_size(ir: Graph) -> None:
    """UnsupportedError naming the first tensor too large for the reference to hold."""
    if ir.is_dynamic:
        raise UnsupportedError(
            f"graph '{ir.name}' has symbolic dims; it runs for concrete extents (graphdnn.specialize.specialize_for)"
        )
    for t in ir.tensors:
        if t.numel > MAX_REFERENCE_ELEMENTS:
            raise UnsupportedError(
                f"has {t.numel} elements; the reference backend computes in float64 and holds at most "
                f"{MAX_REFERENCE_ELEMENTS} elements in a tensor",
                tensor=t.name,
            )


def bind_feeds(ir: Graph, feeds: Mapping[FeedKey, Any]) -> dict[int, np.ndarray]:
    """Check the graph's size and the feeds against its inputs; return float64 values by tensor id."""
    check_size(ir)
    by_key = {}
    for key, value in feeds.items():
        tensor = resolve_tensor(ir, key)
        if tensor.id in by_key:
            raise FeedError(f"tensor '{tensor.name}' is fed twice", tensor=tensor.name)
        by_key[tensor.id] = (tensor, value)
    values: dict[int, np.ndarray] = {}
    for t in ir.tensors:
        if t.is_constant:
            values[t.id] = round_to(t.data_type, np.full(t.dim, float(t.value)))  # type: ignore[arg-type]
    for t in ir.inputs:
        if t.id not in by_key:
            raise FeedError(f"graph input '{t.name}' has no feed", tensor=t.name)
        values[t.id] = _check_feed(t, by_key.pop(t.id)[1])
    for tensor, _ in by_key.values():
        raise FeedError(f"tensor '{tensor.name}' is not a graph input; only inputs are fed", tensor=tensor.name)
    return values


def run_nodes(nodes: tuple[Node, ...] | list[Node], values: dict[int, np.ndarray]) -> None:
    """Run nodes in order, adding each output (rounded to its type) to ``values``."""
    for node in nodes:
        results = node.definition.reference(node, operands(node, values))
        for role_name, t in node.outputs:
            result = np.asarray(results[role_name], dtype=np.float64)
            if result.shape != t.dim:
                raise AssertionError(f"{node.op} reference gave {result.shape} for '{t.name}' of dims {t.dim}")
            values[t.id] = round_to(t.data_type, result)


def operands(node: Node, values: Mapping[int, np.ndarray]) -> dict[str, Any]:
    """A node's inputs as its op's ``reference`` takes them: arrays, tuples for variadic
    roles, Python floats for scalar roles."""
    x: dict[str, Any] = {}
    for role_name, bound in node.inputs:
        if isinstance(bound, tuple):
            x[role_name] = tuple(values[t.id] for t in bound)
        elif node.definition.role(role_name).scalar:
            x[role_name] = float(values[bound.id].reshape(-1)[0])
        else:
            x[role_name] = values[bound.id]
    return x


def _check_feed(t: Tensor, value: Any) -> np.ndarray:
    if t.is_pass_by_value and isinstance(value, (int, float)) and not isinstance(value, bool):
        return round_to(t.data_type, np.full(t.dim, float(value)))
    if not isinstance(value, np.ndarray):
        raise FeedError(f"feed for '{t.name}' is a {type(value).__name__}; give a NumPy array", tensor=t.name)
    if t.data_type.is_packed:
        return unpack(value, t.data_type, t.static_dim, t.static_stride, t.name)
    if tuple(value.shape) != t.dim:
        raise FeedError(f"feed for '{t.name}' has shape {list(value.shape)}, expected {list(t.dim)}", tensor=t.name)
    if value.dtype != t.data_type.numpy:
        raise FeedError(
            f"feed for '{t.name}' has dtype {value.dtype}, expected {t.data_type.numpy} ({t.data_type.value})",
            tensor=t.name,
        )
    return value.astype(np.float64)
