"""Attention backward on Hopper: wgmma (sm_90a), fp16/bf16, head dims 64 and 128 (D = Dv), no
mask or a causal one (either alignment), MHA, GQA and MQA, in FlashAttention-3's shape
(attention_backward_tile.py: the block, the tile's products, dQ's bulk reductions); the problem
checks every Hopper backward kernel shares (its memory passes: attention_backward_passes.py).

This module's dK/dV kernel has no warp specialisation: every thread copies the next query tile's
Q and dO (cp.async, the forward's swizzled row copies) while the current one is computed, two
stages, and two block barriers per tile keep the warpgroups in step (the copies landed; both
warpgroups' dS stored). attention_backward_ws.py feeds the same tile work from a producer
warpgroup instead.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..kernel import Kernel
from .attention_backward_problem import AttentionBackward, declare, row_statistics
from .attention_backward_tile import (
    BN,
    BQ,
    DQ_STAGE_BYTES,
    HEAD_DIMS,
    accumulators,
    block_setup,
    blocks,
    device_functions,
    dq_share,
    gradient_stores,
    tile_products,
)
from .attention_flash import vectorizable
from .attention_problem import Attention, coordinates, element, strides
from .attention_wgmma import swizzled_row_copies
from .gemm_sm90 import ALIGN_SLACK, ARCH, MAX_SHARED
from .tensor_core import TENSOR_CORE_TYPES

THREADS = 256
STAGES = 2  # query tiles in shared memory: the one computed and the one being copied


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
    return 2 * (2 * BN * d + STAGES * 2 * BQ * d + BQ * BN) + DQ_STAGE_BYTES + ALIGN_SLACK


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """dK and dV of a block of keys, and its share of dQ added into ``dq_accum``."""
    a = ab.problem
    assert unsupported(ab, ctx.arch) is None and shared_bytes(a.d) <= MAX_SHARED
    declared = declare(ab, dq_accum=True)
    names, params = declared.names, declared.params
    aligned = params.aligned_flag()
    lse, delta = row_statistics(ab, names, "row", "head")

    def rows_of(role: str, head: str, row: str) -> str:
        return f"&{element(tensor_of(ab, role), names[role], coordinates(a, role, head, row, '0'))}"

    body = [
        f"using T = {cuda_type(a.q.data_type)};",
        f"constexpr int BN = {BN}, BQ = {BQ}, STAGES = {STAGES}, THREADS = {THREADS};",
        f"constexpr long long QS[4] = {{{strides(a.q)}}}, KS[4] = {{{strides(a.k)}}}, VS[4] = {{{strides(a.v)}}};",
        f"constexpr long long OS[4] = {{{strides(ab.d_o)}}};  // dO's",
        *block_setup(a, names),
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "const unsigned k_tile = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 1024-byte aligned: the swizzle's unit",
        "const unsigned v_tile = k_tile + K_BYTES, q_tiles = v_tile + V_BYTES, o_tiles = q_tiles + STAGES * Q_BYTES;",
        "const unsigned ds_s = o_tiles + STAGES * O_BYTES;",
        "const unsigned dq_stage = ds_s + DS_BYTES;  // per warpgroup: 64 rows of DQ_ROW floats",
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
        "// tile's products and stored at its end",
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
        *accumulators(),
        "for (int t = 0; t < total; ++t) {",
        *indent(_iteration(a, names), 1).splitlines(),
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        *gradient_stores(ab, names, aligned),
    ]
    pattern = pattern_name(fused) + "_dkdv_wgmma"
    functions = device_functions(a, 0, kv_registers=False)
    name, source = kernel_source(
        ctx, fused, pattern, params, THREADS, indent(body, 1), min_blocks=1, device_functions=functions
    )
    return Kernel(
        name, source, (blocks(a), 1, 1), (THREADS, 1, 1), shared_bytes(a.d), tuple(params.bindings), arch_suffix="a"
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
        *tile_products(a, kv_registers=False),
        *dq_share(names, []),
        "if (t + 1 < total) store_statistics(t + 1);  // its stage's were read in tile t - 1",
    ]


def tensor_of(ab: AttentionBackward, role: str) -> Tensor:
    return {"Q": ab.problem.q, "K": ab.problem.k, "V": ab.problem.v, "DO": ab.d_o}[role]
