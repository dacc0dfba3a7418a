"""Normalizations: residual add + layer/RMS norm, and norms with their epilogues."""

from __future__ import annotations

from ..guards import FUSED_GUARDS
from ..partition import Family
from ..pattern import Epilogue, Pattern, op
from ..rule import Rule, register_rule

ADD_NORM = register_rule(
    Rule(
        name="add_norm",
        pattern=Pattern(
            (
                op("add", bind="add", where=FUSED_GUARDS),
                op("rmsnorm", "layernorm", bind="norm", via=["input"], where=FUSED_GUARDS),
                Epilogue(guards=FUSED_GUARDS),
            ),
            may_escape=frozenset({"add"}),
        ),
        family=Family.ROW_NORM,
        anchor="norm",
        prologue="add",
        priority=20,
        description=(
            "add (the residual) + rmsnorm or layernorm, then any elementwise epilogue; the sum is "
            "also written when it is a graph output or read elsewhere (the residual stream)"
        ),
    )
)

NORM_EPILOGUE = register_rule(
    Rule(
        name="norm_epilogue",
        pattern=Pattern(
            (
                op("layernorm", "rmsnorm", "groupnorm", "instancenorm", bind="norm", where=FUSED_GUARDS),
                Epilogue(min_nodes=1, guards=FUSED_GUARDS),
            )
        ),
        family=None,
        anchor="norm",
        priority=30,
        description="layernorm, rmsnorm, groupnorm or instancenorm followed by elementwise ops (scale, bias, activations)",
    )
)
