"""Attention backward on Hopper, warp-specialised: the dK/dV kernel of attention_backward_wgmma.py
(same problems, same tile work: attention_backward_tile.py) with a producer warpgroup, as
FlashAttention-3's backward is built.

A block is three warpgroups. The producer's first warp has one thread issue TMA loads: K and V
once, then each query tile's Q and dO (boxes of 64 elements by 64 rows, the 128-byte swizzle;
rows past the sequence zero-filled) into a ring of stages, completing on the stage's *full*
mbarrier; its second warp reads the tile's lse and delta (two rows a lane) into the stage and
arrives there too. The two consumer warpgroups (64 keys each, with the producer's registers:
``setmaxnreg``) wait on *full*, compute the tile and release the stage on its *empty* mbarrier
once dV's and dK's products have read it. dS is double-buffered, so that the only barrier
between the consumers in a tile is the one at which both have stored it (D 128; at D 64 each
reads its own), and one more before the epilogue. The consumers never copy and never wait for
one another's copies. :class:`Consumers` names the variants of their tile work: 128-row query
tiles at D 64, K and V in registers, and at D 128 dQ's product a tile behind (no barrier of
both warpgroups per tile), optionally with the warpgroups taking turns.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.program import TensorMap

from ..context import EmitContext, KernelParams, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..kernel import Kernel
from . import attention_backward_tile as tile
from . import attention_backward_wgmma
from .attention_backward_problem import AttentionBackward, declare, row_statistics
from .attention_wgmma import row_tensor_map
from .gemm_sm90 import ALIGN_SLACK, MAX_SHARED

THREADS = 384  # the producer warpgroup, then the two consumers
MAX_STAGES = 4
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # 128 x 40 + 256 x 232 = 384 x 168, the launch's registers
KV_REGISTERS_HEAD_DIM = 64  # K and V fragments in registers: 32 more a consumer thread, too many at D 128
WIDE_HEAD_DIM = 64  # 128-row query tiles: Sᵀ and dPᵀ 64 floats a thread each, too many beside D 128's dK and dV


@dataclass(frozen=True)
class Consumers:
    """How the consumer warpgroups work a query tile: ``rows`` per tile (tile.WIDE_BQ at head dim
    64 only: Sᵀ and dPᵀ take twice the registers); ``kv_registers`` (head dim 64, 64-row tiles)
    Sᵀ's and dPᵀ's products take K and V from registers, loaded once; ``dq_behind`` (head dim 128)
    dQ's product a tile behind, over a ring of tile.DS_RING dS buffers, so that the warpgroups
    never wait for each other's dS of the current tile (tile.dq_share_behind), and with it
    ``pingpong``: they take turns to issue Sᵀ and dPᵀ."""

    rows: int = tile.BQ
    kv_registers: bool = False
    dq_behind: bool = False
    pingpong: bool = False  # with dq_behind: the warpgroups take turns to issue Sᵀ and dPᵀ (tile.turns)

    @property
    def packed_p(self) -> bool:
        """dS from the packed P (tile._ds_values): where the registers would not hold the rest."""
        return self.rows != tile.BQ

    @property
    def ds_buffers(self) -> int:
        return tile.DS_RING if self.dq_behind else 2

    @property
    def suffix(self) -> str:
        """The kernel name's ending."""
        if self.kv_registers:
            return "_kv"
        if self.rows != tile.BQ:
            return "_wide"
        return "_pingpong" if self.pingpong else "_behind" if self.dq_behind else ""

    def problem(self, d: int) -> str | None:
        """Why the head dim ``d`` cannot take these consumers (None: it can)."""
        if self.kv_registers and (d != KV_REGISTERS_HEAD_DIM or self.rows != tile.BQ or self.dq_behind):
            return f"K and V stay in registers at head dim {KV_REGISTERS_HEAD_DIM} only, not {d} (too few registers)"
        if self.rows != tile.BQ and (d != WIDE_HEAD_DIM or self.rows != tile.WIDE_BQ):
            return f"128-row query tiles are for head dim {WIDE_HEAD_DIM} only, not {d} (too few registers)"
        if self.dq_behind and (d != 128 or self.rows != tile.BQ):
            return f"dQ's product a tile behind is for head dim 128 only, not {d} (too little shared memory)"
        if self.pingpong and not self.dq_behind:
            return "the warpgroups take turns only with dQ's product a tile behind"
        return None


def shared_bytes(d: int, stages: int, consumers: Consumers = Consumers()) -> int:
    """K and V, ``stages`` of Q and dO, the dS tiles, the staged dQ partials, the mbarriers."""
    bq, buffers = consumers.rows, consumers.ds_buffers
    return (
        2 * (2 * tile.BN * d + stages * 2 * bq * d + buffers * bq * tile.BN)
        + tile.DQ_STAGE_BYTES
        + 8 * (1 + 2 * stages + (2 * buffers if consumers.dq_behind else 0))
        + ALIGN_SLACK
    )


