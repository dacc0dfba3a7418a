"""The input projections of one RNN layer as one GEMM: xproj[T*N, D*G*H] = X[T*N, in] @ W_ih^T
+ b_ih, every gate of both directions (the columns past G*H read the reverse direction's
W_ih), into the ``rnn_xproj`` scratch. Nothing in it depends on the recurrence, so the whole
sequence's share of the work runs at GEMM speed before the first step.

Two tile products: mma.sync m16n8k16 (fp32 accumulation, sm_80+) when the weights are fp16 or
bf16 and the compute type is float, the operands converted to the weights' type as they are
staged into shared memory (layer 0's x must be of that type too; a deeper layer's input, held
in float, is rounded to it, as cuDNN keeps it in the data type); else CUDA-core FMAs in the
compute type (float or double). Tiles are staged element by element: the layer input may be
strided (x) and the problem is small next to the recurrence, so no cp.async pipeline.

The kernel also resets the ``rnn_step`` counter the layer's step kernels read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor

from ..context import EmitContext, KernelParams
from ..cuda_types import cuda_type, store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import declare, make_kernel, read
from .rnn_layer import STEP, XPROJ, RnnLayer, by_direction, launch_choice, layer_buffer, staged_copy
from .rnn_projection_vector import PIECE, VectorSources, vector_loop
from .tensor_core import TENSOR_CORE_TYPES, mma_fragments

MMA_MIN_ARCH = 80
# (BM, BN, BK, row stride of a staged tile): 8 warps of 32x32 (mma) or 16x16 threads of 4x4 (FMA).
# The mma tiles' rows are padded by 8 elements (16 bytes) so that a fragment load's 8 rows x 4
# words hit 32 distinct banks; the FMA tiles' by one element.
MMA_TILE = (64, 128, 32, 40)
FMA_TILE = (64, 64, 16, 17)
STAGING = "rnn_projection_staging"  # the launch choice: "vector" (when the operands allow) or "element"


def mma_type(layer: RnnLayer, arch: int) -> DataType | None:
    """The tensor cores' operand type for this layer's GEMM, or None for the FMA path."""
    types = {t.data_type for d in range(layer.directions) for t in layer.weights(d)[:1]}
    if layer.layer == 0:
        types.add(layer.x.data_type)
    if arch < MMA_MIN_ARCH or layer.compute != "float" or len(types) != 1:
        return None
    (only,) = types
    return only if only in TENSOR_CORE_TYPES else None


def projection_kernel(layer: RnnLayer, ctx: EmitContext) -> Kernel:
    operand = mma_type(layer, ctx.arch)
    c, d = layer.compute, layer.directions
    rows, columns = layer.steps * layer.batch, d * layer.gates * layer.hidden
    block_m, block_n, block_k, stride = MMA_TILE if operand is not None else FMA_TILE
    params = KernelParams()
    w_ih = [layer.weights(direction)[0] for direction in range(d)]
    b_ih = [layer.weights(direction)[2] for direction in range(d)]
    x = layer.x if layer.layer == 0 else None
    names = declare(params, [x, *w_ih, *b_ih])
    below = params.scratch(layer_buffer(layer.layer - 1), c) if x is None else None
    xproj = params.scratch(XPROJ, c)
    counter = params.scratch(STEP, "unsigned")

    def element(t: Tensor, coordinate: list[str]) -> str:
        return read(t, names[t.id], offset_at(t, coordinate), c)

    if x is not None:
        a_value = element(x, [f"m / {layer.batch}", f"m % {layer.batch}", "k"])
    else:
        a_value = f"{below}[(long long)m * GK + k]"
    w_value = by_direction(d, "dir", [element(w, ["row", "k"]) for w in w_ih])
    bias = by_direction(d, "dir", [element(b, ["row"]) for b in b_ih])
    staged = cuda_type(operand) if operand is not None else c
    a_index = ["const int m = bm + i / BK, k = k0 + i % BK;"]
    b_index = [
        "const int column = bn + i / BK, k = k0 + i % BK;",
        "const int dir = column / GATE_ROWS, row = column % GATE_ROWS;",
    ]
    element_loop = staged_loop(TileSources(a_value, a_index, w_value, b_index), operand, c)
    vector = _vector_sources(layer, names, below, ctx) if operand is not None else None
    stages = 2 if vector is not None else 1
    loop = element_loop
    if vector is not None:
        aligned = params.aligned_flag()
        pipelined = vector_loop(vector, staged, _mma_products("at", "bt"))
        loop = [
            f"if ({aligned}) {{",
            *("  " + line for line in pipelined),
            "} else {",
            *("  " + line for line in element_loop),
            "}",
        ]
    body = [
        f"constexpr int GM = {rows}, GN = {columns}, GK = {layer.width}, GATE_ROWS = {layer.gates * layer.hidden};",
        f"constexpr int BM = {block_m}, BN = {block_n}, BK = {block_k}, STRIDE = {stride};",
        "const int bm = blockIdx.x * BM, bn = blockIdx.y * BN, tid = threadIdx.x;",
        f"if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {{ {counter}[0] = 0; {counter}[1] = 0; }}",
        f"__shared__ __align__(16) {staged} as[{stages} * BM * STRIDE], bs[{stages} * BN * STRIDE];",
        *(_mma_setup(c) if operand is not None else _fma_setup(c)),
        *loop,
        *(_mma_epilogue if operand is not None else _fma_epilogue)(_stores(xproj, bias)),
    ]
    pattern = f"rnn_{layer.a.mode.value}_layer{layer.layer}_projection{'_mma' if operand is not None else ''}"
    grid = (-(-rows // block_m), -(-columns // block_n), 1)
    kernel = make_kernel(ctx, layer.fused, pattern, params, body, grid)
    return with_mma_functions(kernel, operand) if operand is not None else kernel


@dataclass(frozen=True)
class TileSources:
    """What a tile product out[m, column] = sum over k of A(m, k) B(column, k) stages: after the
    ``a_index`` lines (which define m and k from the staged element i), ``a_value`` is A(m, k);
    after ``b_index`` (column and k), ``b_value`` is B(column, k). Both are read only for m <
    GM, column < GN, k < GK (zeros past them)."""

    a_value: str
    a_index: list[str]
    b_value: str
    b_index: list[str]


def staged_loop(sources: TileSources, operand: DataType | None, c: str) -> list[str]:
    """The k loop of a tile product, its tiles staged element by element into ``as`` and ``bs``
    (converted to ``operand`` for the tensor cores, else kept in the compute type ``c``)."""
    staged = cuda_type(operand) if operand is not None else c
    zero = "0.0f" if c == "float" else "0.0"

    def to_staged(value: str) -> str:
        return store(operand, value) if operand is not None else value

    return [
        "for (int k0 = 0; k0 < GK; k0 += BK) {",
        "  __syncthreads();  // everyone is done with the previous tiles",
        *(
            "  " + line
            for line in staged_copy(
                "tid",
                "BM * BK",
                sources.a_index,
                to_staged(f"m < GM && k < GK ? {sources.a_value} : {zero}"),
                "as[(i / BK) * STRIDE + i % BK]",
                staged,
            )
        ),
        *(
            "  " + line
            for line in staged_copy(
                "tid",
                "BN * BK",
                sources.b_index,
                to_staged(f"column < GN && k < GK ? {sources.b_value} : {zero}"),
                "bs[(i / BK) * STRIDE + i % BK]",
                staged,
            )
        ),
        "  __syncthreads();",
        *("  " + line for line in (_mma_products("as", "bs") if operand is not None else _fma_products(c))),
        "}",
    ]


def tile_shape(operand: DataType | None) -> tuple[int, int]:
    """(BM, BN) of the projection's tiles for ``operand`` (None: the FMA tiles)."""
    block_m, block_n, _, _ = MMA_TILE if operand is not None else FMA_TILE
    return block_m, block_n


