"""The tensor-core step's product with its phases overlapped (launch choice ``rnn_step_schedule``
"overlapped", the default): measured at issue 13's shape (H 1024, N 64, an H200), the serial
product (rnn_step_mma.py) spent about 5 us of a 15 us step waiting for its staging, 4 us in
the products and 3.5 us in the cell's global loads, one after the other. Here:

- the k chunk is staged in SUBCHUNKS ``cp.async`` groups, and the warps multiply a group as
  soon as it lands while the later ones are still in flight;
- each warp owns one m16 tile of sequences and a row of n8 tiles (warps along the sequences,
  then the rows, then k), so it loads its A fragment once for all its n8 tiles: fewer
  shared-memory reads per product, the bound of the serial product;
- each thread loads the cell's operands (the projections, h_{t-1}, c_{t-1} and b_hh of the
  cells it will update) into registers before the staging, so their latency hides behind it.

Step 0 and unaligned launches stage element by element, as the serial product does.
"""

from __future__ import annotations

from graphdnn.dtypes import DataType

from .direct_common import THREADS
from .rnn_layer import RnnLayer, StepProduct, StepSources
from .rnn_step_mma import (
    PIECE,
    WARPS,
    StepCopies,
    cell_inputs,
    fitted_chunk,
    shared_bytes,
    step_operands,
    step_tiles,
)

SUBCHUNKS = 4  # cp.async groups per staged k chunk, when H is large enough for them


