"""The weight-only int4 GEMM on tensor cores, for W packed along K and at most 16 rows of A.

Memory-bound on the packed weights, so the kernel is built around reading them: each warp
owns ``column_tiles`` tiles of 8 columns; a lane (group g = lane / 4, quad q = lane % 4) reads
32 consecutive k of column g of each tile with one 16-byte load, the four quads together one
64-byte run per column; ``unroll`` 128-k chunks are loaded before any is used, so that several
loads per thread are in flight, and the next ``unroll`` chunks' loads are issued before these
are multiplied (double-buffered in registers). The block's ``warps`` warps split K (chunk c goes to warp
c mod warps; every warp makes the same trips, past K with zeros) and sum their partial tiles
through shared memory in warp order: deterministic.

Dequantizing in registers (the lop3 trick, written in C: NVCC makes it one lop3): a 32-bit word holds 8 nibbles; ``(word & 0x000f000f)
^ 0x64086408`` turns nibbles 0 and 4 into the fp16 pair 1024 + (code ^ 8), so subtracting 1032
gives the signed values exactly (bf16: 0x4308 and 136). Shifting the word by 4, 8 and 12 gives
the pairs (1, 5), (2, 6), (3, 7). Times the group's scale (rounded once to A's type, like the
reference's dequantized weight) they are mma.sync m16n8k16 B fragments. The k order inside a
k16 step does not change the sum, so the A fragments take the same permutation: halves (0, 4),
(1, 5), (2, 6), (3, 7) of each 8-half piece of A, gathered with byte permutes. Rows of A past
``rows`` are zero (M <= 8 skips the upper half of the tile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import store
from ..kernel import Kernel
from .rnn_projection import with_mma_functions

if TYPE_CHECKING:
    from .gemm_weight_only import WeightOnly

SMS = 132  # an H100 / H200: the grid should give every SM two blocks or more
CHUNK = 128  # k per warp step: 4 quads x 32
CHOICES = {"column_tiles": (1, 2, 4), "warps": (4, 8), "unroll": (1, 2)}


def choice(p: WeightOnly, tuning: dict[str, Any], node: str) -> dict[str, int]:
    """The launch choice: ``tuning`` checked, else as many column tiles per warp as keep two
    blocks per SM (A is reused across them), 8 warps splitting K, 2 chunks in flight."""
    for key, value in tuning.items():
        if key not in CHOICES or value not in CHOICES[key]:
            raise UnsupportedError(
                f"weight-only GEMM tuning {dict(tuning)}: {key} = {value!r} is not one of "
                + "; ".join(f"{k} in {list(v)}" for k, v in CHOICES.items()),
                node=node,
            )
    tiles = next((t for t in (4, 2) if -(-p.n // (8 * t)) >= 2 * SMS), 1)
    return {"column_tiles": tiles, "warps": 8, "unroll": 2, **tuning}


def candidates() -> list[dict[str, object]]:
    """Every launch choice, for autotuning (the same for every problem the kernel takes)."""
    return [
        {"column_tiles": t, "warps": w, "unroll": u}
        for t in CHOICES["column_tiles"]
        for w in CHOICES["warps"]
        for u in CHOICES["unroll"]
    ]


def kernel(fused: FusedNode, ctx: EmitContext, p: WeightOnly, launch: dict[str, int]) -> Kernel:
    tiles, warps, unroll = launch["column_tiles"], launch["warps"], launch["unroll"]
    params = KernelParams()
    a, w, scale = params.tensor(p.a), params.tensor(p.w), params.tensor(p.scale)
    out = params.tensor(p.out, writable=True)
    aligned = params.aligned_flag()
    bf16 = p.a.data_type is DataType.BFLOAT16
    pair = "__nv_bfloat162" if bf16 else "__half2"
    magic = "0x43084308u" if bf16 else "0x64086408u"  # 136 / 1032 in both halves: magic + 8
    to_pair = "__float2bfloat162_rn" if bf16 else "__float2half2_rn"
    ss, c_n = p.scale.static_stride, p.out.static_stride[-1]
    body = [
        f"constexpr int ROWS = {p.rows}, K = {p.k}, N = {p.n}, GROUP = {p.group};",
        f"constexpr int TILES = {tiles}, WARPS = {warps}, UNROLL = {unroll}, CHUNKS = {-(-p.k // CHUNK)};",
        f"constexpr long long W_COLUMN = {p.w.static_stride[1] // 2};  // bytes between columns",
        "__shared__ float4 partial[WARPS][TILES][32];",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;",
        "const long long first = (long long)blockIdx.x * (8 * TILES);",
        # 16 bytes from p: one vector load where the launch's pointers are 16-byte aligned
        "auto load16 = [&](const void* at) -> uint4 {",
        f"  if ({aligned}) return __ldg(reinterpret_cast<const uint4*>(at));",
        "  unsigned word[4] = {0, 0, 0, 0};",
        "  #pragma unroll",
        "  for (int i = 0; i < 16; ++i) word[i / 4] |= (unsigned)__ldg(reinterpret_cast<const unsigned char*>(at) + i) << (8 * (i % 4));",
        "  return make_uint4(word[0], word[1], word[2], word[3]);",
        "};",
        # nibbles 0 and 4 of v: the signed pair, times the scale pair, as a 32-bit fragment register
        f"auto dequant = [&](unsigned v, {pair} sc) -> unsigned {{",
        f"  const unsigned h = (v & 0x000f000fu) ^ {magic}, biased = {magic};  // one lop3",
        f"  {pair} x = __hsub2(*reinterpret_cast<const {pair}*>(&h), *reinterpret_cast<const {pair}*>(&biased));",
        "  x = __hmul2(x, sc);",
        "  return *reinterpret_cast<unsigned*>(&x);",
        "};",
        "float acc[TILES][4] = {};",
        # the weights and scales of UNROLL chunks (warp's chunks base + warp, base + warp + WARPS, ...)
        f"auto fetch = [&](int base, uint4 (&wv)[UNROLL][TILES], {pair} (&sc)[UNROLL][TILES]) {{",
        "  #pragma unroll",
        "  for (int u = 0; u < UNROLL; ++u) {",
        "    const int k0 = (base + warp + u * WARPS) * 128 + q * 32;",
        "    #pragma unroll",
        "    for (int j = 0; j < TILES; ++j) {",
        "      const long long n = first + 8 * j + g;",
        "      const bool live = n < N && k0 < K;",
        f"      wv[u][j] = live ? load16({w} + n * W_COLUMN + k0 / 2) : make_uint4(0, 0, 0, 0);",
        f"      sc[u][j] = {to_pair}(live ? gd::to<float>({scale}[(k0 / GROUP) * {ss[0]}LL + n * {ss[1]}LL]) : 0.0f);",
        "    }",
        "  }",
        "};",
        "uint4 wv[UNROLL][TILES];",
        f"{pair} sc[UNROLL][TILES];",
        "fetch(0, wv, sc);",
        "for (int c0 = 0; c0 < CHUNKS; c0 += WARPS * UNROLL) {  // the same trips in every warp",
        "  uint4 wc[UNROLL][TILES];",
        f"  {pair} scc[UNROLL][TILES];",
        "  #pragma unroll",
        "  for (int u = 0; u < UNROLL; ++u) {",
        "    #pragma unroll",
        "    for (int j = 0; j < TILES; ++j) { wc[u][j] = wv[u][j]; scc[u][j] = sc[u][j]; }",
        "  }",
        "  if (c0 + WARPS * UNROLL < CHUNKS) fetch(c0 + WARPS * UNROLL, wv, sc);  // in flight while these multiply",
        "  #pragma unroll",
        "  for (int u = 0; u < UNROLL; ++u) {",
        "    const int k0 = (c0 + warp + u * WARPS) * 128 + q * 32;",
        "    uint4 lo[4], hi[4];  // A's rows g and g + 8 at k0 .. k0 + 31",
        "    #pragma unroll",
        "    for (int piece = 0; piece < 4; ++piece) {",
        f"      lo[piece] = g < ROWS && k0 < K ? load16({a} + g * {p.a_row}LL + k0 + 8 * piece) : make_uint4(0, 0, 0, 0);",
        "      hi[piece] = ROWS > 8 && g + 8 < ROWS && k0 < K",
        f"        ? load16({a} + (g + 8) * {p.a_row}LL + k0 + 8 * piece) : make_uint4(0, 0, 0, 0);",
        "    }",
        "    #pragma unroll",
        "    for (int piece = 0; piece < 4; ++piece) {  // 8 k: k0 + 8 * piece ...",
        "      #pragma unroll",
        "      for (int hp = 0; hp < 2; ++hp) {  // k pairs (2 hp, 2 hp + 4) and (2 hp + 1, 2 hp + 5)",
        "        const unsigned lo_a = hp ? lo[piece].y : lo[piece].x, lo_b = hp ? lo[piece].w : lo[piece].z;",
        "        const unsigned hi_a = hp ? hi[piece].y : hi[piece].x, hi_b = hp ? hi[piece].w : hi[piece].z;",
        "        const unsigned frag[4] = {__byte_perm(lo_a, lo_b, 0x5410), __byte_perm(hi_a, hi_b, 0x5410),",
        "                                  __byte_perm(lo_a, lo_b, 0x7632), __byte_perm(hi_a, hi_b, 0x7632)};",
        "        #pragma unroll",
        "        for (int j = 0; j < TILES; ++j) {",
        "          const uint4 ws = wc[u][j];",
        "          const unsigned word = piece == 0 ? ws.x : piece == 1 ? ws.y : piece == 2 ? ws.z : ws.w;",
        "          const unsigned fb0 = dequant(word >> (8 * hp), scc[u][j]);",
        "          const unsigned fb1 = dequant(word >> (8 * hp + 4), scc[u][j]);",
        "          mma_16816(acc[j], frag, fb0, fb1);",
        "        }",
        "      }",
        "    }",
        "  }",
        "}",
        "#pragma unroll",
        "for (int j = 0; j < TILES; ++j) partial[warp][j][lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);",
        "__syncthreads();",
        # one output per thread-step: tile j, lane, register e of the m16n8 accumulator fragment
        "for (int e = threadIdx.x; e < TILES * 128; e += WARPS * 32) {",
        "  const int j = e >> 7, from = (e >> 2) & 31, reg = e & 3;",
        "  const int row = (from >> 2) + 8 * (reg >> 1);",
        "  const long long n = first + 8 * j + 2 * (from & 3) + (reg & 1);",
        "  if (row >= ROWS || n >= N) continue;",
        "  float sum = 0.0f;",
        "  for (int v = 0; v < WARPS; ++v) sum += reinterpret_cast<const float*>(&partial[v][j][from])[reg];",
        f"  {out}[row * {p.c_row}LL + n * {c_n}LL] = {store(p.out.data_type, 'sum')};",
        "}",
    ]
    threads = 32 * warps
    name, source = kernel_source(ctx, fused, "weight_only_gemm_mma", params, threads, indent(body, 1))
    grid = (-(-p.n // (8 * tiles)), 1, 1)
    plain = Kernel(name, source, grid, (threads, 1, 1), 0, tuple(params.bindings), alignment=16)
    return with_mma_functions(plain, p.a.data_type)
