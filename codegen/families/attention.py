"""Attention family: the ``sdpa`` op (scaled dot-product attention forward) as one kernel that
never writes the score matrix to memory.

Three paths, all correct for every mask, layout and head dim up to 256:
- the decode kernel (attention_decode.py) for at most DECODE_MAX_SQ query rows, dense or
  paged: GQA rows packed per kv head, the KV length split across blocks when the (batch, kv
  head) blocks cannot keep enough loads in flight; tuning ``{"path": "decode", "split": n,
  "threads": t, "keys_per_lane": k}`` (each key optional). Paged problems of other types
  run there whatever their rows. Where Q, K and V are one 16-bit type (head dims multiples
  of 16, no dropout, sm_80+) its tensor-core variant (attention_decode_mma.py, tuning
  ``{"path": "decode_mma", "warps": w, "tiles": t, "stages": s, "split": n}``) takes the
  dots and P·V on mma.sync, the default where one block holds a kv head's query rows;
- flash attention on tensor cores when Q, K and V are all fp16 or all bf16: mma.sync
  (attention_flash.py), which also reads paged K and V through the page tables (paged
  prefill), or on sm_90 for dense head dims 64 and 128 with contiguous rows the
  warp-specialised TMA/wgmma kernel (attention_wgmma.py), the default there, and the tuning
  choices ``{"path": "wgmma", ...}`` (``{"path": "wgmma"}`` alone: its default);
- one warp per query row in fp32 for anything else (attention_simt.py).

Every path takes dropout, drawing the reference's mask (attention_problem.dropout_function).
Packed (ragged) sequences run on the Hopper (non-persistent), flash or SIMT kernel, after
attention_ragged.py's fill of the packed outputs.

A dynamic graph's attention (docs/dynamic-shapes.md) takes a symbolic batch on every forward path
(flash, Hopper, SIMT, decode, paged), with every mask, a bias and per-batch lengths: one plan for
any batch in range, the grid (a persistent kernel's item count) computed at launch from the batch,
the Hopper kernel's TMA maps encoded per call. It takes symbolic sequence lengths (Sq, Skv) too,
with or without a symbolic batch, on the flash, Hopper, SIMT and (without) the decode kernels,
which read them at run time (the grid's row blocks from Sq, the TMA maps' sequence dims per call). The decode kernels' KV split depends on the batch
and on Skv, so an untuned decode problem compiles a variant per range of batches (or of key
lengths) that share the static plan's choice (codegen.buckets). :func:`extents_refusal` says what
stays refused.
"""

from __future__ import annotations

import dataclasses

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.symbolic import Sym, show_ranges, symbols_of

from ..buckets import bucketed_program, size_buckets
from ..context import EmitContext
from ..kernel import FusedProgram, Kernel
from .attention_decode import DECODE_MAX_SQ, decode_choices, decode_program, uses_decode
from .attention_decode import default_config as decode_default
from .attention_decode_mma import MMA_PATH, by_default, mma_choices, mma_decode_program
from .attention_decode_mma import default_config as mma_default
from .attention_extents import at_batch, at_skv
from .attention_flash import candidates as flash_candidates
from .attention_flash import config, flash_kernel
from .attention_problem import Attention, attention_of, on_tensor_cores
from .attention_ragged import NEG_INF, fill_kernel
from .attention_rotary import rotary_prepass
from .attention_simt import simt_kernel
from .attention_wgmma import configs as wgmma_configs
from .attention_wgmma import supported as wgmma_supported
from .attention_wgmma import wgmma_attention_kernel


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    a = attention_of(fused)
    q_in_kernel, k_in_kernel = _rotations(a, ctx)
    rotary = rotary_prepass(fused, ctx, a, q_in_kernel, k_in_kernel)
    return _program(fused, ctx, a) if rotary is None else rotary.around(_program(fused, ctx, rotary.attention))


def _rotations(a: Attention, ctx: EmitContext) -> tuple[bool, bool]:
    """Whether the kernel :func:`_program` takes for ``a`` applies RoPE to Q, and to K, itself:
    the flash and Hopper kernels rotate their Q tile in their prologue; the tensor-core decode
    kernel rotates Q as it loads it and K as its keys land (each block reads its keys once), over
    a dense K (the pre-pass rotates a paged pool's or a packed K's rows as the tensor holds
    them). The CUDA-core decode and SIMT kernels read what the pre-pass rotated."""
    path = ctx.tuning.get("path")
    untuned_decode = not ctx.tuning and uses_decode(a)
    mma_decode = (path == MMA_PATH or (untuned_decode and by_default(a, ctx.arch))) and not a.is_dynamic
    decode = path in (DECODE, MMA_PATH) or untuned_decode
    return (on_tensor_cores(a) and not decode) or mma_decode, mma_decode and not (a.paged or a.ragged)


