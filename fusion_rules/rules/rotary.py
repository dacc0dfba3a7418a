"""Rotary position embeddings (RoPE) written from primitives on Q and/or K of an ``sdpa`` node,
folded into the attention: the fused node's anchor is the sdpa with the un-rotated operands and
:class:`~graphdnn.ops.attention.RotarySdpaAttributes` (theta, which operands), so RoPE's
half swap, factors and combine never run as kernels of their own.

Recognised, on an operand ``y`` of sdpa's Q or K (either operand order of each add and mul)::

    y = add(mul(x, C), mul(concatenate([slice(x, D/2:D), slice(x, 0:D/2)], axis=-1), S))

or with the swapped half negated, ``concatenate([neg(slice(x, D/2:D)), slice(x, 0:D/2)])``;
``C`` and ``S`` are either both tables (tensors given or computed elsewhere, broadcastable
against x's [S, D]: torch's cached cos / sin, any positions), which the anchor reads as
ROPE_COS_* / ROPE_SIN_*, or both factors computed from coordinates alone: elementwise ops of
gen_index along x's sequence (2) and head-dim (3) axes and constants (:mod:`.rotary_factors`
reads them). Those must hold RoPE's ``cos(s theta^(-2i/D))`` and sine (signed: ``-sin`` on the
first half unless the swapped half is negated), i = d mod D/2, for one theta, within float's
rounding of the angles: the rule evaluates them on the [S, D] grid, reads theta off position
1, and compares. This is ``rope`` in examples/build_graphs.py and torch's
``x * cos + rotate_half(x) * sin``. The interleaved (GPT-J) pairing is not fused yet.

Numerics: the kernels rotate in float with the angle ``s * expf(i * (-2 ln(theta) / D))`` and
precise ``sincosf``, and round the rotated operand to x's type, the attention kernels'
operand type; the rule asks the RoPE output to have x's type, so the unfused graph rounds there too.
"""

from __future__ import annotations

import dataclasses
import math

from graphdnn.ir import Node, Tensor
from graphdnn.ops.attention import ROTARY_TABLES, RotarySdpaAttributes

from ..partition import Family
from ..pattern import Match, MatchContext, Miss, Pattern, anchored, link_reason, op
from ..rule import Rule, register_rule
from .attention import ATTENTION_TYPES
from .rotary_factors import from_coordinates, read_theta, table_reason


@dataclasses.dataclass(frozen=True)
class _Rope:
    """One operand's RoPE: the tensor before rotation, theta or the (cos, sin) tables, and the
    nodes that compute it."""

    x: Tensor
    theta: float | None  # None: tables, or any theta gives this rotation (one position or frequency)
    nodes: tuple[Node, ...]
    tables: tuple[Tensor, Tensor] | None = None
    negated: bool = False  # the swapped half is [-x2, x1] (the tables' sin unsigned)


def rewrite(ctx: MatchContext, found: Match) -> Match | Miss:
    """The matched sdpa with RoPE on Q and/or K folded in; near misses say why."""
    sdpa = found.bindings["sdpa"]
    if isinstance(sdpa.attributes, RotarySdpaAttributes):
        return Miss()
    ropes: dict[str, _Rope] = {}
    for role in ("Q", "K"):
        value = sdpa.input(role)
        assert value is not None
        read = _read_rope(ctx, value)
        if isinstance(read, str):
            return Miss(read, (sdpa.name,))
        if read is not None:
            ropes[role] = read
    if not ropes:
        return Miss()
    members = (*{n.id: n for rope in ropes.values() for n in rope.nodes}.values(), sdpa)
    names = tuple(n.name for n in members)
    if any(n.id in ctx.claimed for n in members):
        return Miss()
    reason = _reason(ctx, sdpa, ropes, members)
    if reason is not None:
        return Miss(reason, names)
    return anchored(found.bindings, members, _anchor(sdpa, ropes), "rotary sdpa")


