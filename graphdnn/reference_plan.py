"""The plan of the reference backend: the GPU plan's interface, computed by NumPy.

``gd.compile(graph, backend="reference")`` returns one. Buffers are NumPy arrays held
to the same rules as on the GPU (data type, dims, strides), so code written against it
runs unchanged on a GPU plan; outputs are written in place, and outputs left out of the
variant pack are allocated with the graph's strides. An output may share memory with
inputs, as on the GPU: every result is computed (into new arrays) before the first is
written; two outputs may not share memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import FeedError, UnsupportedError
from .ir import Graph, Tensor
from .layout import storage_extent
from .plan import PlanBase
from .reference import check_size, execute
from .runtime.buffers import same_strides
from .runtime.overlap import View
from .runtime.schedule import aliased_inputs
from .specialize import specialize_for
from .variant_pack import resolve

# Host storage a strided array may waste between its elements (a slice of a bigger tensor
# is fine; a stride of 2**40 is not).
MAX_HOST_GAP_BYTES = 2**30


class ReferencePlan(PlanBase):
    backend = "reference"
    kernels: tuple[()] = ()
    workspace_size = 0
    key = None
    origin = "reference"

    def bind(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> ReferenceBound:
        """Check the arrays once; the returned callable runs the reference and writes the outputs.

        A dynamic graph is bound as the static graph of the extents the arrays have
        (symbols read from the inputs, checked against their ranges); outputs left out of
        the pack are allocated for those extents.
        """
        graph = specialize_for(self.graph, variant_pack) if isinstance(variant_pack, Mapping) else self.graph
        check_size(graph)
        pack = resolve(graph, variant_pack)
        for tid, value in pack.buffers.items():
            check_host(graph.tensors[tid], value)
        views = {tid: _view(value) for tid, value in pack.buffers.items()}
        names = {tid: graph.tensors[tid].name for tid in views}
        aliased_inputs(views, {t.id for t in graph.outputs if t.id in views}, names)  # outputs apart
        arrays = dict(pack.buffers)
        arrays.update({t.id: host_array(t) for t in pack.missing_outputs})
        return ReferenceBound(graph, arrays, pack.scalars)

    def describe(self) -> str:
        return f"reference plan for graph '{self.graph.name}': {len(self.graph.nodes)} nodes run by NumPy"

    def __repr__(self) -> str:
        return f"ReferencePlan('{self.graph.name}')"


class ReferenceBound:
    """A reference plan bound to its arrays: each call reads the inputs, writes the outputs."""

    def __init__(self, graph: Graph, arrays: dict[int, np.ndarray], scalars: dict[int, float]) -> None:
        self.graph = graph
        self._arrays = arrays
        self._scalars = scalars
        self.outputs = {t.name: arrays[t.id] for t in graph.outputs}

    def __call__(self) -> None:
        feeds: dict[Any, Any] = {self.graph.tensors[tid].name: value for tid, value in self._scalars.items()}
        feeds.update({t.name: self._arrays[t.id] for t in self.graph.inputs if t.id in self._arrays})
        results = execute(self.graph, feeds)
        for t in self.graph.outputs:
            self._arrays[t.id][...] = results[t.name]


def check_host(t: Tensor, value: Any) -> None:
    """FeedError naming ``t`` unless ``value`` is a NumPy array of its data type, dims and strides."""
    if not isinstance(value, np.ndarray):
        raise FeedError(f"is a {type(value).__name__}; the reference backend takes NumPy arrays", tensor=t.name)
    if value.dtype != t.data_type.numpy:
        raise FeedError(f"has data type {value.dtype}, the graph declares {t.data_type.value}", tensor=t.name)
    if tuple(value.shape) != t.dim:
        raise FeedError(f"has dims {list(value.shape)}, the graph declares {list(t.dim)}", tensor=t.name)
    strides = tuple(s // value.itemsize for s in value.strides)
    if not same_strides(t.static_dim, strides, t.static_stride):
        raise FeedError(
            f"has strides {list(strides)}, the graph declares {list(t.stride)} (graphdnn.reference_plan.host_array "
            "makes an array with the graph's strides)",
            tensor=t.name,
        )


def _view(array: np.ndarray) -> View:
    return View(array.ctypes.data, array.shape, tuple(s // array.itemsize for s in array.strides), array.itemsize)


def host_array(t: Tensor, values: np.ndarray | None = None) -> np.ndarray:
    """A NumPy array with exactly ``t``'s dims, strides and data type, holding ``values`` if given.

    The storage spans the strides' gaps too; an UnsupportedError naming ``t`` refuses gaps
    of more than MAX_HOST_GAP_BYTES (strides of 2**40 would ask for terabytes).
    """
    itemsize = t.data_type.itemsize
    extent = storage_extent(t.static_dim, t.static_stride)
    gap = (extent - t.numel) * itemsize
    if gap > MAX_HOST_GAP_BYTES:
        raise UnsupportedError(
            f"strides {list(t.stride)} leave {gap} bytes of gaps between the {t.numel} elements of dims "
            f"{list(t.dim)}; host arrays are limited to {MAX_HOST_GAP_BYTES} bytes of gaps",
            tensor=t.name,
        )
    storage = np.zeros(extent, dtype=t.data_type.numpy)
    # np.ndarray over the buffer, not as_strided, which cannot rebuild fp8_e5m2 from its typestr ("<f1").
    array = np.ndarray(t.dim, t.data_type.numpy, storage, strides=tuple(s * itemsize for s in t.stride))
    if values is not None:
        array[...] = values
    return array
