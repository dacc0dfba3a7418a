"""Attention written from primitives: matmul(Q, Kᵀ) → scale → [+ bias] → [causal mask] → softmax → matmul(·, V).

The chain becomes one ATTENTION fused node whose anchor is an ``sdpa`` node the rule
builds (no member of the graph): Q, K, V, ATTN_SCALE from the scale's one-element operand,
BIAS from the add's other operand, ``use_causal_mask`` or ``use_causal_mask_bottom_right``
(and ``sliding_window_length``) from a ``binary_select`` of the scores and -inf by gen_index
comparisons (see
:mod:`.causal_mask`), no statistics, O the last matmul's output. The two B·H·Sq·Skv
intermediates (scores and probabilities) and the mask's indexes never reach memory.

Kᵀ comes either as a tensor whose strides transpose a [B, H, Skv, D] buffer, or from a
``transpose`` node (any permutation) that then joins the fused node: the anchor's K is a
view, under dims [B, H, Skv, D], of the memory the graph's tensor occupies (same tensor
id, other dims and strides). The scale is a ``mul`` of the scores, or of Q before the
first matmul, by a one-element tensor or a constant.

Numerics: the attention kernel keeps the scores in float32 and, on tensor cores, rounds
the probabilities P to the input type before the second product, as every flash kernel
does (the primitive chain with half intermediates rounds them too). The rule takes
intermediates of type float, half or bfloat16, never double (the kernel could not keep
that precision).
"""

from __future__ import annotations

import dataclasses

from graphdnn.dtypes import DataType
from graphdnn.errors import GraphError
from graphdnn.ir import Node, Tensor
from graphdnn.ops.attention import MAX_HEAD_DIM, SdpaAttributes
from graphdnn.symbolic import Extent

from ..partition import Family
from ..pattern import Match, MatchContext, Miss, Pattern, link_reason, op
from ..rule import Rule, register_rule
from .causal_mask import CausalMask, read_causal_mask

ATTENTION_TYPES = frozenset({DataType.FLOAT, DataType.HALF, DataType.BFLOAT16})


@dataclasses.dataclass(frozen=True)
class _Chain:
    """The nodes of one attention chain, from the first matmul to the last."""

    qk: Node
    scale: Node | None  # mul of the scores (or, pre_scaled, of Q) by a one-element operand
    scale_operand: Tensor | None
    bias: Node | None
    bias_operand: Tensor | None
    softmax: Node
    pv: Node
    pre_scaled: bool = False
    transpose: Node | None = None  # writes Kᵀ from K
    select: Node | None = None  # binary_select(scores, hidden value, mask), before the softmax
    mask: CausalMask | None = None  # what the select's mask is, once read

    @property
    def steps(self) -> list[tuple[Node, Tensor]]:
        """Each node before the last matmul and the value it passes on (kept inside)."""
        nodes = [self.qk, None if self.pre_scaled else self.scale, self.bias, self.select, self.softmax]
        return [(n, n.outputs[0][1]) for n in nodes if n is not None]

    @property
    def scores(self) -> tuple[Tensor, ...]:
        """The score values before the mask: what a mask's gen_index may read."""
        return tuple(value for node, value in self.steps if node is not self.select and node is not self.softmax)

    @property
    def members(self) -> tuple[Node, ...]:
        extra = (self.transpose, self.scale if self.pre_scaled else None)
        mask = () if self.mask is None else self.mask.nodes
        steps = [n for n, _ in self.steps]
        ordered = (*steps[: len(self.scores)], *mask, *steps[len(self.scores) :])
        return tuple(n for n in (*extra, *ordered, self.pv) if n is not None)


