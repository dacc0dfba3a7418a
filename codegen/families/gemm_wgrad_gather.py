"""A wgrad's image tile when its channels do not read in 16-byte chunks (C = 1, 3, 5, 12, ..., or
a channel stride other than 1; fusion_rules/conv_grad_gemm.image_chunked): the GEMM's columns
n = (r, s..., c) gathered element by element into a k-contiguous tile (B "nk": one row of BK
pixels per column, 16-byte chunks of 8 pixels), N = R*S*C padded with zeros up to the tile (the
stem's 147 columns to 160); the tensor cores and the epilogue see a tile like any other.

k-contiguous, not the chunked loader's n-contiguous tile, so that a warp reads 16 or 32
consecutive columns of a pixel: (s, c) runs are contiguous in an NHWC image (21 elements of the
stem), so a warp's loads touch few 32-byte sectors. The GROUP threads of a k chunk share its 8
pixels, whose image offsets each finds once per tile, and find a column's offset once per
chunk, so an element costs an add, its bounds checks and the load; just the add and the load
where every tap of the 8 pixels is inside the image. Measured on the stem at 64 x 160 on an
H200 (benchmarks/RESULTS.md): 148 µs with 16 pixels a thread, 147 with 8 and the interior
loads, 107 with prefetch (below); an n-contiguous element gather took 138 µs at 64 x 128
(three blocks per SM), without prefetch. Plain loads through registers and one
16-byte shared store per chunk, not cp.async (whose smallest copy is 4 aligned bytes): the
stores complete before the thread's next barrier, and on sm_90 the main loop's proxy fence
publishes them to wgmma as it does the cp.async copies.

Two forms: ``gather_tile`` loads and stores each chunk in turn (the mma.sync loop's
``load_tile``, and wgmma's with ``"prefetch": False``); ``gather`` / ``put`` hold a whole tile
in registers (``pending``), so that the wgmma loop issues the loads of tile kt+STAGES-1 in
iteration kt and stores them in iteration kt+1, their latency hidden under the tensor cores
and the barrier (gemm_sm90.py), at the cost of the registers.
"""

from __future__ import annotations

from ..indexing import coordinates
from .gemm_grad_loaders import filter_tap, wgrad_k
from .gemm_problem import Problem
from .gemm_splitk import KSlices

# An image coordinate no pixel or tap reaches: a pixel past the slice, or a column past N, moves
# its first spatial coordinate there, so that one bounds check covers both.
NOWHERE = "-(1 << 28)"


def gather_functions(
    p: Problem, image: str, itype: str, b_smem: str, k_major: str, slices: KSlices, prefetch: bool
) -> list[str]:
    """Kernel-scope code filling the stage's k-major tile at ``b_smem`` (``k_major`` places a
    16-byte chunk: 8 pixels of one column) with k tile ``kt`` of the block's slice, zeros past
    its end and past N: the lambda ``gather_tile(stage, kt)``, and with ``prefetch`` ``gather(kt)``
    into this thread's registers ``pending`` then ``put(stage)`` (module docstring). The loads are
    predicated, never selected, so that nothing waits for them before the store."""
    pixels = _pixels(p, itype, slices)
    put = f"gd::store_vec<T, 8>(reinterpret_cast<T*>({b_smem} + {k_major}(b * GROUP + first_column, kc)), chunk);"
    lines = [
        "// The GROUP threads of k chunk kc (8 pixels) take its columns GROUP at a time: a thread finds",
        "// its 8 pixels once per tile, and a warp reads 16 or 32 consecutive columns of a pixel.",
        "constexpr int LANES = BK / 8, GROUP = THREADS / LANES;  // LANES: 16-byte chunks of a k-major row",
        'static_assert(BN % GROUP == 0 && GROUP % 16 == 0, "a group of 16 or 32 threads a k chunk");',
        "const int kc = tid / GROUP, first_column = tid % GROUP;",
        "auto gather_tile = [&](int stage, int kt) {",
        *pixels,
        "#pragma unroll",
        "  for (int b = 0; b < BN / GROUP; ++b) {",
        "    gd::Vec<T, 8> chunk;",
        *_chunk(p, image, itype),
        f"    {put}",
        "  }",
        "};",
    ]
    if not prefetch:
        return lines
    return [
        *lines,
        "gd::Vec<T, 8> pending[BN / GROUP];  // this thread's image chunks of one k tile",
        "auto gather = [&](int kt) {",
        *pixels,
        "#pragma unroll",
        "  for (int b = 0; b < BN / GROUP; ++b) {",
        "    gd::Vec<T, 8>& chunk = pending[b];",
        *_chunk(p, image, itype),
        "  }",
        "};",
        "auto put = [&](int stage) {",
        "#pragma unroll",
        "  for (int b = 0; b < BN / GROUP; ++b) {",
        "    const gd::Vec<T, 8>& chunk = pending[b];",
        f"    {put}",
        "  }",
        "};",
    ]


