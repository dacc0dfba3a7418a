"""The pass manager: apply the rules in priority order to a fixed point, log every decision."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from graphdnn.arch import parse_arch
from graphdnn.errors import GraphError, SymbolicDimError
from graphdnn.gc_pause import gc_paused
from graphdnn.ir import Graph, Node, Tensor

from .partition import Family, FusedNode, Partition, Rejection, Rewrite, family_of, is_elementwise, is_synthesized
from .pattern import Claimed, Group, Match, MatchContext, Miss, Op, Outcome, match
from .quotient import Quotient
from .rule import Rule, registered_rules
from .view import GraphView

_LOG = logging.getLogger("graphdnn.fusion")


@gc_paused()
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

    quotient = Quotient(view)  # the fused nodes so far, contracted: must stay a DAG
    claimed: set[int] = set()
    matches: list[tuple[Rule, Match, str | None]] = []
    counts: dict[str, int] = {}  # fused nodes made per rule, which name them
    rejections: dict[tuple[str, tuple[str, ...], str], Rejection] = {}

    def reject(rule: Rule, miss: Miss) -> None:
        if miss.reason is not None:
            key = (rule.name, miss.nodes, miss.reason)
            rejections.setdefault(key, Rejection(rule.name, miss.nodes, miss.reason))

    # Semantically: every round tries every rule (in priority order) at every unclaimed
    # node (in graph order), and rounds repeat while one fires. A try whose outcome
    # cannot have changed since it was last made is skipped: a rule is tried only at the
    # nodes it can start from, and again only once a node it asked about is claimed.
    of_kind = {node.op: node for node in ir.nodes}  # whether a rule may start at a node depends on its kind
    starts = [{kind for kind, node in of_kind.items() if _may_start(rule, node)} for rule in active]
    worklist = _Worklist([[n.id for n in ir.nodes if n.op in kinds] for kinds in starts])
    while worklist.next_round():
        for index, rule in enumerate(active):
            for node_id in worklist.tries(index):
                if node_id in claimed:
                    continue
                node = ir.nodes[node_id]
                asked = Claimed(claimed)
                ctx = MatchContext(ir, view, target, asked, quotient)
                try:
                    outcome = match(rule.pattern, ctx, node)
                    result = outcome.result
                    if rule.rewrite is not None and isinstance(result, Match):
                        result = rule.rewrite(ctx, result)
                except SymbolicDimError as error:  # a guard needs a concrete dim: the rule declines, saying why
                    outcome = Outcome(Miss())
                    result = Miss(f"the rule needs concrete dims here: {error.reason}", (node.name,))
                worklist.watch(asked.asked, index, node_id)
                for miss in outcome.rejections:
                    reject(rule, miss)
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
                name = _fused_name(rule, result, counts)
                if name is not None:
                    blocker = quotient.contract([n.id for n in result.members], name)
                    if blocker is not None:
                        reject(
                            rule,
                            Miss(
                                f"fusing them would form a cycle with fused node {blocker}",
                                tuple(n.name for n in result.members),
                            ),
                        )
                        continue
                    counts[rule.name] = counts.get(rule.name, 0) + 1
                matches.append((rule, result, name))
                claimed.update(n.id for n in result.members)
                worklist.claimed(n.id for n in result.members)
    partition = _assemble(ir, view, matches, claimed, tuple(rejections.values()))
    _log_decisions(partition, target)
    return partition


def _log_decisions(partition: Partition, target: int) -> None:
    """Every rewrite and rejected candidate at debug level, the outcome at info level."""
    if _LOG.isEnabledFor(logging.DEBUG):
        for rewrite in partition.rewrites:
            _LOG.debug("fused %s", rewrite)
        for rejection in partition.rejections:
            _LOG.debug("rejected %s", rejection)
    _LOG.info(
        "graph %r for sm_%d: %d nodes -> %d fused nodes (%d rewrites, %d candidates rejected)",
        partition.graph.name,
        target,
        len(partition.graph.nodes),
        len(partition.nodes),
        len(partition.rewrites),
        len(partition.rejections),
    )


def _fused_name(rule: Rule, result: Match, counts: dict[str, int]) -> str | None:
    """``conv_bn_act_0``...; None for a group of one node, which stays that node alone."""
    if isinstance(rule.pattern, Group) and len(result.members) == 1:
        return None
    return f"{rule.name}_{counts.get(rule.name, 0)}"


def _assemble(
    ir: Graph,
    view: GraphView,
    matches: list[tuple[Rule, Match, str | None]],
    claimed: set[int],
    rejections: tuple[Rejection, ...],
) -> Partition:
    order = {node.id: i for i, node in enumerate(ir.nodes)}
    groups: list[tuple[str, str, Family, tuple[Node, ...], Node | None, Node | None]] = []
    rewrites = []
    for rule, result, fused_name in matches:
        members = tuple(sorted(result.members, key=lambda n: order[n.id]))
        anchor = result.anchor or (result.bindings.get(rule.anchor) if rule.anchor else None)
        prologue = result.bindings.get(rule.prologue) if rule.prologue else None
        family = rule.family or (family_of(anchor) if anchor is not None else Family.ELEMENTWISE)
        if fused_name is None:
            name, rule_name = members[0].name, "single"
        else:
            name, rule_name = fused_name, rule.name
            rewrites.append(Rewrite(rule.name, name, tuple(n.name for n in members)))
        groups.append((rule_name, name, family, members, anchor, prologue))
    for node in ir.nodes:
        if node.id not in claimed:
            anchor = None if family_of(node) is Family.ELEMENTWISE else node
            groups.append(("single", node.name, family_of(node), (node,), anchor, None))

    # Fused nodes in a topological order of the quotient graph (first member breaks ties).
    owner = {n.id: i for i, group in enumerate(groups) for n in group[3]}
    first = [min(order[n.id] for n in group[3]) for group in groups]
    ranked = _ranked(owner, view, first)

    fused = []
    for i in ranked:
        rule_name, name, family, members, anchor, prologue = groups[i]
        epilogue = (
            ()
            if is_synthesized(anchor, members)
            else tuple(n for n in members if n is not anchor and n is not prologue)
        )
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
                outputs=_writes(ir, members),
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


def _writes(ir: Graph, members: tuple[Node, ...]) -> tuple[Tensor, ...]:
    inside = {node.id for node in members}
    return tuple(
        t
        for node in members
        for t in node.output_tensors()
        if not t.is_virtual or any(reader.id not in inside for reader in ir.consumers(t))
    )


def _may_start(rule: Rule, node: Node) -> bool:
    """Whether ``rule`` can match starting at ``node``: its first step's kinds (or, for a
    group, elementwise nodes); a pattern that opens with an optional step may start anywhere."""
    pattern = rule.pattern
    if isinstance(pattern, Group):
        return is_elementwise(node)
    first = pattern.steps[0] if pattern.steps else None
    return not isinstance(first, Op) or first.optional or node.op in first.kinds


class _Worklist:
    """Which (rule, node) tries each round of the fixed point makes.

    Every node is tried in the first round. After that a try is made again only when a
    node it asked about has been claimed since, at the point of the round where the full
    loop would make it: in this round if its rule (or its node, for the rule now
    running) is still ahead, else in the next.
    """

    def __init__(self, starts: list[list[int]]) -> None:
        self._due: list[set[int]] = [set(ids) for ids in starts]
        self._next: list[set[int]] = [set() for _ in starts]
        self._heap: list[int] = []
        self._watchers: dict[int, list[tuple[int, int]]] = {}
        self._rule = -1
        self._at = -1
        self._fired = True

    def next_round(self) -> bool:
        if not self._fired:
            return False
        self._fired = False
        for index, later in enumerate(self._next):
            self._due[index] |= later
            later.clear()
        return True

    def tries(self, rule: int) -> Iterator[int]:
        """Node ids to try ``rule`` at, in graph order; grows while the rule runs."""
        self._rule, self._heap = rule, sorted(self._due[rule])
        self._due[rule].clear()
        while self._heap:
            self._at = heapq.heappop(self._heap)
            if self._heap and self._heap[0] == self._at:
                continue
            yield self._at
        self._rule = len(self._due)

    def watch(self, asked: Iterable[int], rule: int, node_id: int) -> None:
        for asked_id in asked:
            self._watchers.setdefault(asked_id, []).append((rule, node_id))

    def claimed(self, ids: Iterable[int]) -> None:
        self._fired = True
        for claimed_id in ids:
            for rule, node_id in self._watchers.pop(claimed_id, ()):
                if rule > self._rule:
                    self._due[rule].add(node_id)
                elif rule == self._rule and node_id > self._at:
                    heapq.heappush(self._heap, node_id)
                else:
                    self._next[rule].add(node_id)


def _ranked(owner: dict[int, int], view: GraphView, first: list[int]) -> list[int]:
    """Kahn's algorithm on the quotient graph, taking ready fused nodes by first member."""
    waiting = [0] * len(first)
    edges: list[set[int]] = [set() for _ in first]
    for u, successors in enumerate(view.succs):
        for v in successors:
            a, b = owner[u], owner[v]
            if a != b and b not in edges[a]:
                edges[a].add(b)
                waiting[b] += 1
    ready = [(first[i], i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    ranked = []
    while ready:
        _, i = heapq.heappop(ready)
        ranked.append(i)
        for j in edges[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (first[j], j))
    assert len(ranked) == len(first), "fused nodes form a cycle"
    return ranked
