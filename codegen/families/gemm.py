"""GEMM family: convolution forward (as an implicit GEMM, gemm_problem.py) and matmul, with a
fused epilogue (gemm_epilogue.py). This module picks the path and lists the launch choices.

Two paths, both always correct:
- tensor cores (``mma.sync``: fp16/bf16 inputs, fp32 accumulation; int8 inputs, exact s32
  accumulation; from sm_89 fp8 inputs, fp32 accumulation; gemm_mma.py) when the channel / K
  dims are contiguous in memory in 16-byte chunks: a multi-stage ``cp.async``
  pipeline into XOR-swizzled shared memory (gemm_loaders.py), then the accumulator tile is
  staged through shared memory so that the epilogue reads operands and writes the output in
  contiguous 16-byte vectors (gemm_block.py). On sm_90 the same problems can take ``wgmma``
  instead (gemm_sm90.py: same loaders and epilogue), when the tuning choice asks for it;
- SIMT, one output element per thread, for everything else (gemm_simt.py), fp8 on sm_80
  included (no fp8 tensor cores there: each element is widened to fp32 in the kernel). An
  8-bit matmul the tensor cores cannot read (B not K-major, K not in 16-byte chunks) runs
  here too, many times slower, with a warning on the ``graphdnn.compile`` log that names the
  layout the tensor cores need (gemm_problem.eight_bit_slow_path).

Problems with fewer output tiles than the GPU has SMs and a long K take split-K on either
tensor-core path (gemm_splitk.py): a second kernel sums the K slices and runs the epilogue.

On sm_90, matmuls with enough tiles to fill the GPU, and those with few tiles and a long K
(with two K slices), take the persistent warp-specialised TMA engine (gemm_ws.py) unless a
tuning says otherwise; dynamic ones too, per size bucket of M (below); so do the 16-bit 2-d
convolutions like the ResNet layers it was measured faster on, fed by TMA im2col
(gemm_ws.default_choice).

Weight-only 4-bit matmuls (a packed B with group scales, at most 16 rows) take their own
kernels (gemm_weight_only.py).

Convolution gradients come here only when they fit the tensor cores (the fusion rules ask
fusion_rules/conv_grad_gemm.py; the others stay in the direct family): dgrad as an implicit
GEMM over the loss, wgrad as a GEMM over N*P*Q, usually with split-K (few output tiles, long K),
dgrad on the mma.sync path by default (wgmma on sm_90 through tuning), wgrad on it on sm_80 and
on the wgmma path on sm_90 (its m-contiguous loss through wgmma's transposed A; gemm_wgrad.py
says which tile). A tuning may still choose the direct kernel
({"path": "direct"}, without an epilogue), so that autotuning compares them.

A dynamic graph's matmul (a symbolic M, symbolic batch dims; docs/dynamic-shapes.md) reads M
from an EXTENT argument and computes its grid at launch on every path (gemm_block.py,
gemm_simt.py, gemm_ws.py: the engine's tensor maps are resolved at each call). By default it
takes what the static plan takes, per size bucket of M (codegen/buckets.py: a variant per
bucket, the static plan's choice at the bucket's largest M): on sm_90 the engine's tile, or
its two K slices for few tiles and a long K (the partials sized for the bucket's largest M),
where the static plan takes the engine, else the mma.sync tile without split-K; where the
batch is symbolic too, one choice, at the symbols' maxima. mma.sync and wgmma split-K stay
off for a dynamic M (their slices would be chosen for one M): a tuning that asks for them
is refused naming the node. The SIMT kernel takes what the tensor cores cannot.

A forward convolution over a symbolic batch N (its only dim shape inference lets be symbolic)
is bucketed the same way over M = N*P*Q.., but its buckets keep the static plan's mma.sync
split-K where the static plan takes it (the partials sized for the bucket's largest M, the
reduction reading M at launch), and on sm_90 the engine's TMA im2col producer where the static
plan takes it (its image map's batch dim encoded at each call, gemm_im2col.py).
"""

from __future__ import annotations

import dataclasses
import logging

from fusion_rules import FusedNode
from fusion_rules.conv_grad_gemm import refusal
from graphdnn.errors import UnsupportedError
from graphdnn.ops.weight_only import is_weight_only
from graphdnn.symbolic import Sym, show_ranges, symbols_of

