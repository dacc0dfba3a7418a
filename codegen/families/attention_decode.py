"""Attention decode: few query rows per sequence (decode, speculative tokens, small prefill
chunks) over a long KV length, dense or through a paged KV cache, with split-KV.

Memory-bound: each key and value row is read once per (batch, kv head). Two tricks make it so:
- pack GQA (FlashDecoding++, FlashAttention's "pack GQA"): a block takes the ``GROUP * SQ``
  query rows that share a kv head (up to ROWS_PER_BLOCK at once, more row groups beyond), so a
  K/V row read from memory serves every query head of its group;
- split-KV (flash-decoding): when ``B * Hk * row groups`` blocks cannot fill the GPU, each
  block takes one of ``split`` contiguous slices of the visible keys and writes its rows'
  partial O (normalised) and log-sum-exp (base 2) to scratch; a combine kernel weighs the
  slices in slice order (deterministic) into O and STATS. With ``split`` 1 the block writes O
  and STATS itself and there is no scratch.

Inside a block, groups of ``L`` lanes each own one key at a time: a lane holds one 16-byte
vector (``VK`` / ``VV`` elements, ``CK`` / ``CV`` of them) of the key's K and V rows, the dot
products with the block's query rows (in shared memory, fp32) are summed over the L lanes,
and each group keeps its own online softmax (running maximum, sum and O slice, base 2) over
the keys it saw; the groups are merged through shared memory at the end. Any float input
type, any strides (element loads where a row is not 16-byte vectors or a pointer is not
16-byte aligned), every mask, bias and ALiBi. CUDA cores only: at a few rows per key the
arithmetic is a few FLOPs per byte, under what the SMs issue while HBM streams.

Key j of sequence b lives, dense, at K[b, hk, j]; paged, at K[page, hk, j % page_size] with
page = PAGE_TABLE_K[b, 0, j / page_size, 0] (V through its own table and page size).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load
from ..kernel import FusedProgram, Kernel, Scratch
from .attention_problem import (
    Attention,
    alibi_table,
    declare,
    element,
    o_store,
    score_function,
    sequence_setup,
    stats_store,
    strides,
)

DECODE_MAX_SQ = 4  # dense attention with at most this many query rows takes the decode kernel
THREADS = 128
KEYS_PER_LANE = 4  # keys each lane group loads before computing: K/V loads in flight per lane
ROWS_PER_BLOCK = 16
MAX_ROW_REGISTERS = 64  # fp32 O values a thread holds (its rows times its V columns)
MAX_SHARED = 46 * 1024  # static shared memory, under the 48 KiB every block may take
MAX_SPLIT = 64
MIN_KEYS_PER_SPLIT = 256  # a slice at least this long, to pay for its partial O and the combine
PARTIAL_O, PARTIAL_LSE = "partial_o", "partial_lse"
COMBINE_THREADS = 128


@dataclass(frozen=True)
class DecodeShape:
    """How a block's threads cover the head dims and rows."""

    lanes: int  # L: lanes per key
    vk: int  # K elements per 16-byte vector
    vv: int
    ck: int  # K vectors per lane
    cv: int
    rows_per_block: int
    row_groups: int

    @property
    def key_groups(self) -> int:
        return THREADS // self.lanes

    def shared_bytes(self) -> int:
        dkp, dvp = self.lanes * self.vk * self.ck, self.lanes * self.vv * self.cv
        return 4 * self.rows_per_block * (dkp + self.key_groups * (dvp + 2))


