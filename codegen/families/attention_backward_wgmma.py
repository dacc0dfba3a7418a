"""Attention backward on Hopper: wgmma (sm_90a), fp16/bf16, head dims 64 and 128 (D = Dv), no
mask or a causal one (either alignment), MHA, GQA and MQA, in FlashAttention-3's shape.

A block owns BN = 128 keys of one (batch, kv head): two warpgroups of 64 keys each keep dK
and dV (64 x D each) in registers while the block walks the BQ = 64-row query tiles of every
head of the group that see its keys. Per query tile each warpgroup computes
- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, both operands in shared memory (K-major);
- Pᵀ = 2^(score - lse) and dSᵀ = Pᵀ (dPᵀ - delta) in registers (lse and delta per column);
- dV += Pᵀ dO and dK += dSᵀ Q, Pᵀ and dSᵀ straight from the registers (the accumulator layout
  is the register A operand) and dO and Q read n-major from the tiles they were read from;
- dQ += dS K: dSᵀ stored to shared memory as the K-major A tile of dS, a wgmma per warpgroup for
  64 columns of dQ, and the partial added into ``dq_accum`` (fp32, zeroed by the preprocess
  kernel) by bulk reductions in L2 (``cp.reduce.async.bulk``, a row each, as FlashAttention-3
  adds dQ); the last kernel writes dQ = scale * dq_accum.
The order of the blocks' additions varies run to run: unlike the mma.sync path, dQ is not
bitwise deterministic.

No warp specialisation: every thread copies the next query tile's Q and dO (cp.async, the
forward's swizzled row copies) while the current one is computed, two stages.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..kernel import Kernel
from .attention_backward_problem import (
    DQ_ACCUM,
    AttentionBackward,
    declare,
    gradient_store,
    query_range,
    row_statistics,
)
from .attention_flash import pack_function, vectorizable
from .attention_problem import (
    Attention,
    constants,
    coordinates,
    element,
    lengths_and_scale,
    needs_mask,
    score_function,
    sequence_setup,
    strides,
)
from .attention_wgmma import swizzled_row_copies, wgmma_registers_a
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .gemm_sm90 import ALIGN_SLACK, ARCH, MAX_SHARED, STMATRIX, wgmma_prelude, wgmma_step_function
from .tensor_core import TENSOR_CORE_TYPES, OperandTypes
from .tma_prelude import mbarrier_prelude

BN = 128  # keys per block: a warpgroup per 64
BQ = 64  # query rows per tile
THREADS = 256
STAGES = 2  # query tiles in shared memory: the one computed and the one being copied
HEAD_DIMS = (64, 128)
CONVERT_THREADS = 256
DQ_ROW = 64 + 8  # floats per staged dQ row: the 8 of padding keep a half-warp's float2 stores off each other's banks


def unsupported(ab: AttentionBackward, arch: int) -> str | None:
    """Why the Hopper kernels cannot take ``ab`` (None: they can). Every other option stays on
    the mma.sync or SIMT kernels."""
    a = ab.problem
    types = {a.q.data_type, a.k.data_type, a.v.data_type, ab.d_o.data_type}
    reasons = {
        f"the target is sm_{arch}, not sm_{ARCH}": arch != ARCH,
        f"Q, K, V and dO are {sorted(t.value for t in types)}, not all fp16 or all bf16": not (
            len(types) == 1 and types <= TENSOR_CORE_TYPES
        ),
        f"head dims D={a.d}, Dv={a.dv}: equal and one of {list(HEAD_DIMS)}": a.d != a.dv or a.d not in HEAD_DIMS,
        "padding or packed sequences": a.padded or a.ragged,
        "a bias, ALiBi, a sliding window or dropout": bool(
            a.bias is not None or a.attrs.use_alibi_mask or a.window or a.dropout is not None
        ),
        "rows that do not copy as 16-byte chunks": not vectorizable((a.q, a.k, a.v, ab.d_o)),
        "use_deterministic_algorithm (dQ's partial sums add in varying order)": ab.deterministic,
    }
    failed = [reason for reason, bad in reasons.items() if bad]
    return "; ".join(failed) if failed else None


def shared_bytes(d: int) -> int:
    """K and V of the block, two stages of Q and dO, the dS tile and each warpgroup's staged
    64 x 64 fp32 dQ partial (bytes, with the alignment slack)."""
    return 2 * (2 * BN * d + STAGES * 2 * BQ * d + BQ * BN) + 2 * 64 * DQ_ROW * 4 + ALIGN_SLACK


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """dK and dV of a block of keys, and its share of dQ added into ``dq_accum``."""
    a = ab.problem
    assert unsupported(ab, ctx.arch) is None and shared_bytes(a.d) <= MAX_SHARED
    declared = declare(ab, dq_accum=True)
    names, params = declared.names, declared.params
    aligned = params.aligned_flag()
    n_blocks = -(-a.skv // BN)
    lse, delta = row_statistics(ab, names, "row", "head")

    def rows_of(role: str, head: str, row: str) -> str:
        return f"&{element(_tensor(ab, role), names[role], coordinates(a, role, head, row, '0'))}"

    body = [
        f"using T = {cuda_type(a.q.data_type)};",
        f"constexpr int BN = {BN}, BQ = {BQ}, STAGES = {STAGES}, THREADS = {THREADS};",
        f"constexpr long long QS[4] = {{{strides(a.q)}}}, KS[4] = {{{strides(a.k)}}}, VS[4] = {{{strides(a.v)}}};",
        f"constexpr long long OS[4] = {{{strides(ab.d_o)}}};  // dO's",
        *constants(a),
        f"constexpr int N_BLOCKS = {n_blocks}, HK = {a.kv_heads};",
        "const int kv0 = (int)(blockIdx.x % N_BLOCKS) * BN;  // causal: the blocks with the most rows first",
        "const int hk = (int)((blockIdx.x / N_BLOCKS) % HK), b = (int)(blockIdx.x / N_BLOCKS / HK);",
        *lengths_and_scale(a, names, with_slope=False, first=("kv", "kv0")),
        *score_function(a, names),
        *query_range(a, BN, BQ),
        "const int tiles = q_end > q_begin ? (q_end - q_first + BQ - 1) / BQ : 0, total = GROUP * tiles;",
        "constexpr unsigned K_BYTES = BN * D * 2, V_BYTES = BN * DV * 2, Q_BYTES = BQ * D * 2, O_BYTES = BQ * DV * 2;",
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "const unsigned k_tile = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 1024-byte aligned: the swizzle's unit",
        "const unsigned v_tile = k_tile + K_BYTES, q_tiles = v_tile + V_BYTES, o_tiles = q_tiles + STAGES * Q_BYTES;",
        "const unsigned ds_tile = o_tiles + STAGES * O_BYTES;  // dS, [key block of 64][BQ rows][128 bytes]",
        f"constexpr int DQ_ROW = {DQ_ROW};",
        "const unsigned dq_stage = ds_tile + BQ * BN * 2;  // per warpgroup: 64 rows of DQ_ROW floats",
        "__shared__ float lse_s[STAGES][BQ], delta_s[STAGES][BQ];",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;",
        *swizzled_row_copies(aligned, THREADS),
        f"load_rows(k_tile, {rows_of('K', 'hk', 'kv0')}, KS[2], BN, min(BN, SKV - kv0), D);",
        f"load_rows(v_tile, {rows_of('V', 'hk', 'kv0')}, VS[2], BN, min(BN, SKV - kv0), DV);",
        'asm volatile("cp.async.commit_group;\\n" ::);',
        "auto load_tile = [&](int t) {  // tile t: query head hk * GROUP + t / tiles, rows q_first + (t % tiles) * BQ",
        "  const int head = hk * GROUP + t / tiles, row0 = q_first + (t % tiles) * BQ, stage = t % STAGES;",
        f"  load_rows(q_tiles + stage * Q_BYTES, {rows_of('Q', 'head', 'row0')}, QS[2], BQ, min(BQ, SQ - row0), D);",
        f"  load_rows(o_tiles + stage * O_BYTES, {rows_of('DO', 'head', 'row0')}, OS[2], BQ, min(BQ, SQ - row0), DV);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "};",
        "// lse and delta of the next tile's rows (a thread per row), read from memory under this",
        "// tile's products and stored before the barrier that ends it",
        "float lse_next = NEG_INF, delta_next = 0.0f;",
        "auto fetch_statistics = [&](int t) {",
        "  const int head = hk * GROUP + t / tiles, row = q_first + (t % tiles) * BQ + tid;",
        "  const bool live = tid < BQ && row < SQ;",
        f"  lse_next = live ? {lse} : NEG_INF;",
        f"  delta_next = live ? {delta} : 0.0f;",
        "};",
        "auto store_statistics = [&](int t) {",
        "  if (tid < BQ) lse_s[t % STAGES][tid] = lse_next, delta_s[t % STAGES][tid] = delta_next;",
        "};",
        "if (total > 0) {",
        "  load_tile(0);",
        "  fetch_statistics(0);",
        "  store_statistics(0);",
        "}",
        "// wgmma fragments: warp w of a warpgroup holds rows 16w..16w+15 of its 64; acc[4j + 2r + e]",
        "// is row lane/4 + 8r, column 8j + 2 (lane % 4) + e. Rows here are the warpgroup's keys.",
        "const int key_base = wg * 64 + (warp & 3) * 16 + (lane >> 2);  // this thread's keys: + 0 and + 8",
        "const unsigned k_rows = k_tile + wg * (64 * 128), v_rows = v_tile + wg * (64 * 128);",
        "float dk[D / 2], dv[DV / 2];",
        "#pragma unroll",
        "for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;",
        "for (int t = 0; t < total; ++t) {",
        *indent(_iteration(a, names), 1).splitlines(),
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        'asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");  // the bulk reductions are done',
        "#pragma unroll",
        "for (int j = 0; j < D / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        "    const int key = kv0 + key_base + ((e >> 1) << 3), col = j * 8 + (lane & 3) * 2 + (e & 1);",
        "    if (key >= SKV) continue;",
        f"    {gradient_store(a, 'DK', ab.dk, names['DK'], 'hk', 'key', 'col', 'scale * dk[4 * j + e]')}",
        f"    {gradient_store(a, 'DV', ab.dv, names['DV'], 'hk', 'key', 'col', 'dv[4 * j + e]')}",
        "  }",
    ]
    pattern = pattern_name(fused) + "_dkdv_wgmma"
    types = OperandTypes(a.q.data_type, a.q.data_type)
    functions = (
        ASYNC_COPY_PRELUDE
        + wgmma_prelude(BQ, types, 0)
        + wgmma_step_function(64, types, 1, "wgmma_step_n")
        + wgmma_registers_a(a.d, "bf16" if a.q.data_type is DataType.BFLOAT16 else "f16")
        + pack_function(a.q.data_type)
        + STMATRIX
        + mbarrier_prelude(0)
        + BULK_REDUCE
    )
    name, source = kernel_source(
        ctx, fused, pattern, params, THREADS, indent(body, 1), min_blocks=1, device_functions=functions
    )
    blocks = n_blocks * a.kv_heads * a.batch
    return Kernel(
        name, source, (blocks, 1, 1), (THREADS, 1, 1), shared_bytes(a.d), tuple(params.bindings), arch_suffix="a"
    )


def _iteration(a: Attention, names: dict[str, str]) -> list[str]:
    """One query tile: the four products of dK and dV, then dQ's share."""
    return [
        'asm volatile("cp.async.wait_group 0;\\n" ::);  // this tile\'s copies, issued under the last one',
        "// the copies (generic proxy) before the tensor cores' reads (async proxy), then every thread's;",
        "// past this barrier every warp is done with tile t - 1, so its stage takes tile t + 1",
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        "__syncthreads();",
        "if (t + 1 < total) {  // the next tile's copies run under this one's products",
        "  load_tile(t + 1);",
        "  fetch_statistics(t + 1);",
        "}",
        "const int stage = t % STAGES, head = hk * GROUP + t / tiles, row0 = q_first + (t % tiles) * BQ;",
        "const unsigned q_s = q_tiles + stage * Q_BYTES, o_s = o_tiles + stage * O_BYTES;",
        "float s[BQ / 2], dp[BQ / 2];  // Sᵀ, then Pᵀ; dPᵀ, then dSᵀ",
        "#pragma unroll",
        "for (int i = 0; i < BQ / 2; ++i) s[i] = dp[i] = 0.0f;",
        "fence_accumulators(s);",
        "fence_accumulators(dp);",
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kk = 0; kk < D / 16; ++kk)  // 64-element blocks of the head dim, 4 k16 steps each",
        "  wgmma_step(s, wgmma_descriptor(k_rows + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),",
        "             wgmma_descriptor(q_s + (kk >> 2) * (BQ * 128) + (kk & 3) * 32, 16, 1024));",
        "wgmma_commit();",
        "#pragma unroll",
        "for (int kk = 0; kk < DV / 16; ++kk)",
        "  wgmma_step(dp, wgmma_descriptor(v_rows + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024),",
        "             wgmma_descriptor(o_s + (kk >> 2) * (BQ * 128) + (kk & 3) * 32, 16, 1024));",
        "wgmma_commit();",
        "wgmma_wait<1>();  // Sᵀ is in; dPᵀ may still run",
        "fence_accumulators(s);",
        f"const bool masked = {needs_mask(a, BQ, BN)};",
        "#pragma unroll",
        "for (int j = 0; j < BQ / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        "    const int col = j * 8 + (lane & 3) * 2 + (e & 1);",
        "    const float x = score(s[4 * j + e], row0 + col, kv0 + key_base + ((e >> 1) << 3), masked);",
        "    const float lse = lse_s[stage][col];",
        "    s[4 * j + e] = x == NEG_INF || lse == NEG_INF ? 0.0f : gd::exp2_approx(x - lse);",
        "  }",
        "wgmma_wait<0>();",
        "fence_accumulators(dp);",
        "#pragma unroll",
        "for (int j = 0; j < BQ / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - delta_s[stage][j * 8 + (lane & 3) * 2 + (e & 1)]);",
        "unsigned p[BQ / 16][4], ds[BQ / 16][4];  // Pᵀ and dSᵀ as A operands: k16 step kk is columns 16kk ..",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk)",
        "#pragma unroll",
        "  for (int r = 0; r < 4; ++r) {",
        "    p[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);",
        "    ds[kk][r] = pack2(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);",
        "  }",
        *_ds_store(),
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs(dv, p[kk], wgmma_descriptor(o_s + kk * 2048, BQ * 128, 1024));",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs(dk, ds[kk], wgmma_descriptor(q_s + kk * 2048, BQ * 128, 1024));",
        "wgmma_commit();",
        *_dq_share(names),
        "fence_accumulators(dk);",
        "fence_accumulators(dv);",
        "if (t + 1 < total) store_statistics(t + 1);  // its stage's were read in tile t - 1",
    ]


