"""Flash attention forward on mma.sync tensor cores (sm_80+, fp16/bf16 Q/K/V, fp32 accumulation).

A block owns ``16 * warps`` query rows of one (batch, head); each warp owns 16 of them. The
block's Q tile stays in shared memory (in registers as mma fragments when D <= 128); K and V
tiles of ``block_n`` keys stream through a double-buffered ``cp.async`` pipeline. Per key
tile a warp computes S = Q Kᵀ (16 x block_n, fp32), applies scale, bias, ALiBi and the masks,
updates the running row maximum and sum (online softmax, base 2), rescales its O
accumulators and adds P V, with P converted to the input type in registers: the
accumulator layout of m16n8 is the A-fragment layout of the next m16n8k16, so S never
leaves registers. Shared-memory rows are padded by 16 bytes, which makes every ``ldmatrix``
phase conflict-free for any head dim that is a multiple of 16 (D is zero-padded to one).

Q/K/V rows are copied with 16-byte ``cp.async`` when the head dim is contiguous and every
row starts 16-byte aligned (the runtime checks the pointers); otherwise element by element
(any strides, any head dim), with the same tensor-core arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type
from ..indexing import divides
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
    key_row_address,
    needs_mask,
    o_pair_store,
    packed_exit,
    page_of,
    score_function,
    stats_store,
    stride_arrays,
    written_rows,
)
from .attention_rotary import q_rotation
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .tensor_core import mma_fragments

_PACK = {
    DataType.HALF: "__half2 v = __floats2half2_rn(x, y);",
    DataType.BFLOAT16: "__nv_bfloat162 v = __floats2bfloat162_rn(x, y);",
}


@dataclass(frozen=True)
class FlashConfig:
    warps: int
    block_n: int  # keys per pipeline stage
    m_tiles: int = 1  # 16-row mma tiles per warp: each K / V fragment feeds this many

    @property
    def block_m(self) -> int:
        return 16 * self.m_tiles * self.warps

    def accumulators(self, a: Attention) -> int:
        """fp32 registers a thread holds for S and O."""
        return self.m_tiles * (self.block_n // 8 + padded(a.dv) // 8) * 4


def padded(extent: int) -> int:
    return -(-extent // 16) * 16


# Accumulator registers per thread a choice may use (S and O; 255 is the hardware's limit
# for everything), and the shared memory every sm_80+ GPU grants a block.
MAX_ACCUMULATORS = 192
MAX_SHARED = 160 * 1024


def config(a: Attention, tuning: dict[str, object]) -> FlashConfig:
    """The tuned choice, else 4 warps of two 16-row tiles over 64-key tiles (as FlashAttention-2
    for head dims up to 128), one tile per warp over 32 keys past that, where O needs the registers."""
    if tuning:
        choices = candidates(a)
        if dict(tuning) not in choices:
            raise UnsupportedError(f"attention tuning {dict(tuning)} is not one of this problem's choices {choices}")
        return FlashConfig(int(tuning["warps"]), int(tuning["block_n"]), int(tuning["m_tiles"]))  # type: ignore[call-overload]
    for choice in (FlashConfig(4, 64, 2), FlashConfig(4, 32, 1)):
        if fits(a, choice):
            return choice
    return FlashConfig(4, 16, 1)


def fits(a: Attention, c: FlashConfig) -> bool:
    return c.accumulators(a) <= MAX_ACCUMULATORS and shared_bytes(a, c) <= MAX_SHARED


def candidates(a: Attention) -> list[dict[str, object]]:
    return [
        {"warps": warps, "block_n": block_n, "m_tiles": m_tiles}
        for warps in (4, 8)
        for m_tiles in (1, 2)
        for block_n in (32, 64, 128)
        if fits(a, FlashConfig(warps, block_n, m_tiles))
    ]


def shared_bytes(a: Attention, c: FlashConfig) -> int:
    q_row, v_row = padded(a.d) + 8, padded(a.dv) + 8
    return 2 * (c.block_m * q_row + 2 * c.block_n * (q_row + v_row))


def vectorizable(tensors: Sequence[Tensor]) -> bool:
    """Rows of every tensor (Q, K, V...) copy as 16-byte chunks (given aligned pointers)."""
    for t in tensors:
        if t.stride[3] != 1 or t.dim[3] % 8:
            return False
        if not all(divides(stride, 8) for d, stride in zip(t.dim[:3], t.stride[:3]) if d != 1):
            return False
    return True


def flash_kernel(fused: FusedNode, ctx: EmitContext, a: Attention, c: FlashConfig) -> Kernel:
    declared = declare(a)
    names, params = declared.names, declared.params
    vec = vectorizable((a.q, a.k, a.v))
    aligned = params.aligned_flag() if vec else "false"
    dp, dvp = padded(a.d), padded(a.dv)
    q_in_registers = c.m_tiles * dp <= 128  # fragments a thread keeps: at most 32 registers
    t = cuda_type(a.q.data_type)
    body = [
        f"using T = {t};",
        f"constexpr int THREADS = {32 * c.warps}, BM = {c.block_m}, BN = {c.block_n};",
        f"constexpr int DP = {dp}, DVP = {dvp}, QROW = DP + 8, VROW = DVP + 8;  // padded rows: conflict-free ldmatrix",
        stride_arrays([("QS", a.q), ("KS", a.k), ("VS", a.v)]),
        f"constexpr int MI = {c.m_tiles}, NT = BN / 8, OT = DVP / 8, QK = DP / 16;",
        f"constexpr bool Q_IN_REGISTERS = {str(q_in_registers).lower()};",
        *block_setup(a, names, c.block_m),
        *packed_exit(a),
        *key_range(a, c.block_m),
        *score_function(a, names, fold=True),
        *dropout_function(a),
        "extern __shared__ __align__(128) unsigned char smem[];",
        "T* const q_s = reinterpret_cast<T*>(smem);",
        "T* const k_s = q_s + BM * QROW;  // [2][BN][QROW]",
        "T* const v_s = k_s + 2 * BN * QROW;  // [2][BN][VROW]",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
        f"const T* const q_g = &{element(a.q, names['Q'], coordinates(a, 'Q', 'h', 'row0', '0'))};",
        *_key_rows(a, names),
        *tile_loader(vec, aligned, paged=a.paged),
        "const int first = kv_begin / BN * BN;",
        "const int tiles = kv_end > kv_begin ? (kv_end - first + BN - 1) / BN : 0;",
        f"load_rows(q_s, QROW, q_g, QS[2], QS[3], BM, min(BM, {written_rows(a)} - row0), D, DP);",
        'asm volatile("cp.async.commit_group;\\n" ::);',
        "auto load_kv = [&](int tile) {",
        "  const int kv0 = first + tile * BN, stage = tile & 1;",
        *indent(_key_tile_loads(a), 1).splitlines(),
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "};",
        "if (tiles > 0) load_kv(0);",
        *_rotate_q(a, c),
        "float o[MI][OT][4], m[MI][2], l[MI][2];",
        "#pragma unroll",
        "for (int mi = 0; mi < MI; ++mi) {",
        "  m[mi][0] = m[mi][1] = NEG_INF;",
        "  l[mi][0] = l[mi][1] = 0.0f;",
        "#pragma unroll",
        "  for (int j = 0; j < OT; ++j) o[mi][j][0] = o[mi][j][1] = o[mi][j][2] = o[mi][j][3] = 0.0f;",
        "}",
        "unsigned qf[MI][Q_IN_REGISTERS ? QK : 1][4];",
        "// this thread's rows: warp_row + 16 mi and warp_row + 16 mi + 8",
        "const int warp_row = row0 + warp * 16 * MI + (lane >> 2);",
        "for (int tile = 0; tile < tiles; ++tile) {",
        "  if (tile + 1 < tiles) {",
        "    load_kv(tile + 1);",
        '    asm volatile("cp.async.wait_group 1;\\n" ::);',
        "  } else {",
        '    asm volatile("cp.async.wait_group 0;\\n" ::);',
        "  }",
        "  __syncthreads();  // Q and this tile's K, V are in shared memory",
        "  const int kv0 = first + tile * BN;",
        "  const T* const k_tile = k_s + (tile & 1) * BN * QROW;",
        "  const T* const v_tile = v_s + (tile & 1) * BN * VROW;",
        *indent(_q_fragments(q_in_registers), 1).splitlines(),
        *indent(_scores(), 1).splitlines(),
        f"  const bool masked = {needs_mask(a, c.block_m, c.block_n)};",
        "#pragma unroll",
        "  for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "    for (int j = 0; j < NT; ++j)",
        "#pragma unroll",
        "      for (int e = 0; e < 4; ++e)",
        "        s[mi][j][e] = score(s[mi][j][e], warp_row + mi * 16 + ((e >> 1) << 3), kv0 + j * 8 + (lane & 3) * 2 + (e & 1), masked);",
        *indent(_online_softmax(), 1).splitlines(),
        *indent(_dropout(a), 1).splitlines(),
        *indent(_pv(), 1).splitlines(),
        "  __syncthreads();  // everyone is done with this stage before it is refilled",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);  // Q, when no key tile waited for it',
        *_write(a, names, aligned),
    ]
    pattern = pattern_name(fused) + "_flash"
    functions = ASYNC_COPY_PRELUDE + mma_fragments(a.q.data_type) + pack_function(a.q.data_type)
    name, source = kernel_source(ctx, fused, pattern, params, 32 * c.warps, indent(body, 1), device_functions=functions)
    blocks = work_items(a, c.block_m)
    return Kernel(
        name,
        source,
        (blocks, 1, 1),
        (32 * c.warps, 1, 1),
        shared_bytes(a, c),
        tuple(params.bindings),
        blocks=work_grid(a, c.block_m),
    )


def _key_rows(a: Attention, names: dict[str, str]) -> list[str]:
    """Dense: ``k_g`` / ``v_g``, the kv head's first key row of K and V. Paged: ``k_row(j)`` /
    ``v_row(j)``, where key j's row starts, through the page tables (read only for keys inside
    the sequence: the tile loader asks for no other)."""
    if not a.paged:
        return [f"const T* const {role.lower()}_g = {key_row_address(a, names, role, '0')};" for role in ("K", "V")]
    return [
        f"auto {role.lower()}_row = [&](int j) -> const T* {{ const long long page = {page_of(a, names, role, 'j')}; "
        f"return {key_row_address(a, names, role, 'j')}; }};"
        for role in ("K", "V")
    ]


def _key_tile_loads(a: Attention) -> list[str]:
    """The loads of the key tile from ``kv0`` into ``stage``: rows a stride apart, or paged rows."""
    if not a.paged:
        return [
            "load_rows(k_s + stage * BN * QROW, QROW, k_g + (long long)kv0 * KS[2], KS[2], KS[3], BN, min(BN, skv - kv0), D, DP);",
            "load_rows(v_s + stage * BN * VROW, VROW, v_g + (long long)kv0 * VS[2], VS[2], VS[3], BN, min(BN, skv - kv0), DV, DVP);",
        ]
    return [
        "load_key_rows(k_s + stage * BN * QROW, QROW, kv0, false, KS[3], BN, min(BN, skv - kv0), D, DP);",
        "load_key_rows(v_s + stage * BN * VROW, VROW, kv0, true, VS[3], BN, min(BN, skv - kv0), DV, DVP);",
    ]


def pack_function(data_type: DataType) -> str:
    return (
        "\n// Two floats as one register of two 16-bit values, x in the low half (an mma operand).\n"
        "__device__ __forceinline__ unsigned pack2(float x, float y) {\n"
        f"  {_PACK[data_type]}\n"
        "  return *reinterpret_cast<unsigned*>(&v);\n"
        "}\n"
    )


def tile_loader(vec: bool, aligned: str, paged: bool = False) -> list[str]:
    """``load_rows``: ``rows`` rows of ``width`` elements (row stride ``rs``, element stride
    ``cs``) into shared rows of ``row_elems``, zero past ``valid`` rows (never read) and ``width``
    columns up to the padded width. ``paged``: also ``load_key_rows``, the same for keys
    ``kv0 + r`` of V (``value``) or K, each found through ``v_row`` / ``k_row`` (no generic
    lambda: NVRTC 13.0 takes none in device code)."""
    dense = "auto load_rows = [&](T* dst, int row_elems, const T* src, long long rs, long long cs, int rows, int valid, int width, int padded_width) {"
    keyed = "auto load_key_rows = [&](T* dst, int row_elems, int kv0, bool value, long long cs, int rows, int valid, int width, int padded_width) {"
    lines = [dense, *_row_loop(vec, aligned, "src + r * rs")]
    if paged:
        lines += [keyed, *_row_loop(vec, aligned, "value ? v_row(kv0 + r) : k_row(kv0 + r)")]
    return lines


def _row_loop(vec: bool, aligned: str, row: str) -> list[str]:
    """The body of a row loader whose row r starts at ``row``."""
    lines = []
    if vec:
        lines += [
            f"  if ({aligned}) {{",
            "    const int chunks = padded_width / 8;",
            "    for (int c = tid; c < rows * chunks; c += THREADS) {",
            "      const int r = c / chunks, k = c % chunks * 8;",
            "      const bool ok = r < valid && k < width;",
            f"      copy16(smem_addr(dst + r * row_elems + k), ok ? ({row}) + k : nullptr, ok);",
            "    }",
            "    return;",
            "  }",
        ]
    return [
        *lines,
        "  for (int e = tid; e < rows * padded_width; e += THREADS) {",
        "    const int r = e / padded_width, k = e % padded_width;",
        f"    dst[r * row_elems + k] = r < valid && k < width ? ({row})[k * cs] : gd::from<T>(0.0f);",
        "  }",
        "};",
    ]


def _rotate_q(a: Attention, c: FlashConfig) -> list[str]:
    """RoPE on the block's Q tile once it has landed (attention_rotary.q_rotation), where asked."""
    rotation = q_rotation(a, c.block_m, coordinates(a, "Q", "h", "row0 + r", "0")[2], 32 * c.warps, "tid")
    if not rotation:
        return []
    return [
        'if (tiles > 0) asm volatile("cp.async.wait_group 1;\\n" ::); else asm volatile("cp.async.wait_group 0;\\n" ::);',
        "__syncthreads();  // Q is in shared memory",
        "auto q_at = [&](int r, int c) -> T& { return q_s[r * QROW + c]; };",
        *rotation,
        "__syncthreads();  // Q is rotated",
    ]


