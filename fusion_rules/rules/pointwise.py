"""Reductions with epilogues, and groups of pointwise ops."""

from __future__ import annotations

from ..guards import FUSED_GUARDS
from ..partition import Family
from ..pattern import Epilogue, Group, Pattern, op
from ..rule import Rule, register_rule

REDUCTION_EPILOGUE = register_rule(
    Rule(
        name="reduction_epilogue",
        pattern=Pattern(
            (
                op("reduction", "softmax", bind="reduction", where=FUSED_GUARDS),
                Epilogue(min_nodes=1, guards=FUSED_GUARDS),
            )
        ),
        family=Family.REDUCTION,
        anchor="reduction",
        priority=50,
        description="reduction or softmax followed by elementwise ops on its output",
    )
)

POINTWISE_GROUP = register_rule(
    Rule(
        name="pointwise_group",
        pattern=Group(guards=FUSED_GUARDS),
        family=Family.ELEMENTWISE,
        priority=90,
        description=(
            "a maximal connected group of elementwise ops with one output shape (inputs may broadcast), "
            "as long as no path leaves the group and re-enters it; every value read outside is written"
        ),
    )
)