def tile_product(
    sources: TileSources | VectorSources,
    operand: DataType | None,
    c: str,
    stores: Callable[[str], list[str]],
    column_blocks: int,
) -> list[str]:
    """A whole tile-product kernel body after its GM, GN, GK constants, with the projection's
    tiles (mma.sync for ``operand``, else FMAs in ``c``; :func:`tile_shape`): block (bm, bn) from
    blockIdx.x and blockIdx.y % ``column_blocks`` (the quotient is the caller's: a batch index),
    then ``stores(value)`` for each element, with m and column defined. ``VectorSources`` (with
    an ``operand``: rows contiguous in k, whole pieces apart, GK a whole number of pieces) take
    the pipelined loop of 16-byte pieces (rnn_projection_vector.py)."""
    block_m, block_n, block_k, stride = MMA_TILE if operand is not None else FMA_TILE
    staged = cuda_type(operand) if operand is not None else c
    vector = isinstance(sources, VectorSources)
    if isinstance(sources, VectorSources):
        assert operand is not None
        loop = vector_loop(sources, staged, _mma_products("at", "bt"))
    else:
        loop = staged_loop(sources, operand, c)
    body = [
        f"constexpr int BM = {block_m}, BN = {block_n}, BK = {block_k}, STRIDE = {stride};",
        f"const int bm = blockIdx.x * BM, bn = blockIdx.y % {column_blocks} * BN, tid = threadIdx.x;",
        f"__shared__ __align__(16) {staged} as[{2 if vector else 1} * BM * STRIDE], bs[{2 if vector else 1} * BN * STRIDE];",
        *(_mma_setup(c) if operand is not None else _fma_setup(c)),
        *loop,
        *(_mma_epilogue if operand is not None else _fma_epilogue)(stores),
    ]
    return body


