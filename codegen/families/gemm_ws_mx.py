"""The warp-specialised engine's main loop for an MXFP8 matmul (fp8_e8m0 scales per 32 k of
A's rows and of B's columns, graphdnn/ops/block_scaled.py).

Hopper's tensor cores have no MX forms, so the scales are applied outside them: one fp8
wgmma step reads 32 k (32 bytes), exactly one scale block, so each of a k tile's four steps
multiplies into a fresh fp32 fragment (``wgmma_first`` overwrites it) that is then added into
the accumulators times the block's two scales, 2^(ea - 127) of the row and 2^(eb - 127) of the
column. A power-of-two factor is exact in fp32 unless the scaled value leaves fp32's normal
range (under- or overflow), so the only roundings are the tensor cores' sum of a block's 32
products into the fragment and the fp32 addition into the accumulators (docs/kernels.md says
why per-block promotion rather than pre-scaling the operands).

The step's 34 scale bytes per thread (2 rows, 32 columns: the fragment's) are plain loads
issued right after the step, so that their latency overlaps its wgmma; blocks past K (the
last k tile's, zero-filled by TMA), rows past M and columns past N get the scale 0.
"""

from __future__ import annotations

from ..indexing import c_extent
from .gemm_problem import Problem
from .gemm_sm90 import BLOCK_K_BYTES

STEP_K = 32  # fp8 k per wgmma step: one MX scale block


def mx_loop(p: Problem, names: dict[int, str], b_step: int, b_leading: int, b_stride: int) -> list[str]:
    """The consumer's k loop (gemm_ws_consumer.consumer), lines at its depth. Fragment element
    i is row ``srow + 8 * ((i >> 1) & 1)``, column ``8 * (i >> 2) + 2 * (lane & 3) + (i & 1)``
    of the warpgroup's 64 x BN part of the tile."""
    assert p.a_scale is not None and p.b_scale is not None
    sa, sb = p.a_scale, p.b_scale
    a_scale, b_scale = names[sa.id], names[sb.id]
    steps = BLOCK_K_BYTES // STEP_K

    def a_load(h: int) -> str:
        row = f"m0 + srow + {h}"
        at = f"{a_scale}[({row}) * {c_extent(sa.stride[0])} + kb * {c_extent(sa.stride[1])}]"
        return f"live && {row} < GM ? gd::to<float>({at}) : 0.f"

    column = "n0 + 8 * (c >> 1) + 2 * (lane & 3) + (c & 1)"
    b_at = f"{b_scale}[kb * {c_extent(sb.stride[0])} + col * {c_extent(sb.stride[1])}]"
    return [
        "  const int srow = consumer * 64 + (warp & 3) * 16 + (lane >> 2);",
        "  float part[BN / 2];  // one 32-k block's products, a fresh fragment per block",
        "  for (int kt = kt_first; kt < kt_end; ++kt) {",
        "    mbar_wait(full + 8 * stage, phase);",
        "#pragma unroll",
        f"    for (int kk = 0; kk < {steps}; ++kk) {{  // wgmma steps of 32 k: one scale block each",
        f"      const int kb = kt * {steps} + kk;",
        f"      const bool live = kb < {p.k // STEP_K};  // the last k tile's blocks past K hold zeros",
        "      wgmma_fence();",
        "      wgmma_first(part, wgmma_descriptor(a_tiles + stage * A_STAGE + consumer * (64 * 128) + kk * 32, 16, 1024),",
        f"                  wgmma_descriptor(b_tiles + stage * B_STAGE + kk * {b_step}, {b_leading}, {b_stride}));",
        "      wgmma_commit();",
        f"      const float sa0 = {a_load(0)};",
        f"      const float sa1 = {a_load(8)};",
        "      float sbc[BN / 4];  // the scales of the fragment's 32 columns",
        "#pragma unroll",
        "      for (int c = 0; c < BN / 4; ++c) {",
        f"        const int col = {column};",
        f"        sbc[c] = live && col < GN ? gd::to<float>({b_at}) : 0.f;",
        "      }",
        "      wgmma_wait<0>();",
        "      fence_accumulators(part);",
        f"      if (kk == {steps - 1} && lane == 0) mbar_arrive(empty + 8 * stage);  // the buffer goes back first",
        "#pragma unroll",
        "      for (int i = 0; i < BN / 2; ++i)  // exact power-of-two factors: one rounding, the addition",
        "        acc[i] += part[i] * ((i & 2) ? sa1 : sa0) * sbc[((i >> 2) << 1) | (i & 1)];",
        "    }",
        "    if (++stage == STAGES) stage = 0, phase ^= 1;",
        "  }",
    ]
