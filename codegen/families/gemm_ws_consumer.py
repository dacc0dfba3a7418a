"""The warp-specialised GEMM engine's consumer warpgroups (gemm_ws.py): the persistent loop
over units, the wgmma main loop and the epilogue from the accumulators.

The main loop keeps one wgmma batch in flight and accumulates in place; a block-scaled fp8
matmul (graphdnn/ops/block_scaled.py) instead multiplies each 128-element k block, one k
tile, into a fresh fp32 fragment, waits for it, hands the stage back at once, and adds the
fragment into the accumulators times the block's A scale (per row) and B scale (per 128
columns, or per column). The scales are plain loads (L2: a few floats per thread per block)
issued a k block ahead, so that their latency overlaps a whole block's wgmma; the other
warpgroup's wgmma keeps the tensor cores busy while one promotes (DeepGEMM's scheme). An
MXFP8 matmul promotes every 32-k wgmma step instead (gemm_ws_mx.py).
"""

from __future__ import annotations

from fusion_rules import FusedNode

from ..indexing import c_extent
from .gemm_epilogue import tile_epilogue
from .gemm_problem import Problem, batch_coords, mxfp8, scale_columns
from .gemm_sm90 import BLOCK_K_BYTES
from .gemm_splitk import partial_chunks
from .gemm_ws_mx import mx_loop
from .tensor_core import zero

SUBTILE = 64  # a consumer stages its 64 rows of the tile 64 columns at a time for the epilogue


def units() -> list[str]:
    """The persistent loop over (tile, K slice) units, a slice's units adjacent, and the unit's
    k tiles ``kt_first`` .. ``kt_end`` (the last slices may hold fewer, or none)."""
    return [
        "for (int unit = blockIdx.x; unit < TILES * SPLIT; unit += gridDim.x) {",
        "  const int tile = unit / SPLIT, slice = unit % SPLIT;",
        "  const int kt_first = slice * SLICE_TILES, kt_end = min(KTILES, kt_first + SLICE_TILES);",
    ]


def tile_coordinates(p: Problem, itype: str) -> list[str]:
    """Tile ``tile`` -> its first row ``m0``, column ``n0`` and the output batch coordinates c0..:
    GROUP_M tile rows at a time, column by column within the group."""
    return [
        "const int batch = tile / BATCH_TILES, t = tile % BATCH_TILES;",
        "const int first = t / (GROUP_M * TILES_N) * GROUP_M, rows = min(TILES_M - first, GROUP_M);",
        "const int tm = first + t % (GROUP_M * TILES_N) % rows, tn = t % (GROUP_M * TILES_N) / rows;",
        f"const {itype} m0 = ({itype})tm * BM;",
        "const int n0 = tn * BN;",
        *batch_coords(p, itype, "batch"),
    ]


def consumer(
    fused: FusedNode,
    p: Problem,
    names: dict[int, str],
    layout: str | None,
    itype: str,
    aligned: str,
    gather: bool,
    accumulator: str,
    split: int,
) -> list[str]:
    # B descriptor: (leading, stride) byte offsets and the start-address step of one k16 step
    b_leading, b_stride, b_step = (16, 1024, 32) if layout == "nk" else (8192, 1024, 2048)
    return [
        "const int consumer = warpgroup - 1;  // rows consumer * 64 .. + 63 of the tile",
        "int stage = 0;",
        "unsigned phase = 0;",
        *units(),
        *("  " + line for line in tile_coordinates(p, itype)),
        f"  {accumulator} acc[BN / 2];  // the warpgroup's 64 x BN tile, wgmma fragment layout",
        "#pragma unroll",
        f"  for (int i = 0; i < BN / 2; ++i) acc[i] = {zero(accumulator)};",
        *_loop(p, names, gather, b_step, b_leading, b_stride),
        *("  " + line for line in _epilogue(fused, p, names, itype, aligned, accumulator, split)),
        "}",
    ]


