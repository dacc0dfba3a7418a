"""Batch norm backward, with the pointwise op that makes its grad (prologue) and dx's epilogue.

With xhat = (x - mean) * inv_variance, n elements per channel and per-channel sums S1 = sum(grad),
S2 = sum(grad * xhat) (over the batch and the spatial dims):

    dscale = S2,  dbias = S1
    dx = a * grad - a * S1 / n - k * (x - mean),  a = scale * inv_variance,  k = a * inv_variance * S2 / n

Two phases, every sum in a fixed order (no atomics):

1. the per-channel sums: the direct family's sums over axes (direct_reduce.py: a group of
   threads per channel for NCHW, 32 channels per block for NHWC, split over blockIdx.y into
   chunks of at least MIN_SPLIT elements with a finalize kernel when the channels are few and
   long), the grad computed from the prologue's
   operands where there is one. Each channel's finish stores dscale and dbias and, for phase 2,
   (a, a * S1 / n, k, mean) in the ``dx_coefficients`` scratch;
2. dx: training batch norm's apply kernel (batchnorm_train.py: 16-byte vectors in x's memory
   order, a thread's channels held in registers for NHWC) computes dx from the four values of
   the element's channel, then the epilogue, and stores what is written (dx, the epilogue's
   results, the grad when it escapes: a residual branch's gradient).

Keeping x - mean (instead of folding k * mean into the constant) keeps dx accurate when
|mean| >> std, as the forward apply does.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import EmitContext, KernelParams, operand_loader, pattern_name
from ..cuda_types import store
from ..indexing import offset, row_major_index
from ..kernel import FusedProgram, Scratch
from ..pointwise import literal
from .batchnorm_train import PerChannel, apply_kernel
from .direct_common import compute_for, declare, written
from .direct_reduce import Sums, innermost_reduced, sums_kernels
from .reduction_fragments import type_bytes
from .reduction_kernels import refuse_tuning

COEFFICIENTS = "dx_coefficients"  # [4][C]: a, a * S1 / n, k, mean
# Reduced elements per split of the sums at least: finer than the direct family's default, as
# the few channels of early layers (16 to 64) would otherwise leave most SMs idle.
MIN_SPLIT = 512


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    refuse_tuning(fused, ctx)
    bn = fused.anchor
    assert bn is not None
    grad, x, scale, mean, inv = (bn.input(role) for role in ("grad", "input", "scale", "mean", "inv_variance"))
    dscale, dbias = bn.output("dscale"), bn.output("dbias")
    assert grad is not None and x is not None and scale is not None and mean is not None and inv is not None
    compute = compute_for(fused)
    side = {t.id for t in (dscale, dbias) if t is not None}
    full = [t for t in fused.outputs if t.id not in side]  # dx, the epilogue's results, the escaping grad
    count = x.static_numel // x.static_dim[1]
    inputs = {t.id for t in fused.inputs}
    channels = x.static_dim[1]

    def with_grad(values: epilogue.Values) -> str:
        """The grad at the current element: the prologue's result, or loaded."""
        if fused.prologue is not None:
            epilogue.apply([fused.prologue], values)
        return values.get(grad)

    def terms(params: KernelParams, itype: str) -> tuple[list[str], list[str]]:
        read = [*(fused.prologue.input_tensors() if fused.prologue else []), grad, x, mean, inv]
        names = declare(params, [t for t in read if t.id in inputs])
        values = epilogue.Values(
            compute, operand_loader(names, x.static_dim, "c", compute), lambda t: row_major_index(t, x.static_dim, "c")
        )
        element = with_grad(values)
        centered = f"({values.get(x)} - {values.get(mean)}) * {values.get(inv)}"
        return [*values.statements, f"const {compute} grad = {element};", f"const {compute} xhat = {centered};"], [
            "grad",
            "grad * xhat",
        ]

    def finish(params: KernelParams, totals: list[str]) -> list[str]:
        """dscale and dbias, and phase 2's values of the channel (coordinate c1)."""
        lines = []
        for t, total in ((dbias, totals[0]), (dscale, totals[1])):
            if t is not None and written(fused, t):
                lines.append(
                    f"{params.tensor(t, writable=True)}[{offset(t, x.static_dim, 'c')}] = {store(t.data_type, total)};"
                )
        if not full:
            return lines
        names = declare(params, [scale, mean, inv])
        at = operand_loader(names, x.static_dim, "c", compute)
        coefficients = params.scratch(COEFFICIENTS, compute)
        n = literal(count, compute)
        return [
            *lines,
            f"const {compute} a = {at(scale)} * {at(inv)};",
            f"{coefficients}[c1] = a;",
            f"{coefficients}[{channels} + c1] = a * {totals[0]} / {n};",
            f"{coefficients}[{2 * channels} + c1] = a * {at(inv)} * {totals[1]} / {n};",
            f"{coefficients}[{3 * channels} + c1] = {at(mean)};",
        ]

    reduced = tuple(axis for axis in stride_order(x.static_dim, x.static_stride) if axis != 1)
    rows = innermost_reduced(x.static_dim, x.static_stride, reduced)
    sums = Sums(f"{bn.op}_channels", x.static_dim, (1,), reduced, rows, terms, finish, MIN_SPLIT)
    kernels, scratch = sums_kernels(ctx, fused, sums, compute)
    if not full:
        return FusedProgram(fused.name, kernels, scratch)

    dx = bn.output("dx")
    assert dx is not None

    def define_dx(values: epilogue.Values, channel: list[str]) -> None:
        a, a_mean, k, mu = channel
        element = with_grad(values)
        values.define_rounded(dx, f"{a} * {element} - {a_mean} - {k} * ({values.get(x)} - {mu})")

    prologue = fused.prologue.input_tensors() if fused.prologue is not None else [grad]
    epilogue_reads = [t for node in fused.epilogue for t in node.input_tensors()]
    reads = list({t.id: t for t in (*prologue, x, *epilogue_reads) if t.id in inputs}.values())
    kernel = apply_kernel(
        ctx, fused, x, reads, full, compute, f"{pattern_name(fused)}_dx", PerChannel(COEFFICIENTS, 4, define_dx)
    )
    coefficients = Scratch(COEFFICIENTS, 4 * channels * type_bytes(compute))
    return FusedProgram(fused.name, (*kernels, kernel), (*scratch, coefficients))
