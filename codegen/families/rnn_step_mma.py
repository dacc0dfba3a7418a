"""The step kernel's product h_{t-1} @ W_hh^T on the tensor cores (mma.sync m16n8k16, fp32
accumulation), for fp16 / bf16 weights from sm_80: the block's W_hh rows and h_{t-1}, rounded
to the weights' type as cuDNN rounds its state for the product, are staged through dynamic
shared memory (the whole of k when it fits the target's opt-in limit, else k chunks); the
[sequences x rows] tile splits into m16n8 tiles over the 8 warps (and k over the warps left
when there are fewer than 8 tiles), whose accumulators meet in shared memory; then a thread
per (sequence, unit) runs the cell, each phase after the last (the "serial" schedule;
rnn_step_overlap.py overlaps them and uses this module's shared layout). The state itself
stays float.

A step is latency-bound on that staging (the product is a few microseconds of mma.sync), so
when H % 8 == 0 the block stages with 16-byte ``cp.async`` copies, all in flight at once:
W_hh rows straight from the weights (when the launch's pointers are aligned and the rows are
contiguous), h_{t-1} from a 16-bit copy of the state (``rnn_h16``) that each step writes
beside the float one, which also halves the bytes of h every block reads. Step 0 (hx or
zero) and other shapes stage element by element.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphdnn.dtypes import DataType

from ..context import EmitContext
from ..cuda_types import cuda_type, store
from .direct_common import THREADS
from .rnn_layer import RnnLayer, StepProduct, StepSources, stage_step_state, stage_step_weights
from .tensor_core import TENSOR_CORE_TYPES

MMA_MIN_ARCH = 80
WARPS = THREADS // 32
SEQUENCE_TILES = 4  # m16 tiles of sequences per pass: 64 sequences
# A block's dynamic shared memory, opted in, by target (KiB): A100 and Orin 163, Hopper and
# datacenter Blackwell 227, the other parts (sm_86, sm_89, sm_120) 99.
SHARED_OPT_IN = {80: 163, 87: 163, 90: 227, 100: 227, 103: 227}
OTHER_SHARED_OPT_IN = 99
PIECE = 8  # 16-bit elements per 16-byte cp.async copy
PRODUCT = "rnn_step_product"  # the launch choice: "mma" or "fma" (the CUDA-core path)


@dataclass(frozen=True)
class StepCopies:
    """What the tensor-core step may stage with 16-byte ``cp.async`` copies: ``weight_at``, the
    address of W_hh[g * H + j][k] of direction ``dir`` (None when rows are not contiguous in
    16-byte pieces), when ``aligned`` (the launch's ALIGNED flag) holds; h_{t-1} from the
    16-bit state ``state16`` (from step 1). ``weight_base`` is a valid address to name when a
    copy is zero-filled."""

    weight_at: str | None
    weight_base: str
    aligned: str
    state16: str


def recurrence_type(layer: RnnLayer, ctx: EmitContext) -> DataType | None:
    """The tensor cores' operand type for the step's product, or None for the FMA path."""
    types = {layer.weights(direction)[1].data_type for direction in range(layer.directions)}
    if ctx.arch < MMA_MIN_ARCH or layer.compute != "float" or len(types) != 1:
        return None
    if ctx.tuning.get(PRODUCT, "mma") != "mma":
        return None
    (only,) = types
    return only if only in TENSOR_CORE_TYPES else None


def copies_state16(layer: RnnLayer, ctx: EmitContext) -> bool:
    """Whether the layer's step keeps the 16-bit copy of h (``rnn_h16``) it stages from."""
    return recurrence_type(layer, ctx) is not None and layer.hidden % PIECE == 0


def shared_budget(arch: int) -> int:
    return SHARED_OPT_IN.get(arch, OTHER_SHARED_OPT_IN) * 1024


def step_tiles(layer: RnnLayer, units: int) -> tuple[int, int]:
    """m16 tiles of sequences per pass, and W_hh rows (unit u, gate g at u * G + g, zero rows
    to a whole n8 tile) of a block of ``units`` units."""
    return min(SEQUENCE_TILES, -(-layer.batch // 16)), 8 * -(-(units * layer.gates) // 8)


def fitted_chunk(hidden: int, grain: int, m_tiles: int, rows: int, k_parts: int, arch: int) -> int:
    """The k staged at once: all of H (to a multiple of ``grain``), less while the shared
    memory passes the target's opt-in limit."""
    chunk = grain * -(-hidden // grain)
    while chunk > grain and shared_bytes(m_tiles, rows, chunk, k_parts) > shared_budget(arch):
        chunk -= grain
    return chunk


def mma_product(
    layer: RnnLayer, units: int, operand: DataType, sources: StepSources, copies: StepCopies | None, arch: int
) -> StepProduct:
    m_tiles, rows = step_tiles(layer, units)
    n_tiles = rows // 8
    tiles = m_tiles * n_tiles
    k_parts = max(1, WARPS // tiles)
    per_warp = -(-tiles // WARPS)
    chunk = fitted_chunk(layer.hidden, 16 * k_parts, m_tiles, rows, k_parts, arch)
    constants = [
        f"constexpr int MT = {m_tiles}, NT = {n_tiles}, TILES = {tiles}, KP = {k_parts}, TPW = {per_warp};",
        f"constexpr int NC = 16 * MT, ROWS = {rows}, KC = {chunk}, STRIDE = KC + 8, CS = ROWS + 1;",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        "// this warp's share of k; every warp runs the same products (warps past TILES * KP on a",
        "// repeated tile, not stored): the block's threads reach each mma.sync together",
        "const int part = TILES >= 8 ? 0 : min(warp / TILES, KP - 1);",
        "const bool stores = TILES >= 8 || warp < TILES * KP;",
    ]
    shared, weight_rows, h_rows = step_operands(sources, operand)
    staging = _staged(weight_rows, h_rows, copies) if copies is not None else [*weight_rows, *h_rows]
    product = [
        "float acc[TPW][4];",
        "#pragma unroll",
        "for (int i = 0; i < TPW; ++i)",
        "#pragma unroll",
        "  for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;",
        "for (int k0 = 0; k0 < H; k0 += KC) {",
        "  __syncthreads();  // everyone is done with the previous chunk",
        *("  " + line for line in staging),
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
    product_of, state_stores = cell_inputs(copies, operand, k_parts)
    shared_size = shared_bytes(m_tiles, rows, chunk, k_parts)
    return StepProduct(
        constants, shared, 16 * m_tiles, product, cell_open, ["}"], product_of, state_stores, shared_size
    )


def step_operands(sources: StepSources, operand: DataType) -> tuple[list[str], list[str], list[str]]:
    """A tensor-core step's shared memory (W_hh rows ``ws``, h_{t-1} ``hs``, in ``operand``,
    row stride STRIDE; the warps' ``products`` in float) and the element-by-element staging of
    the k chunk from k0 of its W_hh rows and of h_{t-1}."""
    staged = cuda_type(operand)
    shared = [
        "extern __shared__ __align__(128) unsigned char smem[];",
        f"{staged}* const ws = reinterpret_cast<{staged}*>(smem);  // [row][k], ROWS x STRIDE",
        f"{staged}* const hs = ws + ROWS * STRIDE;  // [sequence][k], NC x STRIDE",
        "float* const products = reinterpret_cast<float*>(hs + NC * STRIDE);  // [k part][sequence][row]",
    ]

    def convert(value: str) -> str:
        return store(operand, value)

    weight_rows = stage_step_weights(sources, staged, convert, "0.0f")
    h_rows = stage_step_state(sources, "NC", "hs[(i / KC) * STRIDE + i % KC]", staged, convert, "0.0f")
    return shared, weight_rows, h_rows


def cell_inputs(copies: StepCopies | None, operand: DataType, k_parts: int) -> tuple[str, tuple[str, ...]]:
    """Gate g's product at the cell's ``r`` (the k parts' sums added) and the store of the
    16-bit state the next step stages from (with ``copies``)."""
    product_of = " + ".join(f"products[{part} * NC * CS + r + g]" for part in range(k_parts))
    state_stores = (
        (f"{copies.state16}[((parity ^ 1) * D + dir) * N * H + n * H + j] = {store(operand, 'h_new')};",)
        if copies is not None
        else ()
    )
    return product_of, state_stores


def _staged(weight_rows: list[str], h_rows: list[str], copies: StepCopies) -> list[str]:
    """The k chunk's staging with 16-byte cp.async copies where ``copies`` allows (W_hh rows,
    h_{t-1} from step 1), element by element (``weight_rows``, ``h_rows``) elsewhere."""
    lines: list[str] = []
    if copies.weight_at is not None:
        lines += [
            f"if ({copies.aligned}) {{",
            *_copies(
                "ROWS",
                "const int g = r % G, j = u0 + r / G;",
                "j < u0 + U && j < H && k < H",
                copies.weight_at,
                copies.weight_base,
                "ws",
            ),
            "} else {",
            *("  " + line for line in weight_rows),
            "}",
        ]
    else:
        lines += weight_rows
    h_prev = f"{copies.state16} + (parity * D + dir) * N * H + m * H + k"
    return [
        *lines,
        "if (step > 0) {  // h_{t-1} from the 16-bit copy the previous step wrote",
        *_copies("NC", "const int m = n0 + r;", "m < N && k < H", h_prev, copies.state16, "hs"),
        "} else {",
        *("  " + line for line in h_rows),
        "}",
        'asm volatile("cp.async.commit_group;\\n" ::);',
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
    ]


def _copies(rows: str, index: str, valid: str, source: str, base: str, target: str) -> list[str]:
    """One 16-byte cp.async copy per PIECE elements of ``rows`` rows of the k chunk into
    ``target`` (row r, k offset kk), from ``source`` after ``index`` (zero where not ``valid``)."""
    return [
        f"  for (int i = threadIdx.x; i < {rows} * (KC / {PIECE}); i += {THREADS}) {{",
        f"    const int r = i / (KC / {PIECE}), kk = (i % (KC / {PIECE})) * {PIECE}, k = k0 + kk;",
        f"    {index}",
        f"    const bool valid = {valid};",
        f"    copy16(smem_addr(&{target}[r * STRIDE + kk]), valid ? (const void*)({source}) : (const void*){base}, valid);",
        "  }",
    ]


def shared_bytes(m_tiles: int, rows: int, chunk: int, k_parts: int) -> int:
    """Dynamic shared memory of a tensor-core step: W_hh rows and h in 16-bit, products in float."""
    return (rows + 16 * m_tiles) * (chunk + 8) * 2 + k_parts * 16 * m_tiles * (rows + 1) * 4
