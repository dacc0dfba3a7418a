"""GEMM family, Hopper engine: a persistent, warp-specialised GEMM (sm_90a).

A block of three warpgroups stays on its SM and walks output tiles ``blockIdx.x``,
``+ gridDim.x``, ... (rasterised in groups of GROUP_M tile rows, so that the tiles in flight
share A and B panels in L2):

- the producer warpgroup fills a ring of STAGES shared-memory buffers with the k tiles of A
  and B (128-byte swizzle, the layout the wgmma descriptors read), each buffer guarded by a
  *full* mbarrier (the copies landed) and an *empty* one (the consumers are done with it).
  For a matmul it gives its registers away (``setmaxnreg``) and one thread issues TMA copies;
  for an MXFP8 matmul every thread also stages the k tile's scales (gemm_ws_mx.py);
  for a convolution, by default, all 128 threads gather the implicit-GEMM tiles with ``cp.async``
  (gemm_loaders.py, as the other tensor-core paths do), each thread's copies arriving on the
  full barrier when they land; with ``"producer": "im2col"`` (a tuning, or the default for the
  convolutions it was measured faster on) one thread copies them with TMA's im2col mode instead
  (gemm_im2col.py), as for a matmul;
- two consumer warpgroups take the registers, each computes 64 rows of the 128 x BN tile
  with ``wgmma`` from shared memory, one batch in flight, releasing a buffer as soon as the
  batch that read it completes; then runs the fused epilogue from its accumulators straight
  to global memory, while the producer already fills the ring with the next tile's k tiles.

TMA zero-fills what lies outside the tensors (the gather zero-fills too), so ragged M, N and K
need no predicates in the main loop. The matmul's batch dims become the tensor maps' outer dims.

A dynamic graph's matmul (a symbolic M, symbolic batch dims) runs here too, and so does its
convolution over a symbolic batch (M = N*P*Q.., either producer): its tensor maps'
symbolic dims and strides are resolved from each call's extents when the plan is bound
(TensorMap.symbolic, runtime/tensor_map.py), the kernel reads M (and the batch) from EXTENT
arguments and counts its tiles from them, and the persistent grid is computed at launch:
``ceil(M / BM)`` tile rows times the tile columns and K slices, at most one block per SM (with
a symbolic batch, the batch times the tiles of the largest M, capped the same way; the blocks
past the call's tiles find no unit and return).

Operands are fp16/bf16, fp8 (fp32 accumulators) or int8 (s32 accumulators, staged as int for
the epilogue): a k tile is 128 bytes of k whatever the type, so only BK (in elements), the
wgmma instruction and the accumulators' type change; 8-bit B is K-major (gemm_problem.py).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.arch import sm_count
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Tensor
from graphdnn.program import MAX_TENSOR_MAP_RANK, TensorMap
from graphdnn.symbolic import Extent, Sym, symbols_of, upper

from ..context import EmitContext, KernelParams, indent, kernel_source, pattern_name
from ..kernel import DynamicGrid, Kernel
from . import gemm_im2col as im2col
from .gemm_loaders import (
    ASYNC_COPY_PRELUDE,
    SmemTiles,
    a_loader_setup,
    b_loader_setup,
    element_types,
    load_tile_lambda,
)
from .gemm_problem import Problem, declare, index_type_of, mxfp8, tensor_core_layout, tensor_core_types
from .gemm_sm90 import ARCH, BLOCK_K_BYTES, MAX_SHARED, wgmma_prelude
from .gemm_splitk import MIN_SLICE_K, PARTIALS, KSlices, output_tiles
from .gemm_ws_consumer import SUBTILE, consumer
from .gemm_ws_mx import MX_REGISTERS, full_arrivals, scale_area, scale_loads, scale_stage_bytes, scale_stores
from .gemm_ws_schedule import TileSchedule
from .tma_prelude import mbarrier_prelude

BLOCK_M = 128  # two consumer warpgroups of 64 rows; k tiles of one 128-byte swizzle row (BLOCK_K_BYTES)
THREADS = 384  # the producer warpgroup, then the two consumers
CONSUMER_WARPS = 8
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232  # 128 * 40 + 256 * 232 = 384 * 168, the launch's registers
GROUP_M = 8
BARRIER_BYTES = 16  # a full and an empty mbarrier per stage
STAGING = 2 * SUBTILE * SUBTILE * 4  # fp32, one subtile per consumer
ALIGN_SLACK = 1024  # the dynamic shared memory base is rounded up to 1024 bytes in the kernel
BLOCK_NS = (128, 256)
GATHER_BLOCK_NS = (128,)  # 128 x 256 tiles: the gather's per-thread rows no longer fit in registers
PRODUCERS = ("gather", "im2col")  # a convolution's; a matmul's is TMA, named by no "producer" key


def tiles(block_n: int, extra: int = 0) -> list[dict[str, object]]:
    """The deepest ring that fits for ``block_n``, and one stage less (shared memory for a
    second block is out of reach either way); ``extra``: more bytes per stage (MXFP8's scales)."""
    stage = (BLOCK_M + block_n) * BLOCK_K_BYTES + extra
    deepest = (MAX_SHARED - ALIGN_SLACK - STAGING) // (stage + BARRIER_BYTES)
    return [{"path": "ws", "block_n": block_n, "stages": s} for s in (deepest, deepest - 1)]


def supported(p: Problem, arch: int) -> bool:
    """On sm_90: a convolution the tensor-core paths take, or such a matmul whose operands TMA
    can describe (a dynamic one's maps are resolved at each call)."""
    if arch != ARCH or tensor_core_layout(p) is None:
        return False
    return p.is_conv or all(len(_map_axes(t)) <= MAX_TENSOR_MAP_RANK for t in (p.a, p.b))


def candidates(p: Problem, arch: int) -> list[dict[str, object]]:
    """Every tile, and for problems with few 128 x 128 tiles the deepest 128 x 128 ring with
    each split of ``split_choices``; for a convolution with the gather producer, then with the
    im2col one where it can take the convolution."""
    if not supported(p, arch):
        return []
    if p.block_scaled:  # 128 x 128 tiles: fresh fragments per k block beside the accumulators
        ring = tiles(128, _scale_bytes(p, 128))
        return ring + [{**ring[0], "split_k": s} for s in split_choices(p, arch)] if mxfp8(p) else ring
    split = [{**tiles(128)[0], "split_k": s} for s in split_choices(p, arch)]
    every = [choice for bn in _block_ns("gather" if p.is_conv else "tma") for choice in tiles(bn)] + split
    if not p.is_conv or im2col.refusal(p, _block_k(p)) is not None:
        return every
    mapped = [{**choice, "producer": "im2col"} for bn in BLOCK_NS for choice in tiles(bn)]
    return every + mapped + [{**choice, "producer": "im2col"} for choice in split]


def split_choices(p: Problem, arch: int) -> list[int]:
    """K slices for a problem with fewer 128 x 128 tiles than half the SMs: the most whose units
    still fit one wave of the persistent blocks, half and twice that, each slice keeping at
    least MIN_SLICE_K of K; none for problems that fill the GPU."""
    tiles, sms = output_tiles(p, BLOCK_M, 128), sm_count(arch)
    if tiles * 2 > sms or not _fp32_partials(p):
        return []
    longest = p.k // MIN_SLICE_K
    most = min(sms // tiles, longest)
    return sorted({s for s in (most // 2, most, 2 * most) if 2 <= s <= longest})


def _fp32_partials(p: Problem) -> bool:
    """Split-K sums fp32 partial tiles: float accumulators only (int8's int32 sums stay exact)."""
    types = tensor_core_types(p)
    return types is not None and types.accumulator == "float"


def _scale_bytes(p: Problem, block_n: int) -> int:
    """Shared-memory bytes per stage besides the tiles: an MXFP8 matmul's scales (gemm_ws_mx.py)."""
    return scale_stage_bytes(block_n) if mxfp8(p) else 0


def _block_ns(producer: str) -> tuple[int, ...]:
    return GATHER_BLOCK_NS if producer == "gather" else BLOCK_NS


def _block_k(p: Problem) -> int:
    """A k tile's elements: one 128-byte swizzle row."""
    types = tensor_core_types(p)
    assert types is not None
    return BLOCK_K_BYTES // types.element_bytes


def _producer_of(ctx: EmitContext, p: Problem) -> str:
    """The tuning's producer ("tma" for a matmul, "gather" unless the tuning says "im2col" for a
    convolution); a clear error for one the problem cannot take."""
    producer = ctx.tuning.get("producer")
    if not p.is_conv:
        if producer is not None:
            raise UnsupportedError(
                f"warp-specialised GEMM tuning {ctx.tuning}: a {p.node.op}'s producer is TMA's tiled mode, set by no "
                "'producer' key",
                node=p.node.name,
            )
        return "tma"
    if producer is None:
        return "gather"
    if producer not in PRODUCERS:
        raise UnsupportedError(
            f"warp-specialised GEMM tuning {ctx.tuning}: producer must be one of {list(PRODUCERS)}, not {producer!r}",
            node=p.node.name,
        )
    reason = im2col.refusal(p, _block_k(p)) if producer == "im2col" else None
    if reason is not None:
        raise UnsupportedError(
            f"warp-specialised GEMM tuning {ctx.tuning}: the TMA im2col producer cannot feed this convolution: "
            f"{reason}; take the gather producer (no 'producer' key)",
            node=p.node.name,
        )
    return str(producer)


def default_choice(p: Problem, arch: int) -> dict[str, object] | None:
    """The engine's tile when nothing is tuned, or None to leave ``p`` to the other paths.
    128 x 256 tiles where they still fill every SM, 128 x 128 otherwise; the deepest ring.
    Problems with fewer 128 x 128 tiles than half the SMs take it only with a long K, cut in two
    slices: measured on an H100 (benchmarks/RESULTS.md), 128 x 4096 x 4096 and 64 x 8192 x 8192
    ran 1.4x and 1.3x faster so than on mma.sync split-K, and faster than with 4 or no slices.
    Short-K few-tile problems stay on the other paths (not measured on the engine).
    A block-scaled matmul always takes the engine's 128 x 128 tile, an MXFP8 one of few tiles
    and a long K in two slices too (not measured yet). Convolutions: see ``_default_im2col``."""
    if not supported(p, arch):
        return None
    if p.is_conv:
        return _default_im2col(p, arch)
    if p.block_scaled:  # the engine is its only tensor-core kernel, whatever the tile count
        deepest = tiles(128, _scale_bytes(p, 128))[0]
        return (_two_slices(p, deepest) if mxfp8(p) and _few_tiles(p, arch) else None) or deepest
    if _few_tiles(p, arch):
        return _two_slices(p, tiles(128)[0]) if _fp32_partials(p) else None
    return tiles(256 if output_tiles(p, BLOCK_M, 256) >= sm_count(arch) else 128)[0]


def _registers(p: Problem) -> tuple[int, int]:
    """A producer's and a consumer's registers (setmaxnreg): MXFP8's own split (gemm_ws_mx.py)."""
    return MX_REGISTERS if mxfp8(p) else (PRODUCER_REGISTERS, CONSUMER_REGISTERS)


def _few_tiles(p: Problem, arch: int) -> bool:
    return output_tiles(p, BLOCK_M, 128) * 2 < sm_count(arch)


def _two_slices(p: Problem, choice: dict[str, object]) -> dict[str, object] | None:
    """``choice`` with K cut in two slices, where K is long enough for it; else None."""
    return {**choice, "split_k": 2} if p.k >= 2 * MIN_SLICE_K else None


def _default_im2col(p: Problem, arch: int) -> dict[str, object] | None:
    """The im2col producer for the convolutions like those it was measured faster on (an H200,
    benchmarks/RESULTS.md: ResNet-50's 1x1 64->256 at 56², 3x3 128->128 at 28² and 3x3 256->256
    at 14², N=32, bf16: 1.2x, 1.8x and 2.7x the mma.sync default with the fastest im2col tile of
    each), and its stride-2 layers, 3x3 128->128 and the 1x1 256->512 projection at 56² (1.66x
    and 1.40x): 2-d, 16-bit, strides of 1 or 2, dilation 1, channels in whole k tiles, at least
    128 output channels and tiles for half the SMs. 128 x 256 tiles (3 stages, the fastest
    measured) where the output channels and those tiles fill every SM, 128 x 128 otherwise. 64
    output channels stay on mma.sync (3x3 64->64 at 56² ran 0.96x: half of each 128-column tile
    would multiply zeros); other convolutions were not measured."""
    types, attrs = tensor_core_types(p), p.attrs
    if (
        types is None
        or types.element_bytes != 2
        or len(p.a.dim) != 4
        or any(s != 1 for s in attrs.dilation)
        or any(s > 2 for s in attrs.stride)
        or p.channels % _block_k(p)
        or p.n < 128
        or output_tiles(p, BLOCK_M, 128) * 2 < sm_count(arch)
        or im2col.refusal(p, _block_k(p)) is not None
    ):
        return None
    if p.n >= 256 and output_tiles(p, BLOCK_M, 256) >= sm_count(arch):
        return {**tiles(256)[1], "producer": "im2col"}
    return {**tiles(128)[0], "producer": "im2col"}


def _map_axes(t: Tensor) -> list[int]:
    """The axes of operand ``t`` its tensor map walks, innermost first: the contiguous matrix
    axis, the other matrix axis, then the batch axes that may hold more than one matrix."""
    rank = len(t.dim)
    inner = rank - 1 if t.stride[-1] == 1 else rank - 2
    outer = rank - 2 if inner == rank - 1 else rank - 1
    batch = [axis for axis in range(rank - 3, -1, -1) if t.dim[axis] != 1]
    return [inner, outer, *batch]


def _tensor_map(t: Tensor, box: tuple[int, int]) -> tuple[TensorMap, tuple[Extent, ...]]:
    """The map of ``t`` (its sizes at the symbols' maxima) and, for a tensor with symbolic dims
    or strides, every size of it as an extent (dims, then byte strides), else ()."""
    axes = _map_axes(t)
    size = t.data_type.itemsize
    dims = tuple(t.dim[a] for a in axes)
    strides = tuple(t.stride[a] * size for a in axes[1:])
    tensor_map = TensorMap(
        element_bytes=size,
        dims=tuple(upper(d) for d in dims),
        strides=tuple(upper(s) for s in strides),
        box=(*box, *(1 for _ in axes[2:])),
        swizzle=128,
    )
    return tensor_map, ((*dims, *strides) if symbols_of([*dims, *strides]) else ())


def ws_kernel(fused: FusedNode, ctx: EmitContext, p: Problem, schedule: TileSchedule | None = None) -> Kernel:
    """The kernel for ``p`` with the tuning choice ``ctx.tuning`` (a ``candidates`` entry).
    With ``split_k`` > 1 the blocks walk (tile, K slice) units and store fp32 partial tiles,
    which gemm_splitk's reduction kernel sums and runs the epilogue on. ``schedule``: what a
    unit is (gemm_ws_schedule.py), a matmul's or a convolution's tiles by default."""
    schedule = schedule or TileSchedule(p)
    bn, stages = int(ctx.tuning["block_n"]), int(ctx.tuning["stages"])  # type: ignore[call-overload]
    split = ws_split(ctx, p)
    layout = tensor_core_layout(p)
    stage_bytes = (BLOCK_M + bn) * BLOCK_K_BYTES + BARRIER_BYTES + _scale_bytes(p, bn)
    shared = stages * stage_bytes + STAGING + ALIGN_SLACK + schedule.shared_bytes
    if not supported(p, ctx.arch):
        raise UnsupportedError(
            f"the warp-specialised GEMM engine takes tensor-core problems (16-bit, fp8 or int8 operands) on "
            f"sm_90 only, not this problem on sm_{ctx.arch}"
        )
    types = tensor_core_types(p)
    assert types is not None
    bk = _block_k(p)
    producer = _producer_of(ctx, p)
    if p.block_scaled and (bn != 128 or (split != 1 and not mxfp8(p))):
        raise UnsupportedError(
            f"warp-specialised GEMM tuning {ctx.tuning}: a block-scaled matmul takes block_n 128 (its k-block "
            "fragments and the accumulators share the registers), and split_k only with MXFP8 scales",
            node=p.node.name,
        )
    if bn not in _block_ns(producer) or stages < 2 or shared > MAX_SHARED:
        raise UnsupportedError(
            f"warp-specialised GEMM tile {ctx.tuning}: expected block_n in {list(_block_ns(producer))} and 2 or "
            f"more stages within {MAX_SHARED} bytes of shared memory",
            node=p.node.name,
        )
    params = KernelParams()
    gather = producer == "gather"
    if producer == "tma":
        # B's box: k rows of 64 n (one swizzle row each) for n-contiguous B, BN rows of BK k otherwise
        b_box = (64, bk) if layout == "kn" else (bk, bn)
        a_map = params.tensor_map(p.a, *_tensor_map(p.a, (bk, BLOCK_M)))
        b_map = params.tensor_map(p.b, *_tensor_map(p.b, b_box))
    elif producer == "im2col":
        a_map, b_map = im2col.declare_maps(params, p, bk, bn)
    k_tiles = im2col.k_tiles(p, bk) if producer == "im2col" else -(-p.k // bk)
    declared, names = declare(fused, p)
    params.declarations += declared.declarations
    params.bindings += declared.bindings
    if split > 1:
        params.scratch(PARTIALS, "float")
    aligned = params.aligned_flag()
    itype = index_type_of(fused, p)
    tiles_total = schedule.tiles(BLOCK_M, bn)
    body = [
        *element_types(p),
        f"constexpr int BM = {BLOCK_M}, BN = {bn}, BK = {bk}, STAGES = {stages}, GROUP_M = {GROUP_M};",
        *schedule.sizes(k_tiles, tiles_total, split),
        *(
            [f"constexpr int CTILES = {-(-p.channels // bk)};  // k tiles per filter tap"]
            if producer == "im2col"
            else []
        ),
        f"constexpr unsigned A_STAGE = BM * {BLOCK_K_BYTES}, B_STAGE = BN * {BLOCK_K_BYTES};  // bytes",
        "extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "// The swizzle needs 1024-byte aligned tiles: round the base up (the launch adds the slack).",
        "const unsigned a_tiles = (smem_addr(smem_raw) + 1023u) & ~1023u;",
        "const unsigned b_tiles = a_tiles + STAGES * A_STAGE;",
        f"{types.accumulator}* const staging = reinterpret_cast<{types.accumulator}*>(smem_raw + (b_tiles + STAGES * B_STAGE - smem_addr(smem_raw)));",
        f"const unsigned full = b_tiles + STAGES * B_STAGE + {STAGING}, empty = full + STAGES * 8;  // mbarriers, 8 bytes each",
        *schedule.setup(),
        *(scale_area(bn) if mxfp8(p) else []),
        "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warpgroup = warp >> 2;",
        "if (tid == 0) {",
        "  for (int s = 0; s < STAGES; ++s) {",
        "    // the gathering threads' copies, or the TMA producer's expect_tx arrival and the copies' bytes",
        f"    mbar_init(full + 8 * s, {128 if gather else full_arrivals() if mxfp8(p) else 1});",
        f"    mbar_init(empty + 8 * s, {CONSUMER_WARPS});  // one arrival per consumer warp",
        "  }",
        '  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
        "}",
        "__syncthreads();",
        "if (warpgroup == 0) {",
    ]
    if gather:  # 128 threads gather: they keep their registers (the consumers fit in what is left)
        body += indent(_gather_producer(schedule, names, bn, bk, types.chunk, itype, aligned), 1).splitlines()
    else:
        tile_setup, loads = (
            (im2col.tile_origin(p, itype), im2col.loads(p, a_map, b_map))
            if producer == "im2col"
            else ([], _matmul_loads(p, a_map, b_map, layout, schedule))
        )
        setmaxnreg = f'  asm volatile("setmaxnreg.dec.sync.aligned.u32 {_registers(p)[0]};\\n");'
        if mxfp8(p):  # every producer thread stages scales; thread 0 issues the copies
            producer_lines = _producer(schedule, itype, names, tile_setup, loads, scale_loads(p, names), scale_stores())
            body += [setmaxnreg, *indent(producer_lines, 1).splitlines()]
        elif schedule.warp_wide:  # warp 0 walks the units, lane 0 issues the copies
            producer_lines = _producer(schedule, itype, names, tile_setup, loads, [], [])
            body += [setmaxnreg, "  if (warp == 0) {", *indent(producer_lines, 2).splitlines(), "  }"]
        else:
            body += [
                setmaxnreg,
                "  if (tid == 0) {",
                *indent(_producer(schedule, itype, names, tile_setup, loads), 2).splitlines(),
                "  }",
            ]
    body += [
        "} else {",
        *([] if gather else [f'  asm volatile("setmaxnreg.inc.sync.aligned.u32 {_registers(p)[1]};\\n");']),
        *indent(
            consumer(fused, p, names, layout, itype, aligned, gather, types.accumulator, split, schedule), 1
        ).splitlines(),
        "}",
    ]
    pattern = pattern_name(fused) + schedule.name + "_ws"
    functions = ASYNC_COPY_PRELUDE + wgmma_prelude(bn, types, 1 if layout == "kn" else 0, first=p.block_scaled)
    functions += schedule.device_functions
    if producer == "im2col":
        functions += mbarrier_prelude(len(p.b.dim)) + im2col.prelude(p)
    else:
        functions += mbarrier_prelude(0 if gather else max(len(_map_axes(t)) for t in (p.a, p.b)))
    name, source = kernel_source(
        ctx, fused, pattern, params, THREADS, indent(body, 1), min_blocks=1, device_functions=functions
    )
    sms = sm_count(ctx.arch)
    grid = (min(tiles_total * split, sms), 1, 1)
    blocks = _persistent_grid(p, bn, split, sms) if p.is_dynamic else None
    return Kernel(name, source, grid, (THREADS, 1, 1), shared, tuple(params.bindings), arch_suffix="a", blocks=blocks)


def _persistent_grid(p: Problem, bn: int, split: int, sms: int) -> DynamicGrid:
    """A dynamic problem's persistent grid (module docstring): one block per (tile, K slice) unit
    of the call, at most one per SM."""
    per_m = -(-p.n // bn) * split  # units per tile row
    batch = p.batch_count
    if isinstance(batch, Sym):
        return DynamicGrid(batch, 1, sms, multiplier=-(-p.m // BLOCK_M) * per_m)
    assert isinstance(p.m_extent, Sym)
    return DynamicGrid(p.m_extent, BLOCK_M, sms, multiplier=batch * per_m)


def ws_split(ctx: EmitContext, p: Problem) -> int:
    """The tuning's split_k (1 without one); a clear error for one the problem cannot take."""
    split = ctx.tuning.get("split_k", 1)
    types = tensor_core_types(p)
    assert types is not None
    bk = BLOCK_K_BYTES // types.element_bytes
    if not isinstance(split, int) or isinstance(split, bool) or not 1 <= split <= max(1, p.k // bk):
        raise UnsupportedError(
            f"warp-specialised GEMM tuning {ctx.tuning}: split_k must be an integer from 1 to the "
            f"{max(1, p.k // bk)} k tiles of {bk}"
        )
    if split > 1 and not _fp32_partials(p):
        raise UnsupportedError(
            f"warp-specialised GEMM tuning {ctx.tuning}: {types.accumulator} accumulators take no split-K (the "
            "partial sums are fp32)"
        )
    return split


def _producer(
    schedule: TileSchedule,
    itype: str,
    names: dict[int, str],
    tile_setup: list[str],
    loads: list[str],
    before: list[str] | None = None,
    after: list[str] | None = None,
) -> list[str]:
    """One thread's loop: per unit, the tile's coordinates and ``tile_setup``; per k tile, waits
    for the consumers to release the stage, then issues ``loads`` completing on its full barrier.
    With ``before`` and ``after`` (MXFP8's scales; empty for a schedule that needs a whole warp),
    every thread that runs the loop runs these lines around the wait and the copies, which
    thread 0 alone issues."""
    if before is None or after is None:
        issue = ["mbar_expect_tx(bar, A_STAGE + B_STAGE);", *loads]
        before, after = [], []
    else:
        issue = ["if (tid == 0) {", "  mbar_expect_tx(bar, A_STAGE + B_STAGE);", *("  " + line for line in loads), "}"]
    return [
        "int stage = 0;",
        "unsigned phase = 0;",
        *schedule.unit(itype, names),
        *("  " + line for line in tile_setup),
        "  for (int kt = kt_first; kt < kt_end; ++kt) {",
        *("    " + line for line in before),
        "    mbar_wait(empty + 8 * stage, phase ^ 1);  // the consumers released this buffer (passes at first)",
        "    const unsigned bar = full + 8 * stage;",
        *("    " + line for line in issue),
        *("    " + line for line in after),
        "    if (++stage == STAGES) stage = 0, phase ^= 1;",
        "  }",
        "}",
    ]


def _matmul_loads(p: Problem, a_map: str, b_map: str, layout: str | None, schedule: TileSchedule) -> list[str]:
    """A matmul's k tile ``kt``: the A box, and B's box or BN / 64 boxes of 64 columns."""
    a_coords = schedule.map_coordinates(p.a, ("kt * BK", "(int)m0"))
    if layout == "kn":  # BN / 64 boxes of 64 columns, 8 KB apart
        b_loads = [
            "#pragma unroll",
            "for (int j = 0; j < BN / 64; ++j)",
            f"  tma_load(b_tiles + stage * B_STAGE + j * 8192, &{b_map}, bar, "
            + ", ".join(schedule.map_coordinates(p.b, ("n0 + j * 64", "kt * BK")))
            + ");",
        ]
    else:
        b_loads = [
            f"tma_load(b_tiles + stage * B_STAGE, &{b_map}, bar, "
            + ", ".join(schedule.map_coordinates(p.b, ("kt * BK", "n0")))
            + ");"
        ]
    return [f"tma_load(a_tiles + stage * A_STAGE, &{a_map}, bar, {', '.join(a_coords)});", *b_loads]


def _gather_producer(
    schedule: TileSchedule, names: dict[int, str], bn: int, bk: int, chunk: int, itype: str, aligned: str
) -> list[str]:
    """All 128 threads copy each k tile with the shared loaders; ``cp.async.mbarrier.arrive``
    counts a thread on the stage's full barrier once its copies have landed."""
    p = schedule.p
    tiles = SmemTiles(bk, "swizzle128", "swizzle128_n", chunk=chunk)
    a_chunks, b_chunks = BLOCK_M * bk // chunk // 128, bn * bk // chunk // 128
    loader = [
        *a_loader_setup(p, itype, a_chunks, 128, tiles),
        *b_loader_setup(p, itype, b_chunks, 128, "nk", tiles),
        *load_tile_lambda(
            p,
            names[p.a.id],
            names[p.b.id],
            itype,
            a_chunks,
            b_chunks,
            BLOCK_M * BLOCK_K_BYTES,
            bn * BLOCK_K_BYTES,
            bn,
            "nk",
            aligned,
            tiles,
            KSlices(1),
        ),
    ]
    return [
        "constexpr int THREADS = 128;  // the loaders' names, for the producer warpgroup",
        "unsigned char* const a_smem = smem_raw + (a_tiles - smem_addr(smem_raw));",
        "unsigned char* const b_smem = smem_raw + (b_tiles - smem_addr(smem_raw));",
        "int stage = 0;",
        "unsigned phase = 0;",
        *schedule.unit(itype, names),
        f"  const {itype} block_m = m0;",
        "  const int block_n = n0;",
        *("  " + line for line in loader),
        "  for (int kt = kt_first; kt < kt_end; ++kt) {",
        "    mbar_wait(empty + 8 * stage, phase ^ 1);  // the consumers released this buffer (passes at first)",
        "    load_tile(stage, kt);",
        '    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\\n" ::"r"(full + 8 * stage) : "memory");',
        "    if (++stage == STAGES) stage = 0, phase ^= 1;",
        "  }",
        "}",
    ]