def _program(fused: FusedNode, ctx: EmitContext, a: Attention) -> FusedProgram:
    if a.ragged:
        return _ragged_program(fused, ctx, a)
    path = ctx.tuning.get("path")
    if path in (DECODE, MMA_PATH) and isinstance(a.sq_extent, Sym):
        raise UnsupportedError(
            f"attention tuning {dict(ctx.tuning)}: the decode kernels pack the query rows of a kv head at compile "
            f"time and take no symbolic Sq ({show_ranges(symbols_of([a.sq_extent]))}); the flash kernels do",
            node=a.node.name,
        )
    if (a.is_dynamic or isinstance(a.skv_extent, Sym)) and not ctx.tuning and uses_decode(a):
        return _dynamic_decode(fused, ctx, a)
    if path == MMA_PATH or (not ctx.tuning and uses_decode(a) and by_default(a, ctx.arch)):
        return mma_decode_program(fused, ctx, a)
    if path == DECODE or (not ctx.tuning and uses_decode(a)):
        return decode_program(fused, ctx, a)
    if a.paged and (not on_tensor_cores(a) or ctx.tuning.get("path") == "wgmma"):
        raise UnsupportedError(
            f"attention tuning {dict(ctx.tuning)}: a paged KV cache runs on the decode kernel "
            '(tuning {"path": "decode", "split": n}) or, all fp16 or all bf16, the mma.sync flash kernel',
            node=a.node.name,
        )
    return FusedProgram(fused.name, (_attention_kernel(fused, ctx, a),))


def _dynamic_decode(fused: FusedNode, ctx: EmitContext, a: Attention) -> FusedProgram:
    """A decode problem over a symbolic batch or Skv, untuned: the static plan's kernel and KV
    split at every size (the split falls as the batch grows and rises with the keys), one
    variant per range of sizes that share them (codegen.buckets; past DECODE_BUCKETS, the
    smallest batches share the last variant's split, the longest key lengths the maximum's),
    the partials sized for its largest batch and split. Measured on
    an H200 (benchmarks/dynamic_attention.py): a variant per power-of-two range of the batch,
    each at its smallest batch's split, was 4-15% slower than the static plans inside its
    ranges (more blocks than fit at once)."""
    by_batch = a.is_dynamic
    count = a.batch_extent if by_batch else a.skv_extent

    def choose(size: int) -> dict[str, object]:
        at = at_batch(a, size) if by_batch else at_skv(a, size)
        return mma_default(at, ctx.arch).choice() if by_default(at, ctx.arch) else decode_default(at, ctx.arch).choice()

    def emit_choice(choice: dict[str, object], top: int) -> FusedProgram:
        program = mma_decode_program if choice["path"] == MMA_PATH else decode_program
        return program(fused, dataclasses.replace(ctx, tuning=choice), a, top if by_batch else None)

    assert isinstance(count, Sym)
    # the split falls as the batch grows and levels off at 1; it grows with the keys and levels off
    # where the blocks fill the GPU: cut where it levels off last
    found = size_buckets(count, choose, DECODE_BUCKETS, from_top=by_batch)
    return bucketed_program(fused.name, found, emit_choice)


def _attention_kernel(fused: FusedNode, ctx: EmitContext, a: Attention) -> Kernel:
    """SIMT unless all fp16 or all bf16; then the Hopper kernel where tuned or where it applies,
    else the mma.sync flash kernel."""
    if not on_tensor_cores(a):
        return simt_kernel(fused, ctx, a)
    if ctx.tuning.get("path") == "wgmma" or (not ctx.tuning and wgmma_supported(a, ctx.arch)):
        return wgmma_attention_kernel(fused, ctx, a)
    return flash_kernel(fused, ctx, a, config(a, ctx.tuning))


