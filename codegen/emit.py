"""From a partition to kernel sources: one family emitter per fused node."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from fusion_rules import Family, FusedNode, Partition
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from graphdnn.symbolic import show_ranges, symbols_of

from .context import EmitContext
from .kernel import FusedProgram

_FAMILY_MODULES = {
    Family.ELEMENTWISE: "elementwise",
    Family.ROW_NORM: "rownorm",
    Family.ROW_NORM_BACKWARD: "rownorm_backward",
    Family.GROUP_NORM: "groupnorm",
    Family.BATCHNORM_TRAIN: "batchnorm_train",
    Family.BATCHNORM_BACKWARD: "batchnorm_backward",
    Family.REDUCTION: "reduction",
    Family.GEMM: "gemm",
    Family.ATTENTION: "attention",
    Family.ATTENTION_BACKWARD: "attention_backward",
    Family.DIRECT: "direct",
}
# The families whose kernels take runtime extents (a dynamic graph's symbols as arguments).
DYNAMIC_FAMILIES = frozenset({Family.ELEMENTWISE, Family.ROW_NORM, Family.GEMM, Family.ATTENTION})


def emitter(family: Family) -> Callable[[FusedNode, EmitContext], FusedProgram]:
    return _family_module(family).emit


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """The launch choices worth timing for ``fused`` on sm_``arch`` (autotuning): its family's
    ``candidates(fused, arch)``, or none for a family without choices."""
    choose = getattr(_family_module(fused.family), "candidates", None)
    return list(choose(fused, arch)) if choose is not None else []


def _family_module(family: Family) -> Any:
    try:
        return import_module(f"codegen.families.{_FAMILY_MODULES[family]}")
    except ModuleNotFoundError:
        raise UnsupportedError(f"no code generator for the {family.value} family") from None


def emit_partition(
    partition: Partition,
    arch: int,
    tuning: dict[str, dict[str, object]] | None = None,
    *,
    graph_signature: str | None = None,
) -> tuple[FusedProgram, ...]:
    """CUDA programs for every fused node, in execution order.

    ``tuning`` maps a fused node's name to its family's launch choices (autotuned);
    families fall back to their heuristic choice. ``graph_signature``: the graph's, where
    the caller has it already (the compiler does), else computed here.
    """
    graph_signature = graph_signature or signature(partition.graph)
    for fused in partition.nodes:
        check_extents(fused)
    programs = []
    for fused in partition.nodes:
        ctx = EmitContext(partition.graph, graph_signature, arch, dict((tuning or {}).get(fused.name, {})))
        programs.append(emitter(fused.family)(fused, ctx))
    return tuple(programs)


def extents_refusal(fused: FusedNode) -> str | None:
    """Why ``fused``'s kernels cannot take its symbolic dims as runtime extents (its family takes
    none, or its family's ``extents_refusal`` says why not these); None when they can, or it has none."""
    symbols = symbols_of(v for t in (*fused.inputs, *fused.outputs) for v in (*t.dim, *t.stride))
    if not symbols:
        return None
    if fused.family not in DYNAMIC_FAMILIES:
        *others, last = sorted(f.value for f in DYNAMIC_FAMILIES)
        takes = f"{', '.join(others)} and {last}"
        return (
            f"has symbolic dims ({show_ranges(symbols)}); {fused.family.value} kernels do not take runtime extents "
            f"yet (only {takes} kernels do, docs/dynamic-shapes.md)"
        )
    refusal = getattr(_family_module(fused.family), "extents_refusal", None)
    return refusal(fused) if refusal is not None else None


def check_extents(fused: FusedNode) -> None:
    """UnsupportedError naming the fused node, its ops and its symbols when its kernels cannot
    take its symbolic dims (before any kernel of the graph is emitted)."""
    reason = extents_refusal(fused)
    if reason is not None:
        raise UnsupportedError(
            f"fused node '{fused.name}' ({fused.family.value}: {', '.join(n.name for n in fused.nodes)}) {reason}. "
            "Run it with backend='reference', or build a static graph for each shape"
        )