def _ds_store() -> list[str]:
    """dSᵀ (this warpgroup's 64 keys by BQ rows, packed as the A operand of dK's product) to shared
    memory as dS, the K-major A tile of dQ's product (row q: 64 keys, 128 bytes, 16-byte chunk c at
    c ^ (q % 8)), by transposing stores of its 8 x 8 fragments: ds[kk][i] holds rows 16kk + 8 (i / 2)
    .. + 7 and keys 8 (i % 2) .. + 7 of this warp's 16."""
    return [
        "const int ds_q = 8 * (lane >> 4) + (lane & 7), ds_chunk = 2 * (warp & 3) + ((lane >> 3) & 1);",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk)",
        "  stmatrix_x4_trans(ds_tile + wg * (BQ * 128) + swizzle128(16 * kk + ds_q, ds_chunk), ds[kk]);",
    ]


def _dq_share(names: dict[str, str]) -> list[str]:
    """64 columns of dQ's partial dS K per warpgroup, dS from shared memory (:func:`_ds_store`), K
    read n-major: at D 128 its own 64 columns over the block's 128 keys (both warpgroups' dS: a
    block barrier), at D 64 every column over its own 64 keys (its own dS: a warpgroup barrier). The partial is staged in fp32 rows and
    each warp's 16 rows are added to ``dq_accum`` by bulk reductions (one per row, in L2), which
    read the staged rows asynchronously: a lane waits for its last one before they are rewritten."""
    acc = names[DQ_ACCUM]
    return [
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        "if (D == 128) {",
        "  __syncthreads();  // both warpgroups' dS is in shared memory",
        "} else {",
        "  warpgroup_sync(wg);  // this warpgroup's",
        "}",
        "// this warpgroup's 64 columns from dq_col, over key blocks of 64 from first_block",
        "constexpr int DQ_BLOCKS = D / 64 == 2 ? 2 : 1;",
        "const int dq_col = D == 128 ? wg * 64 : 0, first_block = D == 128 ? 0 : wg;",
        "float dq[32];",
        "#pragma unroll",
        "for (int i = 0; i < 32; ++i) dq[i] = 0.0f;",
        "fence_accumulators(dq);",
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kb = 0; kb < DQ_BLOCKS; ++kb)",
        "#pragma unroll",
        "  for (int kk = 0; kk < 4; ++kk)",
        "    wgmma_step_n(dq, wgmma_descriptor(ds_tile + (first_block + kb) * (BQ * 128) + kk * 32, 16, 1024),",
        "                 wgmma_descriptor(k_tile + (dq_col / 64) * (BN * 128) + (first_block + kb) * (64 * 128) + kk * 2048,",
        "                                  BN * 128, 1024));",
        "wgmma_commit();",
        "bulk_wait_read();  // this lane's reduction of the previous tile has read its staged row",
        "__syncwarp();",
        "wgmma_wait<0>();  // dV's and dK's products too",
        "fence_accumulators(dq);",
        "float* const staged = reinterpret_cast<float*>(smem_raw + (dq_stage - smem_addr(smem_raw))) + wg * (64 * DQ_ROW);",
        "const int q_base = (warp & 3) * 16 + (lane >> 2);  // this thread's rows of dQ: + 0 and + 8",
        "#pragma unroll",
        "for (int j = 0; j < 8; ++j)",
        "#pragma unroll",
        "  for (int r = 0; r < 2; ++r)",
        "    *reinterpret_cast<float2*>(staged + (q_base + 8 * r) * DQ_ROW + j * 8 + (lane & 3) * 2) =",
        "        make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);",
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // before the bulk reductions read them',
        "__syncwarp();",
        "if (lane < 16 && row0 + (warp & 3) * 16 + lane < SQ) {",
        "  const int q = (warp & 3) * 16 + lane;",
        f"  bulk_add(&{acc}[(((long long)b * HQ + head) * SQ + row0 + q) * D + dq_col], staged + q * DQ_ROW, 64 * 4);",
        "}",
    ]


