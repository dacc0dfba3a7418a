"""The tensor-core projection's k loop when its operands arrive in 16-byte pieces: each thread
loads its pieces of the next k tile into registers (one piece per thread of A's 64 x 32 tile,
two of B's 128 x 32) while the warps multiply the current tile, then stores them into the
other of two shared-memory stages, so the global loads' latency hides behind the products
and each tile costs one barrier. The element-by-element loop (rnn_projection.py) issues a
2-byte load per element and waits for every batch of them before any product, which makes
the projection latency-bound at the issue's target shape.

A piece is 8 consecutive k of one row: one 16-byte load of a 16-bit operand, or two of a
float one (a deeper layer's input, the previous layer's float output) rounded to the operand
type. Rows past the problem, and k past GK (GK % 8 == 0, so a piece is all in or all out),
are zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

PIECE = 8  # k elements per 16-byte piece of a 16-bit operand


@dataclass(frozen=True)
class VectorSources:
    """Where piece (row, k) of each operand starts: ``a_at`` (in ``m``, ``k``) and ``b_at`` (in
    ``column``, ``k`` and what ``b_index`` defines from ``column``: the projection's W_ih of
    direction ``dir``, its row ``row``), C expressions of a pointer; ``a_float``: A is float
    (converted per element as stored)."""

    a_at: str
    b_at: str
    a_float: bool
    b_index: str = "const int dir = column / GATE_ROWS, row = column % GATE_ROWS;"


def vector_loop(sources: VectorSources, staged: str, products: list[str]) -> list[str]:
    """The pipelined k loop over the two-stage ``as`` / ``bs`` tiles, ``products`` being the
    warps' mma.sync lines over the stage ``at`` / ``bt`` point to."""
    a_piece = "float4 a_piece[2];" if sources.a_float else "uint4 a_piece;"
    return [
        "// one A piece (row tid / 4, k piece tid % 4) and two B pieces (rows tid / 4 + 64 i) per thread",
        "const int piece_row = tid >> 2, piece_k = (tid & 3) * 8;",
        a_piece,
        "uint4 b_piece[2];",
        "auto load_pieces = [&](int k0) {",
        "  const int k = k0 + piece_k;",
        "  {",
        "    const int m = bm + piece_row;",
        *("    " + line for line in _load_a(sources)),
        "  }",
        "#pragma unroll",
        "  for (int i = 0; i < 2; ++i) {",
        "    const int column = bn + piece_row + 64 * i;",
        f"    {sources.b_index}",
        f"    b_piece[i] = column < GN && k < GK ? *reinterpret_cast<const uint4*>({sources.b_at}) : make_uint4(0, 0, 0, 0);",
        "  }",
        "};",
        "auto store_pieces = [&](int stage) {",
        *("  " + line for line in _store_a(sources, staged)),
        "#pragma unroll",
        "  for (int i = 0; i < 2; ++i)",
        "    *reinterpret_cast<uint4*>(&bs[stage * BN * STRIDE + (piece_row + 64 * i) * STRIDE + piece_k]) = b_piece[i];",
        "};",
        "load_pieces(0);",
        "store_pieces(0);",
        "__syncthreads();",
        "for (int k0 = 0, stage = 0; k0 < GK; k0 += BK, stage ^= 1) {",
        "  const bool more = k0 + BK < GK;",
        "  if (more) load_pieces(k0 + BK);  // in flight during the products",
        f"  const {staged}* const at = as + stage * BM * STRIDE;",
        f"  const {staged}* const bt = bs + stage * BN * STRIDE;",
        *("  " + line for line in products),
        "  if (more) store_pieces(stage ^ 1);  // the stage every warp finished before the last barrier",
        "  __syncthreads();",
        "}",
    ]


def _load_a(sources: VectorSources) -> list[str]:
    valid = "m < GM && k < GK"
    if not sources.a_float:
        return [f"a_piece = {valid} ? *reinterpret_cast<const uint4*>({sources.a_at}) : make_uint4(0, 0, 0, 0);"]
    return [
        "#pragma unroll",
        "for (int h = 0; h < 2; ++h)",
        f"  a_piece[h] = {valid} ? reinterpret_cast<const float4*>({sources.a_at})[h] : make_float4(0, 0, 0, 0);",
    ]


def _store_a(sources: VectorSources, staged: str) -> list[str]:
    target = "&as[stage * BM * STRIDE + piece_row * STRIDE + piece_k]"
    if not sources.a_float:
        return [f"*reinterpret_cast<uint4*>({target}) = a_piece;"]
    return [
        "{",
        f"  __align__(16) {staged} rounded[8];",
        "  const float* const values = reinterpret_cast<const float*>(a_piece);",
        "#pragma unroll",
        f"  for (int e = 0; e < 8; ++e) rounded[e] = gd::from<{staged}>(values[e]);",
        f"  *reinterpret_cast<uint4*>({target}) = *reinterpret_cast<const uint4*>(rounded);",
        "}",
    ]
