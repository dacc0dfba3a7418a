"""The graph signature: SHA-256 of a canonical form of the graph.

The canonical form describes the graph completely (every dim, stride, data type,
attribute, constant value, edge with its role, and which tensors are outputs) but
without names, uids or the order in which tensors and nodes were declared. Tensors and
nodes are numbered by *colour refinement* on an ordered partition, as nauty and bliss
do it: elements start in cells of equal labels, cells in the order of their labels;
then a cell (the *splitter*) splits every cell whose members see it through different
edges (counted with their direction, role and position), the parts ordered by what
they see. When no splitter splits anything, the elements still tied are structurally
alike; one member of the first tied cell is singled out and refinement goes on, until
every element has a cell of its own. Its position is its number.

A dynamic graph's symbols are elements too, labelled by their range and joined to each
tensor whose dims or strides use them (by field and axis): so the signature covers the
ranges and which dims share a symbol, never a symbol's name or any concrete value. A
static graph has no symbol elements and its canonical form is what it always was.

Every step is defined by positions and labels, never by names or ids, so the numbering
is the same for every declaration of a graph whenever ties are true symmetries, which
covers the graphs graphdnn is built for. A split re-queues all but its largest part
(Hopcroft), so numbering costs O(E log N) for a graph of N elements and E edges.
Because the canonical form lists the whole graph, two different graphs never share a
signature (short of a SHA-256 collision).
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Callable
from typing import Any

from .gc_pause import gc_paused
from .ir import Graph, Tensor
from .symbolic import Sym

FORM_VERSION = 2


def signature(graph: Graph) -> str:
    """Hex SHA-256 of :func:`canonical_form` of a validated graph."""
    return _hash(canonical_form(graph))


def signature_and_order(graph: Graph) -> tuple[str, tuple[int, ...]]:
    """The signature and :func:`canonical_tensor_order`, from one canonical numbering."""
    form, order = _canonical(graph)
    return _hash(form), order


def canonical_form(graph: Graph) -> dict[str, Any]:
    """The name-free, order-free description of ``graph`` that the signature hashes."""
    return _canonical(graph)[0]


def canonical_tensor_order(graph: Graph) -> tuple[int, ...]:
    """Tensor ids in the order of the canonical form: position i describes tensor ``order[i]``.

    Graphs with equal signatures have equal canonical forms, so positions map the tensors
    of one onto the tensors of the other (what the plan cache relies on).
    """
    return _canonical(graph)[1]


def _hash(form: dict[str, Any]) -> str:
    text = json.dumps(form, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@gc_paused()
def _canonical(graph: Graph) -> tuple[dict[str, Any], tuple[int, ...]]:
    tensor_labels = [_tensor_label(t, _range_form) for t in graph.tensors]
    node_labels = _node_labels(graph)
    rank = _canonical_ranks(graph, tensor_labels, node_labels)
    first = len(graph.tensors)
    order = tuple(sorted(range(first), key=rank.__getitem__))
    form: dict[str, Any] = {"form": FORM_VERSION}
    if graph.symbols:  # dims name symbols by canonical position; ranges listed in that order
        after_nodes = first + len(graph.nodes)
        by_rank = sorted(range(len(graph.symbols)), key=lambda k: rank[after_nodes + k])
        position = {graph.symbols[k]: p for p, k in enumerate(by_rank)}
        form["symbols"] = [[graph.symbols[k].min, graph.symbols[k].max] for k in by_rank]

        def numbered(e: Sym) -> list[Any]:
            return ["*", e.coefficient, sorted(position[s] for s in e.factors)]

        tensor_labels = [_tensor_label(t, numbered) for t in graph.tensors]
    tensor_index = {tid: position for position, tid in enumerate(order)}
    nodes = []
    for i in sorted(range(len(graph.nodes)), key=lambda i: rank[first + i]):
        node = graph.nodes[i]
        inputs = [
            [role, [tensor_index[t.id] for t in bound] if isinstance(bound, tuple) else tensor_index[bound.id]]
            for role, bound in node.inputs
        ]
        outputs = [[role, tensor_index[t.id]] for role, t in node.outputs]
        nodes.append([*node_labels[i], inputs, outputs])
    form["tensors"] = [tensor_labels[tid] for tid in order]
    form["nodes"] = nodes
    return form, order


def _range_form(e: Sym) -> list[Any]:
    """A symbolic extent without names, for the starting labels: its coefficient and its symbols' ranges."""
    return ["*", e.coefficient, [[s.min, s.max] for s in e.factors]]


