"""A causal mask written from primitives, read as sdpa's causal flag (and sliding window).

The attention rule hands over the ``binary_select`` between the (scaled, biased) scores and
the softmax. Recognised, with ``a``, ``b`` integral constants (either may be absent)::

    row  = gen_index(scores, axis=-2) [+ a]          # the query index i
    col  = gen_index(scores, axis=-1) [+ b]          # the key index j
    keep = cmp_ge(row, col)                          # or cmp_le(col, row); cmp_gt / cmp_lt are strict
    binary_select(scores, -inf, keep)                # binary_select picks input0 where the mask is non-zero

or the inverted form ``binary_select(-inf, scores, hide)`` with ``hide = cmp_gt(col, row)`` (or
``cmp_lt(row, col)``, and the non-strict ones). Either keeps key j of row i exactly when
``j <= i + c`` for one integer c (a strict comparison moves c by one). sdpa keeps ``j <= i``
(``use_causal_mask``, c = 0) or ``j <= i + Skv - Sq`` (``use_causal_mask_bottom_right``).
A sliding window is a second comparison bounding j from below, joined by ``logical_and``
(``logical_or`` of the two hiding comparisons in the inverted form): ``i + d <= j <= i + c``
is sdpa's ``sliding_window_length`` ``c - d + 1`` (sdpa keeps ``j > i + c - window``).

Only -inf is accepted as the hidden value: with a finite value v, softmax gives the hidden
keys the weight ``exp(v - row max)``, zero only while a row's visible scores stay more than
about 745 above v (where exp underflows in double), and a row with no visible key averages
all of them, where sdpa gives none. A row with no visible key (c < 0) makes the chain's
softmax NaN (-inf - -inf) where sdpa gives O = 0, so those masks are refused too.
"""

from __future__ import annotations

import dataclasses
import math

from graphdnn.dtypes import DataType, round_to
from graphdnn.ir import Node, Tensor
from graphdnn.ops.index import EXACT_INDEX
from graphdnn.symbolic import Extent

from ..pattern import MatchContext

# Types holding the indexes (and the offsets added to them) exactly: floats up to EXACT_INDEX.
_EXACT_INDEX_TYPES = frozenset({DataType.INT32, DataType.INT64, DataType.FLOAT, DataType.DOUBLE})
# keep = (left OP right); with left the key index and right the row index, ``j OP i + c``.
_FLIPPED = {"cmp_ge": "cmp_le", "cmp_gt": "cmp_lt", "cmp_le": "cmp_ge", "cmp_lt": "cmp_gt"}
_NEGATED = {"cmp_ge": "cmp_lt", "cmp_gt": "cmp_le", "cmp_le": "cmp_gt", "cmp_lt": "cmp_ge"}


@dataclasses.dataclass(frozen=True)
class CausalMask:
    """The mask's nodes (indexes, offsets, the comparisons and their logical_and; not the
    select) and sdpa's flags."""

    nodes: tuple[Node, ...]
    bottom_right: bool
    window: int | None = None  # sdpa's sliding_window_length: keys j > diagonal - window stay


@dataclasses.dataclass(frozen=True)
class _Index:
    """One side of the comparison: the index along ``axis`` of the scores, plus ``offset``."""

    axis: int
    offset: int
    nodes: tuple[Node, ...]  # the gen_index, then the add or sub of the offset


