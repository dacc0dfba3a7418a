"""Layer, RMS and batch norm backward with the pointwise op that makes their grad (an activation
backward, a dropout or ReLU mask; its value also written for a residual branch: the add backward)
and the elementwise ops after dx (the residual-add backward)."""

from __future__ import annotations

import math
from typing import cast

from graphdnn.ir import Node
from graphdnn.ops.base import Category, get_op, op_kinds
from graphdnn.ops.norms import NormOp

from ..guards import FUSED_GUARDS, reads_only_main_output
from ..partition import Family
from ..pattern import Epilogue, Guard, MatchContext, Pattern, op
from ..rule import Rule, register_rule

# Any pointwise op may make the grad: the kernel computes it per element as it loads.
POINTWISE = tuple(sorted(kind for kind in op_kinds() if get_op(kind).category is Category.POINTWISE))
# The kernel keeps the grad's and x's part of a row in registers, and rows of this many
# elements fit whatever the types; the direct kernels that take longer rows take the norm alone.
MAX_FUSED_ROW = 4096


def row_fits(ctx: MatchContext, node: Node) -> str | None:
    x = node.input("input")
    assert x is not None
    width = math.prod(x.dim[axis] for axis in cast(NormOp, node.definition).checked(node)[1].axes)
    if width > MAX_FUSED_ROW:
        return (
            f"{node.name} normalizes rows of {width} elements; the one-pass kernel that fuses ops around it "
            f"holds rows of at most {MAX_FUSED_ROW}"
        )
    if not per_column_parameters(node):
        return f"{node.name}'s scale is shared by several columns of a row; the one-pass kernel sums per column"
    return None


def per_column_parameters(node: Node) -> bool:
    """The scale has its own value at every column of a normalized row (the one-pass kernel's
    dscale / dbias partials are per column; a scale broadcast along the row needs them summed)."""
    x, scale = node.input("input"), node.input("scale")
    assert x is not None
    if scale is None:
        return True
    axes = cast(NormOp, node.definition).checked(node)[1].axes
    padded = (1,) * (len(x.dim) - len(scale.dim)) + tuple(scale.dim)
    return all(padded[axis] == x.dim[axis] for axis in axes)


NORM_GUARDS = (*FUSED_GUARDS, row_fits)


def reads_no_prologue_value(ctx: MatchContext, node: Node) -> str | None:
    """The row kernel computes the prologue's value in its first pass over the row and keeps only
    what the norm needs for dx, so an epilogue op cannot read it."""
    prologue = ctx.bindings.get("prologue")
    if prologue is None:
        return None
    made = {t.id for t in prologue.output_tensors()}
    for operand in node.input_tensors():
        if operand.id in made:
            return f"{node.name} reads '{operand.name}', which {prologue.name} computes before the norm"
    return None


# The kernels sum dscale and dbias before (batch norm) or after (row norms) dx: the epilogue reads
# dx only.
EPILOGUE_GUARDS = (*FUSED_GUARDS, reads_only_main_output("norm"))
ROW_EPILOGUE_GUARDS = (*EPILOGUE_GUARDS, reads_no_prologue_value)


def _rules(
    name: str,
    kinds: tuple[str, ...],
    family: Family,
    guards: tuple[Guard, ...],
    epilogue_guards: tuple[Guard, ...],
    priority: int,
) -> None:
    """``{name}_prologue`` (at ``priority``): a pointwise op making the grad, the norm reading it as
    ``grad``, then any epilogue; ``{name}_epilogue`` (two after): the norm, then an epilogue of at
    least one op."""
    norms = " or ".join(kinds)
    register_rule(
        Rule(
            name=f"{name}_prologue",
            pattern=Pattern(
                (
                    op(*POINTWISE, bind="prologue", where=FUSED_GUARDS),
                    op(*kinds, bind="norm", via=["grad"], where=guards),
                    Epilogue(guards=epilogue_guards),
                ),
                may_escape=frozenset({"prologue"}),
            ),
            family=family,
            anchor="norm",
            prologue="prologue",
            priority=priority,
            description=(
                f"a pointwise op making the grad (activation backward, dropout or ReLU mask) + {norms}, then "
                "any elementwise epilogue on dx (the residual-add backward); the grad is also written when a "
                "graph output or read elsewhere (the add backward: a residual branch's gradient)"
            ),
        )
    )
    register_rule(
        Rule(
            name=f"{name}_epilogue",
            pattern=Pattern((op(*kinds, bind="norm", where=guards), Epilogue(min_nodes=1, guards=epilogue_guards))),
            family=family,
            anchor="norm",
            priority=priority + 2,
            description=f"{norms} followed by elementwise ops on dx (the residual-add backward)",
        )
    )


ROW_NORMS = ("layernorm_backward", "rmsnorm_backward")
_rules("norm_backward", ROW_NORMS, Family.ROW_NORM_BACKWARD, NORM_GUARDS, ROW_EPILOGUE_GUARDS, 32)
_rules("bn_backward", ("batchnorm_backward",), Family.BATCHNORM_BACKWARD, FUSED_GUARDS, EPILOGUE_GUARDS, 36)

# Zero-centred gamma (the frontend's sample: the norm's scale is gamma + 1): the row kernel
# computes the scale per column as it loads it. The scale is the same for every row, so it is
# never written by the kernel (it may not escape); its gradient is dscale.
NORM_BACKWARD_SCALE_PROLOGUE = register_rule(
    Rule(
        name="norm_backward_scale_prologue",
        pattern=Pattern(
            (
                op(*POINTWISE, bind="prologue", where=FUSED_GUARDS),
                op(*ROW_NORMS, bind="norm", via=["scale"], where=NORM_GUARDS),
                Epilogue(guards=ROW_EPILOGUE_GUARDS),
            )
        ),
        family=Family.ROW_NORM_BACKWARD,
        anchor="norm",
        prologue="prologue",
        priority=33,
        description=(
            "a pointwise op making the scale (zero-centred gamma: gamma + 1) + layernorm_backward or "
            "rmsnorm_backward, then any elementwise epilogue on dx"
        ),
    )
)
