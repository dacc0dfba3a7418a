"""What the Hopper attention backward's two dK/dV kernels share (attention_backward_wgmma.py,
where every thread copies, and attention_backward_ws.py, fed by a producer warpgroup): the
block's keys and query range, and one query tile's work for a warpgroup of 64 keys.

A block owns BN = 128 keys of one (batch, kv head): two warpgroups of 64 keys each keep dK and
dV (64 x D each) in registers while the block walks the query tiles of BQ = 64 rows (or
WIDE_BQ = 128 at head dim 64) of every head of the group that see its keys. Per query tile each warpgroup computes
- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, both operands in shared memory (K-major);
- Pᵀ = 2^(score - lse) and dSᵀ = Pᵀ (dPᵀ - delta) in registers (lse and delta per column);
- dV += Pᵀ dO and dK += dSᵀ Q, Pᵀ and dSᵀ straight from the registers (the accumulator layout
  is the register A operand) and dO and Q read n-major from the tiles they were read from;
- dQ += dS K: dSᵀ stored to shared memory as the K-major A tile of dS (``stmatrix``), a wgmma
  per warpgroup for 64 columns of dQ, and the partial added into ``dq_accum`` (fp32, zeroed by
  the preprocess kernel) by bulk reductions in L2 (``cp.reduce.async.bulk``, a row each, as
  FlashAttention-3 adds dQ); the last kernel writes dQ = scale * dq_accum.
The order of the blocks' additions varies run to run: unlike the mma.sync path, dQ is not
bitwise deterministic.

The kernels name the tile's shared memory alike: ``k_tile`` / ``v_tile`` (the block's keys),
``q_s`` / ``o_s`` (the tile's Q and dO, 128-byte swizzle), ``lse_s[stage]`` / ``delta_s[stage]``,
``ds_s`` (the tile's dS) and ``dq_stage``; ``wg`` is the warpgroup's half of the keys.
"""

from __future__ import annotations

from graphdnn.dtypes import DataType

from ..context import indent
from .attention_backward_problem import DQ_ACCUM, AttentionBackward, gradient_store, query_range
from .attention_flash import pack_function, vectorizable
from .attention_problem import (
    Attention,
    constants,
    coordinates,
    element,
    lengths_and_scale,
    needs_mask,
    score_function,
)
from .attention_wgmma import wgmma_registers_a
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .gemm_sm90 import STMATRIX, wgmma_prelude, wgmma_step_function
from .tensor_core import OperandTypes, mma_fragments
from .tma_prelude import mbarrier_prelude

BN = 128  # keys per block: a warpgroup per 64
BQ = 64  # query rows per tile
WIDE_BQ = 128  # query rows per tile of the producer kernel's wide choice (head dim 64: registers for Sᵀ and dPᵀ)
HEAD_DIMS = (64, 128)
DQ_ROW = 64 + 8  # floats per staged dQ row: the 8 of padding keep a half-warp's float2 stores off each other's banks
DS_BARRIER = 3  # the named barrier both warpgroups meet at once their dS is stored (D 128)
DS_RING = 3  # dS buffers with dQ's product a tile behind (D 128): tile t + 3 waits for tile t's reads
TURN_BARRIER = 4  # and 5: the named barriers at which the warpgroups take turns to issue Sᵀ and dPᵀ
DQ_STAGE_BYTES = 2 * 64 * DQ_ROW * 4  # each warpgroup's staged 64 x 64 fp32 dQ partial
DQ_CHUNK_BYTES = 16 << 20  # causal: the dQ sums of a chunk of blocks run together, a third of an H100's L2