from ..buckets import bucketed_program, size_buckets
from ..context import EmitContext
from ..kernel import FusedProgram, Kernel
from . import direct_conv
from . import gemm_weight_only as weight_only
from .gemm_grouped_conv import candidates as grouped_candidates
from .gemm_grouped_conv import grouped_conv_kernel, takes_grouped_conv
from .gemm_mma import TILE_CANDIDATES, mma_kernel, tile_config
from .gemm_problem import Problem, eight_bit_slow_path, on_tensor_cores, problem_of
from .gemm_simt import simt_kernel
from .gemm_sm90 import candidates as wgmma_candidates
from .gemm_sm90 import wgmma_kernel
from .gemm_splitk import output_tiles, reduce_kernel, scratch, split_choices, tuned_split
from .gemm_wgrad import default_choice as default_wgrad
from .gemm_ws import candidates as ws_candidates
from .gemm_ws import default_choice as default_ws
from .gemm_ws import ws_kernel, ws_split

LOG = logging.getLogger("graphdnn.compile")


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    assert fused.anchor is not None
    if is_weight_only(fused.anchor):
        return weight_only.emit(fused, ctx)
    problem = problem_of(fused.anchor)
    if problem.is_grad:
        return _emit_grad(fused, ctx, problem)
    if problem.block_scaled:
        return _emit_block_scaled(fused, ctx, problem)
    slow = eight_bit_slow_path(problem, ctx.arch)
    if slow is not None:
        LOG.warning("%s", slow)
    if problem.is_dynamic:
        _check_dynamic(problem, ctx)
    if not on_tensor_cores(problem, ctx.arch):
        kernel = grouped_conv_kernel if takes_grouped_conv(problem) else simt_kernel
        return FusedProgram(fused.name, (kernel(fused, ctx, problem),))
    if problem.is_dynamic and not ctx.tuning:
        return _dynamic_default(fused, ctx, problem)
    default = None if ctx.tuning else default_ws(problem, ctx.arch)
    if default is not None:
        ctx = dataclasses.replace(ctx, tuning=default)
    return _tuned(fused, ctx, problem, problem.m)


def _emit_block_scaled(fused: FusedNode, ctx: EmitContext, problem: Problem) -> FusedProgram:
    """A block-scaled fp8 matmul: the warp-specialised engine where it can read the operands
    (sm_90, K-major fp8), else the SIMT kernel (sm_80 has no fp8 tensor cores; on sm_90 the
    log says which layout the tensor cores need)."""
    if not ws_candidates(problem, ctx.arch):
        slow = eight_bit_slow_path(problem, ctx.arch)
        if slow is not None:
            LOG.warning("%s", slow)
        if ctx.tuning:
            raise UnsupportedError(
                f"GEMM tuning {ctx.tuning}: this block-scaled matmul runs on the SIMT kernel here, which takes no tuning",
                node=problem.node.name,
            )
        return FusedProgram(fused.name, (simt_kernel(fused, ctx, problem),))
    if ctx.tuning and ctx.tuning.get("path") != "ws":
        raise UnsupportedError(
            f"GEMM tuning {ctx.tuning}: a block-scaled matmul runs on the warp-specialised engine only "
            "({'path': 'ws', 'block_n': 128, 'stages': n})",
            node=problem.node.name,
        )
    tuned = dataclasses.replace(ctx, tuning=ctx.tuning or default_ws(problem, ctx.arch) or {})
    return _program(fused, tuned, problem, ws_kernel(fused, tuned, problem), ws_split(tuned, problem))


def _tuned(fused: FusedNode, ctx: EmitContext, problem: Problem, top_m: int) -> FusedProgram:
    """The kernels of the choice ``ctx.tuning`` (the mma.sync heuristic without one); with
    split-K the partials are sized for M up to ``top_m``."""
    if ctx.tuning.get("path") == "ws":
        split = ws_split(ctx, problem)
        kernel = ws_kernel(fused, ctx, problem)
    elif ctx.tuning.get("path") == "wgmma":
        split = tuned_split(ctx, problem) or 1
        kernel = wgmma_kernel(fused, ctx, problem, split)
    else:
        tile, split = tile_config(problem, ctx)
        kernel = mma_kernel(fused, ctx, problem, tile, split)
    return _program(fused, ctx, problem, kernel, split, top_m)


