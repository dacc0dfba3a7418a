"""Random inputs for a graph, drawn so that every op sees values inside its domain.

Used by ``graphdnn run``, the tests and the benchmarks: standard normal data, except
where a consumer needs positive values (variances, square roots, logarithms), and
never all zeros, which would hide unwritten outputs. An input whose strides map several
elements to one address (a broadcast view) gets values drawn for its memory, so that
elements sharing memory share their value, as they will in any buffer.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DataType
from .ir import Graph, Tensor
from .layout import overlap_reason, storage_extent


def needs_positive(graph: Graph, tensor: Tensor) -> bool:
    for node in graph.consumers(tensor):
        for role, bound in node.inputs:
            members = bound if isinstance(bound, tuple) else (bound,)
            if tensor in members and node.definition.role(role).positive:
                return True
    return False


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """An array for every graph input, keyed by name, in the input's data type."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in graph.inputs:
        overlapping = overlap_reason(t.dim, t.stride) is not None
        shape = (storage_extent(t.dim, t.stride),) if overlapping else t.dim
        values: np.ndarray
        if needs_positive(graph, t):
            values = rng.uniform(0.5, 2.0, shape)
        elif t.data_type is DataType.BOOLEAN:
            values = rng.integers(0, 2, shape)
        elif not t.data_type.is_floating:
            values = rng.integers(-8, 9, shape)
        else:
            values = rng.standard_normal(shape)
        values = values.astype(t.data_type.numpy)
        if overlapping:
            strides = tuple(s * values.itemsize for s in t.stride)
            values = np.lib.stride_tricks.as_strided(values, t.dim, strides).copy()
        feeds[t.name] = values
    return feeds
