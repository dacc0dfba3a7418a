"""Fusion passes: partition an operation graph into fused nodes, each one kernel family.

``fuse(graph)`` returns a :class:`Partition`; ``Partition.describe()`` explains it.
Rules are declarations (:mod:`fusion_rules.rules`); :func:`register_rule` adds a user rule.
"""

from . import rules  # noqa: F401  (registers the built-in rules)
from .manager import fuse, parse_arch
from .partition import Family, FusedNode, Partition, Rejection, Rewrite
from .pattern import Epilogue, Group, Op, Pattern, op
from .rule import Rule, register_rule, registered_rules, unregister_rule

__all__ = [
    "Epilogue",
    "Family",
    "FusedNode",
    "Group",
    "Op",
    "Partition",
    "Pattern",
    "Rejection",
    "Rewrite",
    "Rule",
    "fuse",
    "op",
    "parse_arch",
    "register_rule",
    "registered_rules",
    "unregister_rule",
]