def rewrite(ctx: MatchContext, found: Match) -> Match | Miss:
    """The matched softmax → matmul, grown back to the first matmul and checked; its anchor
    the equivalent ``sdpa`` node. Near misses are reported only once the whole chain is seen."""
    chain = _walk_back(ctx, found.bindings["softmax"], found.bindings["pv"])
    if chain is None:
        return Miss()
    if any(n.id in ctx.claimed for n in chain.members):
        return Miss()
    chain = _absorb_neighbours(ctx, chain)
    if chain.select is not None:
        mask = _read_mask(ctx, chain)
        if isinstance(mask, str):
            return Miss(mask, tuple(n.name for n in chain.members))
        if any(n.id in ctx.claimed for n in mask.nodes):
            return Miss()
        chain = dataclasses.replace(chain, mask=mask)
    names = tuple(n.name for n in chain.members)
    reason = _chain_reason(ctx, chain)
    if reason is not None:
        return Miss(reason, names)
    anchor = _sdpa(chain)
    try:
        inferred = anchor.definition.infer(anchor, {})
    except GraphError as error:  # the checks above should have caught it; say what sdpa says
        return Miss(f"the equivalent sdpa is invalid: {error}", names)
    if inferred["O"].dim != chain.pv.outputs[0][1].dim:
        return Miss(f"the equivalent sdpa computes dims {list(inferred['O'].dim)}, not the chain's", names)
    return Match({**found.bindings, "qk": chain.qk}, (), chain.members, anchor)


# -- finding the chain ----------------------------------------------------------------------
def _walk_back(ctx: MatchContext, softmax: Node, pv: Node) -> _Chain | None:
    """From the softmax's input back through [binary_select], [add] and [mul] to a matmul;
    None when the softmax does not read (scaled, biased, masked) scores of a matmul."""
    value = softmax.input("input")
    assert value is not None
    node = ctx.graph.producer(value)
    bias = bias_operand = scale = scale_operand = select = None
    if node is not None and node.op == "binary_select":
        select, value = node, _selected_scores(ctx, node)
        if value is None:
            return None
        node = ctx.graph.producer(value)
    if node is not None and node.op == "add":
        side = _operand_from(ctx, node, ("mul", "matmul"), require_matmul_below=True)
        if side is None:
            return None
        bias, (value, bias_operand) = node, side
        node = ctx.graph.producer(value)
    if node is not None and node.op == "mul":
        side = _operand_from(ctx, node, ("matmul",))
        if side is None:
            return None
        scale, (value, scale_operand) = node, side
        node = ctx.graph.producer(value)
    if node is None or node.op != "matmul":
        return None
    return _Chain(node, scale, scale_operand, bias, bias_operand, softmax, pv, select=select)


def _selected_scores(ctx: MatchContext, select: Node) -> Tensor | None:
    """The operand of ``select`` (input0 or input1) that matmul, mul or add writes."""
    for role in ("input0", "input1"):
        value = select.input(role)
        assert value is not None
        producer = ctx.graph.producer(value)
        if producer is not None and producer.op in ("add", "mul", "matmul"):
            return value
    return None


def _read_mask(ctx: MatchContext, chain: _Chain) -> CausalMask | str:
    """The causal mask of the chain's select, or why it is not one."""
    select = chain.select
    assert select is not None
    scores = chain.scores[-1]
    keep_where_set = select.input("input0") == scores
    hidden = select.input("input1" if keep_where_set else "input0")
    assert hidden is not None
    return read_causal_mask(ctx, select, hidden, keep_where_set, chain.scores)


def _operand_from(
    ctx: MatchContext, node: Node, kinds: tuple[str, ...], require_matmul_below: bool = False
) -> tuple[Tensor, Tensor] | None:
    """(the operand of binary ``node`` some node of ``kinds`` writes, the other operand)."""
    for role, other in (("a", "b"), ("b", "a")):
        value, operand = node.input(role), node.input(other)
        assert value is not None and operand is not None
        producer = ctx.graph.producer(value)
        if producer is None or producer.op not in kinds:
            continue
        if require_matmul_below and producer.op == "mul" and _operand_from(ctx, producer, ("matmul",)) is None:
            continue
        return value, operand
    return None


