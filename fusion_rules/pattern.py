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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from graphdnn.ir import Graph, Node, Tensor

from .partition import is_elementwise
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


@dataclass
class MatchContext:
    """What guards may look at: the graph, its view, the target, the match so far."""

    graph: Graph
    view: GraphView
    arch: int  # compute capability * 10, e.g. 90
    claimed: set[int]
    bindings: dict[str, Node] = field(default_factory=dict)
    value: Tensor | None = None  # the tensor through which the node under test is reached


@dataclass(frozen=True)
class Match:
    bindings: dict[str, Node]
    epilogue: tuple[Node, ...]
    members: tuple[Node, ...]


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
            reason = link_reason(ctx, producer, value, {candidate, *members}, escapes)
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


def link_reason(ctx: MatchContext, producer: Node, value: Tensor, group: set[Node], escapes: bool) -> str | None:
    """Why ``value`` cannot stay inside a fused node whose nodes are ``group``."""
    if escapes:
        return None
    others = [n.name for n in ctx.graph.consumers(value) if n not in group]
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
    nodes of the same output dims that pass the guards; then removes, until nothing
    changes, nodes reading a value that something outside also reads or that is a graph
    output, and nodes whose other operands depend on the group (that would be a cycle).
    """
    rejected: list[Miss] = []
    candidates: list[Node] = []
    frontier = [(producer, value)]
    while frontier:
        source, tensor = frontier.pop(0)
        for consumer in ctx.graph.consumers(tensor):
            if consumer in candidates or consumer in members or consumer.id in ctx.claimed:
                continue
            if not is_elementwise(consumer):
                continue
            ctx.value = tensor
            reason = _shape_reason(consumer, value) or _first_reason(guards, ctx, consumer)
            if reason is not None:
                rejected.append(Miss(reason, (source.name, consumer.name)))
                continue
            candidates.append(consumer)
            frontier.append((consumer, primary_output(consumer)))
    order = {node.id: i for i, node in enumerate(ctx.graph.nodes)}
    changed = True
    while changed:
        changed = False
        group = {*members, *candidates}
        produced = {t.id: node for node in group for t in node.output_tensors()}
        for candidate in list(candidates):
            reason = None
            for tensor in candidate.input_tensors():
                writer = produced.get(tensor.id)
                if writer is not None:
                    reason = link_reason(ctx, writer, tensor, group, escapes=False)
                elif ctx.view.depends_on(tensor, group):
                    reason = f"its input '{tensor.name}' is computed from the fused nodes (a cycle)"
                    writer = ctx.graph.producer(tensor)
                if reason is not None:
                    rejected.append(Miss(reason, ((writer.name if writer else tensor.name), candidate.name)))
                    break
            if reason is not None:
                candidates.remove(candidate)
                changed = True
    return sorted(candidates, key=lambda n: order[n.id]), rejected


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
    """Grow a group from ``start`` over producer/consumer links, in topological order."""
    if start.id in ctx.claimed or not is_elementwise(start) or _first_reason(pattern.guards, ctx, start):
        return Outcome(Miss())
    dims = primary_output(start).dim
    group = [start]
    changed = True
    while changed:
        changed = False
        for node in ctx.graph.nodes:
            if node in group or node.id in ctx.claimed or not is_elementwise(node):
                continue
            if primary_output(node).dim != dims or not ctx.view.linked(node, group):
                continue
            if _first_reason(pattern.guards, ctx, node) is not None:
                continue
            if ctx.view.convex({*group, node}):
                group.append(node)
                changed = True
    order = {node.id: i for i, node in enumerate(ctx.graph.nodes)}
    members = tuple(sorted(group, key=lambda n: order[n.id]))
    return Outcome(Match({}, members, members))