def _loop(p: Problem, names: dict[int, str], gather: bool, b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """The k loop: MXFP8's (gemm_ws_mx.py), the float block scales' or the plain one."""
    if mxfp8(p):
        return mx_loop(b_step, b_leading, b_stride)
    if p.block_scaled:
        return _block_scaled_loop(p, names, b_step, b_leading, b_stride)
    return _main_loop(gather, b_step, b_leading, b_stride)


def _main_loop(gather: bool, b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """k tiles accumulated in place, one wgmma batch in flight: the batch of tile kt-1 completes
    while kt's is issued, and then its buffer goes back to the producer."""
    return [
        "  int previous = 0;",
        "  for (int kt = kt_first; kt < kt_end; ++kt) {",
        "    mbar_wait(full + 8 * stage, phase);",
        *(
            # the gathered tile was written through the generic proxy; wgmma reads through the async one
            ['    asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");'] if gather else []
        ),
        "    fence_accumulators(acc);",
        "    wgmma_fence();",
        "#pragma unroll",
        f"    for (int kk = 0; kk < {BLOCK_K_BYTES // 32}; ++kk)  // steps of 32 bytes of k",
        "      wgmma_step(acc, wgmma_descriptor(a_tiles + stage * A_STAGE + consumer * (64 * 128) + kk * 32, 16, 1024),",
        f"                wgmma_descriptor(b_tiles + stage * B_STAGE + kk * {b_step}, {b_leading}, {b_stride}));",
        "    wgmma_commit();",
        "    wgmma_wait<1>();  // the batch of k tile kt-1 is done: its buffer goes back to the producer",
        "    fence_accumulators(acc);",
        "    if (kt > kt_first && lane == 0) mbar_arrive(empty + 8 * previous);",
        "    previous = stage;",
        "    if (++stage == STAGES) stage = 0, phase ^= 1;",
        "  }",
        "  wgmma_wait<0>();",
        "  fence_accumulators(acc);",
        "  if (kt_end > kt_first && lane == 0) mbar_arrive(empty + 8 * previous);",
    ]


def _epilogue(
    fused: FusedNode, p: Problem, names: dict[int, str], itype: str, aligned: str, accumulator: str, split: int
) -> list[str]:
    """The warpgroup's 64 rows, SUBTILE columns at a time: accumulators into its fp32 staging
    subtile (named barriers: the warpgroup alone), then the shared tile epilogue over the
    subtile (gemm_epilogue.tile_epilogue: 8 consecutive columns per thread, 16-byte stores),
    or with split-K the subtile into the unit's partial tile (gemm_splitk's layout).

    wgmma m64nN fragment: warp w of the warpgroup holds rows 16w..16w+15; acc[4j + 2h + e] is
    row lane/4 + 8h, column 8j + 2 (lane % 4) + e."""
    fetch = [
        f"*reinterpret_cast<{accumulator}4*>(acc8) = *reinterpret_cast<const {accumulator}4*>(subtile + staged_at(row, col));",
        f"*reinterpret_cast<{accumulator}4*>(acc8 + 4) = *reinterpret_cast<const {accumulator}4*>(subtile + staged_at(row, col + 4));",
    ]
    return [
        f"{accumulator}* const subtile = staging + consumer * ({SUBTILE} * {SUBTILE});",
        f"constexpr int SUBTILES = BN / {SUBTILE};",
        "#pragma unroll",
        "for (int sub = 0; sub < SUBTILES; ++sub) {",
        "  warpgroup_sync(consumer);  // the subtile before is read",
        "#pragma unroll",
        f"  for (int j = 0; j < {SUBTILE // 8}; ++j) {{",
        "    const int row = (warp & 3) * 16 + (lane >> 2), col = j * 8 + (lane & 3) * 2, a = 4 * (sub * 8 + j);",
        f"    *reinterpret_cast<{accumulator}2*>(subtile + staged_at(row, col)) = make_{accumulator}2(acc[a], acc[a + 1]);",
        f"    *reinterpret_cast<{accumulator}2*>(subtile + staged_at(row + 8, col)) = make_{accumulator}2(acc[a + 2], acc[a + 3]);",
        "  }",
        "  warpgroup_sync(consumer);  // the subtile is whole",
        "  {  // the tile epilogue's names, for this warpgroup's subtile",
        f"    constexpr int BM = 64, BN = {SUBTILE}, THREADS = 128;",
        "    const int tid = threadIdx.x % 128;",
        f"    const {itype} block_m = m0 + consumer * 64;",
        f"    const int block_n = n0 + sub * {SUBTILE};",
        *(
            "    " + line
            for line in (
                partial_chunks(p, "(batch * SPLIT + slice)", lambda col: f"subtile + staged_at(row, {col})")
                if split > 1
                else tile_epilogue(
                    fused,
                    p,
                    names,
                    itype,
                    aligned,
                    fetch,
                    batch_index="batch",
                    chunks_per_thread=SUBTILE**2 // 8 // 128,
                )
            )
        ),
        "  }",
        "}",
    ]


def _block_scaled_loop(p: Problem, names: dict[int, str], b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """The main loop of a block-scaled fp8 matmul (module docstring): one k tile is one scale
    block, multiplied into a fresh fragment (``part0`` and ``part1`` in turn, each with its
    scales, loaded a k block ahead), waited for and promoted. Thread rows ``srow``, ``srow + 8``
    of the tile; fragment element i is row ``srow + 8 * ((i >> 1) & 1)``, column
    ``8 * (i >> 2) + 2 * (lane & 3) + (i & 1)``.

    Measured on an H200 (benchmarks/RESULTS.md), 8192³ with 128 x 128 B scales: 926-933 TFLOP/s;
    keeping the next k block's batch in flight while one is promoted (two fragments, wgmma_wait<1>)
    ran slower, 906-909 (ptxas adds a wait of its own at the loop's back edge), and was dropped.
    With 128 x 1 B scales, loading the fragment's 32 column scales a block ahead (no longer after
    the wait) gave 552 / 584 at 4096³ / 8192³, against 537 / 556 in an earlier run (issue 12)."""
    assert p.a_scale is not None and p.b_scale is not None
    sa, sb = p.a_scale, p.b_scale
    a_scale, b_scale = names[sa.id], names[sb.id]
    columns = scale_columns(p) == 1  # one B scale per column, else per 128 columns (the tile's: BN = 128)

    def scales(kt: str, f: int) -> list[str]:
        """Tile ``kt``'s scales into fragment f's (plain loads, consumed only after a wgmma batch)."""
        row = [
            f"m0 + srow + {h} < GM ? {a_scale}[(m0 + srow + {h}) * {c_extent(sa.stride[0])} + ({kt}) * {c_extent(sa.stride[1])}] : 0.f"
            for h in (0, 8)
        ]
        loads = [f"sa{f}_0 = {row[0]};", f"sa{f}_1 = {row[1]};"]
        if columns:  # the fragment's 32 columns: 8 j + 2 (lane & 3) + e
            return [
                *loads,
                "#pragma unroll",
                "for (int c = 0; c < BN / 4; ++c) {",
                "  const int col = n0 + 8 * (c >> 1) + 2 * (lane & 3) + (c & 1);",
                f"  sb{f}[c] = col < GN ? {b_scale}[({kt}) * {c_extent(sb.stride[0])} + col * {c_extent(sb.stride[1])}] : 0.f;",
                "}",
            ]
        return [
            *loads,
            f"sb{f} = {b_scale}[({kt}) * {c_extent(sb.stride[0])} + (n0 / 128) * {c_extent(sb.stride[1])}];",
        ]

    def mma(f: int) -> list[str]:
        """The wgmma batch of the next stage into part{f}."""
        return [
            "mbar_wait(full + 8 * stage, phase);",
            "wgmma_fence();",
            *(
                f"{'wgmma_first' if kk == 0 else 'wgmma_step'}(part{f}, "
                f"wgmma_descriptor(a_tiles + stage * A_STAGE + consumer * (64 * 128) + {kk * 32}, 16, 1024), "
                f"wgmma_descriptor(b_tiles + stage * B_STAGE + {kk * b_step}, {b_leading}, {b_stride}));"
                for kk in range(BLOCK_K_BYTES // 32)  # steps of 32 bytes of k; the first overwrites the fragment
            ),
            "wgmma_commit();",
            "if (++stage == STAGES) stage = 0, phase ^= 1;",
        ]

    def retire(f: int) -> list[str]:
        """Once part{f}'s batch is done: hands its stage back and adds it into the accumulators
        times the block's scales."""
        if columns:
            scale = []
            promote = f"acc[i] += part{f}[i] * ((i & 2) ? sa{f}_1 : sa{f}_0) * sb{f}[((i >> 2) << 1) | (i & 1)];"
        else:
            scale = [f"const float s0 = sa{f}_0 * sb{f}, s1 = sa{f}_1 * sb{f};"]
            promote = f"acc[i] += part{f}[i] * ((i & 2) ? s1 : s0);"
        return [
            f"fence_accumulators(part{f});",
            "if (lane == 0) mbar_arrive(empty + 8 * done);  // the buffer goes back before the promotion",
            "if (++done == STAGES) done = 0;",
            "{",
            *("  " + line for line in scale),
            "#pragma unroll",
            f"  for (int i = 0; i < BN / 2; ++i) {promote}",
            "}",
        ]

    def block(lines: list[str], depth: int) -> list[str]:
        return ["  " * depth + line for line in lines]

    declared = (
        ["float sb0[BN / 4], sb1[BN / 4];  // each fragment's B scales, its columns"]
        if columns
        else ["float sb0, sb1;"]
    )
    setup = [
        "  const int srow = consumer * 64 + (warp & 3) * 16 + (lane >> 2);",
        "  float part0[BN / 2], part1[BN / 2];  // the k blocks' products, each in a fresh fragment",
        "  float sa0_0, sa0_1, sa1_0, sa1_1;  // each fragment's A scales, rows srow and srow + 8",
        *("  " + line for line in declared),
        "  int done = stage;  // the stage of the oldest k tile in flight",
    ]
    return [
        *setup,
        *block(scales("kt_first", 0), 1),
        "  for (int kt = kt_first; kt < kt_end; kt += 2) {",
        "    if (kt + 1 < kt_end) {",
        *block(scales("kt + 1", 1), 3),
        "    }",
        *block([*mma(0), "wgmma_wait<0>();", *retire(0)], 2),
        "    if (kt + 1 >= kt_end) break;",
        "    if (kt + 2 < kt_end) {",
        *block(scales("kt + 2", 0), 3),
        "    }",
        *block([*mma(1), "wgmma_wait<0>();", *retire(1)], 2),
        "  }",
    ]
