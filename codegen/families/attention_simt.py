"""Attention forward without tensor cores, for what the flash kernel cannot take (fp32 or mixed
input types): correct for every case, not fast.

One warp per query row. The row of Q sits in shared memory as floats; the warp walks the
visible keys 32 at a time, lane j computing the score of key kv0 + j, then updates the
row's running maximum and sum (online softmax, base 2) and accumulates P V with each lane
owning the columns lane, lane + 32, ... of O.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import load
from ..kernel import Kernel
from .attention_extents import work_grid, work_items
from .attention_problem import (
    Attention,
    block_setup,
    coordinates,
    declare,
    dropout_function,
    dropped,
    element,
    key_range,
    o_store,
    score_function,
    stats_store,
    written_rows,
)

WARPS = 4


def simt_kernel(fused: FusedNode, ctx: EmitContext, a: Attention) -> Kernel:
    declared = declare(a)
    names, params = declared.names, declared.params
    columns = -(-a.dv // 32)

    def value(role: str, tensor: Tensor, head: str, row: str, col: str) -> str:
        return load(tensor.data_type, element(tensor, names[role], coordinates(a, role, head, row, col)), "float")

    body = [
        *block_setup(a, names, WARPS),
        *key_range(a, WARPS),
        *score_function(a, names),
        *dropout_function(a),
        f"__shared__ float q_s[{WARPS}][{a.d}];",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        "const int i = row0 + warp;",
        f"if (i >= {written_rows(a)}) return;",
        "for (int d = lane; d < D; d += 32) q_s[warp][d] = " + value("Q", a.q, "h", "i", "d") + ";",
        "__syncwarp();",
        f"float o[{columns}], m = NEG_INF, l = 0.0f;",
        "#pragma unroll",
        f"for (int c = 0; c < {columns}; ++c) o[c] = 0.0f;",
        "for (int kv0 = kv_begin; kv0 < kv_end; kv0 += 32) {",
        "  const int j = kv0 + lane;",
        "  float x = NEG_INF;",
        "  if (j < kv_end) {",
        "    float dot = 0.0f;",
        "    for (int d = 0; d < D; ++d) dot += q_s[warp][d] * " + value("K", a.k, "hk", "j", "d") + ";",
        "    x = score(dot, i, j, true);",
        "  }",
        "  const float mx = fmaxf(m, gd::lanes_max<32>(x));",
        "  const float base = mx == NEG_INF ? 0.0f : mx;",
        "  const float correction = gd::exp2_approx(m - base);",
        "  const float p = gd::exp2_approx(x - base);",
        "  m = mx;",
        "  l = l * correction + gd::lanes_sum<32>(p);",
        f"  const float pv = {dropped(a, 'p', 'h', 'i', 'j')};  // what P V adds",
        "#pragma unroll",
        f"  for (int c = 0; c < {columns}; ++c) o[c] *= correction;",
        "  for (int jj = 0; jj < 32 && kv0 + jj < kv_end; ++jj) {",
        "    const float pj = __shfl_sync(0xffffffffu, pv, jj);",
        "    if (pj == 0.0f) continue;",
        "#pragma unroll",
        f"    for (int c = 0; c < {columns}; ++c) {{",
        "      const int d = lane + 32 * c;",
        "      if (d < DV) o[c] += pj * " + value("V", a.v, "hk", "kv0 + jj", "d") + ";",
        "    }",
        "  }",
        "}",
        "const bool live = i < sq && l > 0.0f;",
        "const float inv = live ? 1.0f / l : 0.0f;",
        "#pragma unroll",
        f"for (int c = 0; c < {columns}; ++c) {{",
        "  const int d = lane + 32 * c;",
        f"  if (d < DV) {o_store(a, names, 'i', 'd', 'live ? o[c] * inv : 0.0f')}",
        "}",
        *("if (lane == 0) " + line for line in stats_store(a, names, "i", "live ? m + log2f(l) : NEG_INF")),
    ]
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_simt", params, 32 * WARPS, indent(body, 1))
    blocks = work_items(a, WARPS)
    grid = work_grid(a, WARPS)
    return Kernel(name, source, (blocks, 1, 1), (32 * WARPS, 1, 1), 0, tuple(params.bindings), blocks=grid)