def _tensor_label(t: Tensor, symbolic: Callable[[Sym], list[Any]]) -> list[Any]:
    if t.symbols:
        dims: list[Any] = [symbolic(d) if isinstance(d, Sym) else d for d in t.dim]
        strides: list[Any] = [symbolic(s) if isinstance(s, Sym) else s for s in t.stride]
    else:
        dims, strides = list(t.dim), list(t.stride)
    return [dims, strides, t.data_type.value, t.is_virtual, t.is_pass_by_value, t.value]


def _node_labels(graph: Graph) -> list[list[Any]]:
    """Each node's [op, attributes, compute type]; nodes sharing an attributes object share the list.

    Keyed on the object's identity, not its value: equal attributes can encode differently
    (0.0 and -0.0 compare equal).
    """
    shared: dict[tuple[str, Any, int], list[Any]] = {}
    labels = []
    for node in graph.nodes:
        key = (node.op, node.compute_data_type, id(node.attributes))
        label = shared.get(key)
        if label is None:
            label = shared[key] = [node.op, node.attributes.to_json(), node.compute_data_type.value]
        labels.append(label)
    return labels


def _canonical_ranks(graph: Graph, tensor_labels: list[list[Any]], node_labels: list[list[Any]]) -> list[int]:
    """A canonical position for every element: tensor ``t.id``, then node ``first + i``."""
    first = len(graph.tensors)
    texts: dict[Any, str] = {}  # most elements share their label with many others: encode each once
    labels = []
    for t, label in zip(graph.tensors, tensor_labels, strict=True):
        # repr, not the value: 0.0 == -0.0, but their labels differ
        key = ("t", t.dim, t.stride, t.data_type, t.is_virtual, t.is_pass_by_value, type(t.value), repr(t.value))
        labels.append(texts.get(key) or texts.setdefault(key, json.dumps(["t", *label], sort_keys=True)))
    node_texts: dict[int, str] = {}  # by identity: nodes share label lists (see _node_labels)
    for label in node_labels:
        text = node_texts.get(id(label))
        labels.append(text or node_texts.setdefault(id(label), json.dumps(["n", *label], sort_keys=True)))
    labels.extend(json.dumps(["s", s.min, s.max]) for s in graph.symbols)
    partition = _Partition(labels, _edges(graph, first))
    partition.refine()
    while (tied := partition.first_tied_cell()) is not None:
        partition.single_out(tied)
        partition.refine()
    return partition.pos


def _edges(graph: Graph, first: int) -> list[list[tuple[int, int]]]:
    """For each element, its neighbours with the label of the edge as the neighbour sees it.

    Labels are (direction, role, position) tuples, numbered in sorted order so that the
    numbers are as canonical as the labels.
    """
    raw: list[tuple[int, int, tuple[int, str, int], tuple[int, str, int]]] = []
    for i, node in enumerate(graph.nodes):
        for role, bound in node.inputs:
            for position, t in enumerate(bound if isinstance(bound, tuple) else (bound,)):
                raw.append((first + i, t.id, (0, role, position), (2, role, position)))
        for role, t in node.outputs:
            raw.append((first + i, t.id, (1, role, 0), (3, role, 0)))
    symbol_id = {s: first + len(graph.nodes) + k for k, s in enumerate(graph.symbols)}
    for t in graph.tensors:
        if t.symbols:  # a symbol and each dim or stride using it (once per factor)
            for field, values in (("dim", t.dim), ("stride", t.stride)):
                for axis, value in enumerate(values):
                    for s in value.factors if isinstance(value, Sym) else ():
                        raw.append((symbol_id[s], t.id, (4, field, axis), (5, field, axis)))
    number = {label: n for n, label in enumerate(sorted({r[2] for r in raw} | {r[3] for r in raw}))}
    adjacent: list[list[tuple[int, int]]] = [[] for _ in range(first + len(graph.nodes) + len(graph.symbols))]
    for element, tensor, seen_by_tensor, seen_by_node in raw:
        adjacent[element].append((tensor, number[seen_by_tensor]))
        adjacent[tensor].append((element, number[seen_by_node]))
    return adjacent


