"""GEMM family, Hopper path: the tensor-core GEMM of gemm_mma.py on ``wgmma.mma_async`` (sm_90a).

Same problems, loaders and epilogue as the mma.sync path (gemm_block.py); what changes is how
the tensor cores are fed:

- a block of 256 threads is two warpgroups (4 consecutive warps each) computing a 128 x BN
  tile: warpgroup g owns rows 64g..64g+63 and issues ``wgmma.mma_async.m64nBNk16`` (k32 for
  8-bit operands) with A and B read straight from shared memory through matrix descriptors
  (no ldmatrix); the fp32 (int8: s32) accumulators stay in registers (BN/2 per thread);
- k tiles of 128 bytes (exactly one row of the 128-byte swizzle: BK = 64 16-bit or 128 8-bit
  elements) are copied by every thread with 16-byte ``cp.async`` into the layout the
  descriptors describe;
- pipeline: STAGES shared-memory buffers; the wgmma batch of tile kt-1 may still be reading
  its buffer while tile kt is issued, so copies run STAGES-2 tiles ahead of the tensor cores.

No TMA (kernel parameters are 8-byte words; a tensor map is 128 bytes) and no warp
specialisation: every thread copies, every warpgroup computes.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError

from ..context import EmitContext
from ..kernel import Kernel
from .gemm_block import BlockShape, TensorCoreBlock
from .gemm_loaders import SmemTiles
from .gemm_problem import Problem, tensor_core_layout, tensor_core_types
from .gemm_splitk import KSlices, output_tiles, split_choices
from .tensor_core import OperandTypes, zero

ARCH = 90  # wgmma exists on sm_90a only (Blackwell's tensor cores take tcgen05 instead)
BLOCK_K_BYTES = 128  # a k tile is one row of the 128-byte swizzle: 64 16-bit or 128 8-bit elements
# (block_m, block_n, stages). A block has one warpgroup per 64 rows. Smaller and shallower
# tiles fit two or three blocks per SM, for problems with few tiles (a 14x14 layer) or
# short K; the larger ones fill an SM each.
TILES = (
    (128, 64, 4),
    (128, 128, 3),
    (128, 128, 4),
    (128, 128, 6),
    (128, 256, 4),
    (64, 64, 4),
    (64, 128, 4),
    (64, 256, 3),
)
# A wgrad's N is R*S*C: 576 for a 3x3 filter over 64 channels, three tiles of 192 columns.
WGRAD_TILES = ((64, 192, 4), (128, 192, 3))
# A wgrad whose image is gathered element by element (k-contiguous B): the stem's N = 147.
GATHER_TILES = ((64, 160, 3),)
MAX_SHARED = 227 * 1024  # an sm_90 block's dynamic shared memory, opted in
ALIGN_SLACK = 1024  # the dynamic shared memory base is rounded up to 1024 bytes in the kernel


WGMMA_HELPERS = r"""
// ---- wgmma (sm_90a) building blocks ----
// Tiles in shared memory use the 128-byte swizzle: rows of 128 bytes (64 16-bit or 128 8-bit elements),
// in groups of 8 rows (1024 bytes); 16-byte chunk c of row r sits at chunk c ^ (r % 8). The
// tensor cores apply that XOR to absolute address bits 4-6 from bits 7-9, so every tile
// starts on a 1024-byte boundary (and the descriptors' base offset is 0).
//
// K-major tile (A, and k-contiguous B): one 128-byte row per m (n), the 128 bytes of k of the tile.
__device__ __forceinline__ int swizzle128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// N-major tile (n-contiguous B): 64-column blocks one after another, each 64 k rows of
// 128 bytes (8 KB); `chunk` counts 16-byte chunks along n.
__device__ __forceinline__ int swizzle128_n(int k, int chunk) {
  return (chunk >> 3) * 8192 + k * 128 + (((chunk & 7) ^ (k & 7)) << 4);
}

// Shared-memory matrix descriptor (PTX ISA, "matrix descriptor format"):
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset: 0, every tile (and each wgmma's start) keeps address bits 7-9 at 0
//   bits 62-63  swizzle mode: 1 = 128-byte swizzle
// K-major, 128-byte swizzle: leading offset unused (a tensor-core step, 32 bytes of k, lies
// within one swizzled row; 16 by convention), stride offset 1024 (the next 8 rows); a step
// advances the start address by 32 bytes. N-major (transposed B): leading offset 8192 (the next 64
// columns), stride offset 1024 (the next 8 k rows); a k16 step advances it by 16 rows, 2048 bytes.
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned addr, unsigned leading, unsigned stride) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (unsigned long long)(leading >> 4) << 16 |
         (unsigned long long)(stride >> 4) << 32 | 1ull << 62;
}

