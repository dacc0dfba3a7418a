"""Flash attention forward on Hopper: warp-specialised, wgmma (sm_90a, fp16/bf16, head dims 64 and 128).

A work item is 128 query rows of one (batch, head); a block takes one (or, persistent, one
block per SM walks items blockIdx.x, + gridDim.x, ...: the producer loads the next item's Q
once the consumers' last wgmma read this one's, and its K/V as stages free, under the
consumers' last tile and their write of O). A block is three warpgroups:

- the producer copies the Q tile once, then each tile of BN keys of K and V, into a ring of
  up to four shared-memory stages in the 128-byte-swizzle layout the wgmma descriptors read:
  one thread issues TMA loads (boxes of 64 elements by the tile's rows, rows past the tensor
  zero-filled) completing on the stage's *full* mbarrier where TMA can describe Q, K and V
  (strides multiples of 16 bytes); otherwise its 128 threads copy with 16-byte ``cp.async``
  (element by element when a pointer is not 16-byte aligned), each arriving once its copies
  landed. The consumers release a stage on its *empty* mbarrier;
- two consumer warpgroups own 64 rows each: S = Q Kᵀ with ``wgmma`` (both operands in
  shared memory), scale / bias / masks and the online softmax in registers as the flash
  kernel does (base 2), then O += P V with P straight from the registers (the accumulator
  layout of S is the register A operand of the next wgmma) and V in shared memory.

Each consumer pipelines its key tiles: the scores and exponentials of tile j run while the
tensor cores finish P V of tile j - 1; and while one consumer runs its softmax the other's
wgmma keeps them busy. Rows, lengths, masks and the final write are the family's
(attention_problem.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.program import TensorMap
from graphdnn.symbolic import Extent, symbols_of, upper

from ..context import EmitContext, KernelParams, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..kernel import Kernel
from .attention_extents import work_count, work_grid, work_items
from .attention_flash import pack_function, vectorizable
from .attention_problem import (
    Attention,
    constants,
    coordinates,
    declare,
    dropout_function,
    dropped,
    element,
    key_range,
    key_row_address,
    needs_mask,
    o_pair_store,
    score_function,
    stats_store,
    stride_arrays,
    work_setup,
    written_rows,
)
from .attention_rotary import hopper_q_rotation
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .gemm_sm90 import ARCH, MAX_SHARED, wgmma_prelude
from .tensor_core import TENSOR_CORE_TYPES, OperandTypes
from .tma_prelude import mbarrier_prelude

BLOCK_M = 128
THREADS = 384
MAX_STAGES = 4
HEAD_DIMS = (64, 128)
BLOCK_NS = (64, 128)
ALIGN_SLACK = 1024
# an item's key tiles: from the BN-aligned tile holding kv_begin through kv_end
ITEM_TILES = (
    "const int first = kv_begin / BN * BN;",
    "const int tiles = kv_end > kv_begin ? (kv_end - first + BN - 1) / BN : 0;",
)
# named barriers of the two consumers' turns (0 is __syncthreads; gemm_ws's warpgroup_sync has 1 and 2)
TURN_BARRIERS = (3, 4)
ROTARY_BARRIER = 5  # and 6: a consumer's warps, once its rows of Q are rotated


@dataclass(frozen=True)
class WgmmaConfig:
    block_n: int  # keys per stage
    pingpong: bool  # the consumers take turns issuing their wgmma (named barriers)
    persistent: bool  # one block per SM walks the work items (else one block per item)

    def choice(self) -> dict[str, object]:
        return {"path": "wgmma", "block_n": self.block_n, "pingpong": self.pingpong, "persistent": self.persistent}


def block_ns(a: Attention) -> tuple[int, ...]:
    """Keys per stage: 128-key scores of a Dv-128 consumer plus dropout's Philox state spill
    (ptxas), so dropout at Dv 128 takes 64-key stages only."""
    return (64,) if a.dropout is not None and a.dv == 128 else BLOCK_NS


def default(a: Attention) -> WgmmaConfig:
    """The most keys per stage and one block per SM. The consumers take turns at head dim 64
    only: measured on an H100, turns gained 5% at D64 and lost 1-5% at D128 (benchmarks/RESULTS.md)."""
    return WgmmaConfig(block_n=max(block_ns(a)), pingpong=a.d == 64, persistent=not a.ragged)


def config(a: Attention, tuning: Mapping[str, object]) -> WgmmaConfig:
    """The configuration a tuning choice names; ``{"path": "wgmma"}`` alone is the default."""
    if set(tuning) == {"path"}:
        return default(a)
    choices = [c.choice() for c in configs(a)]
    if dict(tuning) not in choices:
        raise UnsupportedError(f"attention tuning {dict(tuning)} is not one of this problem's choices {choices}")
    return WgmmaConfig(int(tuning["block_n"]), bool(tuning["pingpong"]), bool(tuning["persistent"]))  # type: ignore[call-overload]


def configs(a: Attention) -> list[WgmmaConfig]:
    """Every configuration whose stages fit in shared memory (autotuning's candidates)."""
    return [
        WgmmaConfig(bn, pingpong, persistent)
        for bn in block_ns(a)
        for pingpong in (False, True)
        for persistent in ((False,) if a.ragged else (False, True))  # a packed item past its sequence exits the block
        if shared_bytes(a, bn) <= MAX_SHARED
    ]


def stages(a: Attention, bn: int) -> int:
    """As many K/V stages as fit beside the Q tile, up to MAX_STAGES."""
    fixed = 2 * BLOCK_M * a.d + 16 + ALIGN_SLACK
    return max(2, min(MAX_STAGES, (MAX_SHARED - fixed) // (2 * bn * (a.d + a.dv) + 16)))


def shared_bytes(a: Attention, bn: int) -> int:
    ring = stages(a, bn)
    return 2 * (BLOCK_M * a.d + ring * bn * (a.d + a.dv)) + 8 * (2 + 2 * ring) + ALIGN_SLACK


def supported(a: Attention, arch: int) -> bool:
    types = {a.q.data_type, a.k.data_type, a.v.data_type}
    return (
        arch == ARCH
        and not a.paged  # TMA boxes of rows cannot follow a page table
        and len(types) == 1
        and types <= TENSOR_CORE_TYPES
        and a.d in HEAD_DIMS
        and a.dv in HEAD_DIMS
        and vectorizable((a.q, a.k, a.v))
        and shared_bytes(a, default(a).block_n) <= MAX_SHARED
    )


def wgmma_attention_kernel(fused: FusedNode, ctx: EmitContext, a: Attention) -> Kernel:
    """The kernel for ``a`` with the tuning choice ``ctx.tuning`` (empty: the default)."""
    if not supported(a, ctx.arch):
        raise UnsupportedError(
            f"the Hopper attention kernel takes head dims {list(HEAD_DIMS)} with contiguous rows on sm_90; "
            f"not D={a.d}, Dv={a.dv} on sm_{ctx.arch}"
        )
    c = config(a, ctx.tuning) if ctx.tuning else default(a)
    bn = c.block_n
    params = KernelParams()
    maps = tensor_maps(a, bn)
    map_names = {
        role: params.scratch_map(a.rotated[role], m) if role in a.rotated else params.tensor_map(t, m, row_map_sizes(t))
        for role, (t, m) in maps.items()
    }
    declared = declare(a, params)
    names = declared.names
    aligned = params.aligned_flag()
    arrivals = 1 if maps else 128  # TMA: the one expect_tx arrival; cp.async: every producer thread
    elem = "bf16" if a.q.data_type is DataType.BFLOAT16 else "f16"
    item = [*work_setup(a, names, BLOCK_M, "work"), *key_range(a, BLOCK_M), *ITEM_TILES]
    body = [
        f"using T = {cuda_type(a.q.data_type)};",
        *_work_constants(a, bn),
        stride_arrays([("QS", a.q), ("KS", a.k), ("VS", a.v)]),
        *constants(a),
        "constexpr unsigned Q_BYTES = BM * D * 2, K_BYTES = BN * D * 2, V_BYTES = BN * DV * 2;",
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "const unsigned q_tile = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 1024-byte aligned: the swizzle's unit",
        "const unsigned kv_tiles = q_tile + Q_BYTES;  // per stage: K, then V",
        "const unsigned q_full = kv_tiles + STAGES * (K_BYTES + V_BYTES), q_empty = q_full + 8;",
        "const unsigned full = q_empty + 8, empty = full + 8 * STAGES;",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warpgroup = warp >> 2;",
        "if (tid == 0) {",
        f"  mbar_init(q_full, {arrivals});",
        "  mbar_init(q_empty, 8);  // every consumer warp, once its last wgmma read Q",
        "  for (int s = 0; s < STAGES; ++s) {",
        f"    mbar_init(full + 8 * s, {arrivals});",
        "    mbar_init(empty + 8 * s, 8);  // every consumer warp, once its wgmma read the stage",
        "  }",
        '  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
        "}",
        "__syncthreads();",
        "// work items blockIdx.x, + gridDim.x, ...: the producer loads the next item's Q and K/V",
        "// while the consumers finish this one; the ring's stage and phase run on across items",
        "int stage = 0;",
        "unsigned phase = 0;",
        "if (warpgroup == 0) {",
        '  asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\\n");',
        "  for (int work = blockIdx.x, item = 0; work < WORK; work += gridDim.x, ++item) {",
        *indent(item + (_tma_producer(a, map_names) if maps else _copy_producer(a, names, aligned)), 2).splitlines(),
        "  }",
        "} else {",
        '  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\\n");',
        *indent(_consumer(a, names, c, item, aligned, generic_writes=not maps), 1).splitlines(),
        "}",
    ]
    pattern = pattern_name(fused) + "_wgmma"
    functions = (
        ASYNC_COPY_PRELUDE
        + wgmma_prelude(bn, OperandTypes(a.q.data_type, a.q.data_type), 0)
        + wgmma_registers_a(a.dv, elem)
        + mbarrier_prelude(4 if maps else 0)
        + pack_function(a.q.data_type)
    )
    name, source = kernel_source(
        ctx, fused, pattern, params, THREADS, indent(body, 1), min_blocks=1, device_functions=functions
    )
    cap = sm_count(ctx.arch) if c.persistent else 2**31 - 1
    return Kernel(
        name,
        source,
        (min(work_items(a, BLOCK_M), cap), 1, 1),
        (THREADS, 1, 1),
        shared_bytes(a, bn),
        tuple(params.bindings),
        arch_suffix="a",
        blocks=work_grid(a, BLOCK_M, cap),
    )


def _work_constants(a: Attention, bn: int) -> list[str]:
    """BM, BN, STAGES and WORK, the work items: a constant, or this call's from the batch or Sq."""
    fixed = f"BM = {BLOCK_M}, BN = {bn}, STAGES = {stages(a, bn)}"
    if not a.is_dynamic and not a.dynamic_lengths:
        return [f"constexpr int {fixed}, WORK = {work_count(a, BLOCK_M)};"]
    return [f"constexpr int {fixed};", f"const int WORK = {work_count(a, BLOCK_M)};  // this call's"]


def tensor_maps(a: Attention, bn: int) -> dict[str, tuple[Tensor, TensorMap]]:
    """TMA maps of Q, K and V (boxes of 64 elements by BM or BN rows of one batch and head, in the
    128-byte swizzle), or none where the driver could not encode one of them. An operand the
    RoPE pre-pass rotated is mapped over its scratch (packed)."""
    maps = {
        "Q": (a.q, row_tensor_map(a.q, BLOCK_M)),
        "K": (a.k, row_tensor_map(a.k, bn)),
        "V": (a.v, row_tensor_map(a.v, bn)),
    }
    return {} if any(m.problems() for _, m in maps.values()) else maps


def row_tensor_map(t: Tensor, rows: int) -> TensorMap:
    """A map of boxes of 64 elements by ``rows`` rows of one batch and head (the 128-byte
    swizzle), for Hopper attention's TMA loads. Dims d, s, h, b innermost first. A size-1 dim's stride never moves the address: it is
    given as the packed one, which the driver accepts whatever the tensor's says."""
    dims, strides = _map_extents(t)
    return TensorMap(t.data_type.itemsize, tuple(map(upper, dims)), tuple(map(upper, strides)), (64, rows, 1, 1), 128)


def row_map_sizes(t: Tensor) -> tuple[Extent, ...]:
    """A dynamic graph's :func:`row_tensor_map` sizes (dims, then byte strides) as extents, resolved
    at each call (a symbolic batch); () where they are static."""
    dims, strides = _map_extents(t)
    return (*dims, *strides) if symbols_of([*dims, *strides]) else ()


def _map_extents(t: Tensor) -> tuple[tuple[Extent, ...], tuple[Extent, ...]]:
    size = t.data_type.itemsize
    dims = tuple(reversed(t.dim))
    strides: list[Extent] = []
    for axis, stride in enumerate(reversed(t.stride)):
        if axis:
            packed = (strides[-1] if strides else size) * dims[axis - 1]
            strides.append(packed if dims[axis] == 1 else stride * size)
    return dims, tuple(strides)


def _tma_producer(a: Attention, maps: dict[str, str]) -> list[str]:
    """One thread issues every load: a box per 64 columns of the head dim, completing on the
    stage's full barrier, whose expected bytes count the zero-filled rows too. The Q tile is
    refilled once the consumers' last wgmma of the previous item read it. A packed sequence's
    rows start at its first token (boxes may run into the next sequence's rows: masked)."""
    kv_rows, kv_batch = _tma_rows(a, "K", "kv0"), _tma_batch(a, "K")
    return [
        "if (tid == 0) {",
        "  if (item > 0) mbar_wait(q_empty, (item - 1) & 1);",
        "  mbar_expect_tx(q_full, Q_BYTES);",
        "  for (int j = 0; j < D / 64; ++j)",
        f"    tma_load(q_tile + j * (BM * 128), &{maps['Q']}, q_full, j * 64, {_tma_rows(a, 'Q', 'row0')}, h, {_tma_batch(a, 'Q')});",
        "  for (int tile = 0; tile < tiles; ++tile) {",
        "    const int kv0 = first + tile * BN;",
        "    const unsigned bar = full + 8 * stage, k_tile = kv_tiles + stage * (K_BYTES + V_BYTES);",
        "    mbar_wait(empty + 8 * stage, phase ^ 1);",
        "    mbar_expect_tx(bar, K_BYTES + V_BYTES);",
        "    for (int j = 0; j < D / 64; ++j)",
        f"      tma_load(k_tile + j * (BN * 128), &{maps['K']}, bar, j * 64, {kv_rows}, hk, {kv_batch});",
        "    for (int j = 0; j < DV / 64; ++j)",
        f"      tma_load(k_tile + K_BYTES + j * (BN * 128), &{maps['V']}, bar, j * 64, {kv_rows}, hk, {kv_batch});",
        "    if (++stage == STAGES) stage = 0, phase ^= 1;",
        "  }",
        "}",
    ]


def _tma_rows(a: Attention, role: str, row: str) -> str:
    """A box's first row coordinate: ``row`` of the batch's sequence (packed: from its first token)."""
    return coordinates(a, role, "0", row, "0")[2]


def _tma_batch(a: Attention, role: str) -> str:
    return coordinates(a, role, "0", "0", "0")[0]


def _copy_producer(a: Attention, names: dict[str, str], aligned: str) -> list[str]:
    """Rows into the swizzled layout (:func:`swizzled_row_copies`). Rows past the tensor (or past
    a packed sequence) are zeros."""
    key_rows = "skv" if a.ragged_kv is not None else "SKV"
    return [
        f"const T* const q_g = &{element(a.q, names['Q'], coordinates(a, 'Q', 'h', '0', '0'))};",
        f"const T* const k_g = {key_row_address(a, names, 'K', '0')};",
        f"const T* const v_g = {key_row_address(a, names, 'V', '0')};",
        *swizzled_row_copies(aligned, 128),
        "// a thread's arrival once its copies landed (cp.async), or after its plain stores",
        "auto arrive = [&](unsigned bar) {",
        f"  if ({aligned}) {{",
        '    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\\n" ::"r"(bar) : "memory");',
        "  } else {",
        "    mbar_arrive(bar);",
        "  }",
        "};",
        "if (item > 0) mbar_wait(q_empty, (item - 1) & 1);  // the previous item's Q is read",
        f"load_rows(q_tile, q_g + (long long)row0 * QS[2], QS[2], BM, min(BM, {written_rows(a)} - row0), D);",
        "arrive(q_full);",
        "for (int tile = 0; tile < tiles; ++tile) {",
        "  const int kv0 = first + tile * BN;",
        "  mbar_wait(empty + 8 * stage, phase ^ 1);",
        "  const unsigned k_tile = kv_tiles + stage * (K_BYTES + V_BYTES);",
        f"  load_rows(k_tile, k_g + (long long)kv0 * KS[2], KS[2], BN, min(BN, {key_rows} - kv0), D);",
        f"  load_rows(k_tile + K_BYTES, v_g + (long long)kv0 * VS[2], VS[2], BN, min(BN, {key_rows} - kv0), DV);",
        "  arrive(full + 8 * stage);",
        "  if (++stage == STAGES) stage = 0, phase ^= 1;",
        "}",
    ]


def swizzled_row_copies(aligned: str, threads: int) -> list[str]:
    """``load_rows(dst, src, rs, rows, valid, width)``: ``threads`` threads (``tid`` 0 ..) copy
    ``rows`` rows of ``width`` elements (row stride ``rs``) into the 128-byte-swizzle layout at
    ``dst``: row r's 16-byte chunk c of its 64-element block c / 8 sits at block * (rows * 128) +
    r * 128 + ((c % 8) ^ (r % 8)) * 16; rows from ``valid`` on are zeros. With 16-byte aligned
    rows (``aligned``) by cp.async, else element by element."""
    return [
        "auto load_rows = [&](unsigned dst, const T* src, long long rs, int rows, int valid, int width) {",
        "  const int chunks = width / 8;",
        f"  for (int c = tid; c < rows * chunks; c += {threads}) {{",
        "    const int r = c / chunks, k = c % chunks;",
        "    const bool ok = r < valid;",
        "    const unsigned at = dst + (k >> 3) * (rows * 128) + r * 128 + (((k & 7) ^ (r & 7)) << 4);",
        "    const T* const from = ok ? src + r * rs + k * 8 : src;",
        f"    if ({aligned}) {{",
        "      copy16(at, from, ok);",
        "    } else {  // unaligned rows: the same 16 bytes, element by element",
        "      gd::Vec<T, 8> chunk;",
        "#pragma unroll",
        "      for (int e = 0; e < 8; ++e) chunk.v[e] = ok ? from[e] : gd::from<T>(0.0f);",
        "      gd::store_vec<T, 8>(reinterpret_cast<T*>(smem_raw + (at - smem_addr(smem_raw))), chunk);",
        "    }",
        "  }",
        "};",
    ]


def _consumer(
    a: Attention, names: dict[str, str], c: WgmmaConfig, item: list[str], aligned: str, generic_writes: bool
) -> list[str]:
    """Software-pipelined over key tiles: S_j = Q K_jᵀ is issued with P_{j-1} V_{j-1} behind it;
    once S_j is in, its scores and exponentials run while the tensor cores finish P_{j-1} V_{j-1};
    then O is rescaled and P_j packed for the next round. With ``c.pingpong`` the two consumers
    take turns issuing (a named barrier each, opened by the other's arrival), so that one's
    softmax runs while the tensor cores work on the other's products. ``item``: the lines that
    set up a work item (``work``). ``generic_writes``: the tiles were written by cp.async (the
    generic proxy), which wgmma's reads (the async proxy) must be fenced against; TMA writes
    through the async proxy already."""
    bn = c.block_n
    fence = ['asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");'] if generic_writes else []
    stats = stats_store(a, names, "i", "live ? m[r] * TO_LOG2 + log2f(sum) : NEG_INF")
    pair = ("live ? o[4 * j + 2 * r] * inv : 0.0f", "live ? o[4 * j + 2 * r + 1] * inv : 0.0f")
    mine, other = TURN_BARRIERS
    turns = [
        "// turns: wait at this consumer's barrier (opened by the other's arrival), then open the other's",
        f'auto turn_begin = [&]() {{ asm volatile("bar.sync %0, 256;\\n" ::"r"({mine} + consumer) : "memory"); }};',
        f'auto turn_end = [&]() {{ asm volatile("bar.arrive %0, 256;\\n" ::"r"({other} - consumer) : "memory"); }};',
    ]
    begin, end = (["turn_begin();"], ["turn_end();"]) if c.pingpong else ([], [])
    per_item = [
        *item,
        *score_function(a, names, fold=True),
        *dropout_function(a),
        *(["if (consumer == 1) turn_end();  // consumer 0 goes first"] if c.pingpong else []),
        "// this thread's rows: row_base and row_base + 8 (wgmma fragment: warp w of the warpgroup",
        "// holds rows 16w..16w+15; acc[4j + 2r + e] is row lane/4 + 8r, column 8j + 2 (lane % 4) + e)",
        "const int row_base = row0 + consumer * 64 + (warp & 3) * 16 + (lane >> 2);",
        "float o[DV / 2], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, correction[2];",
        "unsigned p[BN / 16][4];  // P of the previous tile: the A operand of its P V",
        "#pragma unroll",
        "for (int i = 0; i < DV / 2; ++i) o[i] = 0.0f;",
        "mbar_wait(q_full, item & 1);",
        *fence,
        *hopper_q_rotation(a, ROTARY_BARRIER),
        "const unsigned q_rows = q_tile + consumer * (64 * 128);",
        "// P_{j-1} V_{j-1} into O, V from the stage at v_tile (not waited for)",
        "auto issue_pv = [&](unsigned v_tile) {",
        "  wgmma_fence();",
        "#pragma unroll",
        "  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, p[kk], wgmma_descriptor(v_tile + kk * 2048, BN * 128, 1024));",
        "  wgmma_commit();",
        "};",
        "float s[BN / 2];  // S of the current tile, then its P in fp32",
        "// S = Q Kᵀ for the key tile at k_tile (committed, not waited for)",
        "auto issue_s = [&](unsigned k_tile) {",
        "#pragma unroll",
        "  for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;",
        "  fence_accumulators(s);",
        "  wgmma_fence();",
        "#pragma unroll",
        "  for (int kk = 0; kk < D / 16; ++kk)  // 64-element blocks of the head dim, 4 k16 steps each",
        "    wgmma_step(s, wgmma_descriptor(q_rows + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024),",
        "              wgmma_descriptor(k_tile + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024));",
        "  wgmma_commit();",
        "};",
        "// scale, bias, masks and the online softmax of the tile of keys from kv0 (S is in)",
        "auto softmax = [&](int kv0) {",
        "  fence_accumulators(s);",
        f"  const bool masked = {needs_mask(a, BLOCK_M, bn)};",
        "#pragma unroll",
        "  for (int j = 0; j < BN / 8; ++j)",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e)",
        "      s[4 * j + e] = score(s[4 * j + e], row_base + ((e >> 1) << 3), kv0 + j * 8 + (lane & 3) * 2 + (e & 1), masked);",
        *indent(_online_softmax(), 1).splitlines(),
        *indent(_dropout(a), 1).splitlines(),
        "};",
        "// O to the new maxima (no P V in flight), then P as the next P V's A operand",
        "auto rescale_and_pack = [&]() {",
        "#pragma unroll",
        "  for (int r = 0; r < 2; ++r)",
        "#pragma unroll",
        "    for (int j = 0; j < DV / 8; ++j) {",
        "      o[4 * j + 2 * r] *= correction[r];",
        "      o[4 * j + 2 * r + 1] *= correction[r];",
        "    }",
        "#pragma unroll",
        "  for (int kk = 0; kk < BN / 16; ++kk) {  // P's k16 step kk: S chunks 2kk and 2kk + 1",
        "    p[kk][0] = pack2(s[8 * kk], s[8 * kk + 1]);",
        "    p[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);",
        "    p[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);",
        "    p[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);",
        "  }",
        "};",
        "auto k_tile_of = [&](int stage) { return kv_tiles + stage * (K_BYTES + V_BYTES); };",
        "int previous = stage;",
        "auto next_stage = [&]() {",
        "  previous = stage;",
        "  if (++stage == STAGES) stage = 0, phase ^= 1;",
        "};",
        "if (tiles > 0) {",
        "  mbar_wait(full + 8 * stage, phase);",
        *("  " + line for line in fence),
        *("  " + line for line in begin),
        "  issue_s(k_tile_of(stage));",
        *("  " + line for line in end),
        "  wgmma_wait<0>();",
        "  softmax(first);",
        "  rescale_and_pack();",
        "  next_stage();",
        "}",
        "for (int tile = 1; tile < tiles; ++tile) {",
        "  mbar_wait(full + 8 * stage, phase);",
        *("  " + line for line in fence),
        *("  " + line for line in begin),
        "  issue_s(k_tile_of(stage));",
        "  issue_pv(k_tile_of(previous) + K_BYTES);  // P_{j-1} V_{j-1}, behind S_j",
        *("  " + line for line in end),
        "  wgmma_wait<1>();  // S_j is in; P_{j-1} V_{j-1} may still run",
        "  softmax(first + tile * BN);",
        "  wgmma_wait<0>();",
        "  fence_accumulators(o);",
        "  if (lane == 0) mbar_arrive(empty + 8 * previous);  // K and V of tile j-1 are read",
        "  rescale_and_pack();",
        "  next_stage();",
        "}",
        "if (tiles > 0) {",
        *("  " + line for line in begin),
        "  issue_pv(k_tile_of(previous) + K_BYTES);",
        *("  " + line for line in end),
        "  wgmma_wait<0>();",
        "  fence_accumulators(o);",
        "  if (lane == 0) mbar_arrive(empty + 8 * previous);",
        "}",
        "if (lane == 0) mbar_arrive(q_empty);  // Q is read: the producer may load the next item's",
        *(["if (consumer == 0) turn_begin();  // the last of consumer 1's arrivals"] if c.pingpong else []),
        "#pragma unroll",
        "for (int r = 0; r < 2; ++r) {",
        "  float sum = l[r];",
        "  sum += __shfl_xor_sync(0xffffffffu, sum, 1);",
        "  sum += __shfl_xor_sync(0xffffffffu, sum, 2);",
        "  const int i = row_base + r * 8;",
        f"  if (i >= {written_rows(a)}) continue;",
        "  const bool live = i < sq && sum > 0.0f;",
        "  const float inv = live ? 1.0f / sum : 0.0f;",
        "#pragma unroll",
        "  for (int j = 0; j < DV / 8; ++j) {",
        "    const int col = j * 8 + (lane & 3) * 2;",
        *indent(o_pair_store(a, names, "i", "col", pair, aligned), 2).splitlines(),
        "  }",
        *("  if ((lane & 3) == 0) " + line for line in stats),
        "}",
    ]
    return [
        "const int consumer = warpgroup - 1;  // rows consumer * 64 .. + 63 of the block",
        *(turns if c.pingpong else []),
        "for (int work = blockIdx.x, item = 0; work < WORK; work += gridDim.x, ++item) {",
        *indent(per_item, 1).splitlines(),
        "}",
    ]


def _dropout(a: Attention) -> list[str]:
    """P's dropped elements to 0 before it is packed for P V (the row sums already hold them)."""
    if a.dropout is None:
        return []
    element = "s[4 * j + e]"
    row, key = "row_base + ((e >> 1) << 3)", "kv0 + j * 8 + (lane & 3) * 2 + (e & 1)"
    return [
        "#pragma unroll",
        "for (int j = 0; j < BN / 8; ++j)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e)",
        f"    {element} = {dropped(a, element, 'h', row, key)};",
    ]


def _online_softmax() -> list[str]:
    """New row maxima (over the quad of lanes sharing a row), the rescale of l (O's factor in
    ``correction``), P = 2^(S - max) with S and the maxima in raw units times ``TO_LOG2``."""
    return [
        "#pragma unroll",
        "for (int r = 0; r < 2; ++r) {",
        "  float mx = m[r];",
        "#pragma unroll",
        "  for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));",
        "  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));",
        "  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));",
        "  // in log2 units; a row with nothing visible yet stays at 0",
        "  const float base = mx == NEG_INF ? 0.0f : mx * TO_LOG2;",
        "  correction[r] = gd::exp2_approx(fmaf(m[r], TO_LOG2, -base));  // O's rescale waits for the P V in flight",
        "  m[r] = mx;",
        "  l[r] *= correction[r];",
        "#pragma unroll",
        "  for (int j = 0; j < BN / 8; ++j) {",
        "    s[4 * j + 2 * r] = gd::exp2_approx(fmaf(s[4 * j + 2 * r], TO_LOG2, -base));",
        "    s[4 * j + 2 * r + 1] = gd::exp2_approx(fmaf(s[4 * j + 2 * r + 1], TO_LOG2, -base));",
        "    l[r] += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];",
        "  }",
        "}",
    ]


def wgmma_registers_a(n: int, elem: str, name: str = "wgmma_rs", transpose_b: int = 1) -> str:
    """``name``: d (64 x n fp32) += A (64 x 16, four registers per thread) * B (16 x n from
    shared memory; n contiguous with the transpose bit ``transpose_b``, else k contiguous)."""
    count = n // 2
    outputs = ", ".join(f"%{i}" for i in range(count))
    constraints = ",\n                 ".join(
        ", ".join(f'"+f"(d[{i}])' for i in range(row, min(row + 8, count))) for row in range(0, count, 8)
    )
    return f"""
__device__ __forceinline__ void {name}(float (&d)[{count}], const unsigned (&a)[4], unsigned long long b) {{
  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{elem}.{elem} "
               "{{{outputs}}}, {{%{count}, %{count + 1}, %{count + 2}, %{count + 3}}}, %{count + 4}, 1, 1, 1, {transpose_b};\\n"
               : {constraints}
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
               : "memory");
}}
"""
