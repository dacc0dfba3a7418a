"""The warp-specialised engine's MXFP8 matmul (fp8_e8m0 scales per 32 k of A's rows and of
B's columns, graphdnn/ops/block_scaled.py): the producer warpgroup's loop and the consumers'
k loop.

Hopper's tensor cores have no MX forms, so the scales are applied outside them: one fp8
wgmma step reads 32 k (32 bytes), exactly one scale block, so each of a k tile's four steps
multiplies into a fresh fp32 fragment (``wgmma_first`` overwrites it) that is then added into
the accumulators times the block's two scales, 2^(ea - 127) of the row and 2^(eb - 127) of the
column. A power-of-two factor is exact in fp32 unless the scaled value leaves fp32's normal
range (under- or overflow), so the only roundings are the tensor cores' sum of a block's 32
products into the fragment and the fp32 addition into the accumulators (docs/kernels.md says
why per-block promotion rather than pre-scaling the operands).

That promotion is CUDA-core work every 32 k: per consumer thread and step, 64 fragment
elements times a multiplication and an FMA, against one m64n128k32 wgmma (64 tensor-core
cycles of the SM). So the consumers do little else, and hide the rest:
- the producer warpgroup's 128 threads, idle beside the one that issues the TMA copies, read
  each k tile's scale bytes from global memory (before the stage is free, so that their
  latency overlaps the wait), convert them to floats and store them beside the stage's tiles
  in the order the fragments read them (a step's 32 column scales are eight 16-byte loads);
  the stage's full barrier then counts their 128 arrivals besides the copies' bytes. Blocks
  past K (the last k tile's, zero-filled by TMA), rows past M and columns past N get the
  scale 0;
- a warpgroup's steps run in a pipeline of two fragments: step s + 1's wgmma is issued before
  step s is waited for and promoted, so that the promotion overlaps the warpgroup's own next
  wgmma, not only the other warpgroup's (measured: round 1's loop, one fragment, kept a step's
  wgmma latency and its promotion in series; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from ..indexing import c_extent
from .gemm_problem import Problem
from .gemm_sm90 import BLOCK_K_BYTES

STEP_K = 32  # fp8 k per wgmma step: one MX scale block
STEPS = BLOCK_K_BYTES // STEP_K  # scale blocks per k tile
ROWS = 128  # the tile's rows (gemm_ws.BLOCK_M): one producer thread each, and one B column each
COLUMN_PAD = 4  # floats between the four lane quads' column scales: conflict-free 16-byte loads
PRODUCER_THREADS = 128
# setmaxnreg: the two fragments in flight, the accumulators and a step's scales take more than
# the engine's 232 registers a consumer thread; the producer's loop fits 24 (128 * 24 + 256 * 240
# = 384 * 168, the launch's registers)
MX_REGISTERS = (24, 240)


def column_run(bn: int) -> int:
    """Floats one lane quad's column scales take per step: its BN / 4 columns and the pad."""
    return bn // 4 + COLUMN_PAD


def scale_stage_bytes(bn: int) -> int:
    """A stage's scales: ROWS x STEPS row scales, then per step the four quads' column runs."""
    return 4 * (ROWS * STEPS + STEPS * 4 * column_run(bn))


def full_arrivals() -> int:
    """Arrivals a stage's full barrier waits for: the TMA thread's expect_tx and every
    producer thread's, once its scales are stored."""
    return 1 + PRODUCER_THREADS


def scale_area(bn: int) -> list[str]:
    """The kernel's pointer to the stages' scales: after the mbarriers (16-byte aligned)."""
    return [
        f"constexpr int SCALE_STAGE = {scale_stage_bytes(bn) // 4}, A_SCALES = {ROWS * STEPS}, "
        f"RUN = {column_run(bn)};  // floats",
        "float* const scales = reinterpret_cast<float*>(smem_raw + (empty + STAGES * 8 - smem_addr(smem_raw)));",
    ]


def scale_loads(p: Problem, names: dict[int, str]) -> list[str]:
    """The producer's first lines per k tile ``kt``, every thread, before it waits for the
    stage: row tid's and column tid's scales of the tile's blocks, as floats."""
    assert p.a_scale is not None and p.b_scale is not None
    sa, sb = p.a_scale, p.b_scale
    a_at = f"{names[sa.id]}[(m0 + tid) * {c_extent(sa.stride[0])} + kb * {c_extent(sa.stride[1])}]"
    b_at = f"{names[sb.id]}[kb * {c_extent(sb.stride[0])} + (n0 + tid) * {c_extent(sb.stride[1])}]"
    return [
        f"float fa[{STEPS}], fb[{STEPS}];  // row tid's and column tid's scales of the tile's blocks",
        "#pragma unroll",
        f"for (int j = 0; j < {STEPS}; ++j) {{",
        f"  const int kb = kt * {STEPS} + j;",
        f"  const bool live = kb < {p.k // STEP_K};  // the last k tile's blocks past K hold zeros",
        f"  fa[j] = live && m0 + tid < GM ? gd::to<float>({a_at}) : 0.f;",
        f"  fb[j] = live && n0 + tid < GN ? gd::to<float>({b_at}) : 0.f;",
        "}",
    ]


def scale_stores() -> list[str]:
    """The producer's last lines per k tile, every thread, once the stage is free: its scales
    into the stage (column t of the tile is fragment column 8 j + 2 quad + e: entry 2 j + e of
    quad's run), then its arrival on the stage's full barrier, which releases them."""
    column = "((tid >> 1) & 3) * RUN + (tid >> 3) * 2 + (tid & 1)"
    return [
        "float* const s = scales + stage * SCALE_STAGE;",
        "*reinterpret_cast<float4*>(s + 4 * tid) = make_float4(fa[0], fa[1], fa[2], fa[3]);",
        "#pragma unroll",
        f"for (int j = 0; j < {STEPS}; ++j) s[A_SCALES + j * 4 * RUN + {column}] = fb[j];",
        "mbar_arrive(bar);",
    ]


