"""GEMM family: convolution forward (as an implicit GEMM) and matmul, with a fused epilogue.

As a GEMM, out[m, n] = sum_k A[m, k] * B[k, n]:
- conv_fprop: m runs over output pixels (n_img, p, q...), n over output channels, k over
  (r, s..., c) taps with c fastest; A is gathered from the image on the fly (never
  materialised), B is the filter.
- matmul: m, n, k as named, one grid layer (blockIdx.z) per output batch index.

Two paths, both always correct:
- tensor cores (``mma.sync.m16n8k16``, fp16/bf16 inputs, fp32 accumulation) when the
  channel / K dims are contiguous in memory in 16-byte chunks: a multi-stage ``cp.async``
  pipeline into XOR-swizzled shared memory (conflict-free ``ldmatrix``), warp tiles of
  64x32, then the accumulator tile is staged through shared memory so that the epilogue
  reads operands and writes the output in contiguous 16-byte vectors. On sm_90 the same
  problems can take ``wgmma`` instead (gemm_sm90.py: same loaders and epilogue), when the
  tuning choice asks for it;
- SIMT, one output element per thread, for everything else (fp32 and double data,
  grouped and depthwise convolution, C not a multiple of 8, odd layouts).

The epilogue (folded batch norm, bias, residual, activations...) is rendered by
codegen.epilogue at each output element, from the accumulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Node, Tensor
from graphdnn.ops.conv import ConvAttributes, ConvMode

from .. import epilogue
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import cuda_type, load, rounded, store
from ..indexing import coordinates, index_type, loop_index_type, offset
from ..kernel import FusedProgram, Kernel

TENSOR_CORE_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})
SIMT_THREADS = 256
MAX_BLOCKS = 65535


@dataclass(frozen=True)
class Problem:
    """The anchor seen as a (batched) GEMM."""

    node: Node
    a: Tensor  # image or A
    b: Tensor  # weight or B
    out: Tensor
    m: int
    n: int
    k: int  # per group for a convolution
    groups: int
    batch: tuple[int, ...]  # output batch dims (matmul); () for convolution

    @property
    def is_conv(self) -> bool:
        return self.node.op == "conv_fprop"

    @property
    def attrs(self) -> ConvAttributes:
        assert isinstance(self.node.attributes, ConvAttributes)
        return self.node.attributes


def problem_of(node: Node) -> Problem:
    out = node.outputs[0][1]
    if node.op == "conv_fprop":
        x, w = node.input("image"), node.input("weight")
        assert x is not None and w is not None
        groups = x.dim[1] // w.dim[1]
        return Problem(
            node, x, w, out, out.dim[0] * math.prod(out.dim[2:]), w.dim[0], w.dim[1] * math.prod(w.dim[2:]), groups, ()
        )
    a, b = node.input("A"), node.input("B")
    assert a is not None and b is not None
    return Problem(node, a, b, out, out.dim[-2], out.dim[-1], a.dim[-1], 1, tuple(out.dim[:-2]))


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    from .gemm_sm90 import wgmma_kernel  # it builds on this module

    assert fused.anchor is not None
    problem = problem_of(fused.anchor)
    if tensor_core_layout(problem) is None:
        kernel = _simt_kernel(fused, ctx, problem)
    elif ctx.tuning.get("path") == "wgmma":
        kernel = wgmma_kernel(fused, ctx, problem)
    else:
        kernel = _tensor_core_kernel(fused, ctx, problem, tile_config(problem, ctx))
    return FusedProgram(fused.name, (kernel,))


# -- which path ------------------------------------------------------------------------------
def tensor_core_layout(p: Problem) -> str | None:
    """How B is laid out for the tensor-core path ("nk": k contiguous, "kn": n contiguous),
    or None when the problem needs the SIMT path."""
    if p.a.data_type not in TENSOR_CORE_TYPES or p.b.data_type != p.a.data_type or p.groups != 1:
        return None
    if math.prod(p.batch) > 65535:  # one grid layer per batch index
        return None
    if p.is_conv:
        channels = p.a.dim[1]
        if channels % 8 or p.a.stride[1] != 1 or p.b.stride[1] != 1:
            return None
        if any(s % 8 for axis, s in enumerate(p.a.stride) if axis != 1 and p.a.dim[axis] > 1):
            return None
        if any(s % 8 for axis, s in enumerate(p.b.stride) if axis != 1 and p.b.dim[axis] > 1):
            return None
        return "nk"
    if p.k % 8 or p.a.stride[-1] != 1 or any(s % 8 for s in p.a.stride[:-1]):
        return None
    if p.b.stride[-2] == 1 and all(s % 8 == 0 for i, s in enumerate(p.b.stride) if i != len(p.b.dim) - 2):
        return "nk"
    if p.b.stride[-1] == 1 and p.n % 8 == 0 and all(s % 8 == 0 for s in p.b.stride[:-1]):
        return "kn"
    return None


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    stages: int

    @property
    def threads(self) -> int:
        return (self.block_m // 64) * (self.block_n // 32) * 32


TILE_CANDIDATES = (TileConfig(128, 64, 4), TileConfig(128, 128, 3), TileConfig(64, 64, 4), TileConfig(64, 128, 4))


def candidates(fused: FusedNode, arch: int) -> list[dict[str, object]]:
    """Launch choices the runtime may time on the GPU (autotuning); empty on the SIMT path.
    The mma.sync tiles (no "path" key), then on sm_90 the wgmma ones ({"path": "wgmma", ...})."""
    from .gemm_sm90 import candidates as wgmma_candidates  # it builds on this module

    assert fused.anchor is not None
    problem = problem_of(fused.anchor)
    if tensor_core_layout(problem) is None:
        return []
    mma: list[dict[str, object]] = [
        {"block_m": c.block_m, "block_n": c.block_n, "stages": c.stages} for c in TILE_CANDIDATES
    ]
    return mma + wgmma_candidates(problem, arch)


def tile_config(p: Problem, ctx: EmitContext) -> TileConfig:
    """The tuned choice if there is one, else: the narrowest N tile that covers N, and
    smaller M tiles when there would be too few blocks to fill the GPU (132 SMs)."""
    if ctx.tuning:
        return TileConfig(int(ctx.tuning["block_m"]), int(ctx.tuning["block_n"]), int(ctx.tuning["stages"]))  # type: ignore[call-overload]
    block_n = 64 if p.n <= 64 else 128
    batches = math.prod(p.batch) if p.batch else 1
    block_m = 128 if -(-p.m // 128) * -(-p.n // block_n) * batches >= 264 else 64
    return next(c for c in TILE_CANDIDATES if (c.block_m, c.block_n) == (block_m, block_n))


# -- the epilogue at one output element, shared by both paths ----------------------------------------
class _Epilogue:
    """Statements turning the accumulator at output coordinates c0.. into stored outputs."""

    def __init__(
        self,
        fused: FusedNode,
        problem: Problem,
        names: dict[int, str],
        compute: str,
        preloaded: dict[int, str] | None = None,
    ) -> None:
        self.fused, self.problem, self.names, self.compute = fused, problem, names, compute
        self.preloaded = preloaded or {}  # tensor id -> register array indexed by the column slot `e`

    def statements(self, acc: str, vector_slot: str | None = None, vectors: frozenset[int] = frozenset()) -> list[str]:
        """``vectors``: operands already loaded as 8-wide vectors ``in{id}`` (the vector path)."""
        out = self.problem.out
        dims = out.dim

        def load_operand(t: Tensor) -> str:
            if t.is_pass_by_value:
                return f"({self.compute}){self.names[t.id]}"
            if t.id in self.preloaded:
                return f"{self.preloaded[t.id]}[e]"
            if t.id in vectors:
                return load(t.data_type, f"in{t.id}.v[e]", self.compute)
            return load(t.data_type, f"{self.names[t.id]}[{offset(t, dims, 'c')}]", self.compute)

        values = epilogue.Values(self.compute, load_operand)
        values.define(out, rounded(out.data_type, acc, self.compute))
        epilogue.apply(self.fused.epilogue, values)
        lines = list(values.statements)
        for t in self.fused.outputs:
            value = store(t.data_type, values.get(t))
            if vector_slot is None:
                lines.append(f"{self.names[t.id]}[{offset(t, dims, 'c')}] = {value};")
            else:
                lines.append(f"r{t.id}.v[{vector_slot}] = {value};")
        return lines


def declare(fused: FusedNode, problem: Problem) -> tuple[KernelParams, dict[int, str]]:
    params = KernelParams()
    names = {t.id: params.tensor(t) for t in fused.inputs}
    names.update({t.id: params.tensor(t, writable=True) for t in fused.outputs})
    return params, names


def batch_offsets(p: Problem, itype: str) -> list[str]:
    """Matmul: batch coordinates from blockIdx.z, and the A/B batch offsets `a_base`/`b_base`."""
    if not p.batch:
        return [f"const {itype} a_base = 0;", f"const {itype} b_base = 0;"]
    return [*_batch_coords(p, itype), *_batch_offsets_from_coords(p, itype)]


def _pixel_coordinates(p: Problem, m: str, itype: str) -> list[str]:
    """Conv: output coordinates c0 (image), c2.. (spatial) of output pixel m."""
    spatial = p.out.dim[2:]
    rank = len(p.out.dim)
    dims = (p.out.dim[0], *spatial)
    lines = coordinates(m, dims, range(len(dims)), "u", itype)
    lines.append(f"const {itype} c0 = u0;")
    lines += [f"const {itype} c{axis + 1} = u{axis};" for axis in range(1, rank - 1)]
    return lines


# -- SIMT path ---------------------------------------------------------------------------------
def _simt_kernel(fused: FusedNode, ctx: EmitContext, p: Problem) -> Kernel:
    params, names = declare(fused, p)
    tensors = [*fused.inputs, *fused.outputs]
    compute = compute_of([p.a, p.b, *fused.outputs])
    blocks = min(max(1, -(-p.out.numel // SIMT_THREADS)), MAX_BLOCKS)
    itype = loop_index_type(tensors, p.out.numel, blocks * SIMT_THREADS)
    out = p.out
    rank = len(out.dim)
    body = [
        f"const {itype} stride = ({itype})gridDim.x * blockDim.x;",
        f"for ({itype} e = ({itype})blockIdx.x * blockDim.x + threadIdx.x; e < {out.numel}; e += stride) {{",
    ]
    inner = coordinates("e", out.dim, range(rank), "c", itype)
    inner.append(f"{compute} acc = 0;")
    a, b = names[p.a.id], names[p.b.id]
    if p.is_conv:
        inner += _simt_conv_loop(p, a, b, compute, itype)
    else:
        inner += _simt_matmul_loop(p, a, b, compute, itype)
    inner += _Epilogue(fused, p, names, compute).statements("acc")
    body += ["  " + line for line in inner] + ["}"]
    blocks = min(max(1, -(-out.numel // SIMT_THREADS)), MAX_BLOCKS)
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_simt", params, SIMT_THREADS, indent(body, 1))
    return Kernel(name, source, (blocks, 1, 1), (SIMT_THREADS, 1, 1), 0, tuple(params.bindings))


def _simt_conv_loop(p: Problem, x: str, w: str, compute: str, itype: str) -> list[str]:
    a = p.attrs
    cg = p.b.dim[1]  # input channels per group
    kg = p.out.dim[1] // p.groups  # output channels per group
    spatial = len(p.out.dim) - 2
    filt = p.b.dim[2:]
    lines = [f"const {itype} g = c1 / {kg};", f"for (int ci = 0; ci < {cg}; ++ci) {{"]
    depth = 1
    for axis in range(spatial):
        lines.append("  " * depth + f"for (int f{axis} = 0; f{axis} < {filt[axis]}; ++f{axis}) {{")
        depth += 1
        pad, step, dil = a.pre_padding[axis], a.stride[axis], a.dilation[axis]
        lines.append("  " * depth + f"const {itype} h{axis} = c{axis + 2} * {step} - {pad} + f{axis} * {dil};")
        lines.append("  " * depth + f"if (h{axis} < 0 || h{axis} >= {p.a.dim[axis + 2]}) continue;")
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    taps = [f"({filt[i] - 1} - f{i})" if flip else f"f{i}" for i in range(spatial)]
    x_offset = " + ".join(
        [
            f"c0 * {p.a.stride[0]}",
            f"(g * {cg} + ci) * {p.a.stride[1]}",
            *(f"h{i} * {p.a.stride[i + 2]}" for i in range(spatial)),
        ]
    )
    w_offset = " + ".join(
        [
            f"c1 * {p.b.stride[0]}",
            f"ci * {p.b.stride[1]}",
            *(f"{taps[i]} * {p.b.stride[i + 2]}" for i in range(spatial)),
        ]
    )
    lines.append(
        "  " * depth
        + f"acc += {load(p.a.data_type, f'{x}[{x_offset}]', compute)} * {load(p.b.data_type, f'{w}[{w_offset}]', compute)};"
    )
    for level in range(depth - 1, -1, -1):
        lines.append("  " * level + "}")
    return lines


def _simt_matmul_loop(p: Problem, a: str, b: str, compute: str, itype: str) -> list[str]:
    rank = len(p.out.dim)
    lines = _batch_offsets_from_coords(p, itype)
    a_off = f"a_base + c{rank - 2} * {p.a.stride[-2]} + kk * {p.a.stride[-1]}"
    b_off = f"b_base + kk * {p.b.stride[-2]} + c{rank - 1} * {p.b.stride[-1]}"
    lines.append(f"for ({itype} kk = 0; kk < {p.k}; ++kk) {{")
    lines.append(
        f"  acc += {load(p.a.data_type, f'{a}[{a_off}]', compute)} * {load(p.b.data_type, f'{b}[{b_off}]', compute)};"
    )
    lines.append("}")
    return lines


def _batch_offsets_from_coords(p: Problem, itype: str) -> list[str]:
    """Matmul batch offsets of A and B from the output coordinates c0.. (broadcast dims skip)."""
    lines = []
    for name, t in (("a_base", p.a), ("b_base", p.b)):
        shift = len(p.batch) - (len(t.dim) - 2)
        terms = [f"c{axis + shift} * {s}" for axis, (d, s) in enumerate(zip(t.dim[:-2], t.stride[:-2])) if d > 1]
        lines.append(f"const {itype} {name} = {' + '.join(terms) if terms else '0'};")
    return lines


# -- tensor-core path --------------------------------------------------------------------------
ASYNC_COPY_PRELUDE = r"""
// ---- tensor-core GEMM building blocks (sm_80+) ----
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, zero-filled when !valid (src then is never read).
__device__ __forceinline__ void copy16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
"""

_MMA_PRELUDE = r"""
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// D = A * B + D, one m16n8k16 tile, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA_TYPE.MMA_TYPE.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 64-byte rows (BK = 32
// elements): XOR-swizzled so that the 8 rows one ldmatrix phase reads hit 8 distinct
// bank groups, and so do the 8 chunks of a cp.async wave.
__device__ __forceinline__ int swizzle64(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// The same for rows of ROW_BYTES = BN * 2 bytes (the k-major B tile): chunk ^ (row & 7).
template <int ROW_BYTES> __device__ __forceinline__ int swizzle_rows(int row, int chunk) {
  return row * ROW_BYTES + ((chunk ^ (row & 7)) << 4);
}
"""


@dataclass(frozen=True)
class SmemTiles:
    """A tensor-core path's k tiles in shared memory, as the shared loaders see them: ``bk``
    elements of k per tile, and the device functions ``(row, chunk) -> byte offset`` of a
    16-byte chunk: ``k_major`` for A and k-contiguous B (one row per m / n, ``bk`` elements
    long), ``n_major`` for n-contiguous B (one row per k)."""

    bk: int
    k_major: str
    n_major: str

    @property
    def lanes(self) -> int:
        """Threads sharing one k-major row, one 16-byte chunk each (a power of two)."""
        return self.bk // 8


def _tensor_core_kernel(fused: FusedNode, ctx: EmitContext, p: Problem, tile: TileConfig) -> Kernel:
    layout = tensor_core_layout(p)
    assert layout is not None
    params, names = declare(fused, p)
    aligned = params.aligned_flag()
    tensors = [*fused.inputs, *fused.outputs]
    itype = index_type(tensors, p.m * max(p.n, 1))
    elem = cuda_type(p.a.data_type)
    bm, bn, bk, stages, threads = tile.block_m, tile.block_n, 32, tile.stages, tile.threads
    a_chunks, b_chunks = bm * bk // 8 // threads, bn * bk // 8 // threads
    a_stage, b_stage = bm * bk * 2, bn * bk * 2
    c_stride = bn + 4  # floats per staged accumulator row (+4: fewer bank conflicts, 16-byte rows)
    shared = max(stages * (a_stage + b_stage), bm * c_stride * 4)
    k_tiles = -(-p.k // bk)

    x, w = names[p.a.id], names[p.b.id]
    lines = [
        f"using T = {elem};",
        f"constexpr int BM = {bm}, BN = {bn}, BK = {bk}, STAGES = {stages}, THREADS = {threads};",
        f"constexpr int GM = {p.m}, GN = {p.n}, GK = {p.k}, KTILES = {k_tiles};",
        "extern __shared__ __align__(128) unsigned char smem[];",
        "unsigned char* const a_smem = smem;",
        f"unsigned char* const b_smem = smem + STAGES * {a_stage};",
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
        "const int warp_m = warp / (BN / 32), warp_n = warp % (BN / 32);",
        f"const {itype} block_m = ({itype})blockIdx.x * BM;",
        "const int block_n = blockIdx.y * BN;",
    ]
    if not p.is_conv:
        lines += batch_offsets(p, itype)
    tiles = SmemTiles(bk, "swizzle64", f"swizzle_rows<{bn * 2}>")
    lines += a_loader_setup(p, itype, a_chunks, threads, tiles)
    lines += b_loader_setup(p, itype, b_chunks, threads, layout, tiles)
    lines += load_tile_lambda(p, x, w, itype, a_chunks, b_chunks, a_stage, b_stage, bn, layout, aligned, tiles)
    lines += _main_loop(bn, layout, a_stage, b_stage)
    lines += staged_epilogue(fused, p, names, itype, c_stride, aligned, _mma_staging(c_stride))

    body = (ASYNC_COPY_PRELUDE + _MMA_PRELUDE).replace(
        "MMA_TYPE", "bf16" if p.a.data_type is DataType.BFLOAT16 else "f16"
    )
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_mma", params, threads, indent(lines, 1))
    source = source.replace('extern "C" __global__', body + '\nextern "C" __global__', 1)
    grid = (-(-p.m // bm), -(-p.n // bn), math.prod(p.batch) if p.batch else 1)
    return Kernel(name, source, grid, (threads, 1, 1), shared, tuple(params.bindings), alignment=16)


def a_loader_setup(p: Problem, itype: str, chunks: int, threads: int, tiles: SmemTiles) -> list[str]:
    """Per-thread precomputation for its A rows: which rows it loads never changes across k tiles."""
    lanes = tiles.lanes
    lines = [
        f"// A: each thread copies {chunks} 16-byte chunks per tile, rows tid/{lanes} + i*{threads // lanes}, chunk tid%{lanes}."
    ]
    lines.append(f"const int a_chunk = tid & {lanes - 1};")
    if p.is_conv:
        spatial = len(p.out.dim) - 2
        lines.append(f"{itype} a_base[{chunks}]; bool a_row_ok[{chunks}];")
        lines += [f"int a_h{axis}[{chunks}];" for axis in range(spatial)]
        lines.append("#pragma unroll")
        lines.append(f"for (int i = 0; i < {chunks}; ++i) {{")
        lines.append(f"  const {itype} m = block_m + {_thread_row(tiles)} + i * {threads // lanes};")
        lines.append("  a_row_ok[i] = m < GM;")
        lines.append(f"  const {itype} mm = a_row_ok[i] ? m : 0;")
        lines += ["  " + s for s in _pixel_coordinates(p, "mm", itype)]
        lines.append(f"  a_base[i] = c0 * {p.a.stride[0]};")
        for axis in range(spatial):
            lines.append(f"  a_h{axis}[i] = (int)c{axis + 2} * {p.attrs.stride[axis]} - {p.attrs.pre_padding[axis]};")
        lines.append("}")
    else:
        lines.append(f"{itype} a_base_row[{chunks}]; bool a_row_ok[{chunks}];")
        lines.append("#pragma unroll")
        lines.append(f"for (int i = 0; i < {chunks}; ++i) {{")
        lines.append(f"  const {itype} m = block_m + {_thread_row(tiles)} + i * {threads // lanes};")
        lines.append("  a_row_ok[i] = m < GM;")
        lines.append(f"  a_base_row[i] = a_base + (a_row_ok[i] ? m : 0) * {p.a.stride[-2]};")
        lines.append("}")
    return lines


def b_loader_setup(p: Problem, itype: str, chunks: int, threads: int, layout: str, tiles: SmemTiles) -> list[str]:
    if layout == "kn":  # k-major tile [BK][BN]: chunk id -> (k row, n chunk)
        return [f"// B (n contiguous): each thread copies {chunks} chunks of the [BK][BN] tile."]
    lanes = tiles.lanes
    lines = [
        f"// B (k contiguous): each thread copies {chunks} chunks, rows tid/{lanes} + i*{threads // lanes}, chunk tid%{lanes}."
    ]
    lines.append(f"{itype} b_row[{chunks}]; bool b_row_ok[{chunks}];")
    lines.append("#pragma unroll")
    lines.append(f"for (int i = 0; i < {chunks}; ++i) {{")
    lines.append(f"  const int n = block_n + {_thread_row(tiles)} + i * {threads // lanes};")
    lines.append("  b_row_ok[i] = n < GN;")
    stride_n = p.b.stride[0] if p.is_conv else p.b.stride[-1]
    base = "" if p.is_conv else "b_base + "
    lines.append(f"  b_row[i] = {base}(b_row_ok[i] ? n : 0) * ({itype}){stride_n};")
    lines.append("}")
    return lines


def load_tile_lambda(
    p: Problem,
    x: str,
    w: str,
    itype: str,
    a_chunks: int,
    b_chunks: int,
    a_stage: int,
    b_stage: int,
    bn: int,
    layout: str,
    aligned: str,
    tiles: SmemTiles,
) -> list[str]:
    """`load_tile(stage, kt)`: issue the cp.async copies of k tile kt into a stage.

    Without 16-byte aligned pointers the same chunks are copied with plain loads."""
    lines = [
        "auto load_tile = [&](int stage, int kt) {",
        "  const int k = kt * BK + a_chunk * 8;",
        "  const bool k_ok = kt < KTILES && k < GK;",
    ]
    a_smem = f"a_smem + stage * {a_stage}"
    b_smem = f"b_smem + stage * {b_stage}"
    k_major_chunk = f"{tiles.k_major}({_thread_row(tiles)} + i * (THREADS / {tiles.lanes}), a_chunk)"
    if p.is_conv:
        spatial = len(p.out.dim) - 2
        filt = p.b.dim[2:]
        channels = p.a.dim[1]
        # k = ((r * S + s) * C + c): decompose once per tile (all of this thread's chunks share k)
        lines.append(f"  const int c = k % {channels};")
        rest = f"k / {channels}"
        taps = []
        for axis in reversed(range(spatial)):
            lines.append(f"  const int f{axis} = ({rest}) % {filt[axis]};")
            rest = f"({rest}) / {filt[axis]}"
            taps.append(axis)
        flip = p.attrs.convolution_mode is ConvMode.CONVOLUTION
        w_terms = [
            f"(({filt[i] - 1} - f{i}) * {p.b.stride[i + 2]})" if flip else f"f{i} * {p.b.stride[i + 2]}"
            for i in range(spatial)
        ]
        lines.append(f"  const {itype} w_tap = {' + '.join(w_terms)} + c;")
        lines.append("#pragma unroll")
        lines.append(f"  for (int i = 0; i < {a_chunks}; ++i) {{")
        checks, terms = ["a_row_ok[i]", "k_ok"], []
        for axis in range(spatial):
            lines.append(f"    const int h{axis} = a_h{axis}[i] + f{axis} * {p.attrs.dilation[axis]};")
            checks.append(f"(unsigned)h{axis} < {p.a.dim[axis + 2]}u")
            terms.append(f"({itype})h{axis} * {p.a.stride[axis + 2]}")
        lines.append(f"    const bool ok = {' && '.join(checks)};")
        lines.append(f"    const T* src = ok ? {x} + a_base[i] + {' + '.join(terms)} + c : {x};")
        lines += _copy_chunk(f"{a_smem} + {k_major_chunk}", "src", "ok", aligned, depth=2)
        lines.append("  }")
        lines.append("#pragma unroll")
        lines.append(f"  for (int i = 0; i < {b_chunks}; ++i) {{")
        lines.append("    const bool ok = b_row_ok[i] && k_ok;")
        lines.append(f"    const T* src = ok ? {w} + b_row[i] + w_tap : {w};")
        lines += _copy_chunk(f"{b_smem} + {k_major_chunk}", "src", "ok", aligned, depth=2)
        lines.append("  }")
    else:
        lines.append("#pragma unroll")
        lines.append(f"  for (int i = 0; i < {a_chunks}; ++i) {{")
        lines.append("    const bool ok = a_row_ok[i] && k_ok;")
        lines.append(f"    const T* src = ok ? {x} + a_base_row[i] + k : {x};")
        lines += _copy_chunk(f"{a_smem} + {k_major_chunk}", "src", "ok", aligned, depth=2)
        lines.append("  }")
        if layout == "nk":
            lines.append("#pragma unroll")
            lines.append(f"  for (int i = 0; i < {b_chunks}; ++i) {{")
            lines.append("    const bool ok = b_row_ok[i] && k_ok;")
            lines.append(f"    const T* src = ok ? {w} + b_row[i] + ({itype})k * {p.b.stride[-2]} : {w};")
            lines += _copy_chunk(f"{b_smem} + {k_major_chunk}", "src", "ok", aligned, depth=2)
            lines.append("  }")
        else:
            per_row = bn // 8
            lines.append("#pragma unroll")
            lines.append(f"  for (int i = 0; i < {b_chunks}; ++i) {{")
            lines.append("    const int id = tid + i * THREADS;")
            lines.append(f"    const int kr = id / {per_row}, nc = id % {per_row};")
            lines.append("    const int kk = kt * BK + kr, n = block_n + nc * 8;")
            lines.append("    const bool ok = kt < KTILES && kk < GK && n < GN;")
            lines.append(f"    const T* src = ok ? {w} + b_base + ({itype})kk * {p.b.stride[-2]} + n : {w};")
            lines += _copy_chunk(f"{b_smem} + {tiles.n_major}(kr, nc)", "src", "ok", aligned, depth=2)
            lines.append("  }")
    lines.append("};")
    return lines


def _thread_row(tiles: SmemTiles) -> str:
    """The first k-major row a thread copies (tid / lanes)."""
    return f"(tid >> {tiles.lanes.bit_length() - 1})"


def _copy_chunk(dst: str, src: str, ok: str, aligned: str, depth: int) -> list[str]:
    pad = "  " * depth
    return [
        f"{pad}if ({aligned}) {{",
        f"{pad}  copy16(smem_addr({dst}), {src}, {ok});",
        f"{pad}}} else {{  // unaligned pointers: the same 16 bytes, element by element",
        f"{pad}  gd::Vec<T, 8> chunk;",
        "#pragma unroll",
        f"{pad}  for (int e = 0; e < 8; ++e) chunk.v[e] = {ok} ? {src}[e] : gd::from<T>(0.0f);",
        f"{pad}  gd::store_vec<T, 8>(reinterpret_cast<T*>({dst}), chunk);",
        f"{pad}}}",
    ]


def _main_loop(bn: int, layout: str, a_stage: int, b_stage: int) -> list[str]:
    """The multistage pipeline: tiles kt+STAGES-1 load while tile kt feeds the tensor cores."""
    if layout == "nk":
        b_fragments = [
            "#pragma unroll",
            "      for (int nj = 0; nj < 2; ++nj) {  // two 16-column halves of the warp's 32 columns",
            "        const int row = warp_n * 32 + nj * 16 + ((lane >> 4) << 3) + (lane & 7);",
            "        const int chunk = kk / 8 + ((lane >> 3) & 1);",
            "        ldmatrix_x4(smem_addr(b_tile + swizzle64(row, chunk)), b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);",
            "      }",
        ]
    else:
        b_fragments = [
            "#pragma unroll",
            "      for (int nj = 0; nj < 2; ++nj) {",
            "        const int krow = kk + ((lane >> 3) & 1) * 8 + (lane & 7);",
            "        const int chunk = (warp_n * 32 + nj * 16) / 8 + (lane >> 4);",
            f"        ldmatrix_x4_trans(smem_addr(b_tile + swizzle_rows<{bn * 2}>(krow, chunk)), b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);",
            "      }",
        ]
    return [
        "float acc[4][4][4];  // [m16 tile][n8 tile][fragment]: the warp's 64x32 block",
        "#pragma unroll",
        "for (int i = 0; i < 4; ++i)",
        "#pragma unroll",
        "  for (int j = 0; j < 4; ++j)",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;",
        "#pragma unroll",
        "for (int s = 0; s < STAGES - 1; ++s) {",
        "  load_tile(s, s);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "}",
        "for (int kt = 0; kt < KTILES; ++kt) {",
        '  asm volatile("cp.async.wait_group %0;\\n" ::"n"(STAGES - 2));',
        "  __syncthreads();  // tile kt is in shared memory, and everyone is done with tile kt-1",
        "  load_tile((kt + STAGES - 1) % STAGES, kt + STAGES - 1);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        f"  const unsigned char* a_tile = a_smem + (kt % STAGES) * {a_stage};",
        f"  const unsigned char* b_tile = b_smem + (kt % STAGES) * {b_stage};",
        "#pragma unroll",
        "  for (int kk = 0; kk < BK; kk += 16) {",
        "    unsigned a[4][4], b[4][2];",
        "#pragma unroll",
        "    for (int mi = 0; mi < 4; ++mi) {",
        "      const int row = warp_m * 64 + mi * 16 + (lane & 15);",
        "      ldmatrix_x4(smem_addr(a_tile + swizzle64(row, kk / 8 + (lane >> 4))), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);",
        "    }",
        *("  " + line for line in b_fragments),
        "#pragma unroll",
        "    for (int mi = 0; mi < 4; ++mi)",
        "#pragma unroll",
        "      for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);",
        "  }",
        "}",
        'asm volatile("cp.async.wait_group 0;\\n" ::);',
        "__syncthreads();  // the pipeline's shared memory is reused for the accumulator tile",
    ]


def _mma_staging(c_stride: int) -> list[str]:
    """The warp's 64x32 accumulators (mma.sync fragments) into the staged tile."""
    return [
        "#pragma unroll",
        "for (int mi = 0; mi < 4; ++mi)",
        "#pragma unroll",
        "  for (int ni = 0; ni < 4; ++ni) {",
        "    const int row = warp_m * 64 + mi * 16 + (lane >> 2), col = warp_n * 32 + ni * 8 + (lane & 3) * 2;",
        f"    *reinterpret_cast<float2*>(staged + row * {c_stride} + col) = make_float2(acc[mi][ni][0], acc[mi][ni][1]);",
        f"    *reinterpret_cast<float2*>(staged + (row + 8) * {c_stride} + col) = make_float2(acc[mi][ni][2], acc[mi][ni][3]);",
        "  }",
    ]


def staged_epilogue(
    fused: FusedNode,
    p: Problem,
    names: dict[int, str],
    itype: str,
    c_stride: int,
    aligned: str,
    staging: list[str],
) -> list[str]:
    """Accumulators -> shared memory -> 8 consecutive output columns per thread -> epilogue.

    ``staging`` writes the path's accumulators into the BM x BN tile ``staged`` (rows of
    ``c_stride`` floats), after every thread is done with the pipeline's shared memory.

    A thread's 8 columns are the same in every chunk it handles (THREADS is a multiple of
    BN/8), so operands that vary only along the columns (batch-norm statistics, biases) are
    loaded into registers once, before the chunk loop.
    """
    compute = "float"
    out = p.out
    rank = len(out.dim)
    column_axis = 1 if p.is_conv else rank - 1
    coordinate = "c"
    column = f"{coordinate}{column_axis}"
    per_column = [
        t
        for t in fused.inputs
        if not t.is_pass_by_value
        and t not in (p.a, p.b)
        and all(d == 1 for axis, d in enumerate((1,) * (rank - len(t.dim)) + t.dim) if axis != column_axis)
    ]
    preloaded = {t.id: f"col{t.id}" for t in per_column}
    epi = _Epilogue(fused, p, names, compute, preloaded)
    hoisted = [f"float col{t.id}[8];" for t in per_column]
    if per_column:
        hoisted += [
            "#pragma unroll",
            "for (int e = 0; e < 8; ++e) {",
            f"  const int {column} = block_n + (tid % (BN / 8)) * 8 + e;",
            *(
                f"  col{t.id}[e] = {column} < GN ? {load(t.data_type, f'{names[t.id]}[{offset(t, out.dim, coordinate)}]', compute)} : 0.0f;"
                for t in per_column
            ),
            "}",
        ]
    # 8 consecutive columns form one aligned 16-byte (or wider) vector of every output when
    # the column stride is 1 and every other stride keeps 8-element alignment.
    vector_ok = all(_columns_contiguous(t, column_axis) for t in fused.outputs)
    coords = (
        _pixel_coordinates(p, "m", itype)
        if p.is_conv
        else [f"const {itype} c{rank - 2} = m;", *_batch_coords(p, itype)]
    )
    lines = [
        "float* const staged = reinterpret_cast<float*>(smem);",
        *staging,
        "__syncthreads();",
        *hoisted,
        "for (int chunk = tid; chunk < BM * BN / 8; chunk += THREADS) {",
        "  const int row = chunk / (BN / 8), col = (chunk % (BN / 8)) * 8;",
        f"  const {itype} m = block_m + row;",
        "  if (m >= GM) continue;",
        *("  " + c for c in coords),
        "  float acc8[8];",
        f"  *reinterpret_cast<float4*>(acc8) = *reinterpret_cast<const float4*>(staged + row * {c_stride} + col);",
        f"  *reinterpret_cast<float4*>(acc8 + 4) = *reinterpret_cast<const float4*>(staged + row * {c_stride} + col + 4);",
    ]
    if vector_ok:
        results = [f"gd::Vec<{cuda_type(t.data_type)}, 8> r{t.id};" for t in fused.outputs]
        stores = []
        for t in fused.outputs:
            first_offset = offset(t, out.dim, "c").replace(column, "(block_n + col)")
            stores.append(f"gd::store_vec<{cuda_type(t.data_type)}, 8>({names[t.id]} + {first_offset}, r{t.id});")
        # Full-size operands laid out like the output (a residual) arrive as one vector too.
        full = [
            t for t in fused.inputs if t not in (p.a, p.b) and t.dim == out.dim and _columns_contiguous(t, column_axis)
        ]
        vector_loads = [
            f"const gd::Vec<{cuda_type(t.data_type)}, 8> in{t.id} = gd::load_vec<{cuda_type(t.data_type)}, 8>("
            f"{names[t.id]} + {offset(t, out.dim, 'c').replace(column, '(block_n + col)')});"
            for t in full
        ]
        lines += [
            f"  if ({aligned} && block_n + col + 8 <= GN) {{",
            *("    " + line for line in results + vector_loads),
            "#pragma unroll",
            "    for (int e = 0; e < 8; ++e) {",
            f"      const int {column} = block_n + col + e;",
            *(
                "      " + line
                for line in epi.statements("acc8[e]", vector_slot="e", vectors=frozenset(t.id for t in full))
            ),
            "    }",
            *("    " + line for line in stores),
            "    continue;",
            "  }",
        ]
    lines += [
        "#pragma unroll",
        "  for (int e = 0; e < 8; ++e) {",
        f"    const int {column} = block_n + col + e;",
        f"    if ({column} >= GN) break;",
        *("    " + line for line in epi.statements("acc8[e]")),
        "  }",
        "}",
    ]
    return lines


def _columns_contiguous(t: Tensor, column_axis: int) -> bool:
    """8 consecutive columns of ``t`` form one aligned vector: column stride 1, and every other
    stride keeps 8-element alignment."""
    return t.stride[column_axis] == 1 and all(
        s % 8 == 0 for axis, s in enumerate(t.stride) if axis != column_axis and t.dim[axis] > 1
    )


def _batch_coords(p: Problem, itype: str) -> list[str]:
    rank = len(p.out.dim)
    if not p.batch:
        return []
    return coordinates(f"({itype})blockIdx.z", p.out.dim[:-2], range(rank - 2), "c", itype)