BULK_REDUCE = r"""
// fp32 rows added into global memory by the L2 (sm_90 bulk reductions, completing as a bulk group)
__device__ __forceinline__ void bulk_add(float* dst, const float* src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's bulk reductions have read their shared-memory source.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
"""


def dq_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """dQ = scale * dq_accum in dQ's type and layout, a thread per element."""
    a = ab.problem
    declared = declare(ab, dq_accum=True)
    names, params = declared.names, declared.params
    elements = ab.rows * a.d
    body = [
        *constants(a),
        f"const long long at = (long long)blockIdx.x * {CONVERT_THREADS} + threadIdx.x;",
        f"if (at >= {elements}LL) return;",
        "const int c = (int)(at % D), i = (int)(at / D % SQ), h = (int)(at / D / SQ % HQ), b = (int)(at / D / SQ / HQ);",
        *sequence_setup(a, names),
        gradient_store(a, "DQ", ab.dq, names["DQ"], "h", "i", "c", f"scale * {names[DQ_ACCUM]}[at]"),
    ]
    name, source = kernel_source(
        ctx, fused, pattern_name(fused) + "_dq_convert", params, CONVERT_THREADS, indent(body, 1)
    )
    grid = -(-elements // CONVERT_THREADS)
    return Kernel(name, source, (grid, 1, 1), (CONVERT_THREADS, 1, 1), 0, tuple(params.bindings))


def _tensor(ab: AttentionBackward, role: str) -> Tensor:
    return {"Q": ab.problem.q, "K": ab.problem.k, "V": ab.problem.v, "DO": ab.d_o}[role]
