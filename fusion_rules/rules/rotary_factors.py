"""RoPE's cos and sin factors, written from coordinates: evaluated on the [S, D] grid and read
as theta (for :mod:`.rotary`); or given as tables, read from memory.

A factor is computed by elementwise ops from gen_index along x's sequence axis (2) or head-dim
axis (3) and constants, so it is a function of (s, d) alone: the rule evaluates that function
with each op's own reference arithmetic (rounded to each tensor's type, as the unfused graph
computes it) on an [S, D] grid instead of x's full dims, and compares it with RoPE's.
"""

from __future__ import annotations

import numpy as np

from graphdnn.dtypes import round_to
from graphdnn.ir import Node, Tensor
from graphdnn.ops.pointwise import PointwiseOp
from graphdnn.ops.rotary import rotary_angles, table_broadcasts

from ..pattern import MatchContext
from .attention import ATTENTION_TYPES

SEQUENCE_AXIS, HEAD_AXIS = 2, 3
ANY_THETA = 10000.0  # Llama's, where theta does not matter (or could not be read)
ANGLE_ROUNDING = 8 * 2.0**-24  # float's relative rounding of an angle, a few times over


def read_theta(
    ctx: MatchContext, x: Tensor, cos: Tensor, sin: Tensor, negated: bool
) -> tuple[float | None, tuple[Node, ...]] | str:
    """(theta, the factors' nodes) when ``cos`` and ``sin`` are RoPE's factors for ``x``'s
    positions and head dim (``sin`` signed -sin on the first half unless the swapped half is
    ``negated``), else why not. Theta is None where any theta gives the same factors: one
    position (every angle 0) or one frequency (its angle the position)."""
    found = []
    for factor in (cos, sin):
        value = _evaluate(ctx, x, factor)
        if isinstance(value, str):
            return value
        found.append(value)
    (c, cos_nodes), (s, sin_nodes) = found
    positions, d = x.static_dim[2], x.static_dim[3]
    sign = np.ones(d)
    if not negated:
        sign[: d // 2] = -1.0
    theta = _theta(c, s * sign, d)
    angles = np.tile(rotary_angles(positions, d, theta or ANY_THETA), 2)
    tolerance = 1e-5 + ANGLE_ROUNDING * positions
    for name, got, want in (("cos", c, np.cos(angles)), ("sin", s, np.sin(angles) * sign)):
        error = np.abs(got - want)
        worst = np.unravel_index(int(np.argmax(error)), error.shape)
        if error[worst] > tolerance:
            tensor = cos if name == "cos" else sin
            return (
                f"'{tensor.name}' is not RoPE's {name} factor for theta {theta or ANY_THETA:g}: at position {worst[0]}, column "
                f"{worst[1]} it holds {got[worst]:.6g} where {'-' if sign[worst[1]] < 0 else ''}{name}(s theta^(-2i/D)) "
                f"is {want[worst]:.6g} (compute the factors in float)"
            )
    nodes = {n.id: n for n in (*cos_nodes, *sin_nodes)}
    return theta, tuple(nodes[i] for i in sorted(nodes))


def _theta(cos: np.ndarray, sin: np.ndarray, d: int) -> float | None:
    """theta from the angle of position 1 at the last frequency, ``theta^(-2i/D)`` with the
    largest i (where a float angle pins theta down best), snapped to an integer within float's
    rounding; None with one position or one frequency, where any theta gives the same angles."""
    i = d // 2 - 1
    if cos.shape[0] < 2 or i < 1:
        return None
    angle = float(np.arctan2(sin[1, i], cos[1, i]))
    if not 0.0 < angle < 1.0:
        return ANY_THETA  # not RoPE's; the comparison says how
    theta = float(np.exp(-np.log(angle) * d / (2.0 * i)))
    return float(round(theta)) if abs(theta - round(theta)) <= 1e-5 * theta else theta


def from_coordinates(ctx: MatchContext, factor: Tensor) -> bool:
    """Whether ``factor`` is computed by elementwise ops from gen_index and constants alone (a
    function of the coordinates); otherwise RoPE reads it as a table, from memory."""
    seen: set[int] = set()
    stack = [factor]
    while stack:
        tensor = stack.pop()
        node = None if tensor.is_constant else ctx.graph.producer(tensor)
        if tensor.is_constant or (node is not None and node.id in seen):
            continue
        if node is None or not (node.op == "gen_index" or isinstance(node.definition, PointwiseOp)):
            return False
        seen.add(node.id)
        if node.op != "gen_index":
            stack.extend(node.input_tensors())
    return True


def _evaluate(ctx: MatchContext, x: Tensor, factor: Tensor) -> tuple[np.ndarray, tuple[Node, ...]] | str:
    """``factor`` (:func:`from_coordinates`) on the [S, D] grid of x's positions and columns,
    with the nodes computing it."""
    nodes: dict[int, Node] = {}
    stack = [factor]
    while stack:
        tensor = stack.pop()
        node = None if tensor.is_constant else ctx.graph.producer(tensor)
        if node is None or node.id in nodes:
            continue
        reason = _factor_node_reason(node, x)
        if reason is not None:
            return reason
        nodes[node.id] = node
        if node.op != "gen_index":
            stack.extend(node.input_tensors())
    ordered = tuple(nodes[i] for i in sorted(nodes))
    positions, d = x.static_dim[2], x.static_dim[3]
    values: dict[int, np.ndarray] = {}
    for node in ordered:
        out = node.outputs[0][1]
        if node.op == "gen_index":
            axis = node.attributes.axis % 4  # type: ignore[attr-defined]
            shape = (positions, 1) if axis == SEQUENCE_AXIS else (1, d)
            result = np.arange(positions if axis == SEQUENCE_AXIS else d, dtype=np.float64).reshape(shape)
        else:
            operands = [_value(values, node.input(role.name)) for role in node.definition.inputs]
            with np.errstate(all="ignore"):
                result = np.asarray(type(node.definition).evaluate(operands, node.attributes), dtype=np.float64)
        values[out.id] = round_to(out.data_type, np.broadcast_to(result, np.broadcast_shapes(result.shape, (1, 1))))
    return np.broadcast_to(_value(values, factor), (positions, d)), ordered


def _value(values: dict[int, np.ndarray], tensor: Tensor | None) -> np.ndarray:
    assert tensor is not None
    if tensor.is_constant:
        return round_to(tensor.data_type, np.array(float(tensor.value)))  # type: ignore[arg-type]
    return values[tensor.id]


def _factor_node_reason(node: Node, x: Tensor) -> str | None:
    """Why ``node`` cannot be part of a RoPE factor of ``x`` (a function of (s, d) alone)."""
    if node.op == "gen_index":
        source = node.input("input")
        assert source is not None
        axis = node.attributes.axis % len(source.dim)  # type: ignore[attr-defined]
        if source.dim != x.dim or axis not in (SEQUENCE_AXIS, HEAD_AXIS):
            return (
                f"{node.name} indexes axis {axis} of '{source.name}' {list(source.dim)}; RoPE's factors index the "
                f"positions (axis 2) and head-dim columns (axis 3) of the operand {list(x.dim)}"
            )
        return None

    for tensor in node.input_tensors():
        if len(tensor.dim) > 4 or (tensor.is_constant and tensor.numel != 1):
            return f"{node.name} reads '{tensor.name}' {list(tensor.dim)}, not a coordinate or a one-element constant"
    return None


def table_reason(tensors: tuple[Tensor, Tensor], x: Tensor, names: tuple[str, str]) -> str | None:
    """Why ``tensors`` (cos, sin) cannot be RoPE tables of ``x`` (each broadcastable against x's
    [S, D], leading dims 1; float, half or bfloat16), None when they can."""
    for name, table in zip(names, tensors):
        if not table_broadcasts(table.dim, x.dim):
            return (
                f"RoPE's {name} table '{table.name}' has dims {list(table.dim)}; the fused sdpa takes tables "
                f"broadcastable against the operand's [S, D] = {list(x.dim[2:])} (per position and column)"
            )
        if table.data_type not in ATTENTION_TYPES:
            return f"RoPE's {name} table '{table.name}' is {table.data_type.value}; the fused kernels read float, half or bfloat16 tables"
    return None
