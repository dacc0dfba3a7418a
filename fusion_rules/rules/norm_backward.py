"""Layer / RMS norm backward with the elementwise op that makes its grad (an activation
backward, a dropout or ReLU mask) and the elementwise ops after dx (the residual-add backward)."""

from __future__ import annotations

import math
from typing import cast

from graphdnn.ir import Node
from graphdnn.ops.base import Category, get_op, op_kinds
from graphdnn.ops.norms import NormOp

from ..guards import FUSED_GUARDS, reads_only_main_output
from ..partition import Family
from ..pattern import Epilogue, MatchContext, Pattern, op
from ..rule import Rule, register_rule

NORMS_BACKWARD = ("layernorm_backward", "rmsnorm_backward")
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
    return None


NORM_GUARDS = (*FUSED_GUARDS, row_fits)
# The kernel sums dscale and dbias in a second kernel: the epilogue reads dx only. (It cannot read
# the prologue's value either: that is read only by the norm, or the prologue does not join.)
EPILOGUE_GUARDS = (*FUSED_GUARDS, reads_only_main_output("norm"))

NORM_BACKWARD_PROLOGUE = register_rule(
    Rule(
        name="norm_backward_prologue",
        pattern=Pattern(
            (
                op(*POINTWISE, bind="prologue", where=FUSED_GUARDS),
                op(*NORMS_BACKWARD, bind="norm", via=["grad"], where=NORM_GUARDS),
                Epilogue(guards=EPILOGUE_GUARDS),
            )
        ),
        family=Family.ROW_NORM_BACKWARD,
        anchor="norm",
        prologue="prologue",
        priority=32,
        description=(
            "a pointwise op making the grad (activation backward, dropout or ReLU mask) + layernorm_backward or "
            "rmsnorm_backward, then any elementwise epilogue on dx (the residual-add backward)"
        ),
    )
)

NORM_BACKWARD_EPILOGUE = register_rule(
    Rule(
        name="norm_backward_epilogue",
        pattern=Pattern(
            (
                op(*NORMS_BACKWARD, bind="norm", where=NORM_GUARDS),
                Epilogue(min_nodes=1, guards=EPILOGUE_GUARDS),
            )
        ),
        family=Family.ROW_NORM_BACKWARD,
        anchor="norm",
        priority=33,
        description="layernorm_backward or rmsnorm_backward followed by elementwise ops on dx (the residual-add backward)",
    )
)
