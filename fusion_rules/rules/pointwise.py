"""Groups of pointwise ops."""

from __future__ import annotations

from ..guards import FUSED_GUARDS
from ..partition import Family
from ..pattern import Group
from ..rule import Rule, register_rule

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