def stages(d: int, consumers: Consumers = Consumers()) -> int:
    """As many query-tile stages as fit, up to MAX_STAGES (2 at D 128, 4 at D 64; 2 with 128-row
    tiles)."""
    return max(s for s in range(2, MAX_STAGES + 1) if s == 2 or shared_bytes(d, s, consumers) <= MAX_SHARED)


def tensor_maps(ab: AttentionBackward, bq: int = tile.BQ) -> dict[str, tuple[Tensor, TensorMap]]:
    """TMA maps of Q and dO (boxes of ``bq`` rows) and K and V (BN rows). The wgmma kernels take rows
    that copy as 16-byte chunks only, so that every stride is a multiple of 16 bytes: the driver
    encodes them (binding copies a tensor whose address is not aligned)."""
    a = ab.problem
    maps = {
        "Q": (a.q, row_tensor_map(a.q, bq)),
        "DO": (ab.d_o, row_tensor_map(ab.d_o, bq)),
        "K": (a.k, row_tensor_map(a.k, tile.BN)),
        "V": (a.v, row_tensor_map(a.v, tile.BN)),
    }
    assert not any(m.problems() for _, m in maps.values())
    return maps


def dkdv_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward, consumers: Consumers) -> Kernel:
    """dK and dV of a block of keys, and its share of dQ added into ``dq_accum``, the tiles worked
    as ``consumers`` says."""
    a = ab.problem
    ring, bq = stages(a.d, consumers), consumers.rows
    assert attention_backward_wgmma.unsupported(ab, ctx.arch) is None and consumers.problem(a.d) is None
    assert shared_bytes(a.d, ring, consumers) <= MAX_SHARED
    params = KernelParams()
    maps = {role: params.tensor_map(t, m) for role, (t, m) in tensor_maps(ab, bq).items()}
    names = declare(ab, dq_accum=True, params=params).names
    aligned = params.aligned_flag()
    barriers = ["const unsigned kv_full = dq_stage + DQ_STAGE_BYTES, full = kv_full + 8, empty = full + 8 * STAGES;"]
    inits = []
    if consumers.dq_behind:
        barriers.append("const unsigned ds_full = empty + 8 * STAGES, ds_empty = ds_full + 8 * DS_RING;")
        inits = [
            "  for (int s = 0; s < DS_RING; ++s) {",
            "    mbar_init(ds_full + 8 * s, 8);  // every consumer warp, once its dS of the tile is stored",
            "    mbar_init(ds_empty + 8 * s, 8);  // every consumer warp, once its dQ product read the buffer",
            "  }",
        ]
    body = [
        f"using T = {cuda_type(a.q.data_type)};",
        f"constexpr int BN = {tile.BN}, BQ = {bq}, STAGES = {ring}, DS_RING = {consumers.ds_buffers};",
        f"constexpr unsigned DQ_STAGE_BYTES = {tile.DQ_STAGE_BYTES};",
        *tile.block_setup(a, names, bq),
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "const unsigned k_tile = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 1024-byte aligned: the swizzle's unit",
        "const unsigned v_tile = k_tile + K_BYTES, q_tiles = v_tile + V_BYTES, o_tiles = q_tiles + STAGES * Q_BYTES;",
        "const unsigned ds_tiles = o_tiles + STAGES * O_BYTES;  // tile t's dS at ds_tiles + (t % DS_RING) * DS_BYTES",
        "const unsigned dq_stage = ds_tiles + DS_RING * DS_BYTES;  // per warpgroup: 64 rows of DQ_ROW floats",
        *barriers,
        "__shared__ float lse_s[STAGES][BQ], delta_s[STAGES][BQ];",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warpgroup = warp >> 2;",
        "if (tid == 0) {",
        "  mbar_init(kv_full, 1);",
        "  for (int s = 0; s < STAGES; ++s) {",
        "    mbar_init(full + 8 * s, 1 + 32);  // the TMA thread's expect_tx, the statistics warp's lanes",
        "    mbar_init(empty + 8 * s, 8);  // every consumer warp, once dV's and dK's products read the stage",
        "  }",
        *inits,
        '  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
        "}",
        "__syncthreads();",
        "if (warpgroup == 0) {",
        f'  asm volatile("setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGISTERS};\\n");',
        *indent(_producer(ab, names, maps), 1).splitlines(),
        "} else {",
        f'  asm volatile("setmaxnreg.inc.sync.aligned.u32 {CONSUMER_REGISTERS};\\n");',
        "  const int wg = warpgroup - 1;  // keys wg * 64 .. + 63 of the block",
        *indent(_consumer(ab, names, consumers, aligned), 1).splitlines(),
        "}",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_dkdv_wgmma_ws" + consumers.suffix,
        params,
        THREADS,
        indent(body, 1),
        min_blocks=1,
        device_functions=tile.device_functions(a, 4, consumers.kv_registers, bq, consumers.packed_p),
    )
    return Kernel(
        name,
        source,
        (tile.blocks(a), 1, 1),
        (THREADS, 1, 1),
        shared_bytes(a.d, ring, consumers),
        tuple(params.bindings),
        arch_suffix="a",
    )