def read_causal_mask(
    ctx: MatchContext, select: Node, hidden: Tensor, keep_where_set: bool, scores: tuple[Tensor, ...]
) -> CausalMask | str:
    """The causal mask ``select`` applies, or why it is not one sdpa has.

    ``hidden`` is the value the select puts on hidden keys; ``keep_where_set`` whether the
    scores are its input0 (the mask keeps where non-zero); ``scores`` the chain's score values,
    the only tensors a gen_index may read."""
    reason = _hidden_reason(select, hidden)
    if reason is not None:
        return reason
    mask = select.input("mask")
    assert mask is not None
    both = ctx.graph.producer(mask)
    combine = "logical_and" if keep_where_set else "logical_or"  # keep = one bound and the other
    values, joined = (both.input_tensors(), (both,)) if both is not None and both.op == combine else ((mask,), ())
    bounds: list[_Bound] = []
    for value in values:
        bound = _bound(ctx, select, value, keep_where_set, scores)
        if isinstance(bound, str):
            return bound
        bounds.append(bound)
    upper = [b for b in bounds if b.upper]
    lower = [b for b in bounds if not b.upper]
    if not upper:
        return f"{select.name} keeps the keys {_keys(lower)} of row i: an anti-causal mask, which sdpa has no form of"
    if len(upper) > 1:
        return f"{select.name} keeps the keys {_keys(upper)} of row i: two causal bounds, where sdpa takes one"
    nodes = tuple({n.id: n for b in bounds for n in b.nodes}.values()) + joined
    sq, skv = scores[0].dim[-2], scores[0].dim[-1]
    causal = _flag(select, upper[0].offset, sq, skv, nodes)
    if isinstance(causal, str) or not lower:
        return causal
    return _window(select, upper[0].offset, lower[0].offset, sq, skv, causal)


@dataclasses.dataclass(frozen=True)
class _Bound:
    """What one comparison keeps: ``j <= i + offset`` (``upper``) or ``j >= i + offset``."""

    upper: bool
    offset: int
    nodes: tuple[Node, ...]  # the indexes, their offsets, the comparison


def _bound(
    ctx: MatchContext, select: Node, value: Tensor, keep_where_set: bool, scores: tuple[Tensor, ...]
) -> _Bound | str:
    """The bound that comparison ``value`` keeps (hides, unless ``keep_where_set``)."""
    compare = ctx.graph.producer(value)
    if compare is None or compare.op not in _FLIPPED:
        return (
            f"{select.name}'s mask '{value.name}' is not a comparison (cmp_ge, cmp_gt, cmp_le, cmp_lt) of gen_index "
            "indexes; only causal masks written that way become sdpa masks"
        )
    sides: list[_Index] = []
    for role in ("input", "comparison"):
        side = _index(ctx, compare, role, scores)
        if isinstance(side, str):
            return side
        sides.append(side)
    rank = len(scores[0].dim)
    left, right = sides
    if {left.axis, right.axis} != {rank - 2, rank - 1}:
        return (
            f"{compare.name} compares indexes along axes {left.axis} and {right.axis} of the scores; a causal mask "
            f"compares the query index (axis {rank - 2}) with the key index (axis {rank - 1})"
        )
    relation = compare.op if left.axis == rank - 1 else _FLIPPED[compare.op]
    if not keep_where_set:
        relation = _NEGATED[relation]
    key, row = (left, right) if left.axis == rank - 1 else (right, left)
    c = row.offset - key.offset + {"cmp_lt": -1, "cmp_gt": 1}.get(relation, 0)  # j < i + c: j <= i + c - 1
    return _Bound(relation in ("cmp_le", "cmp_lt"), c, (*row.nodes, *key.nodes, compare))


def _keys(bounds: list[_Bound]) -> str:
    return " and ".join(f"j {'<=' if b.upper else '>='} i{_plus(b.offset)}" for b in bounds)


def _window(select: Node, c: int, d: int, sq: Extent, skv: Extent, causal: CausalMask) -> CausalMask | str:
    """sdpa's sliding window for the keys ``i + d <= j <= i + c`` (the causal bound ``c`` read)."""
    window = c - d + 1  # sdpa keeps j > i + c - window
    if window < 1:
        return f"{select.name} keeps the keys i{_plus(d)} <= j <= i{_plus(c)} of row i: none"
    if not (isinstance(sq, int) and isinstance(skv, int)):
        return f"{select.name} keeps a window of {window} keys; with symbolic Sq, Skv the rule cannot show each row keeps one"
    if sq - 1 + d > skv - 1:  # the last rows' windows start past the last key
        return (
            f"{select.name} keeps the keys i{_plus(d)} <= j <= i{_plus(c)} of row i: rows {skv - d} to {sq - 1} "
            "keep none, where the chain's softmax gives NaN and sdpa gives O = 0"
        )
    return dataclasses.replace(causal, window=window)


