"""Attention decode: few query rows per sequence (decode, speculative tokens, small prefill
chunks) over a long KV length, dense or through a paged KV cache, with split-KV.

Memory-bound: each key and value row is read once per (batch, kv head), and enough of them must
be loading at any time to cover HBM's latency. Three tricks make it so:
- pack GQA (FlashDecoding++, FlashAttention's "pack GQA"): a block takes the ``GROUP * SQ``
  query rows that share a kv head (up to ROWS_PER_BLOCK at once, more row groups beyond), so a
  K/V row read from memory serves every query head of its group;
- loads in flight (attention_decode_loads.py): each lane has ``keys_per_lane`` slots of one
  key's K and V vectors; either registers, each refilled with the next batch's key as soon as
  this batch's K (or V) in it is consumed (one batch loads under the arithmetic of the previous
  one; CPU emulation runs it), or, tuning ``stages`` S, a ring of S batches in shared memory fed
  by ``cp.async`` (S batches in flight per block at no register cost: what a few blocks per SM
  need at small batch);
- split-KV (flash-decoding): when ``B * Hk * row groups`` blocks cannot fill the GPU, each
  block takes one of ``split`` contiguous slices of the visible keys and writes its rows'
  partial O (normalised) and log-sum-exp (base 2) to scratch; a combine kernel weighs the
  slices in slice order (deterministic) into O and STATS. With ``split`` 1 the block writes O
  and STATS itself and there is no scratch.

Inside a block, groups of ``L`` lanes each own one key at a time: a lane holds one 16-byte
vector (``VK`` / ``VV`` elements; ``CK`` / ``CV`` of them where the head dim is longer than L
vectors, or with tuning ``vectors_per_lane`` 2, which halves L and so the shuffles and the
softmax each lane repeats for its key) of the key's K and V rows, the dot
products with the block's query rows (in shared memory, fp32) are summed over the L lanes,
and each group keeps its own online softmax (running maximum, sum and O slice, base 2) over
the keys it saw; the groups are merged through shared memory at the end. Any float input
type, any strides (element loads where a row is not 16-byte vectors or a pointer is not
16-byte aligned), every mask, bias and ALiBi, on CUDA cores. attention_decode_mma.py is its
tensor-core variant for Q, K and V of one 16-bit type (this kernel is issue-bound there: ~2,000
lane-ops per key at GQA 4, D 128).

Key j of sequence b lives, dense, at K[b, hk, j]; paged, at K[page, hk, j % page_size] with
page = PAGE_TABLE_K[b, 0, j / page_size, 0] (V through its own table and page size).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load
from ..kernel import FusedProgram, Kernel, Scratch
from .attention_decode_loads import STAGES_CHOICES, KeyPipeline, ring_bytes, vectorizable
from .attention_decode_merge import PARTIAL_LSE, PARTIAL_O, combine_kernel, merge
from .attention_extents import batch_grid
from .attention_problem import (
    Attention,
    alibi_table,
    declare,
    dropout_function,
    dropped,
    element,
    int_constants,
    on_tensor_cores,
    score_function,
    sequence_setup,
    stride_arrays,
)
from .gemm_loaders import ASYNC_COPY_PRELUDE

DECODE_MAX_SQ = 4  # dense attention with at most this many query rows takes the decode kernel
THREADS_CHOICES = (128, 256)
KEYS_PER_LANE_CHOICES = (2, 4, 8)  # key slots per lane: K and V vectors refilled as they are consumed
RING_KEYS_PER_LANE_CHOICES = (2, 4)  # with a shared-memory ring: more stages rather than more slots
VECTORS_PER_LANE_CHOICES = (1, 2)  # 16-byte vectors of a key's K (and V) row per lane
DEFAULT_THREADS, DEFAULT_KEYS_PER_LANE, DEFAULT_STAGES = 128, 4, 0  # the register pipeline's
# the defaults where a ring fits, the first that does: threads, key slots, stages, vectors per
# lane. Measured on an H200 (2026-11-28, benchmarks/RESULTS.md, Session 8) on every shape of the
# decode sweep: 128/4/3/2 10-13% faster than 256/4/3/1, itself 6-9% faster than 128 threads with
# 4 register slots
DEFAULT_RINGS = ((128, 4, 3, 2), (256, 4, 3, 1))
ROWS_PER_BLOCK = 16
MAX_ROW_REGISTERS = 64  # fp32 O values a thread holds (its rows times its V columns)
MAX_REGISTERS = 255  # a thread's registers: a choice whose estimate (held_registers) is over would spill
SM_REGISTERS = 64 * 1024
MAX_SHARED = 46 * 1024  # static shared memory, under the 48 KiB every block may take
MAX_RING = 96 * 1024  # a ring's shared memory: two blocks with their query rows fit an H100 SM
SM_SHARED = 227 * 1024  # shared memory per SM (H100; an A100 has 163 KiB: fewer resident blocks)
SM_THREADS = 2048
# Little's law on an H100: ~3.3 TB/s of HBM at ~1.5 µs of loaded latency is ~5 MB in flight,
# ~38 KB per SM of 132: the split heuristic aims at this many bytes of loads in flight per SM.
BYTES_IN_FLIGHT_PER_SM = 40 * 1024
# and this many warps per SM, four per scheduler: a ring keeps the bytes in flight with one block,
# but one warp per scheduler cannot hide the shuffles' and shared loads' latency in the arithmetic
MIN_WARPS_PER_SM = 16
MAX_SPLIT = 64
MIN_KEYS_PER_SPLIT = 256  # a slice at least this long, to pay for its partial O and the combine
MIN_BATCHES_PER_SPLIT = 4  # and this many batches of keys, so the pipeline's fill and drain stay small
TUNING_KEYS = frozenset({"path", "split", "threads", "keys_per_lane", "stages", "vectors_per_lane"})


@dataclass(frozen=True)
class DecodeShape:
    """How a block's threads cover the head dims and rows."""

    threads: int
    lanes: int  # L: lanes per key
    vk: int  # K elements per 16-byte vector
    vv: int
    ck: int  # K vectors per lane
    cv: int
    rows_per_block: int
    row_groups: int

    @property
    def key_groups(self) -> int:
        return self.threads // self.lanes

    def query_bytes(self) -> int:
        return 4 * self.rows_per_block * self.lanes * self.vk * self.ck

    def merge_bytes(self) -> int:
        """The key groups' softmax states (maximum, sum, O) that the block merges at the end."""
        return 4 * self.rows_per_block * self.key_groups * (self.lanes * self.vv * self.cv + 2)

    def shared_bytes(self) -> int:
        """Static shared memory of the register pipeline: the query rows and the merge buffers."""
        return self.query_bytes() + self.merge_bytes()

    def ring_bytes(self, keys_per_lane: int, stages: int) -> int:
        """Dynamic shared memory of a ring: ``stages`` batches of every thread's K and V vectors,
        or the merge buffers, which reuse it once the loop is done (0 without a ring)."""
        if not stages:
            return 0
        return max(ring_bytes(stages, self.threads, keys_per_lane, self.ck, self.cv), self.merge_bytes())

    def block_shared_bytes(self, keys_per_lane: int, stages: int) -> int:
        """All the shared memory a block takes."""
        return self.query_bytes() + self.ring_bytes(keys_per_lane, stages) if stages else self.shared_bytes()

    def bytes_in_flight(self, keys_per_lane: int, stages: int = 0) -> int:
        """A block's K and V bytes loading at once: one batch of every lane's key slots (each
        refilled with the next batch's key as soon as its K or V vectors are consumed), or with
        a ring, its ``stages`` batches while the block waits for the oldest."""
        return self.threads * keys_per_lane * 16 * (self.ck + self.cv) * max(1, stages)

    def held_registers(self, keys_per_lane: int, stages: int = 0) -> int:
        """Registers a thread takes (estimate, fitted to ptxas on D 128 bf16 and D 72 fp32 at 2 to
        8 slots, within ~10%): per slot its K and V elements as floats (ptxas unpacks a batch's
        slots together, ahead of the arithmetic; with a ring only one slot's, read from shared
        memory as it is used) and its scores; per row the query elements it multiplies (hoisted
        out of shared memory), O, the running maximum and sum; ~12 for addresses, pages and
        indices."""
        elements = self.ck * self.vk + self.cv * self.vv
        rows = self.rows_per_block
        slots = keys_per_lane * rows + (elements if stages else keys_per_lane * elements)
        return slots + rows * (elements + 2) + 12