def _absorb_neighbours(ctx: MatchContext, chain: _Chain) -> _Chain:
    """Take the ``transpose`` writing Kᵀ, and a ``mul`` scaling Q when the scores are not
    scaled, into the fused node when only the first matmul reads what they write."""
    kt, q = chain.qk.input("B"), chain.qk.input("A")
    assert kt is not None and q is not None
    writer = _private_writer(ctx, kt, chain.qk)
    if writer is not None and writer.op == "transpose" and len(kt.dim) == 4:
        chain = dataclasses.replace(chain, transpose=writer)
    writer = _private_writer(ctx, q, chain.qk)
    if chain.scale is None and writer is not None and writer.op == "mul":
        for role, other in (("a", "b"), ("b", "a")):
            value, operand = writer.input(role), writer.input(other)
            assert value is not None and operand is not None
            if operand.numel == 1 and value.dim == q.dim and q.data_type in ATTENTION_TYPES:
                return dataclasses.replace(chain, scale=writer, scale_operand=operand, pre_scaled=True)
    return chain


def _private_writer(ctx: MatchContext, tensor: Tensor, reader: Node) -> Node | None:
    """The unclaimed node writing virtual ``tensor`` when ``reader`` alone reads it."""
    writer = ctx.graph.producer(tensor)
    if writer is None or not tensor.is_virtual or ctx.graph.consumers(tensor) != (reader,):
        return None
    return None if writer.id in ctx.claimed else writer


# -- the checks -----------------------------------------------------------------------------
def _chain_reason(ctx: MatchContext, c: _Chain) -> str | None:
    group = {n.id for n in c.members}
    inside = [*c.steps[:-1], *((n, n.outputs[0][1]) for n in (c.mask.nodes if c.mask else ()))]
    for node, value in inside:  # the softmax's output was checked by the pattern
        reason = link_reason(ctx, node, value, group, escapes=False)
        if reason is not None:
            return reason
    return _shape_reason(c) or _operand_reason(c) or _type_reason(c)


def _shape_reason(c: _Chain) -> str | None:
    q, kt, v, s = (t for t in (_q(c), c.qk.input("B"), c.pv.input("B"), c.qk.outputs[0][1]) if t is not None)
    axis = c.softmax.attributes.axis  # type: ignore[attr-defined]
    if axis % len(s.dim) != len(s.dim) - 1:
        return f"{c.softmax.name} normalizes axis {axis} of the scores {list(s.dim)}, not the last (keys)"
    if any(len(t.dim) != 4 for t in (q, kt, v, s)):
        return (
            f"sdpa takes rank-4 [B, H, S, D] tensors; Q, Kᵀ, V have dims {list(q.dim)}, {list(kt.dim)}, {list(v.dim)}"
        )
    if not q.dim[0] == kt.dim[0] == v.dim[0]:
        return f"the batch dims of Q {list(q.dim)}, Kᵀ {list(kt.dim)} and V {list(v.dim)} differ (sdpa broadcasts none)"
    hq, hk, hv = q.dim[1], kt.dim[1], v.dim[1]
    if hk != hv:
        return f"K has {hk} heads and V {hv}; sdpa reads K and V through one head index"
    if hk not in (1, hq):
        return (
            f"Q has {hq} heads and K, V {hk}: broadcasting matches sdpa's grouping (query head h "
            "reads h // (Hq / Hk)) only when Hk = Hq or Hk = 1"
        )
    for role, extent in (("Q", q.dim[3]), ("V", v.dim[3])):
        if extent > MAX_HEAD_DIM:
            return f"{role} has head dim {extent}; the attention kernels take head dims up to {MAX_HEAD_DIM}"
    return None


def _operand_reason(c: _Chain) -> str | None:
    scores = c.qk.outputs[0][1].dim
    scale, operand = c.scale, c.scale_operand
    if scale is not None and operand is not None and not c.pre_scaled and _not_a_scale(scale, operand, scores):
        return f"{scale.name}'s operand '{operand.name}' has dims {list(operand.dim)}, not one element (an attention scale)"
    if c.bias is not None and c.bias_operand is not None:
        dims = c.bias_operand.dim
        if len(dims) != 4 or any(e not in (1, s) for e, s in zip(dims, scores)):
            return (
                f"{c.bias.name}'s operand '{c.bias_operand.name}' has dims {list(dims)}; an sdpa bias has rank 4, "
                f"each dim 1 or that of the scores {list(scores)}"
            )
    return None


