"""The quotient graph of the partition so far: fused nodes contracted, kept a DAG.

Each fused node is convex in the graph, yet two of them can still need each other
(A writes what B reads and B writes what A reads), so convexity of each new group is
not enough: contracting it together with the groups already fused must leave a DAG.

Every vertex (a fused group, or a node no rule has taken) has a key, and keys are a
topological order of the quotient graph. A path that leaves a candidate and comes back
only visits keys between the candidate's smallest and largest, so checking a candidate
and contracting it cost the part of the graph it spans (as :mod:`.view` does for the
graph itself). Contracting reorders those keys the way Pearce and Kelly's dynamic
topological order does for an inserted edge.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection

from .view import GraphView


class Quotient:
    def __init__(self, view: GraphView) -> None:
        self._view = view
        count = len(view.succs)
        self._owner = list(range(count))  # the vertex (a member's id) holding each node
        self._members: dict[int, list[int]] = {}  # vertices of more than one node
        self._key = list(range(count))  # per vertex; node ids are a topological order to begin with
        self._names: dict[int, str] = {}  # per contracted vertex, for messages

    def contract(self, group: Collection[int], name: str) -> str | None:
        """Make ``group`` (unclaimed node ids) one vertex named ``name``, unless a path
        leaves it and comes back: then change nothing and return the name of a vertex on
        that path (a fused node when the path meets one)."""
        keys = [self._key[v] for v in group]
        after, via = self._reach(group, forward=True, bound=max(keys))
        if via is not None:
            return self._names.get(via) or self._view.graph.nodes[via].name
        before, _ = self._reach(group, forward=False, bound=min(keys))
        pool = sorted([*keys, *(self._key[v] for v in before), *(self._key[v] for v in after)])
        # Ancestors move to the smallest keys of the pool, descendants to the largest, the
        # group between them: every edge still goes from a smaller key to a larger one.
        for key, v in zip(pool, sorted(before, key=self._key.__getitem__), strict=False):
            self._key[v] = key
        for key, v in zip(reversed(pool), sorted(after, key=self._key.__getitem__, reverse=True), strict=False):
            self._key[v] = key
        vertex = min(group)
        self._key[vertex] = pool[len(before)]
        for v in group:
            self._owner[v] = vertex
        self._members[vertex] = sorted(group)
        self._names[vertex] = name
        return None

    def descendants(self) -> Reach:
        """Vertices reachable from a growing set of seeds (see :class:`Reach`)."""
        return Reach(self, forward=True)

    def ancestors(self) -> Reach:
        return Reach(self, forward=False)

    def _reach(self, group: Collection[int], *, forward: bool, bound: int) -> tuple[set[int], int | None]:
        """Vertices reachable from ``group`` (against the edges unless ``forward``) with keys
        strictly before ``bound`` (after it, backward); and a contracted vertex on a path
        back into the group, if the search met one."""
        edges = self._view.succs if forward else self._view.preds
        inside = set(group)
        label: dict[int, int] = {}  # per vertex found: a contracted vertex on the path to it, else its first
        stack: list[int] = []
        for v in group:
            for w in edges[v]:
                u = self._owner[w]
                if w not in inside and u not in label and self._before(u, bound, forward):
                    label[u] = u
                    stack.append(u)
        while stack:
            u = stack.pop()
            for m in self._members.get(u, [u]):
                for w in edges[m]:
                    if w in inside:
                        return set(label), label[u]
                    x = self._owner[w]
                    if x not in label and self._before(x, bound, forward):
                        label[x] = x if x in self._members else label[u]
                        stack.append(x)
        return set(label), None

    def _before(self, vertex: int, bound: int, forward: bool) -> bool:
        return self._key[vertex] < bound if forward else self._key[vertex] > bound


class Reach:
    """The vertices reachable from a growing set of seeds, discovered lazily in key order.

    ``x in reach`` (x a node id: is the vertex holding it reached?) only explores up to
    that vertex's key, and each vertex is explored once however many seeds and questions
    follow, so growing a group node by node and asking about its neighbours costs the
    size of the region the group spans.
    """

    def __init__(self, quotient: Quotient, *, forward: bool) -> None:
        self._quotient = quotient
        self._edges = quotient._view.succs if forward else quotient._view.preds
        self._sign = 1 if forward else -1
        self._found: set[int] = set()
        self._pending: list[tuple[int, int]] = []  # found, not yet explored: (signed key, vertex), nearest first

    def add(self, seed: int) -> None:
        """Seed with an unclaimed node."""
        self._push_neighbours(seed)

    def __contains__(self, node_id: object) -> bool:
        assert isinstance(node_id, int)
        vertex = self._quotient._owner[node_id]
        bound = self._sign * self._quotient._key[vertex]
        while self._pending and self._pending[0][0] < bound:
            self._push_neighbours(heapq.heappop(self._pending)[1])
        return vertex in self._found

    def _push_neighbours(self, vertex: int) -> None:
        quotient = self._quotient
        for m in quotient._members.get(vertex, [vertex]):
            for w in self._edges[m]:
                u = quotient._owner[w]
                if u not in self._found and u != vertex:
                    self._found.add(u)
                    heapq.heappush(self._pending, (self._sign * quotient._key[u], u))