def _read_rope(ctx: MatchContext, y: Tensor) -> _Rope | str | None:
    """The RoPE that writes ``y``; None when ``y`` is not an add of two products one of which
    multiplies a concatenate (nothing like RoPE), a reason when it is but something is off."""
    add = ctx.graph.producer(y)
    if add is None or add.op != "add":
        return None
    terms = [ctx.graph.producer(t) for t in add.input_tensors()]
    if len(terms) != 2 or any(t is None or t.op != "mul" for t in terms):
        return None
    swapped = [
        (m, o, s) for m in terms if m is not None for o, s in _operand_pairs(m) if _writes(ctx, o, "concatenate")
    ]
    if not swapped:
        return None
    rotated_mul, rotated, sin = swapped[0]
    direct = next(m for m in terms if m is not rotated_mul)
    assert direct is not None
    concat = ctx.graph.producer(rotated)
    assert concat is not None
    halves = _read_halves(ctx, concat)
    if isinstance(halves, str):
        return halves
    x, negated, swap_nodes = halves
    cos = next((other for value, other in _operand_pairs(direct) if value.id == x.id), None)
    if cos is None:
        return f"{add.name} adds {direct.name}, which does not multiply '{x.name}' (the tensor the swapped halves come from)"
    reason = _operand_reason(add, x, y)
    if reason is not None:
        return reason
    computed = [from_coordinates(ctx, factor) for factor in (cos, sin)]
    if not any(computed):
        reason = table_reason((cos, sin), x, ("cos", "sin"))
        own = (*swap_nodes, direct, rotated_mul, add)
        return reason or _Rope(x, None, own, tables=(cos, sin), negated=negated)
    if not all(computed):
        table = sin if computed[0] else cos
        return (
            f"{add.name} multiplies by one factor computed from gen_index and by '{table.name}', a table; the "
            "fused sdpa takes both from coordinates or both as tables"
        )
    theta = read_theta(ctx, x, cos, sin, negated)
    if isinstance(theta, str):
        return theta
    value, factor_nodes = theta
    nodes = (*factor_nodes, *swap_nodes, direct, rotated_mul, add)
    return _Rope(x, value, tuple({n.id: n for n in nodes}.values()))


def _operand_pairs(mul: Node) -> list[tuple[Tensor, Tensor]]:
    a, b = mul.input("a"), mul.input("b")
    assert a is not None and b is not None
    return [(a, b), (b, a)]


def _writes(ctx: MatchContext, tensor: Tensor, kind: str) -> bool:
    producer = ctx.graph.producer(tensor)
    return producer is not None and producer.op == kind


def _read_halves(ctx: MatchContext, concat: Node) -> tuple[Tensor, bool, tuple[Node, ...]] | str:
    """``concat`` as RoPE's swap of x's halves ``[x2, x1]`` or ``[-x2, x1]``: (x, whether x2 is
    negated, the nodes), or why not."""
    parts = concat.inputs_of("inputs")
    out = concat.outputs[0][1]
    rank = len(out.dim)
    if len(parts) != 2 or concat.attributes.axis % rank != rank - 1:  # type: ignore[attr-defined]
        return (
            f"{concat.name} joins {len(parts)} tensors along axis {concat.attributes.axis}; RoPE's swap joins "  # type: ignore[attr-defined]
            "the two halves of the head dim (the last axis)"
        )
    nodes: list[Node] = []
    negated = False
    second = ctx.graph.producer(parts[0])
    if second is not None and second.op == "neg":
        negated = True
        nodes.append(second)
        source = second.input("input")
        assert source is not None
        second = ctx.graph.producer(source)
    first = ctx.graph.producer(parts[1])
    if first is None or second is None or first.op != "slice" or second.op != "slice":
        return f"{concat.name} does not join slices of one tensor (RoPE's swap [x2, x1] of its halves)"
    x, other = first.input("input"), second.input("input")
    assert x is not None and other is not None
    d = x.dim[-1]
    if x.id != other.id or not isinstance(d, int) or d % 2:
        return f"{concat.name} joins slices of '{other.name}' and '{x.name}'; RoPE swaps the halves of one tensor with an even head dim"
    half = d // 2
    for node, (start, stop) in ((second, (half, d)), (first, (0, half))):
        a = node.attributes
        whole = all(
            (s, e, st) == (0, n, 1)
            for s, e, st, n in zip(a.start[:-1], a.stop[:-1], a.step[:-1], x.dim[:-1])  # type: ignore[attr-defined]
        )
        if not whole or (a.start[-1], a.stop[-1], a.step[-1]) != (start, stop, 1):  # type: ignore[attr-defined]
            return (
                f"{concat.name} joins the slices {node.name} [{a.start[-1]}:{a.stop[-1]}:{a.step[-1]}] of the head dim "  # type: ignore[attr-defined]
                f"in the wrong places: RoPE's swap is [x[{half}:{d}], x[0:{half}]] (interleaved pairs are not fused yet)"
            )
    return x, negated, (first, second, *nodes, concat)


