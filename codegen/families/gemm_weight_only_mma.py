"""The weight-only int4 / int8 / fp8_e4m3 GEMM on tensor cores, for W k-contiguous and at most 16
rows of A.

Memory-bound on the packed weights, so the kernel is built around reading them, and around
doing little per weight. The weights are the mma.sync m16n8k16 A operand (16 output columns
by 16 k), the activations its B operand (8 tokens): a tile of 16 columns takes one MMA per
16 k for up to 8 tokens, two for up to 16.

Loads: each warp owns ``column_tiles`` tiles of 16 columns; a lane (group g = lane / 4, quad
q = lane % 4) reads 32 consecutive k (int4; 16 of 8-bit weights) of columns g and g + 8 of each
tile, one 16-byte load each, the four quads together one 64-byte run per column. The warp's
chunks of 128 k (64 of 8-bit weights) come in sets of ``unroll``, two sets in flight while one
multiplies (ping-pong registers); ``early_a`` fetches a set's activations with it. The block's
``warps`` warps split K (chunk c goes to warp c mod warps; every warp makes the same trips,
past K with zeros) and sum their partial tiles through shared memory in warp order:
deterministic. A launch whose pointers are not all 16-byte aligned runs the same loop with
byte loads.

Dequantizing in registers (the lop3 trick; the CPU emulation reads its C form): a 32-bit
word holds 8 nibbles; ``(word & 0x000f000f) ^ 0x64086408`` turns nibbles 0 and 4 into the fp16
pair 1024 + (code ^ 8), so subtracting 1032 gives the signed values exactly (bf16: 0x4308,
136). Shifting the word by 4, 8 and 12 gives the pairs (1, 5), (2, 6), (3, 7). Times the
group's scale (rounded once to A's type, as the reference rounds the dequantized weight) they
are A fragment registers. The k order inside a k16 step does not change the sum, so the
activations' B fragments take the same permutation: halves (0, 4), (1, 5), (2, 6), (3, 7) of
each 8-half piece of a token's row, gathered with byte permutes. Tokens past ``rows`` are zero.

int8 (the prmt trick, exact): a word holds 4 signed codes (k 0-3); ``word ^ 0x80808080`` makes
them unsigned (code + 128), and a byte permute sets each beside the fp16 exponent byte 0x64:
1024 + code + 128, pairs (0, 2) and (1, 3); subtracting 1152 gives the codes. bf16 has too few
mantissa bits for that, so each byte goes beside fp32's 0x4B (2^23 + code + 128), less
2^23 + 128 in fp32, and the pair is the two floats' high halves (exact: integers of 8 bits).
The activations' pieces take the matching permutation: halves (0, 2) and (1, 3) of each 4.
fp8_e4m3 takes the same pairs: a byte permute sets a pair side by side, and cuda_fp8.h's
conversion (one cvt.rn.f16x2.e4m3x2 from sm_89, exact) makes the fp16 pair (bf16: through
fp32, exact: 4 significant bits).
"""

from __future__ import annotations

from typing import Any

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.errors import UnsupportedError

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import store
from ..kernel import Kernel
from . import gemm_weight_only_loops as loops
from .gemm_loaders import ASYNC_COPY_PRELUDE
from .gemm_weight_only_problem import WeightOnly
from .rnn_projection import with_mma_functions

SMS = 132  # an H100 / H200: the grid should give every SM two blocks or more
TILE = 16  # output columns per MMA
CHOICES = {
    "column_tiles": (1, 2, 4),
    "warps": (4, 8, 16),
    "unroll": (1, 2, 4),
    "early_a": (0, 1),
    "split": (1, 2, 4, 8),
    "stages": (0, 3, 4, 6),
}
SHARED_BYTES = 227 * 1024  # an SM's shared memory (sm_80: 163 KB; the driver refuses what does not fit)