@dataclass(frozen=True)
class DecodeConfig:
    """A launch of the decode kernel: threads per block, key slots per lane, KV slices, the
    batches in the shared-memory ring (0: the slots are registers), and the 16-byte vectors of
    a key's row each lane takes (2: half the lanes per key, so half the shuffles of the dot
    products and of the softmax each lane repeats for its key, for twice the registers)."""

    threads: int
    keys_per_lane: int
    split: int
    stages: int = DEFAULT_STAGES
    vectors_per_lane: int = 1

    def choice(self) -> dict[str, object]:
        return {
            "path": "decode",
            "threads": self.threads,
            "keys_per_lane": self.keys_per_lane,
            "split": self.split,
            "stages": self.stages,
            "vectors_per_lane": self.vectors_per_lane,
        }


def shape(a: Attention, threads: int = DEFAULT_THREADS, vectors_per_lane: int = 1) -> DecodeShape:
    """Lanes per key covering the wider head dim in 16-byte vectors, ``vectors_per_lane`` each
    (a power of two, at most a warp); as many packed rows per block as the O registers and
    static shared memory allow."""
    vk, vv = 16 // a.k.data_type.itemsize, 16 // a.v.data_type.itemsize
    vectors = max(-(-a.d // vk), -(-a.dv // vv))
    lanes = max(1, min(32, 1 << (vectors - 1).bit_length()) // vectors_per_lane)
    ck, cv = -(-a.d // (lanes * vk)), -(-a.dv // (lanes * vv))
    rows = a.heads // a.kv_heads * a.sq
    per_block = max(1, min(rows, ROWS_PER_BLOCK, MAX_ROW_REGISTERS // (cv * vv)))
    while per_block > 1 and DecodeShape(threads, lanes, vk, vv, ck, cv, per_block, 1).shared_bytes() > MAX_SHARED:
        per_block -= 1
    return DecodeShape(threads, lanes, vk, vv, ck, cv, per_block, -(-rows // per_block))


def uses_decode(a: Attention) -> bool:
    """The decode kernel's problems when nothing is tuned: few query rows, and paged ones the
    flash kernel cannot take (types other than all fp16 or all bf16)."""
    return a.sq <= DECODE_MAX_SQ or (a.paged and not on_tensor_cores(a))


def rows_vectorize(a: Attention) -> bool:
    """K and V rows load as 16-byte vectors (given aligned pointers): what a ring's copies need."""
    s = shape(a)
    return vectorizable(a.k, s.vk) and vectorizable(a.v, s.vv)


def fits(a: Attention, threads: int, keys_per_lane: int, stages: int, vectors_per_lane: int = 1) -> bool:
    """The choice keeps its registers under MAX_REGISTERS and a ring under MAX_RING (and rows
    that take 16-byte copies)."""
    s = shape(a, threads, vectors_per_lane)
    if s.held_registers(keys_per_lane, stages) > MAX_REGISTERS:
        return False
    return not stages or (s.ring_bytes(keys_per_lane, stages) <= MAX_RING and rows_vectorize(a))


def packs_rows(a: Attention, threads: int, vectors_per_lane: int) -> bool:
    """``vectors_per_lane`` packs as many query rows per block as one vector per lane (two hold
    twice the O registers and merge buffers: fewer rows would mean more row groups, each reading
    K and V again)."""
    return shape(a, threads, vectors_per_lane).rows_per_block == shape(a, threads).rows_per_block


def resident_target(s: DecodeShape, keys_per_lane: int, stages: int = 0) -> int:
    """Blocks per SM the heuristic aims at: enough for BYTES_IN_FLIGHT_PER_SM (a block of 128
    threads with 4 slots of one K and one V vector keeps 128 · 4 · 32 B = 16 KiB in flight:
    3 blocks; a ring of 4 such batches 64 KiB: 1) and MIN_WARPS_PER_SM, at most what fits an
    SM's threads, registers and shared memory."""
    wanted = max(
        -(-BYTES_IN_FLIGHT_PER_SM // s.bytes_in_flight(keys_per_lane, stages)),
        -(-MIN_WARPS_PER_SM * 32 // s.threads),
    )
    fitting = min(
        SM_THREADS // s.threads,
        SM_REGISTERS // (s.threads * min(MAX_REGISTERS, s.held_registers(keys_per_lane, stages))),
        SM_SHARED // max(1, s.block_shared_bytes(keys_per_lane, stages)),
    )
    return max(1, min(wanted, fitting))


def heuristic_split(
    a: Attention,
    arch: int,
    threads: int = DEFAULT_THREADS,
    keys_per_lane: int = DEFAULT_KEYS_PER_LANE,
    stages: int = DEFAULT_STAGES,
    vectors_per_lane: int = 1,
) -> int:
    """KV slices when the tuning names none. Little's law: ~3.3 TB/s × ~1.5 µs of loaded
    latency is ~5 MB in flight on an H100, ~38 KB per SM (BYTES_IN_FLIGHT_PER_SM = 40 KiB); a
    block keeps ``threads · keys_per_lane · 32 B`` in flight (D 128 bf16; times the stages
    with a ring), so the target is ``resident_target`` blocks on each SM of sm_``arch`` (3 at
    128 threads and 4 register slots: 48 KiB). 1 once ``B * Hk * row groups`` blocks reach
    that; else as many slices as fit those blocks (rounded down: no second, nearly empty
    wave), each of at least MIN_KEYS_PER_SPLIT keys and MIN_BATCHES_PER_SPLIT batches (and
    the ring's stages), at most MAX_SPLIT. B 1, Hk 8, Skv 32k: 8 blocks, split 49 (392 blocks
    of 669 keys); B 8: 64 blocks, split 6."""
    s = shape(a, threads, vectors_per_lane)
    blocks = a.batch * a.kv_heads * s.row_groups
    target = resident_target(s, keys_per_lane, stages) * sm_count(arch)
    if blocks >= target:
        return 1
    batches = max(MIN_BATCHES_PER_SPLIT, stages)
    min_keys = max(MIN_KEYS_PER_SPLIT, batches * s.key_groups * keys_per_lane)
    return max(1, min(target // blocks, a.skv // min_keys, MAX_SPLIT))


def default_keys_per_lane(a: Attention, threads: int, stages: int = DEFAULT_STAGES, vectors_per_lane: int = 1) -> int:
    """DEFAULT_KEYS_PER_LANE, or fewer where its registers (or ring) would not fit."""
    allowed = RING_KEYS_PER_LANE_CHOICES if stages else KEYS_PER_LANE_CHOICES
    fitting = [k for k in allowed if k <= DEFAULT_KEYS_PER_LANE and fits(a, threads, k, stages, vectors_per_lane)]
    return max(fitting, default=allowed[0])


def default_config(a: Attention, arch: int) -> DecodeConfig:
    """The first of DEFAULT_RINGS that fits and packs as many rows per block as one vector per
    lane does (two vectors per lane hold twice the O registers: more row groups would read
    K and V again), else the register pipeline; the heuristic's split."""
    rows = shape(a).rows_per_block
    for threads, keys, stages, vectors in DEFAULT_RINGS:
        if fits(a, threads, keys, stages, vectors) and shape(a, threads, vectors).rows_per_block == rows:
            split = heuristic_split(a, arch, threads, keys, stages, vectors)
            return DecodeConfig(threads, keys, split, stages, vectors)
    keys = default_keys_per_lane(a, DEFAULT_THREADS)
    return DecodeConfig(DEFAULT_THREADS, keys, heuristic_split(a, arch, DEFAULT_THREADS, keys))


def decode_choices(a: Attention, arch: int) -> list[dict[str, object]]:
    """What autotuning times (the default first): for every threads and register key slots
    per lane that fit (at most 6), the heuristic's split for them, half and twice it; no split
    (1) with the default; where the rows take 16-byte copies, each threads, ring slots and
    stages that fit, at the heuristic's split and twice it, and with 2 vectors per lane, 3
    stages at the heuristic's split where that packs as many rows per block. At most about 38
    choices."""
    default = default_config(a, arch)
    configs = [default, dataclasses.replace(default, split=1)]
    for stages in STAGES_CHOICES:
        for threads in THREADS_CHOICES:
            for keys in RING_KEYS_PER_LANE_CHOICES if stages else KEYS_PER_LANE_CHOICES:
                for vectors in VECTORS_PER_LANE_CHOICES if stages == 3 else (1,):
                    if not fits(a, threads, keys, stages, vectors) or not packs_rows(a, threads, vectors):
                        continue
                    best = heuristic_split(a, arch, threads, keys, stages, vectors)
                    splits = (
                        (best // 2, best, 2 * best) if not stages else (best, 2 * best) if vectors == 1 else (best,)
                    )
                    configs += [
                        DecodeConfig(threads, keys, split, stages, vectors)
                        for split in splits
                        if 1 <= split <= min(MAX_SPLIT, a.skv)
                    ]
    return [c.choice() for c in dict.fromkeys(configs)]


def tuned_config(a: Attention, ctx: EmitContext) -> DecodeConfig:
    """The tuning's choice, each key it leaves out from the default (but the register pipeline
    with one vector per lane if it names key slots and no stages, and one vector per lane for a
    pipeline other than the default's), the split from the heuristic for the rest."""
    tuning = dict(ctx.tuning)
    unknown = sorted(set(tuning) - TUNING_KEYS)
    if unknown:
        raise UnsupportedError(f"attention tuning {tuning}: the decode kernel has no choice {', '.join(unknown)}")

    def integer(key: str, allowed: tuple[int, ...] | range, default: int) -> int:
        return tuning_integer(tuning, key, allowed, default)

    default = default_config(a, ctx.arch)
    threads = integer("threads", THREADS_CHOICES, default.threads)
    stages = integer("stages", STAGES_CHOICES, DEFAULT_STAGES if "keys_per_lane" in tuning else default.stages)
    as_default = "keys_per_lane" not in tuning and stages == default.stages
    vectors = integer("vectors_per_lane", VECTORS_PER_LANE_CHOICES, default.vectors_per_lane if as_default else 1)
    slots = RING_KEYS_PER_LANE_CHOICES if stages else KEYS_PER_LANE_CHOICES
    keys = integer("keys_per_lane", slots, default_keys_per_lane(a, threads, stages, vectors))
    s = shape(a, threads, vectors)
    if stages and not rows_vectorize(a):
        raise UnsupportedError(
            f"attention tuning {tuning}: a ring of stages copies 16-byte vectors, and the rows of "
            f"K '{a.k.name}' or V '{a.v.name}' are not 16-byte vectors (strides {a.k.stride}, {a.v.stride})"
        )
    if stages and s.ring_bytes(keys, stages) > MAX_RING:
        raise UnsupportedError(
            f"attention tuning {tuning}: the ring of {stages} stages would take "
            f"{s.ring_bytes(keys, stages)} bytes of shared memory, over {MAX_RING}"
        )
    split = integer("split", range(1, MAX_SPLIT + 1), heuristic_split(a, ctx.arch, threads, keys, stages, vectors))
    return DecodeConfig(threads, keys, split, stages, vectors)


def tuning_integer(tuning: dict[str, object], key: str, allowed: tuple[int, ...] | range, default: int) -> int:
    """``tuning[key]`` (``default`` where left out), refused clearly unless an integer in ``allowed``."""
    value = tuning.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value not in allowed:
        choices = f"from {allowed[0]} to {allowed[-1]}" if isinstance(allowed, range) else f"one of {allowed}"
        raise UnsupportedError(f"attention tuning {tuning}: {key} must be an integer {choices}")
    return value


def decode_program(fused: FusedNode, ctx: EmitContext, a: Attention, top_batch: int | None = None) -> FusedProgram:
    """The decode kernel (and with split-KV the combine and the partials, for a batch of up to
    ``top_batch``, by default the problem's)."""
    config = tuned_config(a, ctx)
    split = config.split
    kernel = _decode_kernel(fused, ctx, a, shape(a, config.threads, config.vectors_per_lane), config)
    if split == 1:
        return FusedProgram(fused.name, (kernel,))
    rows = (top_batch or a.batch) * a.heads * a.sq * split
    scratch = (Scratch(PARTIAL_O, 4 * rows * a.dv), Scratch(PARTIAL_LSE, 4 * rows))
    return FusedProgram(fused.name, (kernel, combine_kernel(fused, ctx, a, split)), scratch)


def _decode_kernel(fused: FusedNode, ctx: EmitContext, a: Attention, s: DecodeShape, config: DecodeConfig) -> Kernel:
    declared = declare(a)
    names, params = declared.names, declared.params
    split = config.split
    if split > 1:
        params.scratch(PARTIAL_O, "float")
        params.scratch(PARTIAL_LSE, "float")
    vector = rows_vectorize(a)
    aligned = params.aligned_flag() if vector else "false"
    pipeline = KeyPipeline(a, names, config.stages, vector, aligned)
    body = [
        f"using TK = {cuda_type(a.k.data_type)};",
        f"using TV = {cuda_type(a.v.data_type)};",
        f"constexpr int THREADS = {s.threads}, L = {s.lanes}, KEY_GROUPS = THREADS / L, KT = {config.keys_per_lane};",
        f"constexpr int VK = {s.vk}, VV = {s.vv}, CK = {s.ck}, CV = {s.cv}, DKP = L * VK * CK, DVP = L * VV * CV;",
        *int_constants(
            [("HQ", a.heads), ("HK", a.kv_heads), ("GROUP", "HQ / HK"), ("SQ", a.sq_extent), ("SKV", a.skv_extent)]
        ),
        f"constexpr int D = {a.d}, DV = {a.dv}, ROWS = GROUP * SQ, RB = {s.rows_per_block};",
        f"constexpr int ROW_GROUPS = {s.row_groups}, SPLIT = {split}, STEP = KEY_GROUPS * KT;",
        *([f"constexpr int STAGES = {config.stages};"] if config.stages else []),
        stride_arrays([("KS", a.k), ("VS", a.v)]),
        *block_work(a, names),
        *([] if config.stages else _rows_to_shared(a, names, ring=False)),
        "const int tid = threadIdx.x, grp = tid / L, sub = tid % L;",
        *pipeline.declarations(),
        "float m[RB], l[RB], o[RB][CV * VV];",
        "#pragma unroll",
        "for (int r = 0; r < RB; ++r) {",
        "  m[r] = NEG_INF;",
        "  l[r] = 0.0f;",
        "#pragma unroll",
        "  for (int c = 0; c < CV * VV; ++c) o[r][c] = 0.0f;",
        "}",
        *pipeline.fill(),
        # a ring's first loads hold no registers: the query rows' reads go under them
        *(_rows_to_shared(a, names, ring=True) if config.stages else []),
        "// the same trip count on every thread: lanes of a group sum their dots with shuffles",
        "for (int base = s_begin; base < s_end; base += STEP) {",
        *indent(pipeline.issue(), 1).splitlines(),
        "  float s[KT][RB];",
        "#pragma unroll",
        "  for (int t = 0; t < KT; ++t) {",
        "    float kf[CK * VK];",
        *indent(pipeline.unpack("K"), 2).splitlines(),
        *indent(pipeline.refill("K"), 2).splitlines(),
        "#pragma unroll",
        "    for (int r = 0; r < RB; ++r) {",
        "      float dot = 0.0f;",
        "#pragma unroll",
        "      for (int c = 0; c < CK; ++c)",
        "#pragma unroll",
        "        for (int e = 0; e < VK; ++e) dot += q_s[r][(c * L + sub) * VK + e] * kf[c * VK + e];",
        "      s[t][r] = gd::lanes_sum<L>(dot);",
        "    }",
        "  }",
        "#pragma unroll",
        "  for (int r = 0; r < RB; ++r) {  // scores to probabilities, O and the sum rescaled",
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
        "      s[t][r] = exp2f(s[t][r] - top);",
        "      l[r] += s[t][r];",
        *_dropout(a),
        "    }",
        "  }",
        "#pragma unroll",
        "  for (int t = 0; t < KT; ++t) {",
        "    float vf[CV * VV];",
        *indent(pipeline.unpack("V"), 2).splitlines(),
        *indent(pipeline.refill("V"), 2).splitlines(),
        "#pragma unroll",
        "    for (int r = 0; r < RB; ++r)",
        "#pragma unroll",
        "      for (int c = 0; c < CV * VV; ++c) o[r][c] += s[t][r] * vf[c];",
        "  }",
        *indent(pipeline.advance(), 1).splitlines(),
        "}",
        *merge(a, names, split, config.stages),
    ]
    functions = ASYNC_COPY_PRELUDE if config.stages else ""
    pattern = pattern_name(fused) + "_decode"
    name, source = kernel_source(ctx, fused, pattern, params, s.threads, indent(body, 1), device_functions=functions)
    per_sequence = a.kv_heads * s.row_groups * split
    dynamic = s.block_shared_bytes(config.keys_per_lane, config.stages) if config.stages else 0
    grid = (a.batch * per_sequence, 1, 1)
    blocks = batch_grid(a, per_sequence)
    return Kernel(name, source, grid, (s.threads, 1, 1), dynamic, tuple(params.bindings), blocks=blocks)


def block_work(a: Attention, names: dict[str, str], align: int = 1) -> list[str]:
    """The block's slice ``split``, row group ``rg``, kv head ``hk``, batch ``b`` and first packed
    row ``r0`` (blocks ordered slice fastest); the sequence's lengths and scale, the ALiBi and
    dropout tables; the keys of its slice, ``s_begin`` to ``s_end`` (:func:`slice_range`)."""
    return [
        "const float NEG_INF = __uint_as_float(0xff800000u);",
        "const int split = (int)(blockIdx.x % SPLIT);",
        "const int rg = (int)(blockIdx.x / SPLIT % ROW_GROUPS), hk = (int)(blockIdx.x / SPLIT / ROW_GROUPS % HK);",
        "const int b = (int)(blockIdx.x / SPLIT / ROW_GROUPS / HK);",
        "const int r0 = rg * RB;  // packed row r is query head hk * GROUP + r / SQ, row r % SQ",
        *sequence_setup(a, names),
        *alibi_table(a),
        *dropout_function(a),
        *slice_range(a, align),
    ]


def slice_range(a: Attention, align: int = 1) -> list[str]:
    """``s_begin`` / ``s_end``: this split's slice of the keys any row of the block sees;
    ``align`` > 1: slices start at multiples of it (the first rounded down: the window masks
    the keys before it)."""
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
        if align > 1:
            lines.append(f"kv_begin -= kv_begin % {align};")
    per_split = "(kv_end - kv_begin + SPLIT - 1) / SPLIT"
    if align > 1:
        per_split = f"({per_split} + {align - 1}) / {align} * {align}"
    lines += [
        f"const int per_split = {per_split};",
        "const int s_begin = min(kv_end, kv_begin + split * per_split), s_end = min(kv_end, s_begin + per_split);",
    ]
    return lines


def _rows_to_shared(a: Attention, names: dict[str, str], ring: bool) -> list[str]:
    """The block's query rows as floats, zero past D and past the last packed row (``q_s``,
    which a ring's pipeline declares in its dynamic shared memory)."""
    q = load(a.q.data_type, element(a.q, names["Q"], ["b", "hk * GROUP + rr / SQ", "rr % SQ", "d"]), "float")
    return [
        *([] if ring else ["__shared__ float q_s[RB][DKP];"]),
        "for (int e = threadIdx.x; e < RB * DKP; e += THREADS) {",
        "  const int rr = r0 + e / DKP, d = e % DKP;",
        f"  q_s[e / DKP][d] = rr < ROWS && d < D ? {q} : 0.0f;",
        "}",
        "__syncthreads();",
    ]


def _slope(a: Attention) -> list[str]:
    return ["const float slope = SLOPES[h];"] if a.attrs.use_alibi_mask else []


def _dropout(a: Attention) -> list[str]:
    """Key ``base + t * KEY_GROUPS + grp``'s probability for row r to 0 where dropout drops it,
    once the row sum has it (nothing without dropout)."""
    if a.dropout is None:
        return []
    return [
        "      const int j = base + t * KEY_GROUPS + grp;",
        f"      s[t][r] = {dropped(a, 's[t][r]', 'h', 'i', 'j')};",
    ]
