"""The pass manager: apply the rules in priority order to a fixed point, log every decision."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import networkx as nx

from graphdnn.arch import parse_arch
from graphdnn.errors import GraphError
from graphdnn.ir import Graph, Node, Tensor

from .partition import Family, FusedNode, Partition, Rejection, Rewrite, family_of
from .pattern import Group, Match, MatchContext, Miss, match
from .rule import Rule, registered_rules
from .view import GraphView


def fuse(
    graph: Any,
    *,
    arch: str | int | None = None,
    disable: Iterable[str] = (),
    rules: Iterable[Rule] | None = None,
) -> Partition:
    """Partition ``graph`` (an OperationGraphSpec or a validated Graph) into fused nodes.

    Rules run in priority order, repeatedly, until none fires; ``disable`` names rules to
    skip. Every node ends up in exactly one fused node; nodes no rule took run alone.
    """
    ir: Graph = graph if isinstance(graph, Graph) else graph.validate()
    active = list(registered_rules() if rules is None else sorted(rules, key=lambda r: (r.priority, r.name)))
    disabled = set(disable)
    unknown = disabled - {r.name for r in active}
    if unknown:
        raise GraphError(f"unknown fusion rule(s) {sorted(unknown)}; rules: {', '.join(r.name for r in active)}")
    active = [r for r in active if r.name not in disabled]
    target = parse_arch(arch)
    view = GraphView(ir)

    claimed: set[int] = set()
    matches: list[tuple[Rule, Match]] = []
    rejections: dict[tuple[str, tuple[str, ...], str], Rejection] = {}

    def reject(rule: Rule, miss: Miss) -> None:
        if miss.reason is not None:
            key = (rule.name, miss.nodes, miss.reason)
            rejections.setdefault(key, Rejection(rule.name, miss.nodes, miss.reason))

    fired = True
    while fired:
        fired = False
        for rule in active:
            for node in ir.nodes:
                if node.id in claimed:
                    continue
                outcome = match(rule.pattern, MatchContext(ir, view, target, set(claimed)), node)
                for miss in outcome.rejections:
                    reject(rule, miss)
                result = outcome.result
                if isinstance(result, Miss):
                    reject(rule, result)
                    continue
                if not view.convex(result.members):
                    reject(
                        rule,
                        Miss(
                            "fusing them would form a cycle through another node", tuple(n.name for n in result.members)
                        ),
                    )
                    continue
                matches.append((rule, result))
                claimed.update(n.id for n in result.members)
                fired = True
    return _assemble(ir, view, matches, claimed, tuple(rejections.values()))


def _assemble(
    ir: Graph, view: GraphView, matches: list[tuple[Rule, Match]], claimed: set[int], rejections: tuple[Rejection, ...]
) -> Partition:
    order = {node.id: i for i, node in enumerate(ir.nodes)}
    groups: list[tuple[str, str, Family, tuple[Node, ...], Node | None, Node | None]] = []
    rewrites = []
    counts: dict[str, int] = {}
    for rule, result in matches:
        members = tuple(sorted(result.members, key=lambda n: order[n.id]))
        anchor = result.bindings.get(rule.anchor) if rule.anchor else None
        prologue = result.bindings.get(rule.prologue) if rule.prologue else None
        family = rule.family or (family_of(anchor) if anchor is not None else Family.ELEMENTWISE)
        if isinstance(rule.pattern, Group) and len(members) == 1:
            name, rule_name = members[0].name, "single"
        else:
            name = f"{rule.name}_{counts.get(rule.name, 0)}"
            counts[rule.name] = counts.get(rule.name, 0) + 1
            rule_name = rule.name
            rewrites.append(Rewrite(rule.name, name, tuple(n.name for n in members)))
        groups.append((rule_name, name, family, members, anchor, prologue))
    for node in ir.nodes:
        if node.id not in claimed:
            anchor = None if family_of(node) is Family.ELEMENTWISE else node
            groups.append(("single", node.name, family_of(node), (node,), anchor, None))

    # Fused nodes in a topological order of the quotient graph (first member breaks ties).
    owner = {n.id: i for i, group in enumerate(groups) for n in group[3]}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(groups)))
    for u, v in view.dag.edges():
        if owner[u] != owner[v]:
            quotient.add_edge(owner[u], owner[v])
    first = {i: min(order[n.id] for n in group[3]) for i, group in enumerate(groups)}
    ranked = list(nx.lexicographical_topological_sort(quotient, key=lambda i: first[i]))

    fused = []
    for i in ranked:
        rule_name, name, family, members, anchor, prologue = groups[i]
        member_set = set(members)
        epilogue = tuple(n for n in members if n is not anchor and n is not prologue)
        fused.append(
            FusedNode(
                name=name,
                rule=rule_name,
                family=family,
                nodes=members,
                anchor=anchor,
                prologue=prologue,
                epilogue=epilogue,
                inputs=_reads(members),
                outputs=_writes(ir, members, member_set),
            )
        )
    return Partition(ir, tuple(fused), tuple(rewrites), rejections)


def _reads(members: tuple[Node, ...]) -> tuple[Tensor, ...]:
    produced = {t.id for n in members for t in n.output_tensors()}
    seen: dict[int, Tensor] = {}
    for node in members:
        for t in node.input_tensors():
            if t.id not in produced and not t.is_constant:
                seen.setdefault(t.id, t)
    return tuple(seen.values())


def _writes(ir: Graph, members: tuple[Node, ...], member_set: set[Node]) -> tuple[Tensor, ...]:
    return tuple(
        t
        for node in members
        for t in node.output_tensors()
        if not t.is_virtual or any(reader not in member_set for reader in ir.consumers(t))
    )
