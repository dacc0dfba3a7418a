"""Guards: conditions a node must meet to join a fused node; each returns a reason or None."""

from __future__ import annotations

from graphdnn.dtypes import DataType
from graphdnn.ir import Node

from .pattern import Guard, MatchContext

# Types fused kernels load and store; they compute in float. Double stays unfused.
FUSABLE_TYPES = frozenset(DataType) - {DataType.DOUBLE, DataType.NOT_SET}
FP8 = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})


def fusable_types(ctx: MatchContext, node: Node) -> str | None:
    for tensor in (*node.input_tensors(), *node.output_tensors()):
        if tensor.data_type not in FUSABLE_TYPES:
            return (
                f"{node.name}'s tensor '{tensor.name}' is {tensor.data_type.value}; "
                "fused kernels take float, half, bfloat16, fp8 and integer tensors"
            )
    return None


def fp8_needs_sm89(ctx: MatchContext, node: Node) -> str | None:
    """Hardware fp8 conversion (cvt.e4m3/e5m2) starts with sm_89."""
    if ctx.arch >= 89:
        return None
    for tensor in (*node.input_tensors(), *node.output_tensors()):
        if tensor.data_type in FP8:
            return f"{node.name} uses fp8 tensor '{tensor.name}'; fused fp8 kernels need sm_89 or newer, the target is sm_{ctx.arch}"
    return None


def per_channel_operand(of: str) -> Guard:
    """The node's operands other than the chain's value hold one value per channel of the
    output of the node bound as ``of``: dims [1, C, 1, ...]."""

    def guard(ctx: MatchContext, node: Node) -> str | None:
        out = ctx.bindings[of].outputs[0][1]
        expected = (1, out.dim[1], *[1] * (len(out.dim) - 2))
        for operand in node.input_tensors():
            if operand == ctx.value or operand.is_constant:
                continue
            padded = (1,) * (len(out.dim) - len(operand.dim)) + operand.dim
            if padded != expected:
                return (
                    f"{node.name}'s operand '{operand.name}' has dims {list(operand.dim)}, "
                    f"not one value per output channel {list(expected)}"
                )
        return None

    return guard


def reads_only_main_output(of: str) -> Guard:
    """The node reads none of the other outputs of the node bound as ``of`` (a training
    batchnorm's statistics): the fused kernel computes them in an earlier pass and keeps
    only the ones that are graph outputs, so its epilogue cannot read them."""

    def guard(ctx: MatchContext, node: Node) -> str | None:
        anchor = ctx.bindings[of]
        side = {t.id: role for role, t in anchor.outputs[1:]}
        for operand in node.input_tensors():
            if operand.id in side:
                return f"{node.name} reads {anchor.name}'s {side[operand.id]} '{operand.name}', not only its output"
        return None

    return guard


FUSED_GUARDS: tuple[Guard, ...] = (fusable_types, fp8_needs_sm89)
