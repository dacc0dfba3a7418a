"""A networkx view of an operation graph, for the dependency questions fusion asks.

Vertices are node ids; an edge u -> v, labelled with the tensor and the input role,
means v reads a tensor u writes.
"""

from __future__ import annotations

from collections.abc import Collection
from functools import cached_property

import networkx as nx

from graphdnn.ir import Graph, Node, Tensor


class GraphView:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.dag = nx.MultiDiGraph()
        self.dag.add_nodes_from((node.id, {"node": node}) for node in graph.nodes)
        for node in graph.nodes:
            for role, bound in node.inputs:
                for tensor in bound if isinstance(bound, tuple) else (bound,):
                    producer = graph.producer(tensor)
                    if producer is not None:
                        self.dag.add_edge(producer.id, node.id, tensor=tensor.name, role=role)

    @cached_property
    def _descendants(self) -> dict[int, set[int]]:
        reach: dict[int, set[int]] = {}
        for node_id in reversed(list(nx.topological_sort(self.dag))):
            below: set[int] = set()
            for child in self.dag.successors(node_id):
                below.add(child)
                below |= reach[child]
            reach[node_id] = below
        return reach

    def depends_on(self, tensor: Tensor, group: Collection[Node]) -> bool:
        """True when ``tensor`` is computed (directly or not) from a node of ``group``."""
        producer = self.graph.producer(tensor)
        if producer is None:
            return False
        ids = {node.id for node in group}
        return producer.id in ids or any(producer.id in self._descendants[i] for i in ids)

    def linked(self, node: Node, group: Collection[Node]) -> bool:
        """True when ``node`` reads a tensor the group writes, or writes one it reads."""
        ids = {n.id for n in group}
        return any(p in ids for p in self.dag.predecessors(node.id)) or any(
            s in ids for s in self.dag.successors(node.id)
        )

    def convex(self, group: Collection[Node]) -> bool:
        """True when no path leaves the group and comes back (fusing it makes no cycle)."""
        ids = {node.id for node in group}
        outside_below: set[int] = set()
        for i in ids:
            outside_below |= self._descendants[i] - ids
        return not any(self._descendants[o] & ids for o in outside_below)