def overlapped_product(
    layer: RnnLayer, units: int, operand: DataType, sources: StepSources, copies: StepCopies | None, arch: int
) -> StepProduct:
    m_tiles, rows = step_tiles(layer, units)
    n_tiles = rows // 8
    warps_n = min(n_tiles, WARPS // m_tiles)
    k_parts = max(1, WARPS // (m_tiles * warps_n))
    per_warp = -(-n_tiles // warps_n)
    subchunks = SUBCHUNKS if copies is not None and layer.hidden >= 128 * SUBCHUNKS else 1
    chunk = fitted_chunk(layer.hidden, 16 * k_parts * subchunks, m_tiles, rows, k_parts, arch)
    cells = -(-16 * m_tiles * units // THREADS)
    constants = [
        f"constexpr int MT = {m_tiles}, NT = {n_tiles}, WN = {warps_n}, KP = {k_parts}, TN = {per_warp};",
        f"constexpr int NC = 16 * MT, ROWS = {rows}, KC = {chunk}, KS = KC / {subchunks}, STRIDE = KC + 8, CS = ROWS + 1;",
        f"constexpr int CELLS = {cells};  // cells (sequence, unit) per thread and pass",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        "// this warp's m16 tile, first n8 tile (then every WN-th) and share of k; every warp runs",
        "// the same products (warps past MT * WN * KP, and n8 tiles past NT, on a repeated tile, not",
        "// stored): the block's threads reach each mma.sync together",
        "const int wm = warp % MT, wn = warp / MT % WN, part = min(warp / (MT * WN), KP - 1);",
        "const bool active = warp < MT * WN * KP;",
    ]
    shared, weight_rows, h_rows = step_operands(sources, operand)
    product = [
        "float acc[TN][4];",
        "#pragma unroll",
        "for (int i = 0; i < TN; ++i)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;",
        "auto multiply = [&](int k_low) {  // the products over k_low .. k_low + KS of the staged chunk",
        "  const int row = wm * 16 + (lane >> 2);",
        "#pragma unroll 2",
        "  for (int kk = k_low + part * (KS / KP); kk < k_low + (part + 1) * (KS / KP); kk += 16) {",
        "    const int k = kk + 2 * (lane & 3);",
        "    unsigned a[4];",
        "    a[0] = *reinterpret_cast<const unsigned*>(&hs[row * STRIDE + k]);",
        "    a[1] = *reinterpret_cast<const unsigned*>(&hs[(row + 8) * STRIDE + k]);",
        "    a[2] = *reinterpret_cast<const unsigned*>(&hs[row * STRIDE + k + 8]);",
        "    a[3] = *reinterpret_cast<const unsigned*>(&hs[(row + 8) * STRIDE + k + 8]);",
        "#pragma unroll",
        "    for (int i = 0; i < TN; ++i) {",
        "      const int tile = wn + i * WN, column = (tile < NT ? tile : 0) * 8 + (lane >> 2);",
        "      const unsigned b0 = *reinterpret_cast<const unsigned*>(&ws[column * STRIDE + k]);",
        "      const unsigned b1 = *reinterpret_cast<const unsigned*>(&ws[column * STRIDE + k + 8]);",
        "      mma_16816(acc[i], a, b0, b1);",
        "    }",
        "  }",
        "};",
        "for (int k0 = 0; k0 < H; k0 += KC) {",
        "  __syncthreads();  // everyone is done with the previous chunk",
        *("  " + line for line in _staging(weight_rows, h_rows, copies, subchunks)),
        "}",
        "#pragma unroll",
        "for (int i = 0; i < TN; ++i) {",
        "  const int tile = wn + i * WN;",
        "  if (!active || tile >= NT) continue;",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {  // fragment e: (row + 8 (e >= 2), column + e % 2)",
        "    const int row = wm * 16 + (lane >> 2) + (e >> 1) * 8, column = tile * 8 + 2 * (lane & 3) + (e & 1);",
        "    products[(part * NC + row) * CS + column] = acc[i][e];",
        "  }",
        "}",
        "__syncthreads();",
    ]
    cell_at = [
        f"const int p = threadIdx.x + q * {THREADS};",
        "const int n = n0 + p / U, j = u0 + p % U, r = (p / U) * CS + (p % U) * G;",
        "if (p >= NC * U || n >= N || j >= H) continue;",
    ]
    cell_open = ["#pragma unroll", "for (int q = 0; q < CELLS; ++q) {", *("  " + line for line in cell_at)]
    product_of, state_stores = cell_inputs(copies, operand, k_parts)
    shared_size = shared_bytes(m_tiles, rows, chunk, k_parts)
    return StepProduct(
        constants,
        shared,
        16 * m_tiles,
        product,
        cell_open,
        ["}"],
        product_of,
        state_stores,
        shared_size,
        cells,
        tuple(cell_at),
    )


def _staging(weight_rows: list[str], h_rows: list[str], copies: StepCopies | None, subchunks: int) -> list[str]:
    """The chunk's staging then its products: with ``copies``, one cp.async group per KS of k
    (W_hh rows when aligned, h_{t-1} from step 1), each multiplied once it lands; the element
    by element staging (the rest) is complete before the first product."""
    if copies is None:
        return [*weight_rows, *h_rows, "__syncthreads();", "multiply(0);"]
    h_prev = f"{copies.state16} + (parity * D + dir) * N * H + m * H + k"
    lines: list[str] = []
    for sub in range(subchunks):
        if copies.weight_at is not None:
            lines += [
                f"if ({copies.aligned}) {{",
                *_copies(
                    "ROWS",
                    sub,
                    "const int g = r % G, j = u0 + r / G;",
                    "j < u0 + U && j < H && k < H",
                    copies.weight_at,
                    copies.weight_base,
                    "ws",
                ),
                "}",
            ]
        lines += [
            "if (step > 0) {",
            *_copies("NC", sub, "const int m = n0 + r;", "m < N && k < H", h_prev, copies.state16, "hs"),
            "}",
            'asm volatile("cp.async.commit_group;\\n" ::);',
        ]
    weights = weight_rows if copies.weight_at is None else _when(f"!{copies.aligned}", weight_rows)
    lines += [*weights, *_when("step == 0", h_rows)]
    for sub in range(subchunks):
        lines += [
            f'asm volatile("cp.async.wait_group {subchunks - 1 - sub};\\n" ::);',
            "__syncthreads();",
            f"multiply({sub} * KS);",
        ]
    return lines


def _when(condition: str, lines: list[str]) -> list[str]:
    return [f"if ({condition}) {{", *("  " + line for line in lines), "}"]


def _copies(rows: str, sub: int, index: str, valid: str, source: str, base: str, target: str) -> list[str]:
    """One 16-byte cp.async copy per PIECE elements of ``rows`` rows of the ``sub``-th KS of the
    chunk into ``target`` (row r, k offset kk), from ``source`` after ``index`` (zero where not
    ``valid``)."""
    return [
        f"  for (int i = threadIdx.x; i < {rows} * (KS / {PIECE}); i += {THREADS}) {{",
        f"    const int r = i / (KS / {PIECE}), kk = {sub} * KS + (i % (KS / {PIECE})) * {PIECE}, k = k0 + kk;",
        f"    {index}",
        f"    const bool valid = {valid};",
        f"    copy16(smem_addr(&{target}[r * STRIDE + kk]), valid ? (const void*)({source}) : (const void*){base}, valid);",
        "  }",
    ]