def _hidden_reason(select: Node, hidden: Tensor) -> str | None:
    if not hidden.is_constant or hidden.numel != 1:
        return f"{select.name} puts '{hidden.name}' on the hidden keys, a tensor; an sdpa mask needs the constant -inf"
    value = float(round_to(select.outputs[0][1].data_type, round_to(hidden.data_type, float(hidden.value))))  # type: ignore[arg-type]
    if value == -math.inf:
        return None
    return (
        f"{select.name} puts {value!r} on the hidden keys, not -inf: softmax still gives them the weight "
        "exp(value - row max), not zero for rows whose visible scores are within 745 of it, and the average "
        "of a row with no visible key, where sdpa gives them none"
    )


def _index(ctx: MatchContext, compare: Node, role: str, scores: tuple[Tensor, ...]) -> _Index | str:
    """The compared value ``role`` as gen_index(scores) [+ or - an integral constant]."""
    value = compare.input(role)
    assert value is not None
    node = ctx.graph.producer(value)
    nodes: list[Node] = []
    offset = 0
    if node is not None and node.op in ("add", "sub"):
        a, b = node.input("a"), node.input("b")
        assert a is not None and b is not None
        constant, value = (a, b) if a.is_constant and node.op == "add" else (b, a)
        if not constant.is_constant or constant.numel != 1 or not float(constant.value).is_integer():  # type: ignore[arg-type]
            return (
                f"{node.name} offsets an index by '{constant.name}'; a causal mask's offset is an integral constant "
                "added to the index or subtracted from it"
            )
        offset = int(constant.value) * (-1 if node.op == "sub" else 1)  # type: ignore[arg-type]
        nodes.append(node)
        node = ctx.graph.producer(value)
    if node is None or node.op != "gen_index":
        return f"{compare.name}'s {role} '{value.name}' is not a gen_index (plus a constant) of the scores"
    source = node.input("input")
    assert source is not None
    if all(source.id != s.id for s in scores):
        return f"{node.name} indexes '{source.name}', not the scores"
    rank = len(source.dim)
    axis = node.attributes.axis % rank  # type: ignore[attr-defined]
    nodes.insert(0, node)
    for member in nodes:
        out = member.outputs[0][1]
        if out.data_type not in _EXACT_INDEX_TYPES:
            return (
                f"{member.name}'s output '{out.name}' is {out.data_type.value}; the mask's indexes must be int32, "
                "int64, float or double to stay exact"
            )
    extent = source.dim[axis]
    if isinstance(extent, int) and abs(offset) + extent > EXACT_INDEX:
        return f"{nodes[-1].name} offsets indexes by {offset}, beyond the {EXACT_INDEX} that float holds exactly"
    return _Index(axis, offset, tuple(nodes))


def _flag(select: Node, c: int, sq: Extent, skv: Extent, nodes: tuple[Node, ...]) -> CausalMask | str:
    """sdpa's flag for ``j <= i + c``, or why none means it."""
    if c == 0:
        return CausalMask(nodes, bottom_right=False)
    if not (isinstance(sq, int) and isinstance(skv, int)):
        return (
            f"{select.name} keeps the keys j <= i{_plus(c)} of row i; with symbolic Sq, Skv only j <= i is an sdpa mask"
        )
    if c != skv - sq:
        return (
            f"{select.name} keeps the keys j <= i{_plus(c)} of row i; sdpa's causal masks keep j <= i (top left) "
            f"or j <= i + Skv - Sq = i{_plus(skv - sq)} (bottom right)"
        )
    if c < 0:
        return (
            f"{select.name} keeps the keys j <= i{_plus(c)} of row i: rows 0 to {-c - 1} keep none, where the chain's "
            "softmax gives NaN and sdpa gives O = 0"
        )
    return CausalMask(nodes, bottom_right=True)


def _plus(c: int) -> str:
    return f" + {c}" if c > 0 else f" - {-c}" if c < 0 else ""