GROUP = 2  # k tiles a loop iteration runs in one pipeline (the last iteration may run fewer)


def mx_loop(b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """The consumer's k loop (gemm_ws_consumer.consumer), lines at its depth: GROUP k tiles at a
    time, their steps in a pipeline of two fragments, step s + 1's wgmma issued before step s
    is waited for (``wgmma_wait<1>``) and promoted, so that a warpgroup's tensor-core work and
    its promotion overlap. The group's last step is waited for alone: no wgmma stays in flight
    across the loop's back edge (ptxas would wait for it there)."""
    return [
        "  const int srow = consumer * 64 + (warp & 3) * 16 + (lane >> 2);",
        "  float part0[BN / 2], part1[BN / 2];  // the steps' products, fresh fragments in turn",
        "  int kt = kt_first;",
        f"  for (; kt + {GROUP - 1} < kt_end; kt += {GROUP}) {{",
        *("    " + line for line in _pipeline(GROUP, b_step, b_leading, b_stride)),
        "  }",
        *(
            line
            for rest in range(GROUP - 1, 0, -1)
            for line in [
                f"  if (kt + {rest - 1} < kt_end) {{  // {rest} k tile{'s' if rest > 1 else ''} left",
                *("    " + line for line in _pipeline(rest, b_step, b_leading, b_stride)),
                f"    kt += {rest};",
                "  }",
            ]
        ),
    ]


def _pipeline(tiles: int, b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """The steps of ``tiles`` k tiles, from the current stage on, in one pipeline."""
    lines = _tile(0, b_leading, b_stride) + _issue(0, 0, b_step)
    for g in range(STEPS * tiles):
        t, kk = divmod(g, STEPS)
        if g + 1 < STEPS * tiles:
            following = divmod(g + 1, STEPS)
            lines += (_tile(following[0], b_leading, b_stride) if following[1] == 0 else []) + _issue(
                *following, b_step
            )
        lines += [
            f"{{  // tile {t}, step {kk}",
            *("  " + line for line in _promotion(t, kk, g + 1 == STEPS * tiles)),
            "}",
        ]
        if kk == STEPS - 1:
            lines += [
                "__syncwarp();  // the warp's scale and tile reads of the stage are done",
                f"if (lane == 0) mbar_arrive(empty + 8 * stage{t});",
            ]
    return lines


def _tile(t: int, b_leading: int, b_stride: int) -> list[str]:
    """Tile t of the group: waits for its stage (then the next one is current), its scales'
    address and its descriptors (a step moves their start address, bits 0-13 in 16 bytes: no
    carry out)."""
    return [
        f"const int stage{t} = stage;",
        "mbar_wait(full + 8 * stage, phase);",
        "if (++stage == STAGES) stage = 0, phase ^= 1;",
        f"const float* const s{t} = scales + stage{t} * SCALE_STAGE;",
        f"const unsigned long long da{t} = wgmma_descriptor(a_tiles + stage{t} * A_STAGE + consumer * (64 * 128), 16, 1024);",
        f"const unsigned long long db{t} = wgmma_descriptor(b_tiles + stage{t} * B_STAGE, {b_leading}, {b_stride});",
    ]


def _issue(t: int, kk: int, b_step: int) -> list[str]:
    """Tile t's step ``kk``: its wgmma into fragment part{kk % 2} (a tile has an even number of
    steps: the fragments alternate across tiles too)."""
    return [
        "wgmma_fence();",
        f"wgmma_first(part{kk % 2}, da{t} + {kk * 2}, db{t} + {kk * b_step // 16});",
        "wgmma_commit();",
    ]


def _promotion(t: int, kk: int, last: bool) -> list[str]:
    """Tile t's step ``kk``: its scales, the wait for it and its promotion. Fragment element i
    is row ``srow + 8 * ((i >> 1) & 1)``, column ``8 * (i >> 2) + 2 * (lane & 3) + (i & 1)`` of
    the warpgroup's 64 x BN part of the tile: its column scale is entry
    ``((i >> 2) << 1) | (i & 1)`` of the lane quad's run."""
    part = f"part{kk % 2}"
    chunk = [  # fragment elements 16 q .. 16 q + 15: columns 8 (4 q) .. 8 (4 q + 3) + 7, entries 8 q .. 8 q + 7
        "#pragma unroll",
        "for (int q = 0; q < BN / 32; ++q) {",
        "  float sb[8];  // the column scales of a quarter of the fragment",
        "  *reinterpret_cast<float4*>(sb) = *reinterpret_cast<const float4*>(run + 8 * q);",
        "  *reinterpret_cast<float4*>(sb + 4) = *reinterpret_cast<const float4*>(run + 8 * q + 4);",
        "#pragma unroll",
        "  for (int i = 16 * q; i < 16 * q + 16; ++i)  // exact power-of-two factors: one rounding, the addition",
        f"    acc[i] = fmaf({part}[i] * ((i & 2) ? sa1 : sa0), sb[(((i >> 2) << 1) | (i & 1)) & 7], acc[i]);",
        "}",
    ]
    return [
        f"const float sa0 = s{t}[4 * srow + {kk}], sa1 = s{t}[4 * (srow + 8) + {kk}];  // rows srow, srow + 8",
        f"const float* const run = s{t} + A_SCALES + {kk} * 4 * RUN + (lane & 3) * RUN;",
        f"wgmma_wait<{0 if last else 1}>();  // the step is done{'' if last else ', the next one may run'}",
        f"fence_accumulators({part});",
        *chunk,
    ]