def with_mma_functions(kernel: Kernel, operand: DataType) -> Kernel:
    """``kernel`` with the mma.sync device functions for ``operand`` before it."""
    functions = mma_fragments(operand)
    source = kernel.source.replace('extern "C" __global__', functions + '\nextern "C" __global__', 1)
    return dataclasses.replace(kernel, source=source)


def _mma_setup(c: str) -> list[str]:
    roles = "const int lane = tid & 31, warp = tid >> 5, warp_m = warp / 4, warp_n = warp % 4;"
    return [roles, *_zeroed(c, [2, 4, 4], "[m16 tile][n8 tile][fragment]: the warp's 32x32 block")]


def _zeroed(c: str, dims: list[int], comment: str) -> list[str]:
    """The accumulators ``acc`` of ``dims``, zeroed by unrolled loops (registers, never local memory)."""
    names = "ijk"[: len(dims)]
    lines = [f"{c} acc{''.join(f'[{d}]' for d in dims)};  // {comment}"]
    for depth, (name, extent) in enumerate(zip(names, dims)):
        lines += ["#pragma unroll", "  " * depth + f"for (int {name} = 0; {name} < {extent}; ++{name})"]
    lines[-1] += f" acc{''.join(f'[{name}]' for name in names)} = 0;"
    return lines


def _vector_sources(
    layer: RnnLayer, names: dict[int, str], below: str | None, ctx: EmitContext
) -> VectorSources | None:
    """Where the 16-byte pieces of A and W_ih start, when the launch choice allows them and
    every row is contiguous in k with rows a whole number of pieces apart (the ALIGNED flag
    checks the pointers at run time); None otherwise."""
    if (
        launch_choice(ctx, layer.node.name, STAGING, "vector", ["vector", "element"], "'vector' or 'element'")
        != "vector"
        or layer.width % PIECE
    ):
        return None
    w_ih = [layer.weights(direction)[0] for direction in range(layer.directions)]
    if not all(w.static_stride[-1] == 1 and w.static_stride[0] % PIECE == 0 for w in w_ih):
        return None
    b_at = by_direction(layer.directions, "dir", [f"&{names[w.id]}[{offset_at(w, ['row', 'k'])}]" for w in w_ih])
    if below is not None:
        return VectorSources(f"{below} + (long long)m * GK + k", b_at, a_float=True)
    x = layer.x
    if x.static_stride[2] != 1 or any(stride % PIECE for stride in x.static_stride[:2]):
        return None
    a_at = f"&{names[x.id]}[{offset_at(x, [f'm / {layer.batch}', f'm % {layer.batch}', 'k'])}]"
    return VectorSources(a_at, b_at, a_float=False)