def _ragged_program(fused: FusedNode, ctx: EmitContext, a: Attention) -> FusedProgram:
    """Packed sequences: the Hopper kernel where it applies (one block per work item), else the
    flash kernel (fp16/bf16) or the SIMT one, after the fill of packed outputs
    (attention_ragged.py). The decode kernel addresses a dense batch."""
    path = ctx.tuning.get("path")
    if path in (DECODE, MMA_PATH) or (a.paged and not on_tensor_cores(a)):
        raise UnsupportedError(
            f"attention tuning {dict(ctx.tuning)}: packed (ragged) sequences run on the Hopper, the mma.sync flash "
            "(all fp16 or all bf16; with a paged KV cache only there) or the SIMT kernel",
            node=a.node.name,
        )
    packed = [(t, value) for t, value in ((a.o, "0.0f"), (a.stats, NEG_INF)) if t is not None]
    fill = (fill_kernel(fused, ctx, packed),) if a.ragged_q is not None and packed else ()
    return FusedProgram(fused.name, (*fill, _attention_kernel(fused, ctx, a)))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """The decode kernel's threads, key slots and KV splits where it applies; warps per block
    and keys per tile of the flash kernel, keys per stage and turn-taking of the Hopper one
    (autotuning)."""
    a = attention_of(fused)
    if a.ragged:
        hopper = [c.choice() for c in wgmma_configs(a)] if wgmma_supported(a, arch) else []
        return flash_candidates(a) + hopper if on_tensor_cores(a) else []
    decode: list[dict[str, object]] = []
    if a.paged or uses_decode(a):  # the default's kernel first
        cuda, mma = decode_choices(a, arch), mma_choices(a, arch)
        decode = mma + cuda if uses_decode(a) and by_default(a, arch) else cuda + mma
    if not on_tensor_cores(a) or (a.paged and uses_decode(a)):  # paged decode: the decode kernel's choices
        return decode
    return decode + flash_candidates(a) + ([c.choice() for c in wgmma_configs(a)] if wgmma_supported(a, arch) else [])


def extents_refusal(fused: FusedNode) -> str | None:
    """Why the attention kernels cannot take ``fused``'s symbols, None when they can. They take
    the batch (dim 0 of every tensor but a paged pool, with static strides: the batch outermost
    in memory) and the sequence lengths Sq and Skv (dim 2 of Q / O / STATS and of K / V, and the
    strides that hold them) as runtime extents; heads and head dims (static by validation) and a
    paged pool's pages size the tiles and addresses. Packed (ragged) sequences and dropout take
    no runtime extents, a paged cache and the decode kernel's packed query rows no symbolic
    lengths, and the decode kernels not a batch and lengths both symbolic (their KV split is
    chosen per range of one of them)."""
    a = attention_of(fused)
    tensors = (*fused.inputs, *fused.outputs)
    batch = symbols_of([a.batch_extent])
    lengths = symbols_of([a.sq_extent, a.skv_extent])
    stray = [s for s in symbols_of(v for t in tensors for v in t.dim) if s not in (*batch, *lengths)]
    if stray:
        return (
            f"has symbolic dims other than the batch and the sequence lengths ({show_ranges(stray)}); attention "
            "kernels take the batch (dim 0) and the sequence lengths (dim 2 of Q and of K and V) as runtime extents "
            "only"
        )
    in_strides = [s for s in symbols_of(v for t in tensors for v in t.stride) if s in batch]
    if in_strides:
        return (
            f"has the symbolic batch inside its strides ({show_ranges(in_strides)}); attention kernels take the batch "
            "(dim 0) as a runtime extent with static strides: keep the batch outermost in memory, as [B, H, S, D] "
            "and [B, S, H, D] layouts do"
        )
    symbols = show_ranges((*batch, *lengths))
    if a.ragged or a.dropout is not None:
        what = "packed (ragged) sequences" if a.ragged else "dropout"
        return f"has symbolic dims ({symbols}) with {what}; those attention kernels take no runtime extents yet"
    if not lengths:
        return None
    if a.paged:
        return (
            f"has symbolic sequence lengths ({symbols}) with a paged KV cache; paged attention takes the batch as "
            "a runtime extent, and its key length from the page tables and paged_attention_max_seq_len_kv"
        )
    if isinstance(a.sq_extent, Sym) and uses_decode(a):
        return (
            f"has a symbolic Sq ({show_ranges(symbols_of([a.sq_extent]))}) of at most {DECODE_MAX_SQ} query rows, "
            "which take the decode kernel; its blocks pack the query rows of a kv head at compile time (give Sq a "
            f"static size, or a range reaching past {DECODE_MAX_SQ} for the flash kernels)"
        )
    if batch and uses_decode(a):
        return (
            f"has a symbolic batch and symbolic sequence lengths ({symbols}) on the decode kernels, whose KV split "
            "depends on both (a variant per range of one of them); give the batch or Skv a static size"
        )
    return None


DECODE = "decode"
DECODE_BUCKETS = 16  # GQA 4 over 4096 keys, batch 1..256 on sm_90: 9 (splits 16, 11, 8, 6, 5, 4, 3, 2, 1)
