"""Reductions (sum, mean, norms, products, min / max), with an elementwise epilogue on their
output, on the reduction walk (reduction_walk.py, reduction_kernels.py); softmax shares the
family (reduction_softmax.py, reduction_softmax_backward.py), and so do argmax and argmin
(reduction_argmax.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ops.reduction import ReductionMode

from ..context import EmitContext, compute_of, pattern_name
from ..kernel import FusedProgram
from ..pointwise import literal, render
from .reduction_argmax import emit_arg_reduction
from .reduction_fragments import type_bytes
from .reduction_kernels import Accumulator, epilogue_finish, refuse_tuning, walk_kernels
from .reduction_softmax import emit_softmax
from .reduction_softmax_backward import emit_softmax_backward
from .reduction_walk import plan_walk


def _same(x: str, compute: str) -> str:
    return x


def _unchanged(merged: str, count: int, compute: str) -> str:
    return merged


@dataclass(frozen=True)
class Mode:
    """A reduction mode: each element contributes ``element(x)``; contributions merge with the
    pointwise op ``merge`` starting from ``identity``; the output is ``result(merged, count)``."""

    merge: str
    identity: float
    element: Callable[[str, str], str] = _same
    result: Callable[[str, int, str], str] = _unchanged


MODES: dict[ReductionMode, Mode] = {
    ReductionMode.ADD: Mode("add", 0.0),
    ReductionMode.AVG: Mode("add", 0.0, result=lambda a, n, c: render("div", [a, literal(n, c)], None, c)),
    ReductionMode.NORM1: Mode("add", 0.0, element=lambda x, c: render("abs", [x], None, c)),
    ReductionMode.NORM2: Mode(
        "add",
        0.0,
        element=lambda x, c: render("mul", [x, x], None, c),
        result=lambda a, n, c: render("sqrt", [a], None, c),
    ),
    ReductionMode.MUL: Mode("mul", 1.0),
    ReductionMode.MUL_NO_ZEROS: Mode(
        "mul", 1.0, element=lambda x, c: f"({x} == {literal(0, c)} ? {literal(1, c)} : {x})"
    ),
    ReductionMode.MIN: Mode("min", math.inf),
    ReductionMode.MAX: Mode("max", -math.inf),
    ReductionMode.AMAX: Mode("max", -math.inf, element=lambda x, c: render("abs", [x], None, c)),
}


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    refuse_tuning(fused, ctx)
    anchor = fused.anchor
    assert anchor is not None
    if anchor.op in ("softmax", "log_softmax"):
        return emit_softmax(fused, ctx)
    if anchor.op == "softmax_backward":
        return emit_softmax_backward(fused, ctx)
    if anchor.op in ("argmax", "argmin"):
        return emit_arg_reduction(fused, ctx)
    x, y = anchor.input("input"), anchor.output("y")
    assert x is not None and y is not None
    mode = MODES[anchor.attributes.mode]  # type: ignore[attr-defined]
    compute = compute_of([*fused.inputs, *fused.outputs])
    walk = plan_walk(x, y.static_dim, [*fused.inputs, *fused.outputs], slot_bytes=type_bytes(compute))
    acc = Accumulator(
        compute,
        1,
        mode.identity,
        mode.merge,
        lambda slot, v: [f"acc[{slot}] = merge(acc[{slot}], {mode.element(v, compute)});"],
        compute,
    )
    finish = epilogue_finish(
        fused, y, compute, lambda merged: mode.result(merged[0], walk.count, compute), y.static_dim
    )
    kernels, scratch = walk_kernels(ctx, fused, walk, acc, finish, pattern_name(fused))
    return FusedProgram(fused.name, tuple(kernels), tuple(scratch))