def shape(a: Attention) -> DecodeShape:
    """Lanes per key covering the wider head dim in 16-byte vectors (a power of two, at most a
    warp); as many packed rows per block as the O registers and static shared memory allow."""
    vk, vv = 16 // a.k.data_type.itemsize, 16 // a.v.data_type.itemsize
    vectors = max(-(-a.d // vk), -(-a.dv // vv))
    lanes = min(32, 1 << (vectors - 1).bit_length())
    ck, cv = -(-a.d // (lanes * vk)), -(-a.dv // (lanes * vv))
    rows = a.heads // a.kv_heads * a.sq
    per_block = max(1, min(rows, ROWS_PER_BLOCK, MAX_ROW_REGISTERS // (cv * vv)))
    while per_block > 1 and DecodeShape(lanes, vk, vv, ck, cv, per_block, 1).shared_bytes() > MAX_SHARED:
        per_block -= 1
    return DecodeShape(lanes, vk, vv, ck, cv, per_block, -(-rows // per_block))


def uses_decode(a: Attention) -> bool:
    """The decode kernel's problems when nothing is tuned: every paged one, and few query rows."""
    return a.paged or a.sq <= DECODE_MAX_SQ


def heuristic_split(a: Attention, arch: int) -> int:
    """KV slices when nothing is tuned: 1 once ``B * Hk * row groups`` blocks fill the SMs of
    sm_``arch`` twice over (two resident blocks per SM keep enough loads in flight); else
    enough slices for that, each keeping MIN_KEYS_PER_SPLIT keys of Skv, at most MAX_SPLIT."""
    blocks = a.batch * a.kv_heads * shape(a).row_groups
    target = 2 * sm_count(arch)
    if blocks >= target:
        return 1
    return max(1, min(-(-target // blocks), a.skv // MIN_KEYS_PER_SPLIT, MAX_SPLIT))


def split_choices(a: Attention, arch: int) -> list[int]:
    """The splits autotuning times: none (1), the heuristic's, half and twice it."""
    best = heuristic_split(a, arch)
    return sorted({s for s in (1, best // 2, best, 2 * best) if 1 <= s <= min(MAX_SPLIT, a.skv)})


def tuned_split(a: Attention, ctx: EmitContext) -> int:
    split = ctx.tuning.get("split")
    if split is None:
        return heuristic_split(a, ctx.arch)
    if not isinstance(split, int) or isinstance(split, bool) or not 1 <= split <= MAX_SPLIT:
        raise UnsupportedError(f"attention tuning {dict(ctx.tuning)}: split must be an integer from 1 to {MAX_SPLIT}")
    return split


def decode_program(fused: FusedNode, ctx: EmitContext, a: Attention) -> FusedProgram:
    split = tuned_split(a, ctx)
    s = shape(a)
    kernel = _decode_kernel(fused, ctx, a, s, split)
    if split == 1:
        return FusedProgram(fused.name, (kernel,))
    rows = a.batch * a.heads * a.sq * split
    scratch = (Scratch(PARTIAL_O, 4 * rows * a.dv), Scratch(PARTIAL_LSE, 4 * rows))
    return FusedProgram(fused.name, (kernel, _combine_kernel(fused, ctx, a, split)), scratch)


def vectorizable(tensor: Tensor, vector: int) -> bool:
    """Rows of ``tensor`` ([b or page, h, s, d]) load as 16-byte vectors (given aligned pointers)."""
    if tensor.stride[3] != 1 or tensor.dim[3] % vector:
        return False
    return all(stride % vector == 0 for d, stride in zip(tensor.dim[:3], tensor.stride[:3]) if d != 1)


def _decode_kernel(fused: FusedNode, ctx: EmitContext, a: Attention, s: DecodeShape, split: int) -> Kernel:
    declared = declare(a)
    names, params = declared.names, declared.params
    if split > 1:
        params.scratch(PARTIAL_O, "float")
        params.scratch(PARTIAL_LSE, "float")
    vector = vectorizable(a.k, s.vk) and vectorizable(a.v, s.vv)
    aligned = params.aligned_flag() if vector else "false"
    body = [
        f"using TK = {cuda_type(a.k.data_type)};",
        f"using TV = {cuda_type(a.v.data_type)};",
        f"constexpr int THREADS = {THREADS}, L = {s.lanes}, KEY_GROUPS = THREADS / L, KT = {KEYS_PER_LANE};",
        f"constexpr int VK = {s.vk}, VV = {s.vv}, CK = {s.ck}, CV = {s.cv}, DKP = L * VK * CK, DVP = L * VV * CV;",
        f"constexpr int HQ = {a.heads}, HK = {a.kv_heads}, GROUP = HQ / HK, SQ = {a.sq}, SKV = {a.skv};",
        f"constexpr int D = {a.d}, DV = {a.dv}, ROWS = GROUP * SQ, RB = {s.rows_per_block};",
        f"constexpr int ROW_GROUPS = {s.row_groups}, SPLIT = {split};",
        f"constexpr long long KS[4] = {{{strides(a.k)}}}, VS[4] = {{{strides(a.v)}}};",
        "const float NEG_INF = __uint_as_float(0xff800000u);",
        "const int split = (int)(blockIdx.x % SPLIT);",
        "const int rg = (int)(blockIdx.x / SPLIT % ROW_GROUPS), hk = (int)(blockIdx.x / SPLIT / ROW_GROUPS % HK);",
        "const int b = (int)(blockIdx.x / SPLIT / ROW_GROUPS / HK);",
        "const int r0 = rg * RB;  // packed row r is query head hk * GROUP + r / SQ, row r % SQ",
        *sequence_setup(a, names),
        *alibi_table(a),
        *_key_range(a),
        *_rows_to_shared(a, names),
        "const int tid = threadIdx.x, grp = tid / L, sub = tid % L;",
        *_key_loader(a, names, vector, aligned),
        "float m[RB], l[RB], o[RB][CV * VV];",
        "#pragma unroll",
        "for (int r = 0; r < RB; ++r) {",
        "  m[r] = NEG_INF;",
        "  l[r] = 0.0f;",
        "#pragma unroll",
        "  for (int c = 0; c < CV * VV; ++c) o[r][c] = 0.0f;",
        "}",
        "// the same trip count on every thread: lanes of a group sum their dots with shuffles",
        "for (int base = s_begin; base < s_end; base += KEY_GROUPS * KT) {",
        "  float kf[KT][CK * VK], vf[KT][CV * VV];",
        "#pragma unroll",
        "  for (int t = 0; t < KT; ++t) load_key(base + t * KEY_GROUPS + grp, kf[t], vf[t]);",
        "  float s[KT][RB];",
        "#pragma unroll",
        "  for (int t = 0; t < KT; ++t)",
        "#pragma unroll",
        "    for (int r = 0; r < RB; ++r) {",
        "      float dot = 0.0f;",
        "#pragma unroll",
        "      for (int c = 0; c < CK; ++c)",
        "#pragma unroll",
        "        for (int e = 0; e < VK; ++e) dot += q_s[r][(c * L + sub) * VK + e] * kf[t][c * VK + e];",
        "      s[t][r] = gd::lanes_sum<L>(dot);",
        "    }",
        "#pragma unroll",
        "  for (int r = 0; r < RB; ++r) {",
        "    const int i = (r0 + r) % SQ, h = hk * GROUP + (r0 + r) / SQ;",
        *indent(_slope(a), 2).splitlines(),
        *indent(score_function(a, names), 2).splitlines(),
        "    float mx = m[r];",
        "#pragma unroll",
        "    for (int t = 0; t < KT; ++t) {",
        "      const int j = base + t * KEY_GROUPS + grp;",
        "      s[t][r] = r0 + r < ROWS && j < s_end ? score(s[t][r], i, j, true) : NEG_INF;",
        "      mx = fmaxf(mx, s[t][r]);",
        "    }",
        "    const float top = mx == NEG_INF ? 0.0f : mx;  // nothing visible yet: stay at 0",
        "    const float correction = exp2f(m[r] - top);",
        "    m[r] = mx;",
        "    l[r] *= correction;",
        "#pragma unroll",
        "    for (int c = 0; c < CV * VV; ++c) o[r][c] *= correction;",
        "#pragma unroll",
        "    for (int t = 0; t < KT; ++t) {",
        "      const float p = exp2f(s[t][r] - top);",
        "      l[r] += p;",
        "#pragma unroll",
        "      for (int c = 0; c < CV * VV; ++c) o[r][c] += p * vf[t][c];",
        "    }",
        "  }",
        "}",
        *_merge(a, names, split),
    ]
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_decode", params, THREADS, indent(body, 1))
    grid = a.batch * a.kv_heads * s.row_groups * split
    return Kernel(name, source, (grid, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))


def _key_range(a: Attention) -> list[str]:
    """``s_begin`` / ``s_end``: this split's slice of the keys any row of the block sees."""
    lines = [
        "int i_lo = SQ, i_hi = -1;  // the block's rows inside the sequence",
        "for (int r = r0; r < min(ROWS, r0 + RB); ++r)",
        "  if (r % SQ < sq) {",
        "    i_lo = min(i_lo, r % SQ);",
        "    i_hi = max(i_hi, r % SQ);",
        "  }",
        "int kv_begin = 0, kv_end = i_hi < 0 ? 0 : skv;",
    ]
    if a.causal:
        lines.append("kv_end = max(0, min(kv_end, i_hi + diag + 1));")
    if a.window:
        lines.append(f"kv_begin = min(kv_end, max(0, i_lo + diag - {a.window - 1}));")
    lines += [
        "const int per_split = (kv_end - kv_begin + SPLIT - 1) / SPLIT;",
        "const int s_begin = min(kv_end, kv_begin + split * per_split), s_end = min(kv_end, s_begin + per_split);",
    ]
    return lines


def _rows_to_shared(a: Attention, names: dict[str, str]) -> list[str]:
    """The block's query rows as floats, zero past D and past the last packed row."""
    q = load(a.q.data_type, element(a.q, names["Q"], ["b", "hk * GROUP + rr / SQ", "rr % SQ", "d"]), "float")
    return [
        "__shared__ float q_s[RB][DKP];",
        "for (int e = threadIdx.x; e < RB * DKP; e += THREADS) {",
        "  const int rr = r0 + e / DKP, d = e % DKP;",
        f"  q_s[e / DKP][d] = rr < ROWS && d < D ? {q} : 0.0f;",
        "}",
        "__syncthreads();",
    ]


def _row_address(a: Attention, names: dict[str, str], role: str) -> str:
    """The first element of key ``j``'s row of K or V (head ``hk``), dense or through its page table."""
    tensor, stride = (a.k, "KS") if role == "K" else (a.v, "VS")
    if not a.paged:
        return f"{names[role]} + (long long)b * {stride}[0] + (long long)hk * {stride}[1] + (long long)j * {stride}[2]"
    table = a.page_table_k if role == "K" else a.page_table_v
    assert table is not None
    page_size = tensor.static_dim[2]
    page = load(
        table.data_type, element(table, names[f"PAGE_TABLE_{role}"], ["b", "0", f"j / {page_size}", "0"]), "long long"
    )
    return f"{names[role]} + {page} * {stride}[0] + (long long)hk * {stride}[1] + (long long)(j % {page_size}) * {stride}[2]"


def _key_loader(a: Attention, names: dict[str, str], vector: bool, aligned: str) -> list[str]:
    """``load_key(j, kf, vf)``: this lane's vectors of key j's K and V rows as floats (zero for a
    key past the slice, which reads nothing: its page table entry may be anything)."""

    def chunks(role: str, t: str, width: str, vec: str, count: str, out: str) -> list[str]:
        stride = "KS" if role == "K" else "VS"
        lines = [
            "#pragma unroll",
            f"  for (int c = 0; c < {count}; ++c) {{",
            f"    const int col0 = (c * L + sub) * {vec};",
        ]
        if vector:
            lines += [
                f"    if ({aligned} && col0 < {width}) {{",
                f"      const gd::Vec<{t}, {vec}> x = gd::load_vec<{t}, {vec}>(row_{role.lower()} + col0);",
                "#pragma unroll",
                f"      for (int e = 0; e < {vec}; ++e) {out}[c * {vec} + e] = gd::element<float>(x, e);",
                "      continue;",
                "    }",
            ]
        lines += [
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e)",
            f"      {out}[c * {vec} + e] = col0 + e < {width} ? gd::to<float>(row_{role.lower()}[(col0 + e) * {stride}[3]]) : 0.0f;",
            "  }",
        ]
        return lines

    return [
        "auto load_key = [&](int j, float* kf, float* vf) {",
        "  if (j >= s_end) {",
        "    for (int c = 0; c < CK * VK; ++c) kf[c] = 0.0f;",
        "    for (int c = 0; c < CV * VV; ++c) vf[c] = 0.0f;",
        "    return;",
        "  }",
        f"  const TK* const row_k = {_row_address(a, names, 'K')};",
        f"  const TV* const row_v = {_row_address(a, names, 'V')};",
        *chunks("K", "TK", "D", "VK", "CK", "kf"),
        *chunks("V", "TV", "DV", "VV", "CV", "vf"),
        "};",
    ]


def _slope(a: Attention) -> list[str]:
    return ["const float slope = SLOPES[h];"] if a.attrs.use_alibi_mask else []


def _merge(a: Attention, names: dict[str, str], split: int) -> list[str]:
    """The key groups' softmax states merged per row (in group order), then O and STATS, or
    with split-KV the slice's normalised O and log-sum-exp (base 2) into scratch."""
    lines = [
        "__shared__ float red_m[KEY_GROUPS][RB], red_l[KEY_GROUPS][RB], red_o[KEY_GROUPS][RB][DVP];",
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


def _combine_kernel(fused: FusedNode, ctx: EmitContext, a: Attention, split: int) -> Kernel:
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
    grid = a.batch * a.heads * a.sq
    return Kernel(name, source, (grid, 1, 1), (COMBINE_THREADS, 1, 1), 0, tuple(params.bindings))
