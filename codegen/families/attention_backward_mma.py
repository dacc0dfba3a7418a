"""Attention backward on mma.sync tensor cores (sm_80+, fp16/bf16 Q, K, V and dO, fp32
accumulation, head dims up to 128): FlashAttention-2's dK/dV and dQ passes, deterministic.

Both kernels have one shape. A block holds a fixed tile of ``BR = 16 * WARPS`` rows of two
operands X1, X2 in shared memory (each warp owns 16 of them) and streams tiles of ``BC``
rows of two operands Y1, Y2 through a double-buffered ``cp.async`` pipeline. Per streamed
tile a warp computes A = X1 Y1ᵀ and B = X2 Y2ᵀ (16 x BC, fp32), turns them into P and dS
with the forward's score function and the saved statistics, and accumulates into registers
with P and dS as A fragments in place (the m16n8 accumulator layout is the m16n8k16 A
layout, as in the forward's P V):
- dK/dV, a block per key tile of one (batch, kv head): X1 = K, X2 = V, Y1 = Q, Y2 = dO over
  the query tiles of every head of the group that see the keys; A = Sᵀ, B = dPᵀ;
  dV += Pᵀ dO, dK += dSᵀ Q (Y1, Y2 read transposed by ``ldmatrix.trans``);
- dQ, a block per query tile of one (batch, head): X1 = Q, X2 = dO, Y1 = K, Y2 = V over the
  visible key tiles; A = S, B = dP; dQ += dS K.
Each gradient element is summed by one thread in a fixed order: no atomics, the same bits
run to run. Rows are copied as 16-byte chunks when the head dims are contiguous and
aligned, element by element otherwise (any strides).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor

from ..context import EmitContext, KernelParams, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..kernel import Kernel
from .attention_backward_problem import (
    AttentionBackward,
    declare,
    gradient_store,
    probability_gradients,
    query_range,
    row_statistics,
)
from .attention_extents import work_items
from .attention_flash import pack_function, padded, tile_loader, vectorizable
from .attention_problem import (
    Attention,
    block_setup,
    constants,
    coordinates,
    dropout_function,
    key_range,
    lengths_and_scale,
    packed_exit,
    score_function,
    strides,
    written_rows,
)
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .tensor_core import TENSOR_CORE_TYPES, mma_fragments

MAX_HEAD_DIM = 128  # accumulators of dK and dV together stay within 128 registers a thread
WARPS = 4
BC = 32  # streamed rows per tile


def supported(ab: AttentionBackward) -> bool:
    """Q, K, V and dO all fp16 or all bf16, head dims up to 128."""
    a = ab.problem
    types = {a.q.data_type, a.k.data_type, a.v.data_type, ab.d_o.data_type}
    return len(types) == 1 and types <= TENSOR_CORE_TYPES and max(a.d, a.dv) <= MAX_HEAD_DIM


def shared_bytes(ab: AttentionBackward) -> int:
    row1, row2 = padded(ab.problem.d) + 8, padded(ab.problem.dv) + 8
    return 2 * (WARPS * 16 + 2 * BC) * (row1 + row2)


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    a = ab.problem
    declared = declare(ab)
    names, params = declared.names, declared.params
    br = 16 * WARPS
    n_blocks = -(-a.skv // br)
    rows, keys = written_rows(a), written_rows(a, "kv")
    lse, delta = row_statistics(ab, names, "row", "head")
    body = [
        *_prologue(ab, params.aligned_flag() if _vec(ab) else "false"),
        *constants(a),
        f"constexpr int N_BLOCKS = {n_blocks}, HK = {a.kv_heads};",
        "const int kv0 = (int)(blockIdx.x % N_BLOCKS) * BR;",
        "const int hk = (int)((blockIdx.x / N_BLOCKS) % HK), b = (int)(blockIdx.x / N_BLOCKS / HK);",
        "int h = hk * GROUP;  // the query head of the tile being computed (the score function reads it)",
        *lengths_and_scale(a, names, with_slope=False, first=("kv", "kv0")),
        *packed_exit(a, "kv", "kv0"),
        *(["float slope = SLOPES[h];"] if a.attrs.use_alibi_mask else []),
        *score_function(a, names),
        *dropout_function(a),
        *query_range(a, br, BC),
        "const int tiles = q_end > q_begin ? (q_end - q_first + BC - 1) / BC : 0, total = GROUP * tiles;",
        *_shared_layout(),
        "__shared__ float lse_s[2][BC], delta_s[2][BC];",
        f"const T* const x1_g = {_row(a, 'K', names, 'hk', 'kv0')};",
        f"const T* const x2_g = {_row(a, 'V', names, 'hk', 'kv0')};",
        f"load_rows(x1_s, ROW1, x1_g, KS[2], KS[3], BR, min(BR, {keys} - kv0), D, DP);",
        f"load_rows(x2_s, ROW2, x2_g, VS[2], VS[3], BR, min(BR, {keys} - kv0), DV, DVP);",
        'asm volatile("cp.async.commit_group;\\n" ::);',
        "auto load_tile = [&](int t) {  // tile t: query head hk * GROUP + t / tiles, rows q_first + (t % tiles) * BC",
        "  const int head = hk * GROUP + t / tiles, row0 = q_first + (t % tiles) * BC, stage = t & 1;",
        f"  const T* const y1_g = {_row(a, 'Q', names, 'head', 'row0')};",
        f"  const T* const y2_g = {_row(a, 'DO', names, 'head', 'row0')};",
        f"  load_rows(y1_s + stage * BC * ROW1, ROW1, y1_g, QS[2], QS[3], BC, min(BC, {rows} - row0), D, DP);",
        f"  load_rows(y2_s + stage * BC * ROW2, ROW2, y2_g, OS[2], OS[3], BC, min(BC, {rows} - row0), DV, DVP);",
        "  for (int r = tid; r < BC; r += THREADS) {",
        "    const int row = row0 + r;",
        f"    lse_s[stage][r] = row < {rows} ? {lse} : NEG_INF;",
        f"    delta_s[stage][r] = row < {rows} ? {delta} : 0.0f;",
        "  }",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "};",
        "if (total > 0) load_tile(0);",
        *_accumulators("dk", "DP"),
        *_accumulators("dv", "DVP"),
        "for (int t = 0; t < total; ++t) {",
        *indent(_next_tile(), 1).splitlines(),
        "  const int stage = t & 1, row0 = q_first + (t % tiles) * BC;",
        "  h = hk * GROUP + t / tiles;",
        *(["  slope = SLOPES[h];"] if a.attrs.use_alibi_mask else []),
        *indent(_products(), 1).splitlines(),
        "  // rows of the products are keys (warp_row + ...), columns query rows (row0 + ...)",
        *indent(
            _gradients(a, "row0 + col", "kv0 + warp_row + r", "lse_s[stage][col]", "delta_s[stage][col]"), 1
        ).splitlines(),
        *indent(_accumulate("dv", "s", "y2_tile", "ROW2", "DVP"), 1).splitlines(),
        *indent(_accumulate("dk", "dp", "y1_tile", "ROW1", "DP"), 1).splitlines(),
        "  __syncthreads();  // everyone is done with this stage before it is refilled",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        *_store(a, "DK", ab.dk, names["DK"], "hk", "kv0", ("D", "DP"), "scale * dk"),
        *_store(a, "DV", ab.dv, names["DV"], "hk", "kv0", ("DV", "DVP"), "dv"),
    ]
    return _kernel(fused, ctx, ab, params, "_dkdv_mma", body, n_blocks * a.kv_heads * a.batch)


def dq_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    a = ab.problem
    declared = declare(ab)
    names, params = declared.names, declared.params
    br = 16 * WARPS
    lse, delta = row_statistics(ab, names, "i")
    rows, keys = written_rows(a), written_rows(a, "kv")
    body = [
        *_prologue(ab, params.aligned_flag() if _vec(ab) else "false"),
        *block_setup(a, names, br),
        *packed_exit(a),
        *key_range(a, br),
        *score_function(a, names),
        *dropout_function(a),
        *_shared_layout(),
        f"const T* const x1_g = {_row(a, 'Q', names, 'h', 'row0')};",
        f"const T* const x2_g = {_row(a, 'DO', names, 'h', 'row0')};",
        f"load_rows(x1_s, ROW1, x1_g, QS[2], QS[3], BR, min(BR, {rows} - row0), D, DP);",
        f"load_rows(x2_s, ROW2, x2_g, OS[2], OS[3], BR, min(BR, {rows} - row0), DV, DVP);",
        'asm volatile("cp.async.commit_group;\\n" ::);',
        "const int first = kv_begin / BC * BC;",
        "const int total = kv_end > kv_begin ? (kv_end - first + BC - 1) / BC : 0;",
        "auto load_tile = [&](int t) {",
        "  const int kv0 = first + t * BC, stage = t & 1;",
        f"  const T* const y1_g = {_row(a, 'K', names, 'hk', 'kv0')};",
        f"  const T* const y2_g = {_row(a, 'V', names, 'hk', 'kv0')};",
        f"  load_rows(y1_s + stage * BC * ROW1, ROW1, y1_g, KS[2], KS[3], BC, min(BC, {keys} - kv0), D, DP);",
        f"  load_rows(y2_s + stage * BC * ROW2, ROW2, y2_g, VS[2], VS[3], BC, min(BC, {keys} - kv0), DV, DVP);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "};",
        "if (total > 0) load_tile(0);",
        "float lse_r[2], delta_r[2];  // this thread's rows: warp_row and warp_row + 8",
        "for (int r = 0; r < 2; ++r) {",
        "  const int i = row0 + warp_row + 8 * r;",
        f"  lse_r[r] = i < {rows} ? {lse} : NEG_INF;",
        f"  delta_r[r] = i < {rows} ? {delta} : 0.0f;",
        "}",
        *_accumulators("dq", "DP"),
        "for (int t = 0; t < total; ++t) {",
        *indent(_next_tile(), 1).splitlines(),
        "  const int stage = t & 1, kv0 = first + t * BC;",
        *indent(_products(), 1).splitlines(),
        "  // rows of the products are query rows (warp_row + ...), columns keys (kv0 + ...)",
        *indent(_gradients(a, "row0 + warp_row + r", "kv0 + col", "lse_r[e >> 1]", "delta_r[e >> 1]"), 1).splitlines(),
        *indent(_accumulate("dq", "dp", "y1_tile", "ROW1", "DP"), 1).splitlines(),
        "  __syncthreads();  // everyone is done with this stage before it is refilled",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        *_store(a, "DQ", ab.dq, names["DQ"], "h", "row0", ("D", "DP"), "scale * dq"),
    ]
    return _kernel(fused, ctx, ab, params, "_dq_mma", body, work_items(a, br))


def _vec(ab: AttentionBackward) -> bool:
    return vectorizable((ab.problem.q, ab.problem.k, ab.problem.v, ab.d_o))


def _prologue(ab: AttentionBackward, aligned: str) -> list[str]:
    a = ab.problem
    return [
        f"using T = {cuda_type(a.q.data_type)};",
        f"constexpr int THREADS = {32 * WARPS}, BR = {16 * WARPS}, BC = {BC};",
        f"constexpr int DP = {padded(a.d)}, DVP = {padded(a.dv)}, ROW1 = DP + 8, ROW2 = DVP + 8;  // padded rows",
        f"constexpr long long QS[4] = {{{strides(a.q)}}}, KS[4] = {{{strides(a.k)}}}, VS[4] = {{{strides(a.v)}}};",
        f"constexpr long long OS[4] = {{{strides(ab.d_o)}}};  // dO's",
        "constexpr int NT = BC / 8;",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
        *tile_loader(_vec(ab), aligned),
    ]


def _shared_layout() -> list[str]:
    return [
        "extern __shared__ __align__(128) unsigned char smem[];",
        "T* const x1_s = reinterpret_cast<T*>(smem);  // [BR][ROW1]",
        "T* const x2_s = x1_s + BR * ROW1;  // [BR][ROW2]",
        "T* const y1_s = x2_s + BR * ROW2;  // [2][BC][ROW1]",
        "T* const y2_s = y1_s + 2 * BC * ROW1;  // [2][BC][ROW2]",
        "// this thread's rows of the block's tile: warp_row and warp_row + 8",
        "const int warp_row = warp * 16 + (lane >> 2);",
    ]


def _accumulators(name: str, width: str) -> list[str]:
    return [
        f"float {name}[{width} / 8][4];",
        "#pragma unroll",
        f"for (int j = 0; j < {width} / 8; ++j) {name}[j][0] = {name}[j][1] = {name}[j][2] = {name}[j][3] = 0.0f;",
    ]


def _next_tile() -> list[str]:
    return [
        "if (t + 1 < total) {",
        "  load_tile(t + 1);",
        '  asm volatile("cp.async.wait_group 1;\\n" ::);',
        "} else {",
        '  asm volatile("cp.async.wait_group 0;\\n" ::);',
        "}",
        "__syncthreads();  // the fixed tile and this tile are in shared memory",
    ]


def _products() -> list[str]:
    """s = X1 Y1ᵀ and dp = X2 Y2ᵀ for the warp's 16 rows and the tile's BC rows (the Y rows are
    the B fragments' columns)."""
    lines = [
        "const T* const y1_tile = y1_s + stage * BC * ROW1;",
        "const T* const y2_tile = y2_s + stage * BC * ROW2;",
    ]
    for out, x, y, row, width in (("s", "x1_s", "y1_tile", "ROW1", "DP"), ("dp", "x2_s", "y2_tile", "ROW2", "DVP")):
        lines += [
            f"float {out}[NT][4];",
            "#pragma unroll",
            f"for (int j = 0; j < NT; ++j) {out}[j][0] = {out}[j][1] = {out}[j][2] = {out}[j][3] = 0.0f;",
            "#pragma unroll",
            f"for (int kk = 0; kk < {width} / 16; ++kk) {{",
            "  unsigned a[4];",
            f"  ldmatrix_x4(smem_addr({x} + (warp * 16 + (lane & 15)) * {row} + kk * 16 + (lane >> 4) * 8), a[0], a[1], a[2], a[3]);",
            "#pragma unroll",
            "  for (int nj = 0; nj < NT / 2; ++nj) {",
            "    unsigned b0, b1, b2, b3;",
            "    const int r = nj * 16 + ((lane >> 4) << 3) + (lane & 7), c = kk * 16 + ((lane >> 3) & 1) * 8;",
            f"    ldmatrix_x4(smem_addr({y} + r * {row} + c), b0, b1, b2, b3);",
            f"    mma_16816({out}[2 * nj], a, b0, b1);",
            f"    mma_16816({out}[2 * nj + 1], a, b2, b3);",
            "  }",
            "}",
        ]
    return lines


def _gradients(a: Attention, query: str, key: str, lse: str, delta: str) -> list[str]:
    """s becomes P (as dV takes it: dropped and rescaled under dropout) and dp becomes
    dS = P (dP - delta), element by element; ``query`` / ``key``: the query row and key of
    accumulator element (r, col)."""
    first, p_dv, ds = probability_gradients(a, "p", "dp[j][e]", delta, "h", query, key)
    return [
        "#pragma unroll",
        "for (int j = 0; j < NT; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        "    const int r = (e >> 1) << 3, col = j * 8 + (lane & 3) * 2 + (e & 1);",
        f"    const float x = score(s[j][e], {query}, {key}, true), lse = {lse};",
        "    const float p = x == NEG_INF || lse == NEG_INF ? 0.0f : gd::exp2_approx(x - lse);",
        *(f"    {line}" for line in first),
        f"    s[j][e] = {p_dv};",
        f"    dp[j][e] = {ds};",
        "  }",
    ]


def _accumulate(target: str, source: str, y: str, row: str, width: str) -> list[str]:
    """``target`` (16 x width) += ``source`` (16 x BC: ``s`` holding P or ``dp`` holding dS, as A
    fragments) times the tile's BC rows of ``y`` (read transposed: the rows are k)."""
    return [
        "#pragma unroll",
        "for (int kk = 0; kk < BC / 16; ++kk) {",
        "  unsigned a[4];",
        f"  a[0] = pack2({source}[2 * kk][0], {source}[2 * kk][1]);",
        f"  a[1] = pack2({source}[2 * kk][2], {source}[2 * kk][3]);",
        f"  a[2] = pack2({source}[2 * kk + 1][0], {source}[2 * kk + 1][1]);",
        f"  a[3] = pack2({source}[2 * kk + 1][2], {source}[2 * kk + 1][3]);",
        "#pragma unroll",
        f"  for (int nj = 0; nj < {width} / 16; ++nj) {{",
        "    unsigned b0, b1, b2, b3;",
        "    const int krow = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), c = nj * 16 + (lane >> 4) * 8;",
        f"    ldmatrix_x4_trans(smem_addr({y} + krow * {row} + c), b0, b1, b2, b3);",
        f"    mma_16816({target}[2 * nj], a, b0, b1);",
        f"    mma_16816({target}[2 * nj + 1], a, b2, b3);",
        "  }",
        "}",
    ]


def _row(a: Attention, role: str, names: dict[str, str], head: str, row: str) -> str:
    """C: the first element of row ``row`` of (b, ``head``) of the tensor in ``role`` (Q, dO, K
    or V; dO's strides are OS), from the packed sequence's first token where it is packed."""
    b, h, r, _ = (c if c.isidentifier() else f"({c})" for c in coordinates(a, role, head, row, "0"))
    stride = {"Q": "QS", "DO": "OS", "K": "KS", "V": "VS"}[role]
    name = names[role]
    return f"{name} + (long long){b} * {stride}[0] + (long long){h} * {stride}[1] + (long long){r} * {stride}[2]"


def _store(
    a: Attention, role: str, tensor: Tensor, name: str, head: str, first: str, width: tuple[str, str], acc: str
) -> list[str]:
    """The warp's rows of the accumulators (``acc``: a C expression of ``[j][e]``) to the
    gradient in ``role`` from row ``first``; rows past the sequence's (:func:`written_rows`) and
    the zero padding past ``width[0]`` (of ``width[1]``) are not written."""
    rows = written_rows(a, "q" if role == "DQ" else "kv")
    store = gradient_store(a, role, tensor, name, head, "i", "c", f"{acc}[j][e]")
    return [
        "#pragma unroll",
        f"for (int j = 0; j < {width[1]} / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {",
        f"    const int i = {first} + warp_row + ((e >> 1) << 3), c = j * 8 + (lane & 3) * 2 + (e & 1);",
        f"    if (i < {rows} && c < {width[0]}) {store}",
        "  }",
    ]


def _kernel(
    fused: FusedNode,
    ctx: EmitContext,
    ab: AttentionBackward,
    params: KernelParams,
    suffix: str,
    body: list[str],
    blocks: int,
) -> Kernel:
    data_type: DataType = ab.problem.q.data_type
    functions = ASYNC_COPY_PRELUDE + mma_fragments(data_type) + pack_function(data_type)
    pattern = pattern_name(fused) + suffix
    name, source = kernel_source(ctx, fused, pattern, params, 32 * WARPS, indent(body, 1), device_functions=functions)
    return Kernel(name, source, (blocks, 1, 1), (32 * WARPS, 1, 1), shared_bytes(ab), tuple(params.bindings))