def block_setup(a: Attention, names: dict[str, str], bq: int = BQ) -> list[str]:
    """The block's keys ``kv0`` .. of kv head ``hk`` of batch ``b`` (causal: the blocks with the
    most rows first), the score function, and its ``total`` query tiles of ``bq`` rows (``tiles``
    per head of the group, from row ``q_first``)."""
    n_blocks = -(-a.skv // BN)
    return [
        *constants(a),
        f"constexpr int N_BLOCKS = {n_blocks}, HK = {a.kv_heads};",
        *_block_order(a),
        *lengths_and_scale(a, names, with_slope=False, first=("kv", "kv0")),
        *score_function(a, names),
        *query_range(a, BN, bq),
        "const int tiles = q_end > q_begin ? (q_end - q_first + BQ - 1) / BQ : 0, total = GROUP * tiles;",
        "constexpr unsigned K_BYTES = BN * D * 2, V_BYTES = BN * DV * 2, Q_BYTES = BQ * D * 2, O_BYTES = BQ * DV * 2;",
        "constexpr unsigned DS_BYTES = BQ * BN * 2;  // dS, [key block of 64][BQ rows][128 bytes]",
        f"constexpr int DQ_ROW = {DQ_ROW};",
    ]


def _block_order(a: Attention) -> list[str]:
    """``kv0``, ``hk`` and ``b`` of this block. Without a mask every block has the same work: the
    blocks of one (batch, kv head) pair in turn. Under a causal mask the first keys see the most
    rows: in chunks of pairs whose dQ sums fit a part of L2 (DQ_CHUNK_BYTES), the blocks with the
    most rows of every pair go first, so that the grid ends on short blocks, not on a long one
    started last (blocks start in index order)."""
    if not a.causal:
        return [
            "const int kv0 = (int)(blockIdx.x % N_BLOCKS) * BN;",
            "const int hk = (int)((blockIdx.x / N_BLOCKS) % HK), b = (int)(blockIdx.x / N_BLOCKS / HK);",
        ]
    pairs = a.kv_heads * a.batch
    chunk = max(1, min(pairs, DQ_CHUNK_BYTES // (a.heads // a.kv_heads * a.sq * a.d * 4)))
    return [
        f"constexpr int CHUNK = {chunk}, PAIRS = {pairs};  // (batch, kv head) pairs a chunk",
        "const int chunk = (int)(blockIdx.x / (CHUNK * N_BLOCKS)), within = (int)(blockIdx.x % (CHUNK * N_BLOCKS));",
        "const int pairs = min(CHUNK, PAIRS - chunk * CHUNK), pair = chunk * CHUNK + within % pairs;",
        "const int kv0 = within / pairs * BN;  // the chunk's first keys (the most rows) first",
        "const int hk = pair % HK, b = pair / HK;",
    ]


def blocks(a: Attention) -> int:
    return -(-a.skv // BN) * a.kv_heads * a.batch


def accumulators() -> list[str]:
    """This thread's keys and its dK and dV fragments, zeroed."""
    return [
        "// wgmma fragments: warp w of a warpgroup holds rows 16w..16w+15 of its 64; acc[4j + 2r + e]",
        "// is row lane/4 + 8r, column 8j + 2 (lane % 4) + e. Rows here are the warpgroup's keys.",
        "const int key_base = wg * 64 + (warp & 3) * 16 + (lane >> 2);  // this thread's keys: + 0 and + 8",
        "const unsigned k_rows = k_tile + wg * (64 * 128), v_rows = v_tile + wg * (64 * 128);",
        "float dk[D / 2], dv[DV / 2];",
        "#pragma unroll",
        "for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;",
    ]


def kv_fragments() -> list[str]:
    """This warpgroup's 64 keys of K and V as wgmma A fragments (``ldmatrix`` from their tiles,
    once they landed), for :func:`tile_products` with ``kv_registers``: 16 registers each at D 64."""
    return [
        "unsigned kf[D / 16][4], vf[DV / 16][4];  // k16 step kk: this warp's 16 keys, columns 16kk ..",
        "{",
        "  const int row = (warp & 3) * 16 + (lane & 15), half = lane >> 4;",
        "#pragma unroll",
        "  for (int kk = 0; kk < D / 16; ++kk) {",
        "    const int at = (kk >> 2) * (BN * 128) + swizzle128(row, (kk & 3) * 2 + half);",
        "    ldmatrix_x4(k_rows + at, kf[kk][0], kf[kk][1], kf[kk][2], kf[kk][3]);",
        "    ldmatrix_x4(v_rows + at, vf[kk][0], vf[kk][1], vf[kk][2], vf[kk][3]);",
        "  }",
        "}",
    ]


def tile_products(
    a: Attention, kv_registers: bool, bq: int = BQ, issued: tuple[str, ...] = (), packed_p: bool = False
) -> list[str]:
    """For the query tile of ``stage`` (rows from ``row0``): Sᵀ and dPᵀ issued (K and V from
    shared memory, or with ``kv_registers`` from :func:`kv_fragments`); once Sᵀ is in, the lines
    ``issued``, Pᵀ, and
    dV's product issued behind dPᵀ; once dPᵀ is in, dSᵀ, stored as dS (:func:`_ds_store`). dV's
    product may still run (committed, not waited for). ``packed_p``: dS from the packed P
    (:func:`_ds_values`)."""
    q_at, o_at = "q_s + (kk >> 2) * (BQ * 128) + (kk & 3) * 32", "o_s + (kk >> 2) * (BQ * 128) + (kk & 3) * 32"
    if kv_registers:
        s_step = f"wgmma_rs_k(s, kf[kk], wgmma_descriptor({q_at}, 16, 1024));"
        dp_step = f"wgmma_rs_k(dp, vf[kk], wgmma_descriptor({o_at}, 16, 1024));"
    else:
        s_step = f"wgmma_step(s, wgmma_descriptor(k_rows + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024), wgmma_descriptor({q_at}, 16, 1024));"
        dp_step = f"wgmma_step(dp, wgmma_descriptor(v_rows + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024), wgmma_descriptor({o_at}, 16, 1024));"
    return [
        "float s[BQ / 2], dp[BQ / 2];  // Sᵀ, then Pᵀ; dPᵀ, then dSᵀ",
        "#pragma unroll",
        "for (int i = 0; i < BQ / 2; ++i) s[i] = dp[i] = 0.0f;",
        "fence_accumulators(s);",
        "fence_accumulators(dp);",
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kk = 0; kk < D / 16; ++kk)  // 64-element blocks of the head dim, 4 k16 steps each",
        f"  {s_step}",
        "wgmma_commit();",
        "#pragma unroll",
        "for (int kk = 0; kk < DV / 16; ++kk)",
        f"  {dp_step}",
        "wgmma_commit();",
        "wgmma_wait<1>();  // Sᵀ is in; dPᵀ may still run",
        *issued,
        "fence_accumulators(s);",
        f"const bool masked = {needs_mask(a, bq, BN)};",
        "#pragma unroll",
        "for (int j = 0; j < BQ / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        "    const int col = j * 8 + (lane & 3) * 2 + (e & 1);",
        "    const float x = score(s[4 * j + e], row0 + col, kv0 + key_base + ((e >> 1) << 3), masked);",
        "    const float lse = lse_s[stage][col];",
        "    s[4 * j + e] = x == NEG_INF || lse == NEG_INF ? 0.0f : gd::exp2_approx(x - lse);",
        "  }",
        "unsigned p[BQ / 16][4], ds[BQ / 16][4];  // Pᵀ and dSᵀ as A operands: k16 step kk is columns 16kk ..",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk)",
        "#pragma unroll",
        "  for (int r = 0; r < 4; ++r) p[kk][r] = pack2(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);",
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs(dv, p[kk], wgmma_descriptor(o_s + kk * 2048, BQ * 128, 1024));",
        "wgmma_commit();",
        "wgmma_wait<1>();  // dPᵀ is in; dV's product may still run",
        "fence_accumulators(dp);",
        *_ds_values(packed_p),
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk)",
        "#pragma unroll",
        "  for (int r = 0; r < 4; ++r) ds[kk][r] = pack2(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);",
        *_ds_store(),
    ]


def _ds_values(packed_p: bool) -> list[str]:
    """dSᵀ = Pᵀ (dPᵀ - delta) into ``dp``. With ``packed_p`` Pᵀ is read back from its packed
    16-bit form (``p``, live for dV's product anyway): Sᵀ's floats die at the packing, which keeps
    a consumer with more to hold within its registers (dS is rounded to 16 bits for its products
    too)."""
    unpacked = ["    const float2 pf = unpack2(p[j >> 1][2 * (j & 1) + (e >> 1)]);"] if packed_p else []
    p = "((e & 1) ? pf.y : pf.x)" if packed_p else "s[4 * j + e]"
    lines = [
        "#pragma unroll",
        "for (int j = 0; j < BQ / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        *unpacked,
    ]
    return [
        *lines,
        f"    dp[4 * j + e] = {p} * (dp[4 * j + e] - delta_s[stage][j * 8 + (lane & 3) * 2 + (e & 1)]);",
        "  }",
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
        "  stmatrix_x4_trans(ds_s + wg * (BQ * 128) + swizzle128(16 * kk + ds_q, ds_chunk), ds[kk]);",
    ]


def dq_share(names: dict[str, str], products_read: list[str]) -> list[str]:
    """dQ's and dK's products, and dQ's partial added to ``dq_accum`` while dK's runs.

    dQ's partial dS K is a 64 x 64 block per warpgroup, dS from shared memory (:func:`_ds_store`),
    K read n-major: at D 128 its own 64 columns over the block's 128 keys, with 128-row tiles (D 64)
    its own 64 rows over them (both: both warpgroups' dS, the named barrier DS_BARRIER of their 256
    threads), else (D 64, 64 rows) every column over its own 64 keys (its own dS: a warpgroup
    barrier). dK += dSᵀ Q is issued behind it. The partial is staged in
    fp32 rows and each warp's 16 rows are added to ``dq_accum`` by bulk reductions (one per row,
    in L2), which read the staged rows asynchronously: a lane waits for its last one before they
    are rewritten. ``products_read``: lines run once dV's and dK's products are done (they no
    longer read Q, dO or the statistics)."""
    return [
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // dS, before the tensor cores read it',
        *_dq_columns(),
        "if (BOTH) {",
        f'  asm volatile("bar.sync {DS_BARRIER}, 256;\\n" ::: "memory");  // both warpgroups\' dS is stored',
        "} else {",
        "  warpgroup_sync(wg);  // this warpgroup's",
        "}",
        "float dq[32];",
        *_dq_product("ds_s"),
        *_dk_product(),
        "bulk_wait_read();  // this lane's reduction of the previous tile has read its staged row",
        "__syncwarp();",
        "wgmma_wait<1>();  // dV's and dQ's products are in; dK's may still run",
        "fence_accumulators(dq);",
        "fence_accumulators(dv);",
        *_dq_add(names, "head", "row0"),
        "wgmma_wait<0>();  // dK's product",
        "fence_accumulators(dk);",
        *products_read,
    ]


def dq_share_behind(names: dict[str, str], products_read: list[str]) -> list[str]:
    """:func:`dq_share` at D 128 with dQ's product one tile behind, so that neither warpgroup waits
    for the other's dS of the tile it has just computed: tile t's dS goes to buffer t % DS_RING
    and its *ds_full* mbarrier (every consumer warp arrives); tile t's dQ product is issued in tile
    t + 1 (or after the last tile: :func:`dq_last`) once both warpgroups' arrived, and releases the
    buffer on its *ds_empty* mbarrier, which tile t + DS_RING waits for before storing into it
    (:func:`ds_buffer_wait`)."""
    return [
        'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");  // dS, before the tensor cores read it',
        "__syncwarp();",
        "if (lane == 0) mbar_arrive(ds_full + 8 * (t % DS_RING));",
        *_dq_columns(),
        "float dq[32];",
        "const int behind = t - 1, behind_buffer = (t + DS_RING - 1) % DS_RING;  // the tile whose dQ this one adds",
        "if (t > 0) mbar_wait(ds_full + 8 * behind_buffer, (behind / DS_RING) & 1);  // both warpgroups' dS of tile t - 1",
        "// (tile 0 multiplies a buffer no tile stored yet and drops the product: under a branch, ptxas spilled)",
        *_dq_product("ds_tiles + behind_buffer * DS_BYTES"),
        *_dk_product(),
        "bulk_wait_read();  // this lane's reduction of the previous tile has read its staged row",
        "__syncwarp();",
        "wgmma_wait<1>();  // dV's and tile t - 1's dQ products are in; dK's may still run",
        "fence_accumulators(dq);",
        "fence_accumulators(dv);",
        "if (t > 0) {",
        "  if (lane == 0) mbar_arrive(ds_empty + 8 * behind_buffer);",
        "  const int behind_head = hk * GROUP + behind / tiles, behind_row0 = q_first + (behind % tiles) * BQ;",
        *indent(_dq_add(names, "behind_head", "behind_row0"), 1).splitlines(),
        "}",
        "wgmma_wait<0>();  // dK's product",
        "fence_accumulators(dk);",
        *products_read,
    ]


def turns() -> tuple[list[str], tuple[str, ...], list[str]]:
    """(before a tile's products, once its Sᵀ is in, after the loop): the warpgroups take turns to
    issue Sᵀ and dPᵀ, warpgroup 0 first, so that one's exponentials and dS run while the tensor
    cores work the other's products (FlashAttention-3's ping-pong). Warpgroup w waits at barrier
    TURN_BARRIER + w for the other's arrival (warpgroup 0's first tile does not: it goes first);
    warpgroup 0 waits once more after the loop for warpgroup 1's last arrival. Whether warpgroup
    1 arrives before the loop instead is what ptxas takes for a reason to spill."""
    wait = f'asm volatile("bar.sync %0, 256;\\n" ::"r"({TURN_BARRIER} + wg));'
    pass_turn = f'asm volatile("bar.arrive %0, 256;\\n" ::"r"({TURN_BARRIER} + 1 - wg));'
    return (
        [f"if (t > 0 || wg == 1) {wait}  // this warpgroup's turn"],
        (f"{pass_turn}  // the other's turn",),
        [f"if (wg == 0 && total > 0) {wait}  // warpgroup 1's last turn passed"],
    )


def ds_buffer_wait() -> list[str]:
    """Before tile t stores its dS (:func:`dq_share_behind`): tile t - DS_RING's dQ products, in both
    warpgroups, have read the buffer."""
    return ["if (t >= DS_RING) mbar_wait(ds_empty + 8 * (t % DS_RING), (t / DS_RING - 1) & 1);"]


def dq_last(names: dict[str, str]) -> list[str]:
    """After the last tile of :func:`dq_share_behind`: its dQ product, and the partial added."""
    return [
        "if (total > 0) {",
        "  const int behind = total - 1, behind_buffer = behind % DS_RING;",
        "  mbar_wait(ds_full + 8 * behind_buffer, (behind / DS_RING) & 1);",
        *indent(_dq_columns(), 1).splitlines(),
        "  float dq[32];",
        *indent(_dq_product("ds_tiles + behind_buffer * DS_BYTES"), 1).splitlines(),
        "  bulk_wait_read();",
        "  __syncwarp();",
        "  wgmma_wait<0>();",
        "  fence_accumulators(dq);",
        "  const int behind_head = hk * GROUP + behind / tiles, behind_row0 = q_first + (behind % tiles) * BQ;",
        *indent(_dq_add(names, "behind_head", "behind_row0"), 1).splitlines(),
        "}",
    ]


def _dq_columns() -> list[str]:
    return [
        "constexpr bool BOTH = D == 128 || BQ == 128;  // dQ's product reads both warpgroups' dS",
        "// this warpgroup's 64 rows from dq_row and 64 columns from dq_col, over key blocks of 64 from first_block",
        "constexpr int DQ_BLOCKS = BOTH ? 2 : 1;",
        "const int dq_col = D == 128 ? wg * 64 : 0, dq_row = BQ == 128 ? wg * 64 : 0, first_block = BOTH ? 0 : wg;",
    ]


def _dq_product(ds: str) -> list[str]:
    """dQ's partial (``dq``, zeroed here) from the dS tile at ``ds``: issued and committed."""
    return [
        "#pragma unroll",
        "for (int i = 0; i < 32; ++i) dq[i] = 0.0f;",
        "fence_accumulators(dq);",
        "wgmma_fence();",
        "#pragma unroll",
        "for (int kb = 0; kb < DQ_BLOCKS; ++kb)",
        "#pragma unroll",
        "  for (int kk = 0; kk < 4; ++kk)",
        f"    wgmma_step_n(dq, wgmma_descriptor({ds} + (first_block + kb) * (BQ * 128) + dq_row * 128 + kk * 32, 16, 1024),",
        "                 wgmma_descriptor(k_tile + (dq_col / 64) * (BN * 128) + (first_block + kb) * (64 * 128) + kk * 2048,",
        "                                  BN * 128, 1024));",
        "wgmma_commit();",
    ]


def _dk_product() -> list[str]:
    return [
        "#pragma unroll",
        "for (int kk = 0; kk < BQ / 16; ++kk) wgmma_rs(dk, ds[kk], wgmma_descriptor(q_s + kk * 2048, BQ * 128, 1024));",
        "wgmma_commit();",
    ]


def _dq_add(names: dict[str, str], head: str, row0: str) -> list[str]:
    """``dq`` staged and its rows added to ``dq_accum`` at query head ``head``, rows from ``row0``."""
    acc = names[DQ_ACCUM]
    return [
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
        f"if (lane < 16 && {row0} + dq_row + (warp & 3) * 16 + lane < SQ) {{",
        "  const int q = (warp & 3) * 16 + lane;  // of this warpgroup's rows",
        f"  bulk_add(&{acc}[(((long long)b * HQ + {head}) * SQ + {row0} + dq_row + q) * D + dq_col], staged + q * DQ_ROW, 64 * 4);",
        "}",
    ]


def gradient_stores(ab: AttentionBackward, names: dict[str, str], aligned: str) -> list[str]:
    """Once every tile is done: dK (scaled) and dV written, then the bulk reductions' reads of
    their rows waited for. Where dK's and dV's rows copy as 16-byte chunks of the kernel's type
    (and, at run time, ``aligned``), through shared memory: K's and V's tiles and what follows
    them, free once both warpgroups' last products are done (a barrier), take each warpgroup's
    fragments by ``stmatrix``, then its rows leave by 16-byte stores; else element by element
    from the fragments."""
    a = ab.problem
    elements = [
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
    wait = 'asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");  // the bulk reductions read their rows'
    if not (vectorizable((ab.dk, ab.dv)) and ab.dk.data_type is ab.dv.data_type is a.q.data_type):
        return [*elements, wait]

    def packed(acc: str, factor: str) -> str:
        pairs = (f"pack2({factor}{acc}[8 * jj + {i}], {factor}{acc}[8 * jj + {i + 1}])" for i in range(0, 8, 2))
        return ", ".join(pairs)

    dk_at = element(ab.dk, names["DK"], coordinates(a, "DK", "hk", "key", "col"))
    dv_at = element(ab.dv, names["DV"], coordinates(a, "DV", "hk", "key", "col"))
    return [
        f'asm volatile("bar.sync {DS_BARRIER}, 256;\\n" ::: "memory");  // every product is done: K and V are free',
        f"if ({aligned}) {{",
        "  constexpr int GROW = D * 2 + 16;  // bytes a staged row: the 16 of padding keep stmatrix's rows on distinct banks",
        "  const unsigned dk_rows = k_tile, dv_rows = k_tile + BN * GROW;",
        "  // fragments' column blocks 2jj and 2jj + 1, rows + 0 and + 8: matrices 0 .. 3 of a stmatrix",
        "  const int srow = wg * 64 + (warp & 3) * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, schunk = lane >> 4;",
        "#pragma unroll",
        "  for (int jj = 0; jj < D / 16; ++jj) {",
        f"    const unsigned dk_pairs[4] = {{{packed('dk', 'scale * ')}}};",
        f"    const unsigned dv_pairs[4] = {{{packed('dv', '')}}};",
        "    stmatrix_x4(dk_rows + srow * GROW + (2 * jj + schunk) * 16, dk_pairs);",
        "    stmatrix_x4(dv_rows + srow * GROW + (2 * jj + schunk) * 16, dv_pairs);",
        "  }",
        "  warpgroup_sync(wg);",
        "  const unsigned char* const staged = smem_raw + (k_tile - smem_addr(smem_raw));",
        "  for (int c = tid & 127; c < 64 * (D / 8); c += 128) {  // this warpgroup's rows, 16 bytes a thread",
        "    const int row = wg * 64 + c / (D / 8), col = c % (D / 8) * 8, key = kv0 + row;",
        "    if (key >= SKV) continue;",
        f"    *reinterpret_cast<uint4*>(&{dk_at}) = *reinterpret_cast<const uint4*>(staged + row * GROW + col * 2);",
        f"    *reinterpret_cast<uint4*>(&{dv_at}) =",
        "        *reinterpret_cast<const uint4*>(staged + BN * GROW + row * GROW + col * 2);",
        "  }",
        "} else {",
        *indent(elements, 1).splitlines(),
        "}",
        wait,
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


def unpack_function(data_type: DataType) -> str:
    """``unpack2``: :func:`~.attention_flash.pack_function`'s inverse (x from the low half)."""
    pair, convert = (
        ("__half2", "__half22float2") if data_type is DataType.HALF else ("__nv_bfloat162", "__bfloat1622float2")
    )
    return (
        "\n// One register of two 16-bit values as two floats, x from the low half.\n"
        f"__device__ __forceinline__ float2 unpack2(unsigned v) {{ return {convert}(*reinterpret_cast<{pair}*>(&v)); }}\n"
    )


def device_functions(a: Attention, rank: int, kv_registers: bool, bq: int = BQ, packed_p: bool = False) -> str:
    """cp.async and ``smem_addr``, the wgmma steps (64 keys by ``bq`` rows of Sᵀ and dPᵀ, dQ's 64 columns,
    dV's and dK's register A; with ``kv_registers`` ldmatrix and Sᵀ's and dPᵀ's register A),
    pack2 (and with ``packed_p`` unpack2), stmatrix, the mbarrier helpers with TMA loads of up to ``rank`` dims, bulk reductions."""
    types = OperandTypes(a.q.data_type, a.q.data_type)
    elem = "bf16" if a.q.data_type is DataType.BFLOAT16 else "f16"
    registers_a = mma_fragments(a.q.data_type) + wgmma_registers_a(BQ, elem, "wgmma_rs_k", 0) if kv_registers else ""
    return (
        ASYNC_COPY_PRELUDE
        + wgmma_prelude(bq, types, 0)
        + wgmma_step_function(64, types, 1, "wgmma_step_n")
        + wgmma_registers_a(a.d, elem)
        + registers_a
        + pack_function(a.q.data_type)
        + (unpack_function(a.q.data_type) if packed_p else "")
        + STMATRIX
        + mbarrier_prelude(rank)
        + BULK_REDUCE
    )
