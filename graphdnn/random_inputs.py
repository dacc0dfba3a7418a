"""Random inputs for a graph, drawn so that every op sees values inside its domain.

Used by ``graphdnn run``, the tests and the benchmarks: standard normal data, except
where a consumer needs positive values (variances, square roots, logarithms; fp8_e8m0
tensors, which hold powers of two only), a smaller spread (recurrent weights) or a range
of integers (sequence lengths), and never all zeros, which would hide unwritten outputs. An input whose strides map several
elements to one address (a broadcast view) gets values drawn for its memory, so that
elements sharing memory share their value, as they will in any buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .dtypes import DataType
from .ir import Graph, Node, Tensor
from .layout import overlap_reason, storage_extent
from .packing import pack


def _uses(graph: Graph, tensor: Tensor) -> Iterator[tuple[Node, str]]:
    """Each (consumer, role) that reads ``tensor``."""
    for node in graph.consumers(tensor):
        for role, bound in node.inputs:
            members = bound if isinstance(bound, tuple) else (bound,)
            if tensor in members:
                yield node, role


def needs_positive(graph: Graph, tensor: Tensor) -> bool:
    return any(node.definition.role(role).positive for node, role in _uses(graph, tensor))


def integer_range(graph: Graph, tensor: Tensor) -> tuple[int, int]:
    """The closed range an integer input is drawn from: what every consumer accepts
    (sequence lengths lie in [0, S]), else -8 to 8."""
    ranges = [r for node, role in _uses(graph, tensor) if (r := node.definition.value_range(node, role)) is not None]
    if not ranges:
        return -8, 8
    return max(low for low, _ in ranges), min(high for _, high in ranges)


def floating_scale(graph: Graph, tensor: Tensor) -> float:
    """The standard deviation a floating input is drawn with: the smallest any consumer asks
    for (a recurrent layer's weights, 1 / sqrt(hidden size)), else 1."""
    scales = [s for node, role in _uses(graph, tensor) if (s := node.definition.value_scale(node, role)) is not None]
    return min(scales, default=1.0)


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """An array for every graph input, keyed by name, in the input's data type."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in graph.inputs:
        overlapping = overlap_reason(t.dim, t.stride) is not None
        shape = (storage_extent(t.static_dim, t.static_stride),) if overlapping else t.static_dim
        values: np.ndarray
        if needs_positive(graph, t) or t.data_type is DataType.FP8_E8M0:  # e8m0 holds positive values only
            values = rng.uniform(0.5, 2.0, shape)
        elif t.data_type is DataType.BOOLEAN:
            values = rng.integers(0, 2, shape)
        elif not t.data_type.is_floating:
            low, high = integer_range(graph, t)
            values = rng.integers(low, high + 1, shape)
        else:
            values = rng.standard_normal(shape) * floating_scale(graph, t)
        if t.data_type.is_packed:  # the packed bytes a 4-bit tensor's feed holds (packing.py)
            feeds[t.name] = pack(values, t.data_type, t.static_stride, t.name)
            continue
        values = values.astype(t.data_type.numpy)
        if overlapping:
            strides = tuple(s * values.itemsize for s in t.static_stride)
            values = np.lib.stride_tricks.as_strided(values, t.static_dim, strides).copy()
        feeds[t.name] = values
    return feeds