// Orders this thread's register accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed batches of this warpgroup are still running.
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins the accumulators at this point: the compiler may not move their reads or writes
// across it (wgmma reads and writes them asynchronously, between fence and wait).
template <int N> __device__ __forceinline__ void fence_accumulators(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_accumulators(int (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(acc[i])::"memory");
}
"""


STMATRIX = r"""
// Four 8 x 8 b16 matrices from the registers to shared memory (sm_90): register i of each thread
// holds row lane / 4, columns 2 (lane % 4) .. + 1 of matrix i; lane 8i + r gives the address of
// row r of the stored matrix i, 16 contiguous bytes; _trans stores each matrix transposed.
__device__ __forceinline__ void stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
"""


def candidates(p: Problem, arch: int) -> list[dict[str, object]]:
    """The wgmma launch choices for ``p`` on sm_``arch``: none off sm_90 or off the tensor-core
    layouts; the tiles, then their split-K variants where the output has few tiles."""
    if arch != ARCH or tensor_core_layout(p) is None:
        return []
    shapes: tuple[tuple[int, int, int], ...] = TILES + WGRAD_TILES if p.node.op == "conv_wgrad" else TILES
    if p.node.op == "conv_wgrad" and tensor_core_layout(p) == "nk":  # a gathered image: 160 columns too
        shapes += GATHER_TILES
    tiles: list[dict[str, object]] = [
        {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages} for bm, bn, stages in shapes
    ]
    return tiles + [
        {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages, "split_k": split}
        for bm, bn, stages in shapes
        for split in split_choices(p, output_tiles(p, bm, bn), arch)
    ]


def wgmma_prelude(bn: int, types: OperandTypes, transpose_b: int, first: bool = False, transpose_a: int = 0) -> str:
    """The wgmma device functions for a warpgroup tile 64 x ``bn`` of operands ``types``:
    the helpers of :data:`WGMMA_HELPERS` and ``wgmma_step`` (:func:`wgmma_step_function`).
    With ``first`` (block-scaled fp8), also ``wgmma_first``: the same step overwriting d,
    which starts a fresh fragment without zeroing it."""
    step = wgmma_step_function(bn, types, transpose_b, transpose_a=transpose_a)
    return WGMMA_HELPERS + step + (wgmma_step_function(bn, types, transpose_b, "wgmma_first", True) if first else "")


def wgmma_step_function(
    bn: int,
    types: OperandTypes,
    transpose_b: int,
    name: str = "wgmma_step",
    overwrite: bool = False,
    transpose_a: int = 0,
) -> str:
    """``name`` multiplies one tensor-core step, 32 bytes of k (k16 of 16-bit operands, k32 of
    8-bit ones, whose instructions take no transpose bits: 8-bit B is K-major), into a 64 x
    ``bn`` warpgroup tile; a kernel with two kinds of step names the second one apart.
    ``overwrite``: d = A * B (scale-d 0, d written only) instead of d += A * B.
    ``transpose_a`` 1: A is m-contiguous (a wgrad's loss), 16-bit only."""
    count = bn // 2
    outputs = ", ".join(f"%{i}" for i in range(count))
    mode = "=" if overwrite else "+"
    constraints = ",\n                 ".join(
        ", ".join(f'"{mode}{types.register}"(d[{i}])' for i in range(row, min(row + 8, count)))
        for row in range(0, count, 8)
    )
    acc = types.accumulator
    scale_d = 0 if overwrite else 1
    if types.integer:  # no input scales or transposes for integer operands
        operands = f"%{count}, %{count + 1}, {scale_d}"
    elif types.eight_bit:  # fp8: input scales (1: not negated), no transposes
        operands = f"%{count}, %{count + 1}, {scale_d}, 1, 1"
    else:
        operands = f"%{count}, %{count + 1}, {scale_d}, 1, 1, {transpose_a}, {transpose_b}"
    k = types.k_step
    layout = f"{'n' if transpose_b else 'k'}-contiguous" + ("" if types.eight_bit else f": transpose bit {transpose_b}")
    if transpose_a:
        layout += "; A m-contiguous: transpose bit 1"
    return f"""
// d (the warpgroup's 64 x {bn} {types.accumulator_ptx.replace("f", "fp")} tile, wgmma fragment layout) {"=" if overwrite else "+="} A (64 x {k}) * B ({k} x {bn}),
// both from shared memory; B {layout}.
__device__ __forceinline__ void {name}({acc} (&d)[{count}], unsigned long long a, unsigned long long b) {{
  asm volatile("wgmma.mma_async.sync.aligned.m64n{bn}k{k}{types.suffix} "
               "{{{outputs}}}, {operands};\\n"
               : {constraints}
               : "l"(a), "l"(b)
               : "memory");
}}
"""


def wgmma_kernel(
    fused: FusedNode,
    ctx: EmitContext,
    p: Problem,
    split: int,
    block_type: type[TensorCoreBlock] = TensorCoreBlock,
) -> Kernel:
    """The kernel for ``p`` with the tuning choice ``ctx.tuning`` (a ``candidates`` entry), its
    K cut into ``split`` slices (gemm_splitk.py); ``block_type`` as for gemm_mma.mma_kernel."""
    bm = int(ctx.tuning.get("block_m", 128))  # type: ignore[call-overload]
    bn, stages = int(ctx.tuning["block_n"]), int(ctx.tuning["stages"])  # type: ignore[call-overload]
    types = tensor_core_types(p)
    assert types is not None
    size = types.element_bytes
    bk = BLOCK_K_BYTES // size
    shape = BlockShape(bm, bn, bk, stages, bm * 2, size)  # one warpgroup (128 threads) per 64 rows
    shared = shape.shared_bytes + ALIGN_SLACK
    _check(ctx, bm, bn, stages, shared, tensor_core_layout(p))

    tiles = SmemTiles(bk, "swizzle128", "swizzle128_n", "swizzle128_n", chunk=types.chunk)
    block = block_type(fused, p, shape, tiles, KSlices(split))
    shared_memory = [
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "// The swizzle needs 1024-byte aligned tiles: round the base up (the launch adds the slack).",
        "unsigned char* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);",
    ]
    prefetch = _prefetch(ctx, p)
    roles = "const int warpgroup = warp >> 2;  // rows warpgroup * 64 .. + 63 of the block tile"
    lines = block.prelude(shared_memory, roles, prefetch)
    stages = (shape.a_stage, shape.b_stage)
    lines += _main_loop(p.a_layout, block.layout, stages, block.slices, types.accumulator, prefetch)
    lines += block.epilogue(_staging(shape.c_stride, types.accumulator))
    functions = wgmma_prelude(bn, types, 1 if block.layout == "kn" else 0, transpose_a=1 if p.a_layout == "km" else 0)
    return block.kernel(ctx, lines, "_wgmma", functions, shared, arch_suffix="a")


def _prefetch(ctx: EmitContext, p: Problem) -> bool:
    """Whether the loop issues the image loads of a wgrad gathered element by element a tile
    ahead, through registers (gemm_wgrad_gather.py): tuning ``"prefetch"``, on by default."""
    gathered = p.node.op == "conv_wgrad" and tensor_core_layout(p) == "nk"
    prefetch = ctx.tuning.get("prefetch", gathered)
    if not isinstance(prefetch, bool) or (prefetch and not gathered):
        raise UnsupportedError(
            f"wgmma GEMM tile {ctx.tuning}: prefetch (true or false) applies to a conv_wgrad whose image is "
            "gathered element by element (channels not a multiple of 8, or not contiguous)",
            node=p.node.name,
        )
    return prefetch


def _check(ctx: EmitContext, bm: int, bn: int, stages: int, shared: int, layout: str | None) -> None:
    if ctx.arch != ARCH:
        raise UnsupportedError(f"the wgmma GEMM path runs on sm_90 only (sm_90a code); the target is sm_{ctx.arch}")
    # 160 columns (the stem wgrad's 147) only in a k-contiguous B tile: an n-contiguous one is
    # cut into 64-column blocks
    widths = (64, 128, 160, 192, 256) if layout == "nk" else (64, 128, 192, 256)
    if bm not in (64, 128) or bn not in widths or stages < 3:
        raise UnsupportedError(
            f"wgmma GEMM tile {ctx.tuning}: expected block_m 64 or 128, block_n 64, 128, 192 or 256 (160 too "
            f"where B is k-contiguous; here it is {'k' if layout == 'nk' else 'n'}-contiguous), stages >= 3"
        )
    if shared > MAX_SHARED:
        raise UnsupportedError(f"wgmma GEMM tile {ctx.tuning} needs {shared} bytes of shared memory, over {MAX_SHARED}")


def _main_loop(
    a_layout: str, layout: str, stages: tuple[int, int], slices: KSlices, accumulator: str, prefetch: bool
) -> list[str]:
    """Copies STAGES-2 tiles ahead; one wgmma batch (the 4 steps of 32 bytes of k of a tile) in
    flight. ``prefetch``: B is gathered through registers (gemm_wgrad_gather.py): the loads of
    tile kt+STAGES-1 are issued in iteration kt, under its tensor-core batch and the next
    barrier, and stored in iteration kt+1 (``put``), instead of waited for where issued."""
    a_stage, b_stage = stages
    ahead = "(kt + STAGES - 2) % STAGES, kt + STAGES - 2"
    copies = (
        [
            f"  load_a({ahead});",
            '  asm volatile("cp.async.commit_group;\\n" ::);',
            "  put((kt + STAGES - 2) % STAGES);  // loaded in iteration kt-1",
            "  gather(kt + STAGES - 1);",
        ]
        if prefetch
        else [
            f"  load_tile({ahead});  // into the stage of tile kt-2",
            '  asm volatile("cp.async.commit_group;\\n" ::);',
        ]
    )
    # Descriptors: (leading, stride) byte offsets and the start-address step of one k step. An
    # m-contiguous A tile (a wgrad's loss, read with wgmma's transpose bit) is laid out as an
    # n-contiguous B one (swizzle128_n: 64-row blocks of 64 k rows, one block per warpgroup).
    b_leading, b_stride, b_step = (16, 1024, 32) if layout == "nk" else (8192, 1024, 2048)
    a_leading, a_stride, a_step = (16, 1024, 32) if a_layout == "mk" else (8192, 1024, 2048)
    return [
        f"{accumulator} acc[BN / 2];  // the warpgroup's 64 x BN tile, wgmma fragment layout",
        "#pragma unroll",
        f"for (int i = 0; i < BN / 2; ++i) acc[i] = {zero(accumulator)};",
        "#pragma unroll",
        "for (int s = 0; s < STAGES - 2; ++s) {",
        "  load_tile(s, s);",
        '  asm volatile("cp.async.commit_group;\\n" ::);',
        "}",
        *(["gather(STAGES - 2);  // the image of the first tile the loop stores"] if prefetch else []),
        "const unsigned a_tiles = smem_addr(a_smem) + warpgroup * (64 * 128);  // this warpgroup's 64 rows",
        "const unsigned b_tiles = smem_addr(b_smem);",
        f"for (int kt = 0; kt < {slices.count}; ++kt) {{",
        "  // This thread's copies of tile kt have landed (groups after it: tiles kt+1 .. kt+STAGES-3);",
        "  // the proxy fence makes them visible to the tensor cores, which read through the async proxy.",
        '  asm volatile("cp.async.wait_group %0;\\n" ::"n"(STAGES - 3));',
        '  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");',
        "  // Every thread's copies of tile kt are in; and both warpgroups have passed wgmma_wait<1> of",
        "  // iteration kt-1, so the batch of tile kt-2 is done reading its stage.",
        "  __syncthreads();",
        *copies,
        "  const int stage = kt % STAGES;",
        "  fence_accumulators(acc);",
        "  wgmma_fence();",
        "#pragma unroll",
        f"  for (int kk = 0; kk < {BLOCK_K_BYTES // 32}; ++kk)  // steps of 32 bytes of k",
        f"    wgmma_step(acc, wgmma_descriptor(a_tiles + stage * {a_stage} + kk * {a_step}, {a_leading}, {a_stride}),",
        f"              wgmma_descriptor(b_tiles + stage * {b_stage} + kk * {b_step}, {b_leading}, {b_stride}));",
        "  wgmma_commit();",
        "  wgmma_wait<1>();  // the batch of tile kt-1 is done",
        "  fence_accumulators(acc);",
        "}",
        "wgmma_wait<0>();",
        "fence_accumulators(acc);",
        'asm volatile("cp.async.wait_group 0;\\n" ::);  // the zero-filled copies past the last tile too',
        "__syncthreads();  // the pipeline's shared memory is reused for the accumulator tile",
    ]


def _staging(c_stride: int, accumulator: str) -> list[str]:
    """The warpgroup's accumulators into the staged tile. wgmma m64nN fragment: warp w of the
    warpgroup holds rows 16w..16w+15; acc[4j], acc[4j+1] are row lane/4, columns
    8j + 2 (lane % 4) + {0, 1}; acc[4j+2], acc[4j+3] the same columns of row lane/4 + 8."""
    return [
        "#pragma unroll",
        "for (int j = 0; j < BN / 8; ++j) {",
        "  const int row = warpgroup * 64 + (warp & 3) * 16 + (lane >> 2), col = j * 8 + (lane & 3) * 2;",
        f"  *reinterpret_cast<{accumulator}2*>(staged + row * {c_stride} + col) = make_{accumulator}2(acc[4 * j], acc[4 * j + 1]);",
        f"  *reinterpret_cast<{accumulator}2*>(staged + (row + 8) * {c_stride} + col) = make_{accumulator}2(acc[4 * j + 2], acc[4 * j + 3]);",
        "}",
    ]
