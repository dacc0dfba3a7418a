"""A wgrad's image tile when its channels do not read in 16-byte chunks (C = 1, 3, 5, 12, ..., or
a channel stride other than 1; fusion_rules/conv_grad_gemm.image_chunked): the GEMM's columns
n = (r, s..., c) gathered element by element into the swizzled [BK][BN] tile the chunked loader
fills (gemm_loaders._wgrad_image_rows), N = R*S*C padded with zeros up to the tile (the stem's
147 columns to 192), so the tensor cores and the epilogue see the same tile as for any other C.

Each thread fills the chunks of that loader's mapping (k rows tid/8 + i*THREADS/8, 16-byte
chunks tid%8 + 8j): per chunk it finds the 8 columns' taps once and reads them for each of its
rows, whose pixel coordinates it found once per tile. Plain loads through registers and one
16-byte shared store per chunk, not cp.async (whose smallest copy is 4 aligned bytes): the
stores complete before the thread's next barrier, and on sm_90 the main loop's proxy fence
publishes them to wgmma as it does the cp.async copies.
"""

from __future__ import annotations

from ..indexing import coordinates
from .gemm_grad_loaders import filter_tap, wgrad_k
from .gemm_problem import Problem
from .gemm_splitk import KSlices

ROWS = "BK * 8 / THREADS"  # k rows per thread and tile


def image_elements(p: Problem, image: str, itype: str, b_smem: str, n_major: str, slices: KSlices) -> list[str]:
    """The body of ``load_tile`` that fills the image tile at ``b_smem`` (``n_major`` places a
    16-byte chunk) with k tile ``kt`` of the block's slice, zeros past its end and past N."""
    spatial = len(p.out.dim) - 2
    filt, attrs, x = p.out.static_dim, p.attrs, p.b
    taps = coordinates("nn", (*filt[2:], filt[1]), range(len(filt) - 1), "g", "int")
    checks = " && ".join(["px_ok[i]", "nn < GN", *(f"(unsigned)h{a} < {x.static_dim[a + 2]}u" for a in range(spatial))])
    offset = " + ".join(["px_base[i]", *(f"({itype})h{a} * {x.stride[a + 2]}" for a in range(spatial)), "channel"])
    return [
        '  static_assert(BN % 64 == 0 && BK * 8 % THREADS == 0, "8 threads a k row, 8 chunks apart");',
        f"  {itype} px_base[{ROWS}]; bool px_ok[{ROWS}];",
        *(f"  int px_h{a}[{ROWS}];  // p * stride - pre-padding" for a in range(spatial)),
        "#pragma unroll",
        f"  for (int i = 0; i < {ROWS}; ++i) {{  // k rows tid/8 + i * THREADS/8: their pixels",
        f"    const int kk = {slices.tile('kt')} * BK + (tid >> 3) + i * (THREADS / 8);",
        *("    " + line for line in wgrad_k(p, "kk")),
        f"    px_ok[i] = kt < {slices.count} && kk < GK;",
        f"    px_base[i] = ({itype})q0 * {x.stride[0]};",
        *(f"    px_h{a}[i] = q{a + 1} * {attrs.stride[a]} - {attrs.pre_padding[a]};" for a in range(spatial)),
        "  }",
        "#pragma unroll",
        "  for (int j = 0; j < BN / 64; ++j) {  // chunks tid%8 + 8j",
        "    const int nc = (tid & 7) + 8 * j;",
        f"    gd::Vec<T, 8> chunk[{ROWS}];",
        "#pragma unroll",
        "    for (int e = 0; e < 8; ++e) {  // column nn: taps g0.., channel g" + str(spatial),
        "      const int nn = block_n + nc * 8 + e;",
        *("      " + line for line in taps),
        *(f"      const int reach{a} = {filter_tap(p, a, f'g{a}')} * {attrs.dilation[a]};" for a in range(spatial)),
        f"      const {itype} channel = ({itype})g{spatial} * {x.stride[1]};",
        "#pragma unroll",
        f"      for (int i = 0; i < {ROWS}; ++i) {{",
        *(f"        const int h{a} = px_h{a}[i] + reach{a};" for a in range(spatial)),
        f"        chunk[i].v[e] = {checks} ? {image}[{offset}] : gd::from<T>(0.0f);",
        "      }",
        "    }",
        "#pragma unroll",
        f"    for (int i = 0; i < {ROWS}; ++i)",
        f"      gd::store_vec<T, 8>(reinterpret_cast<T*>({b_smem} + {n_major}((tid >> 3) + i * (THREADS / 8), nc)), chunk[i]);",
        "  }",
    ]