def _refusal(p: WeightOnly, launch: dict[str, int], arch: int) -> str | None:
    """Why a combination of choices cannot build, or None: sets of 4 chunks hold 16 loads per
    tile in registers (one tile only), 16 warps' partial tiles fill 32 KB of static shared
    memory per 2 tiles (at most 2), activations fetched a set ahead (``early_a``) hold 16
    k per load, up to 8 tokens (8-bit weights), and K slices (``split``) are summed through a
    thread-block cluster's shared memory (sm_90); the ring must fit an SM's shared memory."""
    if launch["split"] > 1 and arch < 90:
        return (
            f"split = {launch['split']} takes sm_90 or later (a thread-block cluster sums the K slices), not sm_{arch}"
        )
    if launch["stages"] and launch["early_a"]:
        return "stages > 0 takes early_a = 0 (the ring carries the weights, multiply loads the activations)"
    if loops.ring_bytes(launch) > SHARED_BYTES:
        return f"stages = {launch['stages']}: the ring needs {loops.ring_bytes(launch)} bytes of shared memory, over {SHARED_BYTES}"
    if launch["early_a"] and (p.w.data_type.is_packed or p.rows > 8):
        return "early_a = 1 takes 8-bit weights and at most 8 rows (registers)"
    if launch["unroll"] == 4 and launch["column_tiles"] != 1:
        return "unroll = 4 takes column_tiles = 1 (registers)"
    if launch["warps"] == 16 and launch["column_tiles"] > 2:
        return "warps = 16 takes column_tiles <= 2 (shared memory for the partial sums)"
    return None


