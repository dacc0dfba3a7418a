"""The graph signature: SHA-256 of a canonical form of the graph.

The canonical form describes the graph completely (every dim, stride, data type,
attribute, constant value, edge with its role, and which tensors are outputs) but
without names, uids or the order in which tensors and nodes were declared. Tensors and
nodes are numbered by *colour refinement* (Weisfeiler-Lehman): each element starts
from a colour of its own properties, then repeatedly absorbs the colours of its
neighbours, labelled by role, until the colouring stops splitting. Elements still tied
are structurally alike; one of the smallest tied class is singled out and refinement
runs again, until every element has its own colour. The colours then give the order.

Because the canonical form lists the whole graph, two different graphs never share a
signature (short of a SHA-256 collision). Two declarations of the same graph get the
same one whenever ties are true symmetries, which covers the graphs graphdnn is built
for; the colours are blake2b digests, so they are the same on every machine and in
every Python process.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .ir import Graph

FORM_VERSION = 1


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


def _canonical(graph: Graph) -> tuple[dict[str, Any], tuple[int, ...]]:
    tensor_rank, node_rank = _canonical_order(graph)
    order = tuple(sorted((t.id for t in graph.tensors), key=lambda tid: tensor_rank[tid]))
    tensor_index = {tid: position for position, tid in enumerate(order)}
    tensors = [None] * len(graph.tensors)
    for t in graph.tensors:
        tensors[tensor_index[t.id]] = _tensor_label(t)  # type: ignore[call-overload]
    nodes = []
    for node in sorted(graph.nodes, key=lambda n: node_rank[n.id]):
        inputs = [
            [role, [tensor_index[t.id] for t in bound] if isinstance(bound, tuple) else tensor_index[bound.id]]
            for role, bound in node.inputs
        ]
        outputs = [[role, tensor_index[t.id]] for role, t in node.outputs]
        nodes.append([*_node_label(node), inputs, outputs])
    return {"form": FORM_VERSION, "tensors": tensors, "nodes": nodes}, order


def _tensor_label(t: Any) -> list[Any]:
    return [list(t.dim), list(t.stride), t.data_type.value, t.is_virtual, t.is_pass_by_value, t.value]


def _node_label(node: Any) -> list[Any]:
    return [node.op, node.attributes.to_json(), node.compute_data_type.value]


def _digest(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _canonical_order(graph: Graph) -> tuple[dict[int, str], dict[int, str]]:
    """Final, all-distinct colours of tensors and nodes (ids -> colour)."""
    tensor_color = {t.id: _digest("t", *_tensor_label(t), graph.producer(t) is None) for t in graph.tensors}
    node_color = {n.id: _digest("n", *_node_label(n)) for n in graph.nodes}
    # Edges, from each side: tensor -> [(direction, role, position, node)], node -> its bindings.
    tensor_edges: dict[int, list[tuple[str, str, int, int]]] = {t.id: [] for t in graph.tensors}
    for node in graph.nodes:
        for role, bound in node.inputs:
            for position, t in enumerate(bound if isinstance(bound, tuple) else (bound,)):
                tensor_edges[t.id].append(("read by", role, position, node.id))
        for role, t in node.outputs:
            tensor_edges[t.id].append(("written by", role, 0, node.id))

    def refine() -> None:
        distinct = len(set(tensor_color.values())) + len(set(node_color.values()))
        while True:
            new_nodes = {}
            for node in graph.nodes:
                ins = [
                    [role, [tensor_color[t.id] for t in bound] if isinstance(bound, tuple) else tensor_color[bound.id]]
                    for role, bound in node.inputs
                ]
                outs = [[role, tensor_color[t.id]] for role, t in node.outputs]
                new_nodes[node.id] = _digest(node_color[node.id], ins, outs)
            new_tensors = {
                tid: _digest(color, sorted([d, r, p, node_color[n]] for d, r, p, n in tensor_edges[tid]))
                for tid, color in tensor_color.items()
            }
            tensor_color.update(new_tensors)
            node_color.update(new_nodes)
            now = len(set(tensor_color.values())) + len(set(node_color.values()))
            if now == distinct:
                return
            distinct = now

    refine()
    while True:
        tied = _smallest_tied_class(tensor_color) or _smallest_tied_class(node_color)
        if tied is None:
            return tensor_color, node_color
        colors, members = tied
        # Single out one member; refinement then separates everything it distinguishes.
        colors[members[0]] = _digest("individualized", colors[members[0]])
        refine()


def _smallest_tied_class(colors: dict[int, str]) -> tuple[dict[int, str], list[int]] | None:
    classes: dict[str, list[int]] = {}
    for element, color in colors.items():
        classes.setdefault(color, []).append(element)
    tied = [color for color, members in classes.items() if len(members) > 1]
    if not tied:
        return None
    return colors, sorted(classes[min(tied)])