def _pixels(p: Problem, itype: str, slices: KSlices) -> list[str]:
    """This thread's 8 pixels of k tile ``kt``: their image offsets at tap 0 and first coordinates,
    and whether every tap of theirs falls inside the image (``inside``)."""
    spatial = len(p.out.dim) - 2
    attrs, x = p.attrs, p.b
    corner = [
        f"({itype})(q{a + 1} * {attrs.stride[a]} - {attrs.pre_padding[a]}) * {x.stride[a + 2]}" for a in range(spatial)
    ]
    reach = [(p.out.static_dim[a + 2] - 1) * attrs.dilation[a] for a in range(spatial)]
    window = [f"px_h{a}[e] >= 0 && px_h{a}[e] + {reach[a]} < {x.static_dim[a + 2]}" for a in range(spatial)]
    return [
        f"  {itype} px_base[8];  // pixel e's image offset at tap 0, its first reach NOWHERE past the slice",
        *(f"  int px_h{a}[8];" for a in range(spatial)),
        "#pragma unroll",
        "  for (int e = 0; e < 8; ++e) {",
        f"    const int kk = {slices.tile('kt')} * BK + kc * 8 + e;",
        f"    const bool in = kt < {slices.count} && kk < GK;",
        *("    " + line for line in wgrad_k(p, "(in ? kk : 0)")),
        f"    px_base[e] = ({itype})q0 * {x.stride[0]} + {' + '.join(corner)};",
        *(f"    px_h{a}[e] = q{a + 1} * {attrs.stride[a]} - {attrs.pre_padding[a]};" for a in range(spatial)),
        f"    if (!in) px_h0[e] = {NOWHERE};",
        "  }",
        "  bool inside = true;  // every tap of the 8 pixels in the image (most of them): no bounds checks",
        "#pragma unroll",
        "  for (int e = 0; e < 8; ++e)",
        f"    inside = inside && {' && '.join(window)};",
    ]


def _chunk(p: Problem, image: str, itype: str) -> list[str]:
    """The 8 pixels of column nn (taps g0.., channel g{spatial}) into ``chunk``: zeros where a
    pixel or tap falls outside, or the column past N."""
    spatial = len(p.out.dim) - 2
    filt, attrs, x = p.out.static_dim, p.attrs, p.b
    taps = coordinates("nn", (*filt[2:], filt[1]), range(len(filt) - 1), "g", "int")
    checks = " && ".join(f"(unsigned)(px_h{a}[e] + reach{a}) < {x.static_dim[a + 2]}u" for a in range(spatial))
    column = [f"({itype})reach{a} * {x.stride[a + 2]}" for a in range(spatial)]
    return [
        "    const int nn = block_n + b * GROUP + first_column;",
        "#pragma unroll",
        "    for (int e = 0; e < 8; ++e) chunk.v[e] = gd::from<T>(0.0f);",
        "    if (nn - first_column < GN) {  // else the group's columns are all past N (the stem's 160..191)",
        *("      " + line for line in taps),
        *(f"      int reach{a} = {filter_tap(p, a, f'g{a}')} * {attrs.dilation[a]};" for a in range(spatial)),
        f"      const {itype} column = {' + '.join(column)} + ({itype})g{spatial} * {x.stride[1]};",
        f"      if (nn >= GN) reach0 = {NOWHERE};",
        "      if (inside && nn < GN) {",
        "#pragma unroll",
        f"        for (int e = 0; e < 8; ++e) chunk.v[e] = {image}[px_base[e] + column];",
        "      } else {",
        "#pragma unroll",
        "        for (int e = 0; e < 8; ++e)",
        f"          if ({checks}) chunk.v[e] = {image}[px_base[e] + column];",
        "      }",
        "    }",
    ]
