"""Fusion rules: a pattern, what it becomes, and the registry the pass manager reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graphdnn.errors import GraphError

from .partition import Family
from .pattern import Group, Match, MatchContext, Miss, Pattern

Rewriter = Callable[[MatchContext, Match], "Match | Miss"]


@dataclass(frozen=True)
class Rule:
    """A declaration: nodes matching ``pattern`` become one fused node of ``family``.

    ``anchor`` and ``prologue`` name bindings of the pattern (the op the family is built
    around, and an elementwise node before it). Lower ``priority`` runs first.
    """

    name: str
    pattern: Pattern | Group
    family: Family | None  # None: the family of the anchor, or ELEMENTWISE for a group
    priority: int
    description: str
    anchor: str | None = None
    prologue: str | None = None
    rewrite: Rewriter | None = None


_RULES: dict[str, Rule] = {}


def register_rule(rule: Rule) -> Rule:
    """Make a rule known to :func:`fusion_rules.fuse` (user rules too)."""
    if rule.name in _RULES:
        raise GraphError(f"a fusion rule named '{rule.name}' is already registered")
    _RULES[rule.name] = rule
    return rule


def unregister_rule(name: str) -> None:
    _RULES.pop(name, None)


def registered_rules() -> tuple[Rule, ...]:
    """Every rule, in the order the pass manager applies them."""
    return tuple(sorted(_RULES.values(), key=lambda r: (r.priority, r.name)))