def _not_a_scale(scale: Node, operand: Tensor, scores: tuple[Extent, ...]) -> bool:
    """Whether ``scale`` multiplies by more than one value, or broadcasts the scores' dims."""
    return operand.numel != 1 or scale.outputs[0][1].dim != scores


def _type_reason(c: _Chain) -> str | None:
    q, kt, v = _q(c), c.qk.input("B"), c.pv.input("B")
    named = [("Q", q), ("Kᵀ", kt), ("V", v), ("the bias", c.bias_operand), ("O", c.pv.outputs[0][1])]
    for role, tensor in named:
        if tensor is not None and tensor.data_type not in ATTENTION_TYPES:
            return f"{role} '{tensor.name}' is {tensor.data_type.value}; the attention kernel takes float, half and bfloat16"
    for node, value in c.steps:
        if value.data_type not in ATTENTION_TYPES:
            return (
                f"{node.name}'s output '{value.name}' is {value.data_type.value}; the attention kernel keeps "
                "scores in float and probabilities in the input type, so only float, half and bfloat16 "
                "intermediates keep their accuracy"
            )
    return None


# -- the anchor -----------------------------------------------------------------------------
def _q(c: _Chain) -> Tensor:
    q = c.qk.input("A")
    if c.pre_scaled:
        assert c.scale is not None
        q = next(t for t in c.scale.input_tensors() if t is not c.scale_operand)
    assert q is not None
    return q


def _k(c: _Chain) -> Tensor:
    """K as [B, H, Skv, D]: a view of Kᵀ's memory, or of the transpose's input."""
    kt = c.qk.input("B")
    assert kt is not None
    base, stride = kt, kt.stride
    if c.transpose is not None:
        source = c.transpose.input("input")
        assert source is not None
        base, stride = source, tuple(source.stride[p] for p in c.transpose.attributes.permutation)  # type: ignore[attr-defined]
    swap = (0, 1, 3, 2)
    return dataclasses.replace(base, dim=tuple(kt.dim[i] for i in swap), stride=tuple(stride[i] for i in swap))


def _sdpa(c: _Chain) -> Node:
    v, o = c.pv.input("B"), c.pv.outputs[0][1]
    assert v is not None
    inputs: list[tuple[str, Tensor | tuple[Tensor, ...]]] = [("Q", _q(c)), ("K", _k(c)), ("V", v)]
    if c.scale_operand is not None:
        inputs.append(("ATTN_SCALE", c.scale_operand))
    if c.bias_operand is not None:
        inputs.append(("BIAS", c.bias_operand))
    return Node(
        id=c.pv.id,
        name=f"{c.pv.name}.sdpa",
        op="sdpa",
        inputs=tuple(inputs),
        outputs=(("O", o),),
        attributes=SdpaAttributes(
            use_causal_mask=c.mask is not None and not c.mask.bottom_right,
            use_causal_mask_bottom_right=c.mask is not None and c.mask.bottom_right,
            sliding_window_length=None if c.mask is None else c.mask.window,
        ),
        compute_data_type=DataType.FLOAT,
    )


ATTENTION = register_rule(
    Rule(
        name="attention",
        pattern=Pattern((op("softmax", bind="softmax"), op("matmul", bind="pv", via=["A"]))),
        family=Family.ATTENTION,
        priority=38,  # before matmul_epilogue and reduction_epilogue, which would split the chain
        rewrite=rewrite,
        description=(
            "attention from primitives: matmul(Q, Kᵀ) (Kᵀ by strides or a transpose) → mul by a one-element "
            "scale (or Q scaled first) → [add of a rank-4 bias] → [binary_select of -inf by a causal "
            "gen_index comparison, or its logical_and with a sliding window's] → softmax over the keys → matmul(P, V), as one "
            "sdpa kernel that keeps the scores and probabilities on chip"
        ),
    )
)
