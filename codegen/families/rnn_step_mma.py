"""The step kernel's product h_{t-1} @ W_hh^T on the tensor cores (mma.sync m16n8k16, fp32
accumulation), for fp16 / bf16 weights from sm_80: the block's W_hh rows and h_{t-1}, rounded
to the weights' type as cuDNN rounds its state for the product, are staged through shared
memory in k chunks; the [sequences x rows] tile splits into m16n8 tiles over the 8 warps (and
k over the warps left when there are fewer than 8 tiles), whose accumulators meet in shared
memory; then a thread per (sequence, unit) runs the cell. The state itself stays float.
"""

from __future__ import annotations

from graphdnn.dtypes import DataType

from ..context import EmitContext
from ..cuda_types import cuda_type, store
from .direct_common import THREADS
from .rnn_layer import RnnLayer, StepProduct, StepSources, stage_step_operands
from .tensor_core import TENSOR_CORE_TYPES

MMA_MIN_ARCH = 80
WARPS = THREADS // 32
SEQUENCE_TILES = 4  # m16 tiles of sequences per pass: 64 sequences
SHARED_BUDGET = 46 * 1024
PRODUCT = "rnn_step_product"  # the launch choice: "mma" or "fma" (the CUDA-core path)


def recurrence_type(layer: RnnLayer, ctx: EmitContext) -> DataType | None:
    """The tensor cores' operand type for the step's product, or None for the FMA path."""
    types = {layer.weights(direction)[1].data_type for direction in range(layer.directions)}
    if ctx.arch < MMA_MIN_ARCH or layer.compute != "float" or len(types) != 1:
        return None
    if ctx.tuning.get(PRODUCT, "mma") != "mma":
        return None
    (only,) = types
    return only if only in TENSOR_CORE_TYPES else None


def mma_product(layer: RnnLayer, units: int, operand: DataType, sources: StepSources) -> StepProduct:
    m_tiles = min(SEQUENCE_TILES, -(-layer.batch // 16))
    rows = 8 * -(-(units * layer.gates) // 8)  # row (unit u, gate g) = u * G + g; zero rows to the n8 tile
    n_tiles = rows // 8
    tiles = m_tiles * n_tiles
    k_parts = max(1, WARPS // tiles)
    per_warp = -(-tiles // WARPS)
    chunk = 16 * k_parts * -(-layer.hidden // (16 * k_parts))
    while chunk > 16 * k_parts and _shared(m_tiles, rows, chunk, k_parts) > SHARED_BUDGET:
        chunk -= 16 * k_parts
    staged = cuda_type(operand)
    constants = [
        f"constexpr int MT = {m_tiles}, NT = {n_tiles}, TILES = {tiles}, KP = {k_parts}, TPW = {per_warp};",
        f"constexpr int NC = 16 * MT, ROWS = {rows}, KC = {chunk}, STRIDE = KC + 8, CS = ROWS + 1;",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        "// this warp's share of k; every warp runs the same products (warps past TILES * KP on a",
        "// repeated tile, not stored): the block's threads reach each mma.sync together",
        "const int part = TILES >= 8 ? 0 : min(warp / TILES, KP - 1);",
        "const bool stores = TILES >= 8 || warp < TILES * KP;",
    ]
    shared = [
        f"__shared__ __align__(16) {staged} ws[ROWS * STRIDE], hs[NC * STRIDE];",
        "__shared__ float products[KP * NC * CS];  // [k part][sequence][row]",
    ]
    product = [
        "float acc[TPW][4];",
        "#pragma unroll",
        "for (int i = 0; i < TPW; ++i)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;",
        "for (int k0 = 0; k0 < H; k0 += KC) {",
        "  __syncthreads();  // everyone is done with the previous chunk",
        *(
            "  " + line
            for line in stage_step_operands(
                sources, "NC", "hs[(i / KC) * STRIDE + i % KC]", staged, lambda value: store(operand, value), "0.0f"
            )
        ),
        "  __syncthreads();",
        "  for (int kk = part * (KC / KP); kk < (part + 1) * (KC / KP); kk += 16) {",
        "    const int k = kk + 2 * (lane & 3);",
        "#pragma unroll",
        "    for (int i = 0; i < TPW; ++i) {",
        "      const int first = TILES >= 8 ? warp + i * 8 : warp % TILES, tile = first < TILES ? first : 0;",
        "      const int row = (tile / NT) * 16 + (lane >> 2), column = (tile % NT) * 8 + (lane >> 2);",
        "      unsigned a[4];",
        "      a[0] = *reinterpret_cast<const unsigned*>(&hs[row * STRIDE + k]);",
        "      a[1] = *reinterpret_cast<const unsigned*>(&hs[(row + 8) * STRIDE + k]);",
        "      a[2] = *reinterpret_cast<const unsigned*>(&hs[row * STRIDE + k + 8]);",
        "      a[3] = *reinterpret_cast<const unsigned*>(&hs[(row + 8) * STRIDE + k + 8]);",
        "      const unsigned b0 = *reinterpret_cast<const unsigned*>(&ws[column * STRIDE + k]);",
        "      const unsigned b1 = *reinterpret_cast<const unsigned*>(&ws[column * STRIDE + k + 8]);",
        "      mma_16816(acc[i], a, b0, b1);",
        "    }",
        "  }",
        "}",
        "#pragma unroll",
        "for (int i = 0; i < TPW; ++i) {",
        "  const int tile = TILES >= 8 ? warp + i * 8 : warp % TILES;",
        "  if (!stores || tile >= TILES) continue;",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) {  // fragment e: (row + 8 (e >= 2), column + e % 2)",
        "    const int row = (tile / NT) * 16 + (lane >> 2) + (e >> 1) * 8, column = (tile % NT) * 8 + 2 * (lane & 3) + (e & 1);",
        "    products[(part * NC + row) * CS + column] = acc[i][e];",
        "  }",
        "}",
        "__syncthreads();",
    ]
    cell_open = [
        "for (int p = threadIdx.x; p < NC * U; p += blockDim.x) {",
        "  const int n = n0 + p / U, j = u0 + p % U, r = (p / U) * CS + (p % U) * G;",
        "  if (n >= N || j >= H) continue;",
    ]
    product_of = " + ".join(f"products[{part} * NC * CS + r + g]" for part in range(k_parts))
    return StepProduct(constants, shared, 16 * m_tiles, product, cell_open, ["}"], product_of)


def _shared(m_tiles: int, rows: int, chunk: int, k_parts: int) -> int:
    return (rows + 16 * m_tiles) * (chunk + 8) * 2 + k_parts * 16 * m_tiles * (rows + 1) * 4