class _Partition:
    """An ordered partition of elements 0..n-1 into cells of consecutive positions.

    ``perm[p]`` is the element at position p and ``pos`` its inverse; ``cell[x]`` is the
    first position of x's cell, which names the cell, and ``size[c]`` its size. Splitting
    keeps the part that saw nothing at the cell's start, so only elements that saw the
    splitter move: refinement costs what the splitter's edges cost.
    """

    def __init__(self, labels: list[str], adjacent: list[list[tuple[int, int]]]) -> None:
        n = len(labels)
        self.adjacent = adjacent
        self.perm = sorted(range(n), key=labels.__getitem__)
        self.pos = [0] * n
        self.cell = [0] * n
        self.size = [0] * n
        start = 0
        for p, x in enumerate(self.perm):
            if labels[x] != labels[self.perm[start]]:
                self.size[start] = p - start
                start = p
            self.pos[x] = p
            self.cell[x] = start
        if n:
            self.size[start] = n - start
        self.queue = sorted(set(self.cell))
        self.queued = set(self.queue)
        self.tied_from = 0  # no position before it is in a tied cell

    def refine(self) -> None:
        """Split by queued cells until the partition is equitable."""
        adjacent, cell, size, perm, queue, queued = (
            self.adjacent,
            self.cell,
            self.size,
            self.perm,
            self.queue,
            self.queued,
        )
        split = self._split
        while queue:
            splitter = heapq.heappop(queue)
            queued.discard(splitter)
            seen: dict[int, list[int]] = {}
            for s in perm[splitter : splitter + size[splitter]]:
                for x, label in adjacent[s]:
                    if size[cell[x]] == 1:
                        continue  # a cell of one cannot split: most are, once refinement is under way
                    labels = seen.get(x)
                    if labels is None:
                        seen[x] = [label]
                    else:
                        labels.append(label)
            by_cell: dict[int, list[int]] = {}
            for x in seen:
                c = cell[x]
                members = by_cell.get(c)
                if members is None:
                    by_cell[c] = [x]
                else:
                    members.append(x)
            for c, members in by_cell.items():
                split(c, members, seen)

    def _split(self, c: int, members: list[int], seen: dict[int, list[int]]) -> None:
        perm, pos, cell, size = self.perm, self.pos, self.cell, self.size
        end = c + size[c]
        if len(members) == 1:  # the common case: one member moves to a cell of its own at the end
            x, last = members[0], end - 1
            p, y = pos[x], perm[last]
            perm[p], pos[y] = y, p
            perm[last], pos[x], cell[x] = x, last, last
            size[c] = last - c
            size[last] = 1
            heapq.heappush(self.queue, last)  # the smaller part, whether or not c is queued
            self.queued.add(last)
            return
        groups: dict[tuple[int, ...], list[int]] = {}
        for x in members:
            labels = seen[x]
            groups.setdefault(tuple(sorted(labels)) if len(labels) > 1 else (labels[0],), []).append(x)
        rest = end - len(members)  # members that saw nothing stay in [c, rest)
        if len(groups) == 1 and rest == c:
            return
        boundary = end
        for x in members:  # move the members to the end of the cell
            boundary -= 1
            p, y = pos[x], perm[boundary]
            perm[p], pos[y] = y, p
            perm[boundary], pos[x] = x, boundary
        parts = [c] if rest > c else []
        p = rest
        for key in sorted(groups):
            parts.append(p)
            for x in groups[key]:
                perm[p], pos[x], cell[x] = x, p, parts[-1]
                p += 1
        bounds = [*parts[1:], end]
        for start, stop in zip(parts, bounds, strict=True):
            size[start] = stop - start
        if c in self.queued:
            fresh = parts[1:]
        else:
            largest = max(parts, key=size.__getitem__)
            fresh = [start for start in parts if start != largest]
        for start in fresh:
            heapq.heappush(self.queue, start)
            self.queued.add(start)

    def first_tied_cell(self) -> int | None:
        while self.tied_from < len(self.perm) and self.size[self.tied_from] == 1:
            self.tied_from += 1
        return self.tied_from if self.tied_from < len(self.perm) else None

    def single_out(self, c: int) -> None:
        """Give one member of cell ``c`` a cell of its own, after the others."""
        last = c + self.size[c] - 1
        x, y = self.perm[c], self.perm[last]
        self.perm[c], self.pos[y] = y, c
        self.perm[last], self.pos[x] = x, last
        self.cell[x] = last
        self.size[c] -= 1
        self.size[last] = 1
        heapq.heappush(self.queue, last)
        self.queued.add(last)