def _dynamic_default(fused: FusedNode, ctx: EmitContext, problem: Problem) -> FusedProgram:
    """A dynamic matmul's kernels when nothing is tuned: the static plan's choice for each size
    bucket of M (codegen.buckets), each bucket's kernels tagged with it, or one choice at the
    symbols' maxima where the batch is symbolic (module docstring)."""

    def choose(m: int) -> dict[str, object]:
        at = dataclasses.replace(problem, m=m)
        engine = default_ws(at, ctx.arch)
        if engine is not None:
            return engine
        tile, split = tile_config(at, ctx)  # no split for a dynamic matmul's M, the static one for a conv's
        choice: dict[str, object] = {"block_m": tile.block_m, "block_n": tile.block_n, "stages": tile.stages}
        return {**choice, "split_k": split} if split > 1 else choice

    def emit_choice(choice: dict[str, object], top_m: int) -> FusedProgram:
        return _tuned(fused, dataclasses.replace(ctx, tuning=choice), problem, top_m)

    if isinstance(problem.batch_count, Sym):
        return emit_choice(choose(problem.m), problem.m)
    assert isinstance(problem.m_extent, Sym)
    return bucketed_program(fused.name, size_buckets(problem.m_extent, choose), emit_choice)


def extents_refusal(fused: FusedNode) -> str | None:
    """Why the GEMM kernels cannot take ``fused``'s symbols: they take a matmul's M (its rows)
    and batch dims, and a forward convolution's batch N (M = N*P*Q..); N and K of a matmul
    (which size the tiles and the k loop), a convolution's other dims and the gradients' dims
    stay static. None when they can."""
    assert fused.anchor is not None
    node = fused.anchor
    if node.op == "conv_fprop":
        x, w, out = node.input("image"), node.input("weight"), node.outputs[0][1]
        assert x is not None and w is not None
        fixed = symbols_of([*w.dim, *w.stride, *x.dim[1:], *x.stride, *out.dim[1:], *out.stride])
        if fixed:
            return (
                f"has symbolic strides or dims besides its batch ({show_ranges(fixed)}); gemm kernels take a "
                "convolution's batch N as a runtime extent only (its channels, spatial dims and strides size the "
                "tiles and the gather: keep N outermost in memory, as NHWC and NCHW do)"
            )
        return None
    if node.op != "matmul":
        symbols = symbols_of(v for t in (*fused.inputs, *fused.outputs) for v in (*t.dim, *t.stride))
        return (
            f"has symbolic dims ({show_ranges(symbols)}); gemm kernels take runtime extents in a matmul's rows and "
            f"batch dims and a conv_fprop's batch only, not in a {node.op}'s (docs/dynamic-shapes.md)"
        )
    a, out = node.input("A"), node.outputs[0][1]
    assert a is not None
    fixed = symbols_of([out.dim[-1], a.dim[-1]])
    if fixed:
        return (
            f"multiplies over a symbolic N or K ({show_ranges(fixed)}); gemm kernels take runtime extents in a "
            "matmul's rows (M) and batch dims only (N and K size the tiles and the k loop)"
        )
    return None


def _check_dynamic(problem: Problem, ctx: EmitContext) -> None:
    """UnsupportedError naming the node when a dynamic problem asks for a split that cannot take
    runtime extents: a matmul's mma.sync or wgmma split, a convolution's wgmma split (module
    docstring; the engine's can, and a convolution's mma.sync split, which its buckets take)."""
    node, symbols = problem.node, show_ranges(problem.out.symbols)
    path = ctx.tuning.get("path")
    if path == "ws" or (problem.is_conv and path is None) or (tuned_split(ctx, problem) or 1) == 1:
        return
    refused = "wgmma" if problem.is_conv else "mma.sync or wgmma"
    raise UnsupportedError(
        f"GEMM tuning {ctx.tuning}: a {node.op} with symbolic dims ({symbols}) takes no {refused} split-K "
        "(their slices would be chosen for one M): take the warp-specialised engine's split "
        "({'path': 'ws', ..., 'split_k': n}) on sm_90, or no split",
        node=node.name,
    )


def _program(
    fused: FusedNode, ctx: EmitContext, problem: Problem, kernel: Kernel, split: int, top_m: int | None = None
) -> FusedProgram:
    """The tensor-core kernel, then with split-K the reduction and its scratch (the partials of
    M up to ``top_m``, by default the problem's)."""
    if split == 1:
        return FusedProgram(fused.name, (kernel,))
    partials = scratch(dataclasses.replace(problem, m=top_m or problem.m), split)
    return FusedProgram(fused.name, (kernel, reduce_kernel(fused, ctx, problem, split)), (partials,))


