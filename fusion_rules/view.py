"""The dependency questions fusion asks of an operation graph, answered in bounded time.

Vertices are node ids, which are positions in the graph's topological order; an edge
u -> v means v reads a tensor u writes. Because every edge goes to a later position, a
path from u to v visits only positions between them: searches stop at that bound, so a
question about a group costs what the part of the graph it spans costs, never the
whole graph (fusion stays linear in the size of the graph).
"""

from __future__ import annotations

from collections.abc import Collection

from graphdnn.ir import Graph, Node, Tensor


class GraphView:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        if any(node.id != i for i, node in enumerate(graph.nodes)):
            raise ValueError("node ids must be positions in topological order (a validated Graph)")
        self.preds: list[list[int]] = [[] for _ in graph.nodes]
        self.succs: list[list[int]] = [[] for _ in graph.nodes]
        for node in graph.nodes:
            for tensor in node.input_tensors():
                producer = graph.producer(tensor)
                if producer is not None:
                    self.preds[node.id].append(producer.id)
                    self.succs[producer.id].append(node.id)

    def neighbours(self, node_id: int) -> list[int]:
        """Nodes that write a tensor ``node_id`` reads or read one it writes."""
        return self.preds[node_id] + self.succs[node_id]

    def depends_on(self, tensor: Tensor, group: Collection[int], floor: int, clear: set[int]) -> bool:
        """True when ``tensor`` is computed (directly or not) from a node of ``group`` (ids).

        ``floor`` is at most the smallest id in the group; ``clear`` collects nodes known
        not to depend on the group, to share work between questions about one group.
        """
        producer = self.graph.producer(tensor)
        if producer is None:
            return False
        stack, seen = [producer.id], {producer.id}
        while stack:
            v = stack.pop()
            if v in group:
                return True
            for u in self.preds[v]:
                if u >= floor and u not in seen and u not in clear:
                    seen.add(u)
                    stack.append(u)
        clear |= seen
        return False

    def convex(self, group: Collection[Node]) -> bool:
        """True when no path leaves the group and comes back (fusing it makes no cycle)."""
        inside = {node.id for node in group}
        top = max(inside, default=-1)
        stack = [w for v in inside for w in self.succs[v] if w not in inside and w < top]
        seen = set(stack)
        while stack:
            for w in self.succs[stack.pop()]:
                if w in inside:
                    return False
                if w < top and w not in seen:
                    seen.add(w)
                    stack.append(w)
        return True