def _producer(ab: AttentionBackward, names: dict[str, str], maps: dict[str, str]) -> list[str]:
    """Warp 0's first thread: TMA loads; warp 1: the statistics (BQ / 32 rows a lane). Both wait for the stage's
    *empty* phase before they fill it (the first pass finds every stage free)."""
    lse, delta = row_statistics(ab, names, "row", "head")
    return [
        "if (tid == 0) {",
        "  mbar_expect_tx(kv_full, K_BYTES + V_BYTES);",
        "  for (int j = 0; j < D / 64; ++j)",
        f"    tma_load(k_tile + j * (BN * 128), &{maps['K']}, kv_full, j * 64, kv0, hk, b);",
        "  for (int j = 0; j < DV / 64; ++j)",
        f"    tma_load(v_tile + j * (BN * 128), &{maps['V']}, kv_full, j * 64, kv0, hk, b);",
        "  for (int t = 0; t < total; ++t) {",
        "    const int stage = t % STAGES, head = hk * GROUP + t / tiles, row0 = q_first + (t % tiles) * BQ;",
        "    const unsigned bar = full + 8 * stage;",
        "    mbar_wait(empty + 8 * stage, ((t / STAGES) & 1) ^ 1);",
        "    mbar_expect_tx(bar, Q_BYTES + O_BYTES);",
        "    for (int j = 0; j < D / 64; ++j)",
        f"      tma_load(q_tiles + stage * Q_BYTES + j * (BQ * 128), &{maps['Q']}, bar, j * 64, row0, head, b);",
        "    for (int j = 0; j < DV / 64; ++j)",
        f"      tma_load(o_tiles + stage * O_BYTES + j * (BQ * 128), &{maps['DO']}, bar, j * 64, row0, head, b);",
        "  }",
        "} else if (warp == 1) {",
        "  for (int t = 0; t < total; ++t) {",
        "    const int stage = t % STAGES, head = hk * GROUP + t / tiles;",
        "    float lse_v[BQ / 32], delta_v[BQ / 32];  // rows lane, lane + 32 .. of the tile, read before the stage frees",
        "#pragma unroll",
        "    for (int part = 0; part < BQ / 32; ++part) {",
        "      const int row = q_first + (t % tiles) * BQ + lane + 32 * part;",
        f"      lse_v[part] = row < SQ ? {lse} : NEG_INF;",
        f"      delta_v[part] = row < SQ ? {delta} : 0.0f;",
        "    }",
        "    mbar_wait(empty + 8 * stage, ((t / STAGES) & 1) ^ 1);",
        "#pragma unroll",
        "    for (int part = 0; part < BQ / 32; ++part)",
        "      lse_s[stage][lane + 32 * part] = lse_v[part], delta_s[stage][lane + 32 * part] = delta_v[part];",
        "    mbar_arrive(full + 8 * stage);",
        "  }",
        "}",
    ]


def _consumer(ab: AttentionBackward, names: dict[str, str], consumers: Consumers, aligned: str) -> list[str]:
    """The tiles as they land; the stage released as soon as dV's and dK's products are done."""
    release = ["if (lane == 0) mbar_arrive(empty + 8 * stage);  // Q, dO, lse and delta are read"]
    if consumers.dq_behind:
        share, last, wait = tile.dq_share_behind(names, release), tile.dq_last(names), tile.ds_buffer_wait()
    else:
        share, last, wait = tile.dq_share(names, release), [], []
    turn, issued, after = tile.turns() if consumers.pingpong else ([], (), [])
    products = tile.tile_products(ab.problem, consumers.kv_registers, consumers.rows, issued, consumers.packed_p)
    return [
        *tile.accumulators(),
        "mbar_wait(kv_full, 0);",
        *(tile.kv_fragments() if consumers.kv_registers else []),
        "for (int t = 0; t < total; ++t) {",
        "  const int stage = t % STAGES, head = hk * GROUP + t / tiles, row0 = q_first + (t % tiles) * BQ;",
        "  const unsigned q_s = q_tiles + stage * Q_BYTES, o_s = o_tiles + stage * O_BYTES;",
        "  const unsigned ds_s = ds_tiles + (t % DS_RING) * DS_BYTES;",
        *indent(wait, 1).splitlines(),
        "  mbar_wait(full + 8 * stage, (t / STAGES) & 1);",
        *indent(turn, 1).splitlines(),
        *indent(products, 1).splitlines(),
        *indent(share, 1).splitlines(),
        "}",
        *after,
        *last,
        *tile.gradient_stores(ab, names, aligned),
    ]
