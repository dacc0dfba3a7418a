"""A bound plan's launches as nodes of a caller's CUDA graph (the cuDNN frontend's
``populate_cuda_graph`` / ``update_cuda_graph``).

Populating captures the launches into the caller's empty graph, so they form one chain: the
input copies, then the kernels, in launch order. Updating checks that the graph holds such a
chain, then captures the launches on the new buffers in its place: the same topology and node
insertion order, which is what ``cudaGraphExecChildGraphNodeSetParams`` and
``cudaGraphExecUpdate`` require of a graph changed after instantiation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import driver


def nodes(graph: Any) -> list[Any]:
    """Every node of ``graph`` (a CUgraph)."""
    return _listed(driver.api().cuGraphGetNodes, graph)


def chain(graph: Any, expected: Sequence[str]) -> list[Any]:
    """The nodes of ``graph`` from its root along its one edge each, checked against
    ``expected`` (``"kernel"`` or ``"memcpy"`` per step): a graph that another plan, another
    binding's launches or the caller's own nodes populated is refused, never half updated."""
    api = driver.api()
    kinds = {
        int(api.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL): "kernel",
        int(api.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY): "memcpy",
    }
    every = nodes(graph)
    roots = _listed(api.cuGraphGetRootNodes, graph)
    found: list[Any] = []
    following = roots if len(every) == len(expected) else []
    while len(following) == 1:
        found.append(following[0])
        following = _listed(api.cuGraphNodeGetDependentNodes, following[0])
    kinds_found = [kinds.get(int(driver.call(api.cuGraphNodeGetType, node)), "other") for node in found]
    if kinds_found != list(expected):
        raise driver.CudaError(
            f"this CUDA graph holds {len(every)} nodes ({', '.join(kinds_found) or 'no chain from one root'}) where "
            f"populate_cuda_graph of this plan puts a chain of {len(expected)} ({', '.join(expected)}): "
            "update_cuda_graph takes a graph that this graph's populate_cuda_graph filled, or its clone"
        )
    return found


def _listed(query: Any, handle: Any) -> list[Any]:
    """The handles a count-then-fill driver query returns (its first result is the list,
    its last the count)."""
    count = driver.call(query, handle, 0)[-1]
    return list(driver.call(query, handle, count)[0][:count]) if count else []