def _emit_grad(fused: FusedNode, ctx: EmitContext, problem: Problem) -> FusedProgram:
    """A convolution gradient: the mma.sync kernel (split-K when the heuristic or tuning says),
    or the wgmma kernel (a wgrad's default on sm_90, gemm_wgrad.py) or the direct kernel when
    the tuning asks for it."""
    node = problem.node
    path = ctx.tuning.get("path")
    if path == "direct":
        if fused.epilogue:
            raise UnsupportedError(
                f"GEMM tuning {ctx.tuning}: the direct {node.op} kernel has no epilogue, and {fused.name} has one",
                node=node.name,
            )
        emit_direct = direct_conv.emit_dgrad if node.op == "conv_dgrad" else direct_conv.emit_wgrad
        return emit_direct(fused, ctx)
    paths = ("wgmma", "direct")
    if path is not None and path not in paths:
        raise UnsupportedError(
            f"GEMM tuning {ctx.tuning}: {node.op} takes the mma.sync path or "
            f"{' or '.join(f'{{path: {p!r}}}' for p in paths)}, not path {path!r}",
            node=node.name,
        )
    reason = refusal(node)
    if reason is not None:
        raise UnsupportedError(f"{node.op} cannot take the tensor-core GEMM: {reason}", node=node.name)
    if "prefetch" in ctx.tuning and path != "wgmma":
        raise UnsupportedError(f"GEMM tuning {ctx.tuning}: prefetch is a choice of the wgmma path", node=node.name)
    default = None if ctx.tuning else default_wgrad(problem, ctx.arch)
    if default is not None:
        ctx, path = dataclasses.replace(ctx, tuning=default), "wgmma"
    if path == "wgmma":
        split = tuned_split(ctx, problem) or 1
        return _program(fused, ctx, problem, wgmma_kernel(fused, ctx, problem, split), split)
    tile, split = tile_config(problem, ctx)
    return _program(fused, ctx, problem, mma_kernel(fused, ctx, problem, tile, split), split)


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Launch choices the runtime may time on the GPU (autotuning); empty on the SIMT path
    (a depthwise or small-group convolution's: gemm_grouped_conv.candidates).
    The mma.sync tiles (no "path" key) and, for problems with few output tiles, their split-K
    variants ("split_k"), then on sm_90 the wgmma ones ({"path": "wgmma", ...}); for a
    convolution gradient the mma.sync and wgmma ones (with a wgrad's sm_90 default,
    gemm_wgrad.py), and the direct kernel ({"path": "direct"})."""
    assert fused.anchor is not None
    if is_weight_only(fused.anchor):
        return weight_only.candidates(fused.anchor, arch)
    problem = problem_of(fused.anchor)
    if not on_tensor_cores(problem, arch):  # the grouped path's kernels, or none (SIMT)
        return grouped_candidates(problem) if takes_grouped_conv(problem) else []
    if problem.block_scaled:
        return ws_candidates(problem, arch)
    if problem.is_grad:  # mma.sync, wgmma (a wgrad's default among them); the direct kernel without an epilogue
        direct: list[dict[str, object]] = [] if fused.epilogue else [{"path": "direct"}]
        wgmma = wgmma_candidates(problem, arch)
        default = default_wgrad(problem, arch)
        return _mma_candidates(problem, arch) + wgmma + ([default] if default and default not in wgmma else []) + direct
    if problem.is_dynamic:  # split-K on the engine only (_check_dynamic)
        every = _mma_candidates(problem, arch) + wgmma_candidates(problem, arch)
        return [c for c in every if "split_k" not in c] + ws_candidates(problem, arch)
    return _mma_candidates(problem, arch) + wgmma_candidates(problem, arch) + ws_candidates(problem, arch)


def _mma_candidates(problem: Problem, arch: int) -> list[dict[str, object]]:
    mma: list[dict[str, object]] = [
        {"block_m": c.block_m, "block_n": c.block_n, "stages": c.stages} for c in TILE_CANDIDATES
    ]
    split: list[dict[str, object]] = [
        {"block_m": c.block_m, "block_n": c.block_n, "stages": c.stages, "split_k": s}
        for c in TILE_CANDIDATES
        for s in split_choices(problem, output_tiles(problem, c.block_m, c.block_n), arch)
    ]
    return mma + split