def _q_fragments(in_registers: bool) -> list[str]:
    """The warp's rows of Q as A fragments, once (registers) or per k step (shared memory)."""
    if not in_registers:
        return []
    return [
        "if (tile == 0) {",
        "#pragma unroll",
        "  for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "    for (int kk = 0; kk < QK; ++kk)",
        "      ldmatrix_x4(smem_addr(q_s + (warp * 16 * MI + mi * 16 + (lane & 15)) * QROW + kk * 16 + (lane >> 4) * 8),",
        "                  qf[mi][kk][0], qf[mi][kk][1], qf[mi][kk][2], qf[mi][kk][3]);",
        "}",
    ]


def _scores() -> list[str]:
    """S = Q Kᵀ for the warp's rows and the tile's BN keys (K rows are the B fragments' columns):
    each K fragment feeds the warp's MI row tiles."""
    return [
        "float s[MI][NT][4];",
        "#pragma unroll",
        "for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "  for (int j = 0; j < NT; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.0f;",
        "#pragma unroll",
        "for (int kk = 0; kk < QK; ++kk) {",
        "  unsigned a[MI][4];",
        "#pragma unroll",
        "  for (int mi = 0; mi < MI; ++mi) {",
        "    if (Q_IN_REGISTERS) {",
        "      a[mi][0] = qf[mi][kk][0]; a[mi][1] = qf[mi][kk][1]; a[mi][2] = qf[mi][kk][2]; a[mi][3] = qf[mi][kk][3];",
        "    } else {",
        "      ldmatrix_x4(smem_addr(q_s + (warp * 16 * MI + mi * 16 + (lane & 15)) * QROW + kk * 16 + (lane >> 4) * 8),",
        "                  a[mi][0], a[mi][1], a[mi][2], a[mi][3]);",
        "    }",
        "  }",
        "#pragma unroll",
        "  for (int nj = 0; nj < NT / 2; ++nj) {",
        "    unsigned b0, b1, b2, b3;",
        "    const int row = nj * 16 + ((lane >> 4) << 3) + (lane & 7), col = kk * 16 + ((lane >> 3) & 1) * 8;",
        "    ldmatrix_x4(smem_addr(k_tile + row * QROW + col), b0, b1, b2, b3);",
        "#pragma unroll",
        "    for (int mi = 0; mi < MI; ++mi) {",
        "      mma_16816(s[mi][2 * nj], a[mi], b0, b1);",
        "      mma_16816(s[mi][2 * nj + 1], a[mi], b2, b3);",
        "    }",
        "  }",
        "}",
    ]


def _online_softmax() -> list[str]:
    """New row maxima (over the quad of lanes sharing a row), rescale of l and O, P = 2^(S - max)
    with S and the maxima in raw units times ``TO_LOG2``."""
    return [
        "#pragma unroll",
        "for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "  for (int r = 0; r < 2; ++r) {",
        "    float mx = m[mi][r];",
        "#pragma unroll",
        "    for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mi][j][2 * r], s[mi][j][2 * r + 1]));",
        "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));",
        "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));",
        "    const float base = mx == NEG_INF ? 0.0f : mx * TO_LOG2;  // log2 units; an empty row stays at 0",
        "    const float correction = gd::exp2_approx(fmaf(m[mi][r], TO_LOG2, -base));",
        "    m[mi][r] = mx;",
        "    l[mi][r] *= correction;",
        "#pragma unroll",
        "    for (int j = 0; j < OT; ++j) {",
        "      o[mi][j][2 * r] *= correction;",
        "      o[mi][j][2 * r + 1] *= correction;",
        "    }",
        "#pragma unroll",
        "    for (int j = 0; j < NT; ++j) {",
        "      s[mi][j][2 * r] = gd::exp2_approx(fmaf(s[mi][j][2 * r], TO_LOG2, -base));",
        "      s[mi][j][2 * r + 1] = gd::exp2_approx(fmaf(s[mi][j][2 * r + 1], TO_LOG2, -base));",
        "      l[mi][r] += s[mi][j][2 * r] + s[mi][j][2 * r + 1];",
        "    }",
        "  }",
    ]


def _dropout(a: Attention) -> list[str]:
    """P's dropped elements to 0 before P V (the row sums already hold them); nothing without dropout."""
    if a.dropout is None:
        return []
    element = "s[mi][j][e]"
    row, key = "warp_row + mi * 16 + ((e >> 1) << 3)", "kv0 + j * 8 + (lane & 3) * 2 + (e & 1)"
    return [
        "#pragma unroll",
        "for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "  for (int j = 0; j < NT; ++j)",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e)",
        f"      {element} = {dropped(a, element, 'h', row, key)};",
    ]


def _pv() -> list[str]:
    """O += P V: P's accumulators become A fragments in place; V rows (keys) are k. Each V
    fragment feeds the warp's MI row tiles."""
    return [
        "#pragma unroll",
        "for (int kk = 0; kk < BN / 16; ++kk) {",
        "  unsigned a[MI][4];",
        "#pragma unroll",
        "  for (int mi = 0; mi < MI; ++mi) {",
        "    a[mi][0] = pack2(s[mi][2 * kk][0], s[mi][2 * kk][1]);",
        "    a[mi][1] = pack2(s[mi][2 * kk][2], s[mi][2 * kk][3]);",
        "    a[mi][2] = pack2(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);",
        "    a[mi][3] = pack2(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);",
        "  }",
        "#pragma unroll",
        "  for (int nj = 0; nj < OT / 2; ++nj) {",
        "    unsigned b0, b1, b2, b3;",
        "    const int krow = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), col = nj * 16 + (lane >> 4) * 8;",
        "    ldmatrix_x4_trans(smem_addr(v_tile + krow * VROW + col), b0, b1, b2, b3);",
        "#pragma unroll",
        "    for (int mi = 0; mi < MI; ++mi) {",
        "      mma_16816(o[mi][2 * nj], a[mi], b0, b1);",
        "      mma_16816(o[mi][2 * nj + 1], a[mi], b2, b3);",
        "    }",
        "  }",
        "}",
    ]


def _write(a: Attention, names: dict[str, str], aligned: str) -> list[str]:
    """Each row's O = accumulators / sum (0 for a row that sees no key or lies past sq), two
    columns at a time, STATS."""
    stats = stats_store(a, names, "i", "live ? m[mi][r] * TO_LOG2 + log2f(sum) : NEG_INF")
    values = ("live ? o[mi][j][2 * r] * inv : 0.0f", "live ? o[mi][j][2 * r + 1] * inv : 0.0f")
    return [
        "#pragma unroll",
        "for (int mi = 0; mi < MI; ++mi)",
        "#pragma unroll",
        "  for (int r = 0; r < 2; ++r) {",
        "    float sum = l[mi][r];",
        "    sum += __shfl_xor_sync(0xffffffffu, sum, 1);",
        "    sum += __shfl_xor_sync(0xffffffffu, sum, 2);",
        "    const int i = warp_row + mi * 16 + r * 8;",
        f"    if (i >= {written_rows(a)}) continue;",
        "    const bool live = i < sq && sum > 0.0f;",
        "    const float inv = live ? 1.0f / sum : 0.0f;",
        "#pragma unroll",
        "    for (int j = 0; j < OT; ++j) {",
        "      const int col = j * 8 + (lane & 3) * 2;",
        "      if (col < DV) {",
        *indent(o_pair_store(a, names, "i", "col", values, aligned), 4).splitlines(),
        "      }",
        "    }",
        *("    if ((lane & 3) == 0) " + line for line in stats),
        "  }",
    ]
