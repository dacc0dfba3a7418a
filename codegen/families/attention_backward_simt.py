"""Attention backward without tensor cores: correct for every type, mask, layout and head dim
up to 256, deterministic (each output element is summed by one thread in a fixed order, no
atomics), not fast. The fallback where the tensor-core kernels do not apply.

Two kernels after the ``delta`` preprocess, both over tiles of T query rows and T keys in
shared memory (floats, zero past the tensors' ends), 128 threads a block, every thread
taking part in every loop (no divergent barriers):
- dK/dV: a block owns T keys of one (batch, kv head) and walks the query heads of its group
  and the query tiles whose rows can see its keys; per tile it forms P and dS (T x T) and
  adds Pᵀ dO to dV and dSᵀ Q to dK, each thread owning fixed (key, column) elements;
- dQ: a block owns T query rows of one (batch, head) and walks the key tiles its rows can
  see, adding dS K to dQ.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import load
from ..kernel import Kernel
from .attention_backward_problem import (
    AttentionBackward,
    declare,
    gradient_store,
    probability_gradients,
    query_range,
    row_statistics,
)
from .attention_problem import (
    Attention,
    constants,
    coordinates,
    dropout_function,
    element,
    key_range,
    lengths_and_scale,
    packed_exit,
    score_function,
    written_rows,
)

THREADS = 128


def tile(ab: AttentionBackward) -> int:
    """Rows and keys per tile: 16, or 8 for head dims past 256 together (static shared memory
    stays at 34 KB, under the 48 KB a kernel may declare)."""
    return 16 if ab.problem.d + ab.problem.dv <= 256 else 8


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    a, t = ab.problem, tile(ab)
    declared = declare(ab)
    names, params = declared.names, declared.params
    n_blocks = -(-a.skv // t)
    keys = written_rows(a, "kv")
    body = [
        *constants(a),
        f"constexpr int T = {t}, THREADS = {THREADS}, N_BLOCKS = {n_blocks}, HK = {a.kv_heads};",
        "const int kv0 = (int)(blockIdx.x % N_BLOCKS) * T;",
        "const int hk = (int)((blockIdx.x / N_BLOCKS) % HK), b = (int)(blockIdx.x / N_BLOCKS / HK);",
        "int h = hk * GROUP;  // the query head being walked (the score function reads it)",
        *lengths_and_scale(a, names, with_slope=False, first=("kv", "kv0")),
        *packed_exit(a, "kv", "kv0"),
        *(["float slope = 0.0f;"] if a.attrs.use_alibi_mask else []),
        *score_function(a, names),
        *dropout_function(a),
        *_shared_tiles(),
        "const int tid = threadIdx.x;",
        *_load_rows(a, "K", a.k, names["K"], "hk", "kv0", "D"),
        *_load_rows(a, "V", a.v, names["V"], "hk", "kv0", "DV"),
        *query_range(a, t, t),
        "constexpr int ACC_K = (T * D + THREADS - 1) / THREADS, ACC_V = (T * DV + THREADS - 1) / THREADS;",
        "float dk[ACC_K], dv[ACC_V];",
        "for (int e = 0; e < ACC_K; ++e) dk[e] = 0.0f;",
        "for (int e = 0; e < ACC_V; ++e) dv[e] = 0.0f;",
        "for (int g = 0; g < GROUP; ++g) {",
        "  h = hk * GROUP + g;",
        *(f"  {line}" for line in (["slope = SLOPES[h];"] if a.attrs.use_alibi_mask else [])),
        "  for (int row0 = q_first; row0 < q_end; row0 += T) {",
        "    __syncthreads();  // the last tile's readers are done",
        *indent(_load_query_tile(ab, names), 2).splitlines(),
        "    __syncthreads();",
        *indent(_score_gradients(a), 2).splitlines(),
        "    __syncthreads();",
        "    for (int e = 0; e < ACC_V; ++e) {",
        "      const int x = tid + e * THREADS, c = x / DV, d = x % DV;",
        "      if (x < T * DV)",
        "        for (int r = 0; r < T; ++r) dv[e] += p_s[r][c] * do_s[r][d];",
        "    }",
        "    for (int e = 0; e < ACC_K; ++e) {",
        "      const int x = tid + e * THREADS, c = x / D, d = x % D;",
        "      if (x < T * D)",
        "        for (int r = 0; r < T; ++r) dk[e] += ds_s[r][c] * q_s[r][d];",
        "    }",
        "  }",
        "}",
        "for (int e = 0; e < ACC_K; ++e) {",
        "  const int x = tid + e * THREADS, c = x / D, d = x % D;",
        f"  if (x < T * D && kv0 + c < {keys}) {gradient_store(a, 'DK', ab.dk, names['DK'], 'hk', 'kv0 + c', 'd', 'scale * dk[e]')}",
        "}",
        "for (int e = 0; e < ACC_V; ++e) {",
        "  const int x = tid + e * THREADS, c = x / DV, d = x % DV;",
        f"  if (x < T * DV && kv0 + c < {keys}) {gradient_store(a, 'DV', ab.dv, names['DV'], 'hk', 'kv0 + c', 'd', 'dv[e]')}",
        "}",
    ]
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_dkdv_simt", params, THREADS, indent(body, 1))
    blocks = n_blocks * a.kv_heads * a.batch
    return Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))


def dq_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    a, t = ab.problem, tile(ab)
    declared = declare(ab)
    names, params = declared.names, declared.params
    m_blocks = -(-a.rows_per_sequence // t)
    body = [
        *constants(a),
        f"constexpr int T = {t}, THREADS = {THREADS}, M_BLOCKS = {m_blocks};",
        "const int row0 = (int)(blockIdx.x % M_BLOCKS) * T;",
        "const int h = (int)((blockIdx.x / M_BLOCKS) % HQ), b = (int)(blockIdx.x / M_BLOCKS / HQ);",
        "const int hk = h / GROUP;",
        *lengths_and_scale(a, names),
        *packed_exit(a),
        *key_range(a, t),
        *score_function(a, names),
        *dropout_function(a),
        *_shared_tiles(),
        "const int tid = threadIdx.x;",
        *_load_query_tile(ab, names),
        "constexpr int ACC = (T * D + THREADS - 1) / THREADS;",
        "float dq[ACC];",
        "for (int e = 0; e < ACC; ++e) dq[e] = 0.0f;",
        "for (int kv0 = kv_begin / T * T; kv0 < kv_end; kv0 += T) {",
        "  __syncthreads();  // the query tile is in; the last key tile's readers are done",
        *(f"  {line}" for line in _load_rows(a, "K", a.k, names["K"], "hk", "kv0", "D")),
        *(f"  {line}" for line in _load_rows(a, "V", a.v, names["V"], "hk", "kv0", "DV")),
        "  __syncthreads();",
        *indent(_score_gradients(a), 1).splitlines(),
        "  __syncthreads();",
        "  for (int e = 0; e < ACC; ++e) {",
        "    const int x = tid + e * THREADS, r = x / D, d = x % D;",
        "    if (x < T * D)",
        "      for (int c = 0; c < T; ++c) dq[e] += ds_s[r][c] * k_s[c][d];",
        "  }",
        "}",
        "for (int e = 0; e < ACC; ++e) {",
        "  const int x = tid + e * THREADS, r = x / D, d = x % D;",
        f"  if (x < T * D && row0 + r < {written_rows(a)}) {gradient_store(a, 'DQ', ab.dq, names['DQ'], 'h', 'row0 + r', 'd', 'scale * dq[e]')}",
        "}",
    ]
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_dq_simt", params, THREADS, indent(body, 1))
    blocks = m_blocks * a.heads * a.batch
    return Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))


def _shared_tiles() -> list[str]:
    return [
        "__shared__ float q_s[T][D], do_s[T][DV], k_s[T][D], v_s[T][DV];",
        "__shared__ float p_s[T][T], ds_s[T][T], lse_s[T], delta_s[T];",
    ]


def _load_rows(a: Attention, role: str, tensor: Tensor, name: str, head: str, first: str, width: str) -> list[str]:
    """Rows ``first`` .. ``first + T`` of (b, ``head``) of the tensor in ``role`` as floats, into
    its tile (``q_s``, ``do_s``, ``k_s`` or ``v_s``), zero past the sequence's rows."""
    target = {"Q": "q_s", "DO": "do_s", "K": "k_s", "V": "v_s"}[role]
    rows = written_rows(a, "kv" if role in ("K", "V") else "q")
    value = load(tensor.data_type, element(tensor, name, coordinates(a, role, head, f"{first} + r", "d")), "float")
    return [
        f"for (int x = tid; x < T * {width}; x += THREADS) {{",
        f"  const int r = x / {width}, d = x % {width};",
        f"  {target}[r][d] = {first} + r < {rows} ? {value} : 0.0f;",
        "}",
    ]