def _mma_products(a_tile: str, b_tile: str) -> list[str]:
    """The warp's 2 x 4 m16n8k16 products per 16 of k, fragments read as pairs of elements
    (PTX's layouts: A (row, k) in lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) +
    2 (k >= 8); B (k, n) in lane n * 4 + (k % 8) / 2, register k >= 8), from the tiles
    ``a_tile`` and ``b_tile``."""
    return [
        "#pragma unroll",
        "for (int kk = 0; kk < BK; kk += 16) {",
        "  const int k = kk + 2 * (lane & 3);",
        "  unsigned a[2][4], b[4][2];",
        "#pragma unroll",
        "  for (int mi = 0; mi < 2; ++mi) {",
        "    const int row = warp_m * 32 + mi * 16 + (lane >> 2);",
        f"    a[mi][0] = *reinterpret_cast<const unsigned*>(&{a_tile}[row * STRIDE + k]);",
        f"    a[mi][1] = *reinterpret_cast<const unsigned*>(&{a_tile}[(row + 8) * STRIDE + k]);",
        f"    a[mi][2] = *reinterpret_cast<const unsigned*>(&{a_tile}[row * STRIDE + k + 8]);",
        f"    a[mi][3] = *reinterpret_cast<const unsigned*>(&{a_tile}[(row + 8) * STRIDE + k + 8]);",
        "  }",
        "#pragma unroll",
        "  for (int ni = 0; ni < 4; ++ni) {",
        "    const int column = warp_n * 32 + ni * 8 + (lane >> 2);",
        f"    b[ni][0] = *reinterpret_cast<const unsigned*>(&{b_tile}[column * STRIDE + k]);",
        f"    b[ni][1] = *reinterpret_cast<const unsigned*>(&{b_tile}[column * STRIDE + k + 8]);",
        "  }",
        "#pragma unroll",
        "  for (int mi = 0; mi < 2; ++mi)",
        "#pragma unroll",
        "    for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);",
        "}",
    ]


def _stores(xproj: str, bias: str) -> Callable[[str], list[str]]:
    """The projection's store of ``value`` + b_ih at (m, column) into ``xproj``."""
    return lambda value: [
        "const int dir = column / GATE_ROWS, row = column % GATE_ROWS;",
        f"if (m < GM && column < GN) {xproj}[(long long)m * GN + column] = {value} + {bias};",
    ]


def _epilogue(loops: list[str], m: str, column: str, value: str, stores: Callable[[str], list[str]]) -> list[str]:
    """The ``stores`` lines of ``value`` at (``m``, ``column``), for each accumulator the ``loops`` walk."""
    lines = [line for depth, loop in enumerate(loops) for line in ("#pragma unroll", "  " * depth + loop)]
    inner = "  " * len(loops)
    return [
        *lines[:-1],
        lines[-1] + " {",
        f"{inner}const int m = {m}, column = {column};",
        *(inner + line for line in stores(value)),
        "  " * (len(loops) - 1) + "}",
    ]


def _mma_epilogue(stores: Callable[[str], list[str]]) -> list[str]:
    """Fragment e of tile (mi, ni) is (row + 8 (e >= 2), column + e % 2) of the warp's block."""
    loops = ["for (int mi = 0; mi < 2; ++mi)", "for (int ni = 0; ni < 4; ++ni)", "for (int e = 0; e < 4; ++e)"]
    m = "bm + warp_m * 32 + mi * 16 + (lane >> 2) + (e >> 1) * 8"
    column = "bn + warp_n * 32 + ni * 8 + 2 * (lane & 3) + (e & 1)"
    return _epilogue(loops, m, column, "acc[mi][ni][e]", stores)


def _fma_setup(c: str) -> list[str]:
    roles = "const int tx = tid % 16, ty = tid / 16;"
    return [roles, *_zeroed(c, [4, 4], "rows ty + 16 i, columns tx + 16 j")]


def _fma_products(c: str) -> list[str]:
    return [
        "#pragma unroll",
        "for (int kk = 0; kk < BK; ++kk) {",
        f"  {c} a[4], b[4];",
        "#pragma unroll",
        "  for (int i = 0; i < 4; ++i) a[i] = as[(ty + 16 * i) * STRIDE + kk];",
        "#pragma unroll",
        "  for (int j = 0; j < 4; ++j) b[j] = bs[(tx + 16 * j) * STRIDE + kk];",
        "#pragma unroll",
        "  for (int i = 0; i < 4; ++i)",
        "#pragma unroll",
        "    for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];",
        "}",
    ]


def _fma_epilogue(stores: Callable[[str], list[str]]) -> list[str]:
    loops = ["for (int i = 0; i < 4; ++i)", "for (int j = 0; j < 4; ++j)"]
    return _epilogue(loops, "bm + ty + 16 * i", "bn + tx + 16 * j", "acc[i][j]", stores)
