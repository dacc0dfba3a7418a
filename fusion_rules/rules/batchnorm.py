"""Training batch norm with what follows it (residual add, activation)."""

from __future__ import annotations

from ..guards import FUSED_GUARDS, reads_only_main_output
from ..partition import Family
from ..pattern import Epilogue, Pattern, op
from ..rule import Rule, register_rule

BN_TRAIN_ACT = register_rule(
    Rule(
        name="bn_train_act",
        pattern=Pattern(
            (
                op("batchnorm", bind="bn", where=FUSED_GUARDS),
                Epilogue(min_nodes=1, guards=(*FUSED_GUARDS, reads_only_main_output("bn"))),
            )
        ),
        family=Family.BATCHNORM_TRAIN,
        anchor="bn",
        priority=35,
        description=(
            "training batchnorm followed by elementwise ops (residual add, activation): statistics, "
            "then normalize + epilogue; the saved mean / inv_variance and running statistics are still written"
        ),
    )
)