def _load_query_tile(ab: AttentionBackward, names: dict[str, str]) -> list[str]:
    """Rows ``row0`` .. ``row0 + T`` of Q and dO, their lse (log2 units; -inf past the rows) and delta."""
    a = ab.problem
    lse, delta = row_statistics(ab, names, "row0 + tid")
    rows = written_rows(a)
    return [
        *_load_rows(a, "Q", a.q, names["Q"], "h", "row0", "D"),
        *_load_rows(a, "DO", ab.d_o, names["DO"], "h", "row0", "DV"),
        "if (tid < T) {",
        f"  lse_s[tid] = row0 + tid < {rows} ? {lse} : NEG_INF;",
        f"  delta_s[tid] = row0 + tid < {rows} ? {delta} : 0.0f;",
        "}",
    ]


def _score_gradients(a: Attention) -> list[str]:
    """P (as dV takes it: dropped and rescaled under dropout) and dS of the T x T tile of rows
    ``row0 + r`` and keys ``kv0 + c`` (0 where masked)."""
    first, p_dv, ds = probability_gradients(a, "p", "dp", "delta_s[r]", "h", "row0 + r", "kv0 + c")
    return [
        "for (int x = tid; x < T * T; x += THREADS) {",
        "  const int r = x / T, c = x % T;",
        "  float dot = 0.0f;",
        "  for (int d = 0; d < D; ++d) dot += q_s[r][d] * k_s[c][d];",
        "  const float s = score(dot, row0 + r, kv0 + c, true);",
        "  float p_dv = 0.0f, ds = 0.0f;",
        "  if (s != NEG_INF && lse_s[r] != NEG_INF) {",
        "    const float p = exp2f(s - lse_s[r]);",
        "    float dp = 0.0f;",
        "    for (int d = 0; d < DV; ++d) dp += do_s[r][d] * v_s[c][d];",
        *(f"    {line}" for line in first),
        f"    p_dv = {p_dv};",
        f"    ds = {ds};",
        "  }",
        "  p_s[r][c] = p_dv;",
        "  ds_s[r][c] = ds;",
        "}",
    ]
