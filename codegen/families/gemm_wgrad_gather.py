"""A wgrad's image tile when its channels do not read in 16-byte chunks (C = 1, 3, 5, 12, ..., or
a channel stride other than 1; fusion_rules/conv_grad_gemm.image_chunked): the GEMM's columns
n = (r, s..., c) gathered element by element into a k-contiguous tile (B "nk": one row of BK
pixels per column, 16-byte chunks of 8 pixels), N = R*S*C padded with zeros up to the tile (the
stem's 147 columns to 192); the tensor cores and the epilogue see a tile like any other.

k-contiguous, not the chunked loader's n-contiguous tile, so that the 32 lanes of a warp read
32 consecutive columns of one pixel: (s, c) runs are contiguous in an NHWC image (21 elements
of the stem), a warp's loads touch two or three 32-byte sectors. Each thread finds the image
offsets of its chunk's 8 pixels once per tile and each column's offset once per chunk, so an
element costs an add, its bounds checks and the load. Plain loads through registers and one
16-byte shared store per chunk, not cp.async (whose smallest copy is 4 aligned bytes): the
stores complete before the thread's next barrier, and on sm_90 the main loop's proxy fence
publishes them to wgmma as it does the cp.async copies.
"""

from __future__ import annotations

from ..indexing import coordinates
from .gemm_grad_loaders import filter_tap, wgrad_k
from .gemm_problem import Problem
from .gemm_splitk import KSlices

# An image coordinate no pixel or tap reaches: a pixel past the slice, or a column past N, moves
# its first spatial coordinate there, so that one bounds check covers both.
NOWHERE = "-(1 << 28)"


def gather_functions(p: Problem, image: str, itype: str, b_smem: str, k_major: str, slices: KSlices) -> list[str]:
    """Kernel-scope code: the image chunks of a thread in registers (``pending``), and the
    lambdas ``gather(kt)``, which loads k tile ``kt`` of the block's slice into them (zeros past
    its end and past N), and ``put(stage)``, which stores them into the stage's k-major tile at
    ``b_smem`` (``k_major`` places a 16-byte chunk: 8 pixels of one column). The loads are
    predicated, never selected, so that nothing waits for them before ``put``."""
    spatial = len(p.out.dim) - 2
    filt, attrs, x = p.out.static_dim, p.attrs, p.b
    taps = coordinates("nn", (*filt[2:], filt[1]), range(len(filt) - 1), "g", "int")
    extents = x.static_dim[2:]
    checks = " && ".join(f"(unsigned)(px_h{a}[e] + reach{a}) < {extents[a]}u" for a in range(spatial))
    corner = [
        f"({itype})(q{a + 1} * {attrs.stride[a]} - {attrs.pre_padding[a]}) * {x.stride[a + 2]}" for a in range(spatial)
    ]
    column = [f"({itype})reach{a} * {x.stride[a + 2]}" for a in range(spatial)]
    return [
        "constexpr int WARPS = THREADS / 32, LANES = BK / 8;  // LANES: 16-byte chunks of a k-major row",
        "// warp w: k chunks w % LANES + a * WARPS (a < KCS), 32-column groups from w / LANES, NSTEP apart",
        "constexpr int KCS = LANES > WARPS ? LANES / WARPS : 1, NSTEP = WARPS > LANES ? WARPS / LANES : 1;",
        'static_assert(BN % (32 * NSTEP) == 0, "a warp fills 32 columns at a time");',
        "gd::Vec<T, 8> pending[KCS][BN / (32 * NSTEP)];  // this thread's image chunks of one k tile",
        "auto gather = [&](int kt) {",
        "#pragma unroll",
        "  for (int a = 0; a < KCS; ++a) {",
        "    const int kc = warp % LANES + a * WARPS;",
        f"    {itype} px_base[8];  // pixel e's image offset at tap 0, its first reach NOWHERE past the slice",
        *(f"    int px_h{a}[8];" for a in range(spatial)),
        "#pragma unroll",
        "    for (int e = 0; e < 8; ++e) {",
        f"      const int kk = {slices.tile('kt')} * BK + kc * 8 + e;",
        f"      const bool in = kt < {slices.count} && kk < GK;",
        *("      " + line for line in wgrad_k(p, "(in ? kk : 0)")),
        f"      px_base[e] = ({itype})q0 * {x.stride[0]} + {' + '.join(corner)};",
        *(f"      px_h{a}[e] = q{a + 1} * {attrs.stride[a]} - {attrs.pre_padding[a]};" for a in range(spatial)),
        f"      if (!in) px_h0[e] = {NOWHERE};",
        "    }",
        "#pragma unroll",
        "    for (int b = 0; b < BN / (32 * NSTEP); ++b) {  // column n: taps g0.., channel g" + str(spatial),
        "      const int nn = block_n + (b * NSTEP + warp / LANES) * 32 + lane;",
        "      gd::Vec<T, 8>& chunk = pending[a][b];",
        "#pragma unroll",
        "      for (int e = 0; e < 8; ++e) chunk.v[e] = gd::from<T>(0.0f);",
        "      if (nn - lane >= GN) continue;  // the warp's 32 columns all past N (the stem's 160..191)",
        *("      " + line for line in taps),
        *(f"      int reach{a} = {filter_tap(p, a, f'g{a}')} * {attrs.dilation[a]};" for a in range(spatial)),
        f"      const {itype} column = {' + '.join(column)} + ({itype})g{spatial} * {x.stride[1]};",
        f"      if (nn >= GN) reach0 = {NOWHERE};",
        "#pragma unroll",
        "      for (int e = 0; e < 8; ++e)",
        f"        if ({checks}) chunk.v[e] = {image}[px_base[e] + column];",
        "    }",
        "  }",
        "};",
        "auto put = [&](int stage) {",
        "#pragma unroll",
        "  for (int a = 0; a < KCS; ++a)",
        "#pragma unroll",
        "    for (int b = 0; b < BN / (32 * NSTEP); ++b) {",
        "      const int n = (b * NSTEP + warp / LANES) * 32 + lane;",
        f"      gd::store_vec<T, 8>(reinterpret_cast<T*>({b_smem} + {k_major}(n, warp % LANES + a * WARPS)), pending[a][b]);",
        "    }",
        "};",
    ]
