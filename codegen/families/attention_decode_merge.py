"""How the decode kernel's key groups end: their softmax states merged per row into O and the
statistics, or with split-KV into each slice's partial O and log-sum-exp, which the combine
kernel (one block per row) weighs into O in slice order."""

from __future__ import annotations

from fusion_rules import FusedNode

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..kernel import Kernel
from .attention_extents import batch_grid
from .attention_problem import Attention, declare, o_store, stats_store

PARTIAL_O, PARTIAL_LSE = "partial_o", "partial_lse"
COMBINE_THREADS = 128


def merge(a: Attention, names: dict[str, str], split: int, stages: int) -> list[str]:
    """The key groups' softmax states merged per row (in group order), then O and STATS, or
    with split-KV the slice's normalised O and log-sum-exp (base 2) into scratch. With a ring,
    the states go into its memory once every thread is past its last read (and copy)."""
    buffers = [
        "__shared__ float red_m[KEY_GROUPS][RB], red_l[KEY_GROUPS][RB], red_o[KEY_GROUPS][RB][DVP];",
    ]
    if stages:
        buffers = [
            'asm volatile("cp.async.wait_group 0;\\n" ::);',
            "__syncthreads();  // the ring is free: it holds the merge",
            "auto& red_m = *reinterpret_cast<float(*)[KEY_GROUPS][RB]>(ring);",
            "auto& red_l = *reinterpret_cast<float(*)[KEY_GROUPS][RB]>(ring + KEY_GROUPS * RB * 4);",
            "auto& red_o = *reinterpret_cast<float(*)[KEY_GROUPS][RB][DVP]>(ring + 2 * KEY_GROUPS * RB * 4);",
        ]
    return [
        *buffers,
        "#pragma unroll",
        "for (int r = 0; r < RB; ++r) {",
        "  if (sub == 0) {",
        "    red_m[grp][r] = m[r];",
        "    red_l[grp][r] = l[r];",
        "  }",
        "#pragma unroll",
        "  for (int c = 0; c < CV; ++c)",
        "#pragma unroll",
        "    for (int e = 0; e < VV; ++e) red_o[grp][r][(c * L + sub) * VV + e] = o[r][c * VV + e];",
        "}",
        "__syncthreads();",
        *merge_rows(a, names, split),
    ]


def merge_rows(a: Attention, names: dict[str, str], split: int) -> list[str]:
    """Once every key group's state (``red_m``, ``red_l``, ``red_o`` in shared memory) is
    written: each row's states weighed by 2^(m - max), in group order, into O and STATS, or
    with split-KV into the slice's normalised O and log-sum-exp (base 2)."""
    lines = [
        "for (int e = tid; e < RB * DV; e += THREADS) {",
        "  const int r = e / DV, col = e % DV;",
        "  if (r0 + r >= ROWS) continue;",
        "  const int i = (r0 + r) % SQ, h = hk * GROUP + (r0 + r) / SQ;",
        "  float top = NEG_INF;",
        "  for (int g = 0; g < KEY_GROUPS; ++g) top = fmaxf(top, red_m[g][r]);",
        "  if (top == NEG_INF) top = 0.0f;",
        "  float sum = 0.0f, acc = 0.0f;",
        "  for (int g = 0; g < KEY_GROUPS; ++g) {",
        "    const float w = exp2f(red_m[g][r] - top);",
        "    sum += w * red_l[g][r];",
        "    acc += w * red_o[g][r][col];",
        "  }",
        "  const bool live = i < sq && sum > 0.0f;",
    ]
    if split == 1:
        lines.append("  " + o_store(a, names, "i", "col", "live ? acc / sum : 0.0f"))
        lines += ["  if (col == 0) " + line for line in stats_store(a, names, "i", "live ? top + log2f(sum) : NEG_INF")]
    else:
        lines += [
            "  const long long slot = (((long long)b * HQ + h) * SQ + i) * SPLIT + split;",
            f"  {PARTIAL_O}[slot * DV + col] = live ? acc / sum : 0.0f;",
            f"  if (col == 0) {PARTIAL_LSE}[slot] = live ? top + log2f(sum) : NEG_INF;",
        ]
    lines.append("}")
    return lines


def combine_kernel(fused: FusedNode, ctx: EmitContext, a: Attention, split: int) -> Kernel:
    """One block per (b, h, row): the slices' O weighted by 2^(lse - max), in slice order."""
    declared = declare(a)
    names, params = declared.names, declared.params
    params.scratch(PARTIAL_O, "const float")
    params.scratch(PARTIAL_LSE, "const float")
    body = [
        f"constexpr int THREADS = {COMBINE_THREADS}, HQ = {a.heads}, SQ = {a.sq}, DV = {a.dv}, SPLIT = {split};",
        "const float NEG_INF = __uint_as_float(0xff800000u);",
        "const int i = (int)(blockIdx.x % SQ), h = (int)(blockIdx.x / SQ % HQ), b = (int)(blockIdx.x / SQ / HQ);",
        "const long long slot = (long long)blockIdx.x * SPLIT;",
        "float top = NEG_INF;",
        f"for (int s = 0; s < SPLIT; ++s) top = fmaxf(top, {PARTIAL_LSE}[slot + s]);",
        "if (top == NEG_INF) top = 0.0f;",
        "float total = 0.0f;",
        f"for (int s = 0; s < SPLIT; ++s) total += exp2f({PARTIAL_LSE}[slot + s] - top);",
        "const float inv = total > 0.0f ? 1.0f / total : 0.0f;",
        "for (int col = threadIdx.x; col < DV; col += THREADS) {",
        "  float acc = 0.0f;",
        f"  for (int s = 0; s < SPLIT; ++s) acc += exp2f({PARTIAL_LSE}[slot + s] - top) * {PARTIAL_O}[(slot + s) * DV + col];",
        "  " + o_store(a, names, "i", "col", "acc * inv"),
        "}",
        *(
            "if (threadIdx.x == 0) " + line
            for line in stats_store(a, names, "i", "total > 0.0f ? top + log2f(total) : NEG_INF")
        ),
    ]
    name, source = kernel_source(
        ctx, fused, pattern_name(fused) + "_decode_combine", params, COMBINE_THREADS, indent(body, 1)
    )
    grid = (a.batch * a.heads * a.sq, 1, 1)
    blocks = batch_grid(a, a.heads * a.sq)
    return Kernel(name, source, grid, (COMBINE_THREADS, 1, 1), 0, tuple(params.bindings), blocks=blocks)
