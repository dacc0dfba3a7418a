"""A small declarative pattern language over the operation graph.

A :class:`Pattern` is a chain of steps that follows one value through the graph:

- :class:`Op` matches one node of the given kinds that reads the current value (through
  the given input roles); it may be optional and carry guards;
- :class:`Epilogue` matches the largest DAG of elementwise nodes fed by the current value
  whose intermediates never leave it.

Between steps, the value must be virtual and read by nothing else (it never reaches
memory), unless the step that made it is listed in ``may_escape`` (then the fused node
also writes it). Guards are functions returning a reason when a node may not join; every
rejected candidate comes back with its reason, for the pass manager's log.

:class:`Group` matches a maximal connected, convex group of elementwise nodes of one
shape (a plain pointwise kernel).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from graphdnn.errors import GraphError
from graphdnn.ir import Graph, Node, Tensor

from .partition import is_elementwise
from .quotient import Quotient
from .view import GraphView

Guard = Callable[["MatchContext", Node], "str | None"]


@dataclass(frozen=True)
class Op:
    kinds: frozenset[str]
    bind: str
    via: frozenset[str] | None = None
    optional: bool = False
    guards: tuple[Guard, ...] = ()


def op(
    *kinds: str, bind: str, via: Sequence[str] | None = None, optional: bool = False, where: Sequence[Guard] = ()
) -> Op:
    return Op(frozenset(kinds), bind, None if via is None else frozenset(via), optional, tuple(where))


@dataclass(frozen=True)
class Epilogue:
    """The elementwise DAG after the value; ``guards`` apply to every node in it."""

    min_nodes: int = 0
    guards: tuple[Guard, ...] = ()


@dataclass(frozen=True)
class Pattern:
    steps: tuple[Op | Epilogue, ...]
    may_escape: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Group:
    """A maximal connected, convex group of elementwise nodes with the same output dims."""

    guards: tuple[Guard, ...] = ()


class Claimed:
    """The ids of nodes earlier matches took, recording which ids a match asks about.

    What a match decides depends on the claimed set only through those questions, so the
    pass manager tries a match again only once one of those nodes has been claimed.
    """

    def __init__(self, ids: set[int]) -> None:
        self._ids = ids
        self.asked: set[int] = set()

    def __contains__(self, node_id: object) -> bool:
        assert isinstance(node_id, int)
        self.asked.add(node_id)
        return node_id in self._ids


@dataclass
class MatchContext:
    """What guards may look at: the graph, its view, the target, the match so far."""

    graph: Graph
    view: GraphView
    arch: int  # compute capability * 10, e.g. 90
    claimed: Claimed
    quotient: Quotient  # the fused nodes so far, contracted
    bindings: dict[str, Node] = field(default_factory=dict)
    value: Tensor | None = None  # the tensor through which the node under test is reached


@dataclass(frozen=True)
class Match:
    """What a pattern matched. ``anchor``, set by a rule's ``rewrite``: a node outside the
    graph that computes every member at once (the fused node's anchor)."""

    bindings: dict[str, Node]
    epilogue: tuple[Node, ...]
    members: tuple[Node, ...]
    anchor: Node | None = None


@dataclass(frozen=True)
class Miss:
    """No match; ``reason`` (with the nodes it concerns) when a near miss is worth reporting."""

    reason: str | None = None
    nodes: tuple[str, ...] = ()


@dataclass
class Outcome:
    result: Match | Miss
    rejections: list[Miss] = field(default_factory=list)


def match(pattern: Pattern | Group, ctx: MatchContext, start: Node) -> Outcome:
    if isinstance(pattern, Group):
        return _match_group(pattern, ctx, start)
    return _match_chain(pattern, ctx, start)


# -- chains ---------------------------------------------------------------------------------
def _match_chain(pattern: Pattern, ctx: MatchContext, start: Node) -> Outcome:
    outcome = Outcome(Miss())
    members: list[Node] = []
    value: Tensor | None = None
    producer: Node | None = None
    for index, step in enumerate(pattern.steps):
        if isinstance(step, Epilogue):
            assert value is not None and producer is not None, "an epilogue follows a step"
            epilogue, rejected = grow_epilogue(ctx, producer, value, members, step.guards)
            outcome.rejections.extend(rejected)
            if len(epilogue) < step.min_nodes:
                outcome.result = rejected[0] if rejected else _no_epilogue(ctx, producer, value)
                return outcome
            members.extend(epilogue)
            outcome.result = Match(dict(ctx.bindings), tuple(epilogue), tuple(members))
            continue
        if index == 0:
            candidate = start if start.op in step.kinds and start.id not in ctx.claimed else None
        else:
            candidate = _next(step, ctx, value)
        if candidate is None:
            if step.optional:
                continue
            outcome.result = Miss()
            return outcome
        reason = None
        if index > 0:
            assert producer is not None and value is not None
            escapes = any(ctx.bindings.get(b) is producer for b in pattern.may_escape)
            reason = link_reason(ctx, producer, value, {candidate.id, *(m.id for m in members)}, escapes)
        ctx.value = value
        reason = reason or _first_reason(step.guards, ctx, candidate)
        if reason is not None:
            miss = Miss(reason, (*([producer.name] if producer and index > 0 else []), candidate.name))
            if step.optional:  # skip it: the next step may still match another reader
                outcome.rejections.append(miss)
                continue
            outcome.result = miss
            return outcome
        ctx.bindings[step.bind] = candidate
        members.append(candidate)
        producer, value = candidate, primary_output(candidate)
    if not isinstance(outcome.result, Match):
        outcome.result = Match(dict(ctx.bindings), (), tuple(members))
    return outcome


def _next(step: Op, ctx: MatchContext, value: Tensor | None) -> Node | None:
    if value is None:
        return None
    for consumer in ctx.graph.consumers(value):
        if consumer.id in ctx.claimed or consumer.op not in step.kinds:
            continue
        roles = {role for role, bound in consumer.inputs if value in (bound if isinstance(bound, tuple) else (bound,))}
        if step.via is None or roles & step.via:
            return consumer
    return None


def _first_reason(guards: Sequence[Guard], ctx: MatchContext, node: Node) -> str | None:
    for guard in guards:
        reason = guard(ctx, node)
        if reason is not None:
            return reason
    return None


def primary_output(node: Node) -> Tensor:
    """The value a chain follows: a node's first output (y, C, dx...)."""
    return node.outputs[0][1]


def anchored(bindings: dict[str, Node], members: tuple[Node, ...], anchor: Node, what: str) -> Match | Miss:
    """The match of ``members`` with the ``anchor`` a rule built; a miss naming ``what`` (the
    anchor) when the anchor's op refuses it, saying what the op says (the rule's own checks
    should have caught it first)."""
    try:
        anchor.definition.infer(anchor, {})
    except GraphError as error:
        return Miss(f"the {what} is invalid: {error}", tuple(n.name for n in members))
    return Match(bindings, (), members, anchor)


def link_reason(ctx: MatchContext, producer: Node, value: Tensor, group: Collection[int], escapes: bool) -> str | None:
    """Why ``value`` cannot stay inside a fused node whose nodes are ``group`` (ids)."""
    if escapes:
        return None
    others = [n.name for n in ctx.graph.consumers(value) if n.id not in group]
    if others:
        return f"{producer.name}'s output is also read by {', '.join(others)}"
    if not value.is_virtual:
        return f"{producer.name}'s output '{value.name}' is a graph output"
    return None


# -- epilogues ------------------------------------------------------------------------------
def grow_epilogue(
    ctx: MatchContext, producer: Node, value: Tensor, members: list[Node], guards: Sequence[Guard]
) -> tuple[list[Node], list[Miss]]:
    """The largest elementwise DAG fed by ``value`` whose intermediates stay inside.

    First collects every elementwise node reachable from the value through elementwise
    nodes of the same output dims that pass the guards, with the scalar-fed nodes (``_sources``)
    that only they read; then removes, pass after pass
    until nothing changes, nodes reading a value that something outside also reads or
    that is a graph output, and nodes whose other operands depend on the group (that
    would be a cycle). Each pass judges against the group as it was when the pass began,
    and after the first only re-judges the nodes next to one the previous pass removed
    (nothing else about them changed).
    """
    rejected: list[Miss] = []
    candidates: list[Node] = []
    group = {node.id for node in members}
    frontier = deque([(producer, value)])
    reader_of: dict[int, int] = {}  # a source's id -> the id of the one member that reads it
    while frontier:
        source, tensor = frontier.popleft()
        for consumer in ctx.graph.consumers(tensor):
            if consumer.id in group or consumer.id in ctx.claimed:
                continue
            if not is_elementwise(consumer):
                continue
            ctx.value = tensor
            reason = _shape_reason(consumer, value) or _first_reason(guards, ctx, consumer)
            if reason is not None:
                rejected.append(Miss(reason, (source.name, consumer.name)))
                continue
            candidates.append(consumer)
            group.add(consumer.id)
            frontier.append((consumer, primary_output(consumer)))
            for source in _sources(ctx, consumer, value, guards, rejected, group):
                candidates.append(source)
                group.add(source.id)
                reader_of[source.id] = consumer.id
    floor = min(group, default=0)
    remaining = {node.id: node for node in candidates}
    found = {node.id: i for i, node in enumerate(candidates)}  # passes judge in this order
    pending = candidates
    while pending:
        clear: set[int] = set()
        removed = [node for node in pending if _leak_or_cycle(ctx, node, group, floor, clear, rejected)]
        for node in removed:
            group.discard(node.id)
            del remaining[node.id]
        # Judged again: readers of what a removed node wrote, and co-readers of what it read.
        touched = {
            reader.id
            for node in removed
            for t in (*node.output_tensors(), *node.input_tensors())
            for reader in ctx.graph.consumers(t)
        }
        pending = sorted((remaining[i] for i in touched if i in remaining), key=lambda n: found[n.id])
    # A source whose reader left goes too: it would be computed here only to be stored.
    return [remaining[i] for i in sorted(remaining) if reader_of.get(i, i) in remaining], rejected


def _sources(
    ctx: MatchContext, consumer: Node, value: Tensor, guards: Sequence[Guard], rejected: list[Miss], group: set[int]
) -> list[Node]:
    """The elementwise nodes outside ``group`` that read nothing but the graph's scalar inputs (an
    rng drawing a dropout mask from its seed and offset) and whose output, virtual and of the
    fused output's dims, only ``consumer`` reads: computed in the epilogue, they never reach
    memory. (A one-element tensor some node computes is a value, not such a scalar: in a graph
    of 1x1 tensors every node reads one-element tensors.)"""
    sources = []
    for tensor in consumer.input_tensors():
        source = ctx.graph.producer(tensor)
        if (
            source is None
            or source.id in ctx.claimed
            or not is_elementwise(source)
            or not tensor.is_virtual
            or source.id in group
            or any(t.numel != 1 or ctx.graph.producer(t) is not None for t in source.input_tensors())
            or any(reader is not consumer for reader in ctx.graph.consumers(tensor))
        ):
            continue
        ctx.value = None
        reason = _shape_reason(source, value) or _first_reason(guards, ctx, source)
        if reason is not None:
            rejected.append(Miss(reason, (source.name, consumer.name)))
            continue
        sources.append(source)
    return sources


def _leak_or_cycle(
    ctx: MatchContext, candidate: Node, group: set[int], floor: int, clear: set[int], rejected: list[Miss]
) -> bool:
    """Whether ``candidate`` must leave the epilogue ``group``; records the reason in ``rejected``."""
    for tensor in candidate.input_tensors():
        writer = ctx.graph.producer(tensor)
        if writer is not None and writer.id in group:
            reason = link_reason(ctx, writer, tensor, group, escapes=False)
        elif ctx.view.depends_on(tensor, group, floor, clear):
            reason = f"its input '{tensor.name}' is computed from the fused nodes (a cycle)"
        else:
            reason = None
        if reason is not None:
            rejected.append(Miss(reason, ((writer.name if writer else tensor.name), candidate.name)))
            return True
    return False


def _no_epilogue(ctx: MatchContext, producer: Node, value: Tensor) -> Miss:
    """Why no epilogue follows ``producer`` when every reader of its output is a non-elementwise op."""
    readers = ctx.graph.consumers(value)
    if not readers or any(is_elementwise(n) for n in readers):
        return Miss()
    names = ", ".join(f"{n.name} ({n.op})" for n in readers)
    return Miss(
        f"{producer.name}'s output is read only by {names}, which cannot join an epilogue (not elementwise)",
        (producer.name, *(n.name for n in readers)),
    )


def _shape_reason(node: Node, value: Tensor) -> str | None:
    out = primary_output(node)
    if out.dim != value.dim:
        return f"{node.name} broadcasts to dims {list(out.dim)}, beyond the fused output's {list(value.dim)}"
    return None


# -- elementwise groups ---------------------------------------------------------------------
def _match_group(pattern: Group, ctx: MatchContext, start: Node) -> Outcome:
    """Grow a group from ``start`` over producer/consumer links, in sweeps in topological order.

    Each sweep visits, in topological order, the nodes linked to the group (including
    those linked by nodes added earlier in the same sweep) and adds each one that keeps
    the group convex; sweeps repeat while one adds a node. Only neighbours of the group
    are visited, and convexity is judged from the group's reach, grown as the group grows.
    """
    if start.id in ctx.claimed or not is_elementwise(start) or _first_reason(pattern.guards, ctx, start):
        return Outcome(Miss())
    view, nodes = ctx.view, ctx.graph.nodes
    dims = primary_output(start).dim
    group = {start.id}
    below, above = ctx.quotient.descendants(), ctx.quotient.ancestors()
    below.add(start.id)
    above.add(start.id)
    excluded: set[int] = set()  # linked nodes that can never join
    frontier = set(view.neighbours(start.id))
    changed = True
    while changed:
        changed = False
        sweep = sorted(frontier)
        visited: set[int] = set()
        while sweep:
            v = heapq.heappop(sweep)
            if v in visited or v in group or v in excluded:
                continue
            visited.add(v)
            node = nodes[v]
            if (
                v in ctx.claimed
                or not is_elementwise(node)
                or primary_output(node).dim != dims
                or _first_reason(pattern.guards, ctx, node) is not None
            ):
                excluded.add(v)
                frontier.discard(v)
                continue
            leaves_and_returns = any(w not in group and w in above for w in view.succs[v]) or any(
                u not in group and u in below for u in view.preds[v]
            )
            if leaves_and_returns:
                continue
            group.add(v)
            frontier.discard(v)
            below.add(v)
            above.add(v)
            changed = True
            for w in view.neighbours(v):
                if w not in group and w not in excluded:
                    frontier.add(w)
                    if w > v:
                        heapq.heappush(sweep, w)
    members = tuple(nodes[i] for i in sorted(group))
    return Outcome(Match({}, members, members))
