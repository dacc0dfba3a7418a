"""Attention decode on the tensor cores (tuning path ``decode_mma``): the decode kernel's problem
(few query rows, a long dense or paged KV, split-KV) with the q·k dots and P·V on mma.sync
m16n8k16, fp32 accumulation.

Why: the CUDA-core decode kernel (attention_decode.py) spends ~2,000 lane-ops per key (the
FMAs of 4 rows x 128 dims for K and V, conversions, the dots' shuffle sums, the softmax every
lane of a key repeats) and is issue-bound at 29-76% of the HBM roofline (benchmarks/RESULTS.md,
Session 8). Here a warp takes 16 keys as the mma's M and the block's (up to) 8 packed query rows
as its N: S^T = K·Q^T is D/16 mmas per 16 keys, and O^T += V^T·P^T DV/16 more, ~6 warp
instructions per key in all. Measured on an H200 (benchmarks/RESULTS.md, issue 10): 31-91% of
the roofline where the CUDA-core kernel reaches 29-76%, 0.86-0.91x torch SDPA.

Fragments (m16n8k16, g = lane / 4, c = lane % 4):
- S^T: A = the K tile [key][d] (ldmatrix from shared memory), B = Q^T, whose fragment is
  Q[row g][d 2c, 2c+1 (+8)] (registers, loaded once); the accumulator holds S at (key g or
  g + 8, rows 2c and 2c + 1), so each thread keeps the softmax state of rows 2c and 2c + 1,
  reduced over the 8 lanes that share c (shuffles by 4, 8, 16);
- O^T: A = V^T, ldmatrix.trans of the V tile [key][dv]; B = P^T, whose fragment is (keys
  2c, 2c+1 (+8), row g): the transpose of the S accumulator's pairs, one movmatrix per 8x8
  (keys 0-7 and 8-15); the accumulator holds O at (dv g or g + 8, rows 2c and 2c + 1), the
  same rows as the softmax state.

Each warp has its own ring of ``stages`` batches of ``tiles`` 16-key tiles of K and V in
shared memory, fed by cp.async (a warp's copy covers whole rows; pages read a batch ahead, one
per tile where pages hold a multiple of 16 keys); rows are padded by 16 bytes, which makes
ldmatrix conflict-free. The warps of a
block take consecutive batches of its slice, then merge their states through shared memory
(attention_decode_merge.merge_rows), into O or, split, the partials of the combine kernel.

Takes K and V of fp16 or bf16 with Q of K's type, head dims multiples of 16 up to 256, any
GQA group (8 packed rows per block; more rows are more row groups, each reading K and V
again), every mask, bias and ALiBi; not dropout, and sm_80 or newer. The CUDA-core kernel
takes the rest (fp32 or mixed types, other head dims, dropout, sm < 80).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load
from ..kernel import FusedProgram, Kernel, Scratch
from .attention_decode import (
    MAX_SPLIT,
    MIN_KEYS_PER_SPLIT,
    SM_SHARED,
    SM_THREADS,
    block_work,
    rows_vectorize,
    tuning_integer,
)
from .attention_decode_merge import PARTIAL_LSE, PARTIAL_O, combine_kernel, merge_rows
from .attention_extents import batch_grid
from .attention_flash import pack_function
from .attention_problem import (
    Attention,
    declare,
    element,
    int_constants,
    key_row_address,
    page_of,
    score_function,
    stride_arrays,
)
from .attention_rotary import decode_k_rotation, rotated_load
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .tensor_core import TENSOR_CORE_TYPES, mma_fragments

MMA_PATH = "decode_mma"
WARPS_CHOICES = (2, 4, 8)
TILES_CHOICES = (1, 2)  # 16-key tiles per warp and batch
STAGES_CHOICES = (2, 3, 4)  # batches in each warp's ring
# the default: the first (warps, tiles, stages) whose shared memory fits two blocks per SM.
# Measured on an H200 (2026-11-28, the six decode shapes, GQA 4, D 128): 4/1/3 and 4/1/2 within
# 3% of each other everywhere; 2 warps of 2 tiles 4-46% slower; twice the split from 0.5% faster
# (B 8, Skv 32k) to 17% slower (B 1, Skv 8k)
DEFAULTS = ((4, 1, 3), (4, 1, 2), (2, 1, 3), (2, 1, 2))
ROWS_PER_BLOCK = 8  # the mma's N: packed query rows per block
MAX_SHARED = SM_SHARED // 2  # a block's ring: two blocks per SM
MAX_HEAD_DIM = 256
TUNING_KEYS = frozenset({"path", "warps", "tiles", "stages", "split"})

# 8x8 transpose of 16-bit pairs across a warp (sm_75+): the S accumulator's pairs to P^T's B fragment
TRANSPOSE = r"""
// An 8x8 matrix of 16-bit values, row lane / 4, columns 2 (lane % 4) and +1 in each lane,
// transposed across the warp.
__device__ __forceinline__ unsigned transpose8x8(unsigned x) {
  unsigned y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
"""


@dataclass(frozen=True)
class MmaDecodeConfig:
    """A launch: warps per block, 16-key tiles per warp and batch, batches in each warp's ring,
    KV slices."""

    warps: int
    tiles: int
    stages: int
    split: int

    def choice(self) -> dict[str, object]:
        return {"path": MMA_PATH, "warps": self.warps, "tiles": self.tiles, "stages": self.stages, "split": self.split}


def unsupported(a: Attention, arch: int) -> str | None:
    """Why the tensor-core decode kernel cannot take ``a`` on sm_``arch`` (None: it can)."""
    if arch < 80:
        return f"it needs sm_80 or newer (sm_{arch})"
    if a.k.data_type not in TENSOR_CORE_TYPES or a.v.data_type not in TENSOR_CORE_TYPES:
        return f"K and V must be fp16 or bf16 (K {a.k.data_type.value}, V {a.v.data_type.value})"
    if a.q.data_type is not a.k.data_type or a.v.data_type is not a.k.data_type:
        types = f"Q {a.q.data_type.value}, K {a.k.data_type.value}, V {a.v.data_type.value}"
        return f"Q, K and V must have one type ({types})"
    if a.d % 16 or a.dv % 16 or max(a.d, a.dv) > MAX_HEAD_DIM:
        return f"head dims must be multiples of 16 up to {MAX_HEAD_DIM} (D {a.d}, DV {a.dv})"
    if a.dropout is not None:
        return "it takes no dropout"
    if a.ragged:
        return "it takes no packed (ragged) sequences"
    return None


def row_groups(a: Attention) -> int:
    return -(-(a.heads // a.kv_heads * a.sq) // ROWS_PER_BLOCK)


def ring_bytes(a: Attention, warps: int, tiles: int, stages: int) -> int:
    """Every warp's ring: ``stages`` batches of ``tiles`` 16-key tiles of K and V rows, padded."""
    return warps * stages * tiles * 16 * (a.d + 8 + a.dv + 8) * 2


def shared_bytes(a: Attention, warps: int, tiles: int, stages: int) -> int:
    """The rings, or the warps' softmax states the merge reuses them for."""
    merge = warps * ROWS_PER_BLOCK * (a.dv + 2) * 4
    return max(ring_bytes(a, warps, tiles, stages), merge)


def fits(a: Attention, warps: int, tiles: int, stages: int) -> bool:
    return shared_bytes(a, warps, tiles, stages) <= MAX_SHARED


def heuristic_split(a: Attention, arch: int, warps: int, tiles: int, stages: int) -> int:
    """KV slices when the tuning names none: as many as fill the blocks that fit each SM (by
    threads and shared memory; rounded down: no second, nearly empty wave), each of at least
    MIN_KEYS_PER_SPLIT keys and ``stages`` batches, at most MAX_SPLIT; 1 once ``B * Hk * row
    groups`` blocks fill the GPU. B 1, Hk 8, Skv 32k, D 128, 4 warps of 3 stages: 2 blocks per
    SM, split 33 on an H100."""
    blocks = a.batch * a.kv_heads * row_groups(a)
    per_sm = min(SM_THREADS // (32 * warps), SM_SHARED // shared_bytes(a, warps, tiles, stages))
    target = max(1, per_sm) * sm_count(arch)
    if blocks >= target:
        return 1
    min_keys = max(MIN_KEYS_PER_SPLIT, stages * warps * tiles * 16)
    return max(1, min(target // blocks, a.skv // min_keys, MAX_SPLIT))


def default_config(a: Attention, arch: int) -> MmaDecodeConfig:
    warps, tiles, stages = next((c for c in DEFAULTS if fits(a, *c)), DEFAULTS[-1])
    return MmaDecodeConfig(warps, tiles, stages, heuristic_split(a, arch, warps, tiles, stages))


def mma_choices(a: Attention, arch: int) -> list[dict[str, object]]:
    """What autotuning times where the kernel applies (the default first): each warps, tiles
    and stages that fit, at the heuristic's split and twice it (at most 36 choices)."""
    if unsupported(a, arch):
        return []
    configs = [default_config(a, arch)]
    for warps in WARPS_CHOICES:
        for tiles in TILES_CHOICES:
            for stages in STAGES_CHOICES:
                if fits(a, warps, tiles, stages):
                    best = heuristic_split(a, arch, warps, tiles, stages)
                    configs += [
                        MmaDecodeConfig(warps, tiles, stages, s) for s in (best, 2 * best) if s <= min(MAX_SPLIT, a.skv)
                    ]
    return [c.choice() for c in dict.fromkeys(configs)]


def tuned_config(a: Attention, ctx: EmitContext) -> MmaDecodeConfig:
    """The tuning's choice, each key it leaves out from the default (the split from the
    heuristic for the rest); a clear error where the kernel cannot take the problem."""
    tuning = dict(ctx.tuning)
    reason = unsupported(a, ctx.arch)
    if reason:
        raise UnsupportedError(
            f"attention tuning {tuning}: the tensor-core decode kernel cannot run this node: {reason}"
        )
    unknown = sorted(set(tuning) - TUNING_KEYS)
    if unknown:
        raise UnsupportedError(
            f"attention tuning {tuning}: the tensor-core decode kernel has no choice {', '.join(unknown)}"
        )

    default = default_config(a, ctx.arch)
    warps = tuning_integer(tuning, "warps", WARPS_CHOICES, default.warps)
    tiles = tuning_integer(tuning, "tiles", TILES_CHOICES, default.tiles)
    stages = tuning_integer(tuning, "stages", STAGES_CHOICES, default.stages)
    if not fits(a, warps, tiles, stages):
        raise UnsupportedError(
            f"attention tuning {tuning}: {warps} warps of {stages} stages of {tiles} tiles take "
            f"{shared_bytes(a, warps, tiles, stages)} bytes of shared memory, over {MAX_SHARED}"
        )
    split = tuning_integer(tuning, "split", range(1, MAX_SPLIT + 1), heuristic_split(a, ctx.arch, warps, tiles, stages))
    return MmaDecodeConfig(warps, tiles, stages, split)


def mma_decode_program(fused: FusedNode, ctx: EmitContext, a: Attention, top_batch: int | None = None) -> FusedProgram:
    """The kernel (and with split-KV the combine and the partials, for a batch of up to
    ``top_batch``, by default the problem's)."""
    config = tuned_config(a, ctx)
    kernel = _kernel(fused, ctx, a, config)
    if config.split == 1:
        return FusedProgram(fused.name, (kernel,))
    rows = (top_batch or a.batch) * a.heads * a.sq * config.split
    scratch = (Scratch(PARTIAL_O, 4 * rows * a.dv), Scratch(PARTIAL_LSE, 4 * rows))
    return FusedProgram(fused.name, (kernel, combine_kernel(fused, ctx, a, config.split)), scratch)


def _kernel(fused: FusedNode, ctx: EmitContext, a: Attention, c: MmaDecodeConfig) -> Kernel:
    declared = declare(a)
    names, params = declared.names, declared.params
    if c.split > 1:
        params.scratch(PARTIAL_O, "float")
        params.scratch(PARTIAL_LSE, "float")
    vector = rows_vectorize(a)
    aligned = params.aligned_flag() if vector else "false"
    q = load(a.q.data_type, element(a.q, names["Q"], ["b", "hk * GROUP + rr / SQ", "rr % SQ", "d"]), "float")
    q_rotation = rotated_load(a, "q_value", "rr % SQ", q)  # RoPE as Q is read, where asked
    q = "q_value(rr, d)" if q_rotation else q
    groups = row_groups(a)
    body = [
        f"using TK = {cuda_type(a.k.data_type)};",
        f"using TV = {cuda_type(a.v.data_type)};",
        f"constexpr int WARPS = {c.warps}, THREADS = 32 * WARPS, TILES = {c.tiles}, STAGES = {c.stages};",
        "constexpr int KEYS = 16 * TILES, STEP = WARPS * KEYS;  // a warp's keys per batch, the block's",
        *int_constants(
            [("HQ", a.heads), ("HK", a.kv_heads), ("GROUP", "HQ / HK"), ("SQ", a.sq_extent), ("SKV", a.skv_extent)]
        ),
        f"constexpr int D = {a.d}, DV = {a.dv}, DVP = DV, ROWS = GROUP * SQ, RB = {ROWS_PER_BLOCK};",
        f"constexpr int ROW_GROUPS = {groups}, SPLIT = {c.split}, KEY_GROUPS = WARPS;",
        "constexpr int KROW = D + 8, VROW = DV + 8;  // shared rows padded by 16 bytes: conflict-free ldmatrix",
        "constexpr int KCH = D / 8, VCH = DV / 8;  // 16-byte chunks of a K and a V row",
        stride_arrays([("KS", a.k), ("VS", a.v)]),
        *block_work(a, names, 16),  # slices of whole 16-key tiles
        "const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, lr = lane / 4, lc = lane % 4;",
        "extern __shared__ __align__(128) unsigned char smem[];",
        "TK* const k_ring = reinterpret_cast<TK*>(smem) + warp * STAGES * KEYS * KROW;",
        "TV* const v_ring = reinterpret_cast<TV*>(smem + WARPS * STAGES * KEYS * KROW * sizeof(TK)) + warp * STAGES * KEYS * VROW;",
        *q_rotation,
        "// Q^T's B fragments: row lr of the block, dims 2 lc, +1 and 8 further of each 16",
        "unsigned qf[D / 16][2];",
        "{",
        "  const int rr = r0 + lr;",
        "#pragma unroll",
        "  for (int kk = 0; kk < D / 16; ++kk)",
        "#pragma unroll",
        "    for (int half = 0; half < 2; ++half) {",
        "      int d = kk * 16 + half * 8 + 2 * lc;",
        f"      const float x = rr < ROWS ? {q} : 0.0f;",
        "      ++d;",
        f"      const float y = rr < ROWS ? {q} : 0.0f;",
        "      qf[kk][half] = pack2(x, y);",
        "    }",
        "}",
        *_loaders(a, names, vector, aligned),
        "float m[2], l[2], o[DV / 16][4];  // rows 2 lc and 2 lc + 1; O^T at (dv lr or lr + 8, those rows)",
        "#pragma unroll",
        "for (int rr = 0; rr < 2; ++rr) {",
        "  m[rr] = NEG_INF;",
        "  l[rr] = 0.0f;  // this lane's part of the row sum, summed over the row's lanes at the end",
        "}",
        "#pragma unroll",
        "for (int dt = 0; dt < DV / 16; ++dt)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;",
        *_ring_fill(a),
        "// the same trip count on every warp (keys past the slice are zeros, masked)",
        "const int batches = (s_end - s_begin + STEP - 1) / STEP;",
        "for (int n = 0; n < batches; ++n) {",
        "  issue(n + STAGES - 1);",
        f'  asm volatile("cp.async.wait_group {c.stages - 1};\\n" ::);',
        "  __syncwarp();  // the batch's rows, copied by the warp's lanes",
        "  const int stage = n % STAGES, key0 = s_begin + n * STEP + warp * KEYS;",
        *indent(decode_k_rotation(a), 1).splitlines(),
        "  float s[TILES][4];  // S at (key lr or lr + 8 of tile t, rows 2 lc and 2 lc + 1)",
        "#pragma unroll",
        "  for (int t = 0; t < TILES; ++t) {",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e) s[t][e] = 0.0f;",
        "    const TK* const k_tile = k_ring + (stage * KEYS + t * 16 + lane % 16) * KROW + lane / 16 * 8;",
        "#pragma unroll",
        "    for (int kk = 0; kk < D / 16; ++kk) {",
        "      unsigned frag[4];",
        "      ldmatrix_x4(smem_addr(k_tile + kk * 16), frag[0], frag[1], frag[2], frag[3]);",
        "      mma_16816(s[t], frag, qf[kk][0], qf[kk][1]);",
        "    }",
        "  }",
        "#pragma unroll",
        "  for (int rr = 0; rr < 2; ++rr) {  // scores to probabilities, O and the sum rescaled",
        "    const int r = r0 + 2 * lc + rr, i = r % SQ, h = hk * GROUP + r / SQ;",
        *indent(["const float slope = SLOPES[h < HQ ? h : 0];"] if a.attrs.use_alibi_mask else [], 2).splitlines(),
        *indent(score_function(a, names), 2).splitlines(),
        "    float mx = m[rr];",
        "#pragma unroll",
        "    for (int t = 0; t < TILES; ++t)",
        "#pragma unroll",
        "      for (int half = 0; half < 2; ++half) {",
        "        const int j = key0 + t * 16 + half * 8 + lr;",
        "        float& x = s[t][2 * half + rr];",
        "        x = r < ROWS && j < s_end ? score(x, i, j, true) : NEG_INF;",
        "        mx = fmaxf(mx, x);",
        "      }",
        "#pragma unroll",
        "    for (int width = 4; width < 32; width *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, width));",
        "    const float top = mx == NEG_INF ? 0.0f : mx;  // nothing visible yet: stay at 0",
        "    const float correction = gd::exp2_approx(m[rr] - top);",
        "    m[rr] = mx;",
        "    l[rr] *= correction;",
        "#pragma unroll",
        "    for (int dt = 0; dt < DV / 16; ++dt) {",
        "      o[dt][rr] *= correction;",
        "      o[dt][2 + rr] *= correction;",
        "    }",
        "#pragma unroll",
        "    for (int t = 0; t < TILES; ++t)",
        "#pragma unroll",
        "      for (int half = 0; half < 2; ++half) {",
        "        float& x = s[t][2 * half + rr];",
        "        x = gd::exp2_approx(x - top);",
        "        l[rr] += x;",
        "      }",
        "  }",
        "#pragma unroll",
        "  for (int t = 0; t < TILES; ++t) {  // P^T's B fragments: keys 2 lc, +1 (and 8 further), row lr",
        "    const unsigned p0 = transpose8x8(pack2(s[t][0], s[t][1]));",
        "    const unsigned p1 = transpose8x8(pack2(s[t][2], s[t][3]));",
        "    const TV* const v_tile = v_ring + (stage * KEYS + t * 16 + lane % 8 + lane / 16 * 8) * VROW + lane / 8 % 2 * 8;",
        "#pragma unroll",
        "    for (int dt = 0; dt < DV / 16; ++dt) {",
        "      unsigned frag[4];",
        "      ldmatrix_x4_trans(smem_addr(v_tile + dt * 16), frag[0], frag[1], frag[2], frag[3]);",
        "      mma_16816(o[dt], frag, p0, p1);",
        "    }",
        "  }",
        "  __syncwarp();  // every lane is past this stage before the next batch's copies refill it",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        "__syncthreads();  // the rings are free: they hold the merge",
        "auto& red_m = *reinterpret_cast<float(*)[KEY_GROUPS][RB]>(smem);",
        "auto& red_l = *reinterpret_cast<float(*)[KEY_GROUPS][RB]>(smem + KEY_GROUPS * RB * 4);",
        "auto& red_o = *reinterpret_cast<float(*)[KEY_GROUPS][RB][DVP]>(smem + 2 * KEY_GROUPS * RB * 4);",
        "#pragma unroll",
        "for (int rr = 0; rr < 2; ++rr) {",
        "#pragma unroll",
        "  for (int width = 4; width < 32; width *= 2) l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], width);",
        "  if (lr == 0) {",
        "    red_m[warp][2 * lc + rr] = m[rr];",
        "    red_l[warp][2 * lc + rr] = l[rr];",
        "  }",
        "}",
        "#pragma unroll",
        "for (int dt = 0; dt < DV / 16; ++dt)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) red_o[warp][2 * lc + e % 2][dt * 16 + lr + e / 2 * 8] = o[dt][e];",
        "__syncthreads();",
        *merge_rows(a, names, c.split),
    ]
    functions = ASYNC_COPY_PRELUDE + mma_fragments(a.k.data_type) + pack_function(a.k.data_type) + TRANSPOSE
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_decode_mma",
        params,
        32 * c.warps,
        indent(body, 1),
        device_functions=functions,
    )
    per_sequence = a.kv_heads * groups * c.split
    dynamic = shared_bytes(a, c.warps, c.tiles, c.stages)
    grid = (a.batch * per_sequence, 1, 1)
    blocks = batch_grid(a, per_sequence)
    return Kernel(name, source, grid, (32 * c.warps, 1, 1), dynamic, tuple(params.bindings), blocks=blocks)


def _loaders(a: Attention, names: dict[str, str], vector: bool, aligned: str) -> list[str]:
    """``load_k(j0, pages, stage, t)`` / ``load_v``: the 16 rows of keys j0 to j0 + 15 into tile t
    of the warp's stage, chunk ``lane + 32 i`` of the tile's 16-byte chunks per lane (so a warp's
    copy covers whole rows: 256 contiguous bytes per key at D 128, as the CUDA-core ring reads
    them; with 32-byte pieces of 16 rows per copy the kernel took 24-46% longer on an H200),
    through the page of each chunk's key (``pages[i]``) or of the whole tile (``pages[0]``,
    :func:`tile_pages`); zeros past the slice (nothing read). 16-byte copies where the rows are
    vectors and the pointers aligned, else element loads stored as 16-byte vectors. Paged,
    ``page_k(j)``."""
    lines = [
        f"auto page_{role.lower()} = [&](int j) -> long long {{ return j < s_end ? "
        f"{page_of(a, names, role, 'j')} : 0; }};"
        for role in ("K", "V")
        if a.paged
    ]
    for role, t, chunks, row_len, ring in (("K", "TK", "KCH", "KROW", "k_ring"), ("V", "TV", "VCH", "VROW", "v_ring")):
        stride = "KS" if role == "K" else "VS"
        row = key_row_address(a, names, role, "j", "pages[0]" if tile_pages(a, role) else "pages[i]")
        copy = [f"    if ({aligned}) {{", "      copy16(smem_addr(dst), src + col, true);", "      continue;", "    }"]
        lines += [
            f"auto load_{role.lower()} = [&](int j0, const long long* pages, int stage, int t) {{",
            "#pragma unroll",
            f"  for (int i = 0; i < {chunks} / 2; ++i) {{",
            f"    const int e = lane + 32 * i, key = e / {chunks}, col = e % {chunks} * 8, j = j0 + key;",
            f"    {t}* const dst = {ring} + (stage * KEYS + t * 16 + key) * {row_len} + col;",
            "    if (j >= s_end) {",
            "      *reinterpret_cast<uint4*>(dst) = uint4{};",
            "      continue;",
            "    }",
            f"    const {t}* const src = {row};",
            *(copy if vector else []),
            f"    gd::Vec<{t}, 8> value;",
            "#pragma unroll",
            f"    for (int x = 0; x < 8; ++x) value.v[x] = src[(col + x) * {stride}[3]];",
            f"    *reinterpret_cast<gd::Vec<{t}, 8>*>(dst) = value;",
            "  }",
            "};",
        ]
    return lines


def tile_pages(a: Attention, role: str) -> bool:
    """A 16-key tile of K or V (``role``) lies in one page (pages of a multiple of 16 keys; the
    slices start at multiples of 16): one uniform page lookup per tile, not one per chunk."""
    tensor = a.k if role == "K" else a.v
    return a.paged and tensor.static_dim[2] % 16 == 0


def _ring_fill(a: Attention) -> list[str]:
    """``issue(n)``: batch n's tiles into stage n % STAGES, one commit group (empty past the
    slice); paged, through the pages looked up at the previous issue, then the next batch's
    pages looked up. Then the first STAGES - 1 batches issued."""
    paged = a.paged
    pages = ("pk[t]", "pv[t]") if paged else ("nullptr", "nullptr")
    lookups, counts = [], []
    for role, chunks in (("K", "KCH"), ("V", "VCH")):
        r = role.lower()
        if tile_pages(a, role):
            lookups.append(f"  p{r}[t][0] = page_{r}(j0);")
            counts.append("1")
        else:
            lookups += [
                "#pragma unroll",
                f"  for (int i = 0; i < {chunks} / 2; ++i) p{r}[t][i] = page_{r}(j0 + (lane + 32 * i) / {chunks});",
            ]
            counts.append(f"{chunks} / 2")
    first = [
        "// the pages of this lane's chunks (or of the whole tile) of the batch issued next",
        f"long long pk[TILES][{counts[0]}], pv[TILES][{counts[1]}];",
        "#pragma unroll",
        "for (int t = 0; t < TILES; ++t) {",
        "  const int j0 = s_begin + warp * KEYS + t * 16;",
        *lookups,
        "}",
    ]
    return [
        *(first if paged else []),
        "auto issue = [&](int n) {",
        "#pragma unroll",
        "  for (int t = 0; t < TILES; ++t) {",
        "    int j0 = s_begin + n * STEP + warp * KEYS + t * 16;",
        f"    load_k(j0, {pages[0]}, n % STAGES, t);",
        f"    load_v(j0, {pages[1]}, n % STAGES, t);",
        *(["    j0 += STEP;", *indent(lookups, 1).splitlines()] if paged else []),
        "  }",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "};",
        "#pragma unroll",
        "for (int n = 0; n < STAGES - 1; ++n) issue(n);",
    ]


def by_default(a: Attention, arch: int) -> bool:
    """The untuned plan takes this kernel: where it applies, the rows take 16-byte copies and one
    row group holds every packed row (past 8, the CUDA-core kernel packs 16 rows per block and
    reads K and V half as often). Measured on an H200 (benchmarks/attention.py --decode
    --compare, GQA 4, D 128, bf16): as fast as the CUDA-core default at B 1, Skv 32k, 5-17%
    faster on the five other shapes."""
    return unsupported(a, arch) is None and row_groups(a) == 1 and rows_vectorize(a)