def _operand_reason(add: Node, x: Tensor, y: Tensor) -> str | None:
    if len(x.dim) != 4 or y.dim != x.dim:
        return f"{add.name} writes {list(y.dim)} from '{x.name}' {list(x.dim)}; RoPE on sdpa's [B, H, S, D] operands keeps the dims"
    if x.data_type not in ATTENTION_TYPES or y.data_type is not x.data_type:
        return (
            f"{add.name} writes '{y.name}' as {y.data_type.value} from '{x.name}' {x.data_type.value}; the fused "
            "kernels rotate float, half or bfloat16 operands and round the result to the operand's type"
        )
    return None


def _reason(ctx: MatchContext, sdpa: Node, ropes: dict[str, _Rope], members: tuple[Node, ...]) -> str | None:
    group = {n.id for n in members}
    for rope in ropes.values():
        for node in rope.nodes:
            for value in node.output_tensors():
                reason = link_reason(ctx, node, value, group, escapes=False)
                if reason is not None:
                    return reason
    thetas = sorted({rope.theta for rope in ropes.values() if rope.theta is not None})
    if len(thetas) > 1 and not math.isclose(thetas[0], thetas[1], rel_tol=1e-3):
        return f"RoPE on Q has theta {ropes['Q'].theta:g} and on K {ropes['K'].theta:g}; the fused sdpa takes one theta"
    if len({rope.negated for rope in ropes.values() if rope.tables is not None}) > 1:
        return "RoPE on Q and on K swap the halves with different signs ([-x2, x1] and [x2, x1]) around their tables"
    return None


def _anchor(sdpa: Node, ropes: dict[str, _Rope]) -> Node:
    inputs = tuple((role, ropes[role].x if role in ropes else t) for role, t in sdpa.inputs)
    tables = tuple(
        (name, table)
        for role, rope in ropes.items()
        if rope.tables
        for name, table in zip(ROTARY_TABLES[role], rope.tables)
    )
    thetas = [rope.theta for rope in ropes.values() if rope.theta is not None]
    fields = {f.name: getattr(sdpa.attributes, f.name) for f in dataclasses.fields(sdpa.attributes)}
    attributes = RotarySdpaAttributes(
        **fields,
        rotary_theta=thetas[0] if thetas else RotarySdpaAttributes.rotary_theta,
        rotary_q="Q" in ropes,
        rotary_k="K" in ropes,
        rotary_negated=any(rope.negated for rope in ropes.values() if rope.tables is not None),
    )
    return Node(
        id=sdpa.id,
        name=f"{sdpa.name}.rotary",
        op="sdpa",
        inputs=(*inputs, *tables),
        outputs=sdpa.outputs,
        attributes=attributes,
        compute_data_type=sdpa.compute_data_type,
    )


ROTARY_ATTENTION = register_rule(
    Rule(
        name="rotary_attention",
        pattern=Pattern((op("sdpa", bind="sdpa"),)),
        family=Family.ATTENTION,
        priority=36,  # before matmul_epilogue, which would take RoPE's products into the projection
        rewrite=rewrite,
        description=(
            "rotary position embedding (rotate-half RoPE from gen_index factors, two slices and a "
            "concatenate) on sdpa's Q and/or K, folded into the attention: the rotated operands are "
            "never written by a kernel of their own"
        ),
    )
)
