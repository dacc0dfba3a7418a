"""One graph on its way to a plan: what compiling it computes once and hands on.

The signature and the canonical tensor order come from one canonicalisation; the key
fields from that signature; the partition (``fusion_rules.fuse``) is made on first use,
so a plan-cache hit never fuses. Tuning, lowering and storing the plan all read these
products instead of computing them again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from .cache.key import KeyFields, key_fields
from .ir import Graph, Tensor
from .signature import signature_and_order

if TYPE_CHECKING:
    from fusion_rules import Partition


@dataclass(frozen=True)
class Compilation:
    """A validated graph, its target and its plan-cache key, with what they determine."""

    ir: Graph
    target: int
    disable: tuple[str, ...]  # fusion rules turned off
    signature: str
    order: tuple[int, ...]  # tensor ids in canonical order: what a stored plan's positions index
    fields: KeyFields

    @classmethod
    def of(cls, ir: Graph, target: int, disable: Iterable[str] = ()) -> Compilation:
        """A dynamic graph compiles once for the whole range of its symbols (its signature
        covers the ranges); codegen refuses the fused nodes whose family takes no runtime extents."""
        rules_off = tuple(disable)
        graph_signature, order = signature_and_order(ir)
        return cls(ir, target, rules_off, graph_signature, order, key_fields(ir, target, rules_off, graph_signature))

    @property
    def canonical_tensors(self) -> tuple[Tensor, ...]:
        """The graph's tensors in canonical order (what a stored plan is checked against)."""
        return tuple(self.ir.tensors[tensor_id] for tensor_id in self.order)

    @cached_property
    def partition(self) -> Partition:
        """The fused graph for the target, made once, on first use."""
        from fusion_rules import fuse

        return fuse(self.ir, arch=self.target, disable=self.disable)
