"""Reductions, the softmax ops, argmax and argmin with the elementwise epilogue on their output."""

from __future__ import annotations

from ..guards import FUSED_GUARDS
from ..partition import Family
from ..pattern import Epilogue, Pattern, op
from ..rule import Rule, register_rule

REDUCTION_EPILOGUE = register_rule(
    Rule(
        name="reduction_epilogue",
        pattern=Pattern(
            (
                op(
                    "reduction",
                    "softmax",
                    "log_softmax",
                    "softmax_backward",
                    "argmax",
                    "argmin",
                    bind="reduction",
                    where=FUSED_GUARDS,
                ),
                Epilogue(min_nodes=1, guards=FUSED_GUARDS),
            )
        ),
        family=Family.REDUCTION,
        anchor="reduction",
        priority=50,
        description="reduction, a softmax op, argmax or argmin followed by elementwise ops on its output",
    )
)