def choice(p: WeightOnly, tuning: dict[str, Any], node: str, arch: int) -> dict[str, int]:
    """The launch choice: ``tuning`` checked, else as many column tiles per warp as keep two
    blocks per SM (the activations are reused across them), 8 warps splitting K, and sets of 2
    chunks for one tile, of 1 for more (registers: two blocks of 256 threads per SM). 8-bit
    weights in one tile per warp for up to 8 tokens take 16 warps in sets of 4 chunks: 11.3 µs
    against 13.8 at 1 x 4096 x 4096 int8 (H200, one run: RESULTS.md); ptxas fits them in 64
    registers, so two blocks of 512 threads share an SM. Where two tiles would be taken,
    int8 weights with one scale per column for up to 8 tokens take one tile through the
    cp.async ring instead (_ring_by_default)."""
    for key, value in tuning.items():
        if key not in CHOICES or value not in CHOICES[key]:
            raise UnsupportedError(
                f"weight-only GEMM tuning {dict(tuning)}: {key} = {value!r} is not one of "
                + "; ".join(f"{k} in {list(v)}" for k, v in CHOICES.items()),
                node=node,
            )
    tiles = tuning.get("column_tiles", next((t for t in (4, 2) if -(-p.n // (TILE * t)) >= 2 * SMS), 1))
    launch = {
        "column_tiles": tiles,
        "warps": 8,
        "unroll": 2 if tiles == 1 else 1,
        "early_a": 0,
        "split": 1,
        "stages": 0,
    }
    if tiles == 1 and not p.w.data_type.is_packed and p.rows <= 8:
        launch.update(warps=16, unroll=4)
    if "column_tiles" not in tuning and tiles == 2 and _ring_by_default(p):
        launch.update(column_tiles=1, unroll=1, stages=4)
    launch.update(tuning)
    refusal = _refusal(p, launch, arch)
    if refusal is not None:
        raise UnsupportedError(f"weight-only GEMM tuning {dict(tuning)}: {refusal}", node=node)
    return launch


def _ring_by_default(p: WeightOnly) -> bool:
    """int8 weights with one scale per column, up to 8 tokens: one column tile per warp, 8 warps,
    through a 4-stage ring (tiles/warps/unroll/early_a/split/stages 1/8/1/0/1/4) rather than 2
    tiles in ping-pong registers: 31.1 against 36.7 µs at 1 x 4096 x 14336, 31.7 against 38.0 at
    4 tokens (H200, RESULTS.md, h/wosplit; measured at 1 and 4 tokens, per-channel int8 only:
    16 tokens were slower, 37.5 against 34.9, and int4 gained nothing)."""
    return p.w.data_type is DataType.INT8 and p.group >= p.k and p.rows <= 8


def candidates(p: WeightOnly, arch: int) -> list[dict[str, object]]:
    """The launch choices autotuning times: every one the problem can take without K slices or
    the ring; with them, 2 or 4 K slices and a ring of 4 stages, beside 1 or 2 column tiles of 4
    or 8 warps in sets of 1 or 2 chunks (the ring: of 1), so that the list stays short enough
    to time (the others can still be asked for)."""
    every = [
        {
            "column_tiles": t,
            "warps": w,
            "unroll": u,
            "early_a": e,
            "split": s,
            "stages": r,
        }
        for t in CHOICES["column_tiles"]
        for w in CHOICES["warps"]
        for u in CHOICES["unroll"]
        for e in CHOICES["early_a"]
        for s in CHOICES["split"]
        for r in CHOICES["stages"]
        if (s == 1 or (s <= 4 and t <= 2 and w <= 8 and u <= 2 and not e))
        and (not r or (r == 4 and u == 1 and t <= 2 and w <= 8 and s <= 2))
    ]
    return [dict(launch) for launch in every if _refusal(p, launch, arch) is None]


def _dequant_int4(pair: str, magic: str, nz: str) -> list[str]:
    """dequant(v, scale pair): nibbles 0 and 4 of v, the signed pair times the scale pair (less
    the zero point, with ``nz``), as a 32-bit fragment register."""
    return [
        f"auto dequant = [&](unsigned v, {pair} sc{f', {pair} nz' if nz else ''}) -> unsigned {{",
        "  unsigned h;",
        "#ifdef __CUDA_ARCH__  // one lop3: NVCC splits the C expression into two",
        f'  asm("lop3.b32 %0, %1, 0x000f000f, {magic}, 0x6a;" : "=r"(h) : "r"(v));',
        "#else",
        f"  h = (v & 0x000f000fu) ^ {magic}u;",
        "#endif",
        f"  const unsigned biased = {magic}u;",
        f"  {pair} x = __hsub2(*reinterpret_cast<const {pair}*>(&h), *reinterpret_cast<const {pair}*>(&biased));",
        "  x = __hfma2(x, sc, nz);" if nz else "  x = __hmul2(x, sc);",
        "  return *reinterpret_cast<unsigned*>(&x);",
        "};",
    ]


def _dequant_bytes(weight: DataType, pair: str, bf16: bool) -> list[str]:
    """dequant(v, scale pair, even, odd): the 4 int8 or fp8_e4m3 bytes of v, pairs (0, 2) and
    (1, 3), times the scale pair, as two 32-bit fragment registers (the module's tricks)."""
    if weight is DataType.FP8_E4M3:
        to_pair = "__float22bfloat162_rn(__half22float2(x))" if bf16 else "x"
        exact = [
            "  unsigned h[2];",
            "  #pragma unroll",
            "  for (int i = 0; i < 2; ++i) {  // bytes (i, i + 2) side by side, converted exactly",
            "    const __half2 x = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)__byte_perm(v, 0u, 0x20 + i * 0x11), __NV_E4M3));",
            f"    const {pair} y = {to_pair};",
            "    h[i] = *reinterpret_cast<const unsigned*>(&y);",
            "  }",
        ]
    elif bf16:
        exact = [
            "  float f[4];  // 2^23 + code + 128 in fp32, less 2^23 + 128",
            "  #pragma unroll",
            "  for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650 + i)) - 8388736.0f;",
            "  unsigned h[2] = {__byte_perm(__float_as_uint(f[0]), __float_as_uint(f[2]), 0x7632),",
            "                   __byte_perm(__float_as_uint(f[1]), __float_as_uint(f[3]), 0x7632)};",
        ]
    else:
        exact = [
            "  unsigned h[2] = {__byte_perm(u, 0x64646464u, 0x4240), __byte_perm(u, 0x64646464u, 0x4341)};  // 1024 + code + 128",
            "  const unsigned biased = 0x64806480u;  // 1152 in both halves",
            "  #pragma unroll",
            "  for (int i = 0; i < 2; ++i) {",
            f"    const {pair} x = __hsub2(*reinterpret_cast<const {pair}*>(&h[i]), *reinterpret_cast<const {pair}*>(&biased));",
            "    h[i] = *reinterpret_cast<const unsigned*>(&x);",
            "  }",
        ]
    return [
        f"auto dequant = [&](unsigned v, {pair} sc, unsigned& even, unsigned& odd) {{",
        *([] if weight is DataType.FP8_E4M3 else ["  const unsigned u = v ^ 0x80808080u;  // code + 128 in each byte"]),
        *exact,
        f"  const {pair} e = __hmul2(*reinterpret_cast<const {pair}*>(&h[0]), sc), o = __hmul2(*reinterpret_cast<const {pair}*>(&h[1]), sc);",
        "  even = *reinterpret_cast<const unsigned*>(&e);",
        "  odd = *reinterpret_cast<const unsigned*>(&o);",
        "};",
    ]


def kernel(fused: FusedNode, ctx: EmitContext, p: WeightOnly, launch: dict[str, int]) -> Kernel:
    tiles, warps, unroll, early = launch["column_tiles"], launch["warps"], launch["unroll"], launch["early_a"]
    split, stages = launch["split"], launch["stages"]
    byte_codes = not p.w.data_type.is_packed
    chunk = 4 * p.k_per_load  # k per warp step: 4 quads of one 16-byte load
    params = KernelParams()
    a, w, scale = params.tensor(p.a), params.tensor(p.w), params.tensor(p.scale)
    out = params.tensor(p.out, writable=True)
    aligned = params.aligned_flag()
    bf16 = p.a.data_type is DataType.BFLOAT16
    pair = "__nv_bfloat162" if bf16 else "__half2"
    magic = "0x43084308" if bf16 else "0x64086408"  # 136 / 1032 in both halves: magic + 8
    to_pair = "__float2bfloat162_rn" if bf16 else "__float2half2_rn"
    ss, c_n = p.scale.static_stride, p.out.static_stride[-1]
    target = f"{out}[row * {p.c_row}LL + n * {c_n}LL]"
    # Zero points: a weight is q * scale + (-zero * scale), one fma per pair where the symmetric
    # kernel has one multiply; -zero * scale is computed in fp32 as the scales are fetched, and
    # travels beside them (nz, in the za / zb ping-pong arrays).
    nz = ""
    if p.zero_point is not None:
        zero, zs = params.tensor(p.zero_point), p.zero_point.static_stride
        nz = f"{to_pair}(live ? -gd::to<float>({zero}[(k0 / GROUP) * {zs[0]}LL + n * {zs[1]}LL]) * s : 0.0f)"
    nz_array = f"{pair} (&nz)[UNROLL][TILES][2]"
    nz_out, nz_in = (f", {nz_array}", f", const {nz_array}") if nz else ("", "")  # fetch's and multiply's
    nz_arg = ", nz[u][j][h]" if nz else ""
    # early_a (8-bit weights, up to 8 tokens): the activations come with the weights, a set
    # ahead, so that multiply waits for neither; else multiply loads them (L2) as it starts
    xs_array = "uint4 (&xs)[UNROLL][HALVES][PIECES]"
    xs_out, xs_in = (f", {xs_array}", f", const {xs_array}") if early else ("", "")
    activations = [
        "#pragma unroll",
        "for (int t = 0; t < HALVES; ++t) {",
        "  #pragma unroll",
        "  for (int piece = 0; piece < PIECES; ++piece) {",
        "    const bool live = g + 8 * t < ROWS && k0 < K;",
        "    X[t][piece] = live ? LOAD(A + (g + 8 * t) * A_ROWLL + k0 + 8 * piece) : make_uint4(0, 0, 0, 0);",
        "  }",
        "}",
    ]

    # The k order inside a k16 step is free, so each word's codes pair up as they dequantize
    # cheapest, and the activations' halves follow: int4 pairs (2 hp, 2 hp + 4), (2 hp + 1,
    # 2 hp + 5) of a piece's word; int8 pairs (0, 2), (1, 3) of its word hp.
    if byte_codes:
        pairs, word_at = "(0, 2) and (1, 3) of word 2 piece + hp", "2 * piece + hp"
        halves = "hp ? x[t][piece].z : x[t][piece].x, hi = hp ? x[t][piece].w : x[t][piece].y"
    else:
        pairs, word_at = "(2 hp, 2 hp + 4) and (2 hp + 1, 2 hp + 5)", "piece"
        halves = "hp ? x[t][piece].y : x[t][piece].x, hi = hp ? x[t][piece].w : x[t][piece].z"

    def product(load: str, ring: bool) -> list[str]:
        """The K loop and its loads, reading 16 bytes with ``load``, or with ``ring`` copying
        them into the thread's slots of the shared-memory ring (cp.async, STAGES sets)."""

        def load_x(into: str, depth: str) -> list[str]:
            """The loads of tokens g and g + 8 at k0 .. k0 + KPL - 1 into ``into``."""
            text = [line.replace("X[", f"{into}[").replace("LOAD", load) for line in activations]
            text = [line.replace("A + ", f"{a} + ").replace("A_ROWLL", f"{p.a_row}LL") for line in text]
            return [depth + line for line in text]

        return [
            # the weights and scales of a set of chunks: the warp's chunks base + warp, base + warp + WARPS, ...
            f"auto fetch = [&](int base, {'int stage' if ring else 'uint4 (&wv)[UNROLL][TILES][2]'}, {pair} (&sc)[UNROLL][TILES][2]{nz_out}{xs_out}) {{",
            "  #pragma unroll",
            "  for (int u = 0; u < UNROLL; ++u) {",
            "    const int k0 = (base + kw + u * KWARPS) * CHUNK + q * KPL;",
            "    #pragma unroll",
            "    for (int j = 0; j < TILES; ++j) {",
            "      #pragma unroll",
            "      for (int h = 0; h < 2; ++h) {  // columns g and g + 8 of the tile",
            "        const long long n = first + 16 * j + 8 * h + g;",
            "        const bool live = n < N && k0 < K;",
            (
                f"        copy16(smem_addr(ring + SLOT(stage, u, j, h)), {w} + (live ? n * W_COLUMN + k0{'' if byte_codes else ' / 2'} : 0), live);"
                if ring
                else f"        wv[u][j][h] = live ? {load}({w} + n * W_COLUMN + k0{'' if byte_codes else ' / 2'}) : make_uint4(0, 0, 0, 0);"
            ),
            f"        const float s = live ? gd::to<float>({scale}[(k0 / GROUP) * {ss[0]}LL + n * {ss[1]}LL]) : 0.0f;",
            f"        sc[u][j][h] = {to_pair}(s);",
            *([f"        nz[u][j][h] = {nz};"] if nz else []),
            "      }",
            "    }",
            *(load_x("xs[u]", "    ") if early else []),
            "  }",
            *(['  asm volatile("cp.async.commit_group;\\n" ::);'] if ring else []),
            "};",
            f"auto multiply = [&](int base, const uint4 (&wv)[UNROLL][TILES][2], const {pair} (&sc)[UNROLL][TILES][2]{nz_in}{xs_in}) {{",
            "  #pragma unroll",
            "  for (int u = 0; u < UNROLL; ++u) {",
            *(
                ["    const uint4 (&x)[HALVES][PIECES] = xs[u];  // tokens g and g + 8 at k0 .. k0 + KPL - 1"]
                if early
                else [
                    "    const int k0 = (base + kw + u * KWARPS) * CHUNK + q * KPL;",
                    "    uint4 x[HALVES][PIECES];  // tokens g and g + 8 at k0 .. k0 + KPL - 1",
                    *load_x("x", "    "),
                ]
            ),
            "    #pragma unroll",
            "    for (int piece = 0; piece < PIECES; ++piece) {  // 8 k: k0 + 8 * piece ...",
            "      #pragma unroll",
            f"      for (int hp = 0; hp < 2; ++hp) {{  // k pairs {pairs}",
            "        unsigned fb[HALVES][2];",
            "        #pragma unroll",
            "        for (int t = 0; t < HALVES; ++t) {",
            f"          const unsigned lo = {halves};",
            "          fb[t][0] = __byte_perm(lo, hi, 0x5410);",
            "          fb[t][1] = __byte_perm(lo, hi, 0x7632);",
            "        }",
            "        #pragma unroll",
            "        for (int j = 0; j < TILES; ++j) {",
            "          unsigned fa[4];  // columns g, g + 8; k pairs (2 hp, 2 hp + 4), (2 hp + 1, 2 hp + 5)",
            "          #pragma unroll",
            "          for (int h = 0; h < 2; ++h) {",
            "            const uint4 ws = wv[u][j][h];",
            f"            const int at = {word_at};",
            "            const unsigned word = at == 0 ? ws.x : at == 1 ? ws.y : at == 2 ? ws.z : ws.w;",
            *(
                ["            dequant(word, sc[u][j][h], fa[h], fa[2 + h]);"]
                if byte_codes
                else [
                    f"            fa[h] = dequant(word >> (8 * hp), sc[u][j][h]{nz_arg});",
                    f"            fa[2 + h] = dequant(word >> (8 * hp + 4), sc[u][j][h]{nz_arg});",
                ]
            ),
            "          }",
            "          #pragma unroll",
            "          for (int t = 0; t < HALVES; ++t) mma_16816(acc[j][t], fa, fb[t][0], fb[t][1]);",
            "        }",
            "      }",
            "    }",
            "  }",
            "};",
            "constexpr int STEP = KWARPS * UNROLL;",
            *(loops.ring_loop(pair, stages, bool(nz)) if ring else loops.ping_pong(pair, bool(nz), bool(early))),
        ]

    body = [
        f"constexpr int ROWS = {p.rows}, K = {p.k}, N = {p.n}, GROUP = {p.group}, HALVES = ROWS > 8 ? 2 : 1;",
        f"constexpr int TILES = {tiles}, WARPS = {warps}, UNROLL = {unroll}, CHUNKS = {-(-p.k // chunk)};",
        f"constexpr int SPLIT = {split}, KWARPS = SPLIT * WARPS;  // K slices (blocks of a cluster); warps over K",
        f"constexpr int CHUNK = {chunk}, KPL = {p.k_per_load}, PIECES = KPL / 8;  // k per warp step, lane, 8 halves",
        f"constexpr long long W_COLUMN = {p.w.static_stride[1] // (1 if byte_codes else 2)};  // bytes between columns",
        "__shared__ float4 partial[WARPS][TILES * HALVES][32];",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;",
        "const int rank = blockIdx.x % SPLIT, kw = rank * WARPS + warp;  // the block's K slice, the warp's",
        "const long long first = (long long)(blockIdx.x / SPLIT) * (16 * TILES);",
        *(_dequant_bytes(p.w.data_type, pair, bf16) if byte_codes else _dequant_int4(pair, magic, nz)),
        "float acc[TILES][HALVES][4] = {};  // [tile][tokens 0-7, 8-15][m16n8 accumulator fragment]",
        *(loops.cluster_setup() if split > 1 else []),
        *(loops.ring_setup(stages, warps) if stages else []),
        "auto load_wide = [&](const void* at) -> uint4 { return __ldg(reinterpret_cast<const uint4*>(at)); };",
        "auto load_bytes = [&](const void* at) -> uint4 {",
        "  unsigned word[4] = {0, 0, 0, 0};",
        "  #pragma unroll",
        "  for (int i = 0; i < 16; ++i)",
        "    word[i / 4] |= (unsigned)__ldg(reinterpret_cast<const unsigned char*>(at) + i) << (8 * (i % 4));",
        "  return make_uint4(word[0], word[1], word[2], word[3]);",
        "};",
        f"if ({aligned}) {{",
        *("  " + line for line in product("load_wide", stages > 0)),
        "} else {",
        *("  " + line for line in product("load_bytes", False)),
        "}",
        *loops.tile_end(target, store(p.out.data_type, "sum"), split > 1),
    ]
    threads = 32 * warps
    name, source = kernel_source(
        ctx,
        fused,
        "weight_only_gemm_mma",
        params,
        threads,
        indent(body, 1),
        device_functions=ASYNC_COPY_PRELUDE if stages else "",
        cluster=split,
    )
    grid = (-(-p.n // (TILE * tiles)) * split, 1, 1)
    plain = Kernel(name, source, grid, (threads, 1, 1), loops.ring_bytes(launch), tuple(params.bindings), alignment=16)
    return with_mma_functions(plain, p.a.data_type)
