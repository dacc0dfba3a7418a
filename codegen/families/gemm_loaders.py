"""The tensor-core GEMM paths' loaders: each thread's 16-byte ``cp.async`` copies of a k tile of A
and B into shared memory (implicit GEMM gather for a convolution), shared by the mma.sync and
wgmma kernels; each path says how its tiles are laid out (:class:`SmemTiles`)."""

from __future__ import annotations

from dataclasses import dataclass

from fusion_rules.conv_grad_gemm import image_chunked
from graphdnn.ops.conv import ConvMode

from ..cuda_types import cuda_type
from ..indexing import c_extent
from . import gemm_grad_loaders as grad
from .gemm_problem import Problem, pixel_coordinates
from .gemm_splitk import KSlices
from .gemm_wgrad_gather import gather_functions

ASYNC_COPY_PRELUDE = r"""
// ---- tensor-core GEMM building blocks (sm_80+) ----
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, zero-filled when !valid (src then is never read).
__device__ __forceinline__ void copy16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
"""


@dataclass(frozen=True)
class SmemTiles:
    """A tensor-core path's k tiles in shared memory, as the shared loaders see them: ``bk``
    elements of k per tile, ``chunk`` elements per 16-byte chunk (8 16-bit or 16 8-bit ones),
    and the device functions ``(row, chunk) -> byte offset`` of a chunk: ``k_major`` for A and
    k-contiguous B (one row per m / n, ``bk`` elements long), ``n_major`` for n-contiguous B
    (one row per k), ``m_major`` for m-contiguous A (one row per k; the paths without one take
    no such A)."""

    bk: int
    k_major: str
    n_major: str
    m_major: str = ""
    chunk: int = 8

    @property
    def lanes(self) -> int:
        """Threads sharing one k-major row, one 16-byte chunk each (a power of two)."""
        return self.bk // self.chunk


def a_loader_setup(p: Problem, itype: str, chunks: int, threads: int, tiles: SmemTiles) -> list[str]:
    """Per-thread precomputation for its A rows: which rows it loads never changes across k tiles."""
    lanes = tiles.lanes
    if p.is_grad:
        return grad.a_setup(p, itype, chunks, threads, lanes, _thread_row(tiles))
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
        lines += ["  " + s for s in pixel_coordinates(p, "mm", itype)]
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
        lines.append(f"  a_base_row[i] = a_base + (a_row_ok[i] ? m : 0) * {c_extent(p.a.stride[-2])};")
        lines.append("}")
    return lines


def b_loader_setup(p: Problem, itype: str, chunks: int, threads: int, layout: str, tiles: SmemTiles) -> list[str]:
    if p.is_grad:
        return grad.b_setup(p, itype, chunks, threads, tiles.lanes, layout, _thread_row(tiles))
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
    slices: KSlices,
    prefetch: bool = False,
) -> list[str]:
    """`load_tile(stage, kt)`: issue the cp.async copies of the block's k tile kt (of its K
    slice) into a stage; zeros past the slice's last tile.

    Without 16-byte aligned pointers the same chunks are copied with plain loads."""
    if p.is_grad:
        stages = (a_stage, b_stage)
        chunks = (a_chunks, b_chunks)
        return _grad_load_tile(p, (x, w), itype, chunks, stages, layout, aligned, tiles, slices, prefetch)
    b_type = _b_element(p)
    lines = [
        "auto load_tile = [&](int stage, int kt) {",
        f"  const int k = {slices.tile('kt')} * BK + a_chunk * {tiles.chunk};",
        f"  const bool k_ok = kt < {slices.count} && k < GK;",
    ]
    b_smem = f"b_smem + stage * {b_stage}"
    k_major_chunk = f"{tiles.k_major}({_thread_row(tiles)} + i * (THREADS / {tiles.lanes}), a_chunk)"
    a_dst, b_dst = f"a_smem + stage * {a_stage} + {k_major_chunk}", f"{b_smem} + {k_major_chunk}"
    if p.is_conv:
        spatial = len(p.out.dim) - 2
        filt = p.b.dim[2:]
        channels = p.a.dim[1]
        # k = ((r * S + s) * C + c): decompose once per tile (all of this thread's chunks share k)
        lines.append(f"  const int c = k % {channels};")
        rest = f"k / {channels}"
        for axis in reversed(range(spatial)):
            lines.append(f"  const int f{axis} = ({rest}) % {filt[axis]};")
            rest = f"({rest}) / {filt[axis]}"
        flip = p.attrs.convolution_mode is ConvMode.CONVOLUTION
        w_terms = [
            f"(({filt[i] - 1} - f{i}) * {p.b.stride[i + 2]})" if flip else f"f{i} * {p.b.stride[i + 2]}"
            for i in range(spatial)
        ]
        lines.append(f"  const {itype} w_tap = {' + '.join(w_terms)} + c;")
        setup, checks, terms = [], ["a_row_ok[i]", "k_ok"], []
        for axis in range(spatial):
            setup.append(f"const int h{axis} = a_h{axis}[i] + f{axis} * {p.attrs.dilation[axis]};")
            checks.append(f"(unsigned)h{axis} < {p.a.dim[axis + 2]}u")
            terms.append(f"({itype})h{axis} * {p.a.stride[axis + 2]}")
        a_src = f"a_base[i] + {' + '.join(terms)} + c"
        lines += copy_loop(a_chunks, setup, " && ".join(checks), x, a_src, a_dst, aligned, tiles.chunk)
        b_src = "b_row[i] + w_tap"
        lines += copy_loop(b_chunks, [], "b_row_ok[i] && k_ok", w, b_src, b_dst, aligned, tiles.chunk, b_type)
    else:
        lines += copy_loop(a_chunks, [], "a_row_ok[i] && k_ok", x, "a_base_row[i] + k", a_dst, aligned, tiles.chunk)
        if layout == "nk":
            b_src = f"b_row[i] + ({itype})k * {p.b.stride[-2]}"
            lines += copy_loop(b_chunks, [], "b_row_ok[i] && k_ok", w, b_src, b_dst, aligned, tiles.chunk, b_type)
        else:
            per_row = bn // tiles.chunk
            setup = [
                "const int id = tid + i * THREADS;",
                f"const int kr = id / {per_row}, nc = id % {per_row};",
                f"const int kk = {slices.tile('kt')} * BK + kr, n = block_n + nc * {tiles.chunk};",
            ]
            ok = f"kt < {slices.count} && kk < GK && n < GN"
            b_src = f"b_base + ({itype})kk * {p.b.stride[-2]} + n"
            b_dst = f"{b_smem} + {tiles.n_major}(kr, nc)"
            lines += copy_loop(b_chunks, setup, ok, w, b_src, b_dst, aligned, tiles.chunk, b_type)
    lines.append("};")
    return lines


def _grad_load_tile(
    p: Problem,
    names: tuple[str, str],
    itype: str,
    chunks: tuple[int, int],
    stages: tuple[int, int],
    layout: str,
    aligned: str,
    tiles: SmemTiles,
    slices: KSlices,
    prefetch: bool,
) -> list[str]:
    """`load_tile(stage, kt)` of a convolution gradient (gemm_grad_loaders.py); with ``prefetch``
    (a gathered image), also `load_a`, `gather` and `put` (gemm_wgrad_gather.py)."""
    dy, b = names
    a_smem, b_smem = f"a_smem + stage * {stages[0]}", f"b_smem + stage * {stages[1]}"
    tile, count = slices.tile("kt"), slices.count
    k_major_chunk = f"{tiles.k_major}({_thread_row(tiles)} + i * (THREADS / {tiles.lanes}), a_chunk)"
    gathered = p.node.op == "conv_wgrad" and not image_chunked(p.node)
    lines = ["auto load_a = [&](int stage, int kt) {" if gathered else "auto load_tile = [&](int stage, int kt) {"]
    if p.node.op == "conv_wgrad":
        a_pixel, a_src = grad.wgrad_a(p, itype)
        a_setup = [
            "const int id = tid + i * THREADS;",
            "const int kr = id / (BM / 8), mc = id % (BM / 8);",
            f"const int kk = {tile} * BK + kr;",
            f"const {itype} m = block_m + mc * 8;",
            *a_pixel,
        ]
        a_ok = f"kt < {count} && kk < GK && m < GM"
        lines += copy_loop(chunks[0], a_setup, a_ok, dy, a_src, f"{a_smem} + {tiles.m_major}(kr, mc)", aligned)
        if gathered:  # the image element by element (gemm_wgrad_gather.py)
            return [
                *gather_functions(p, b, itype, b_smem, tiles.k_major, slices, prefetch),
                *lines,
                "};",
                "auto load_tile = [&](int stage, int kt) { load_a(stage, kt); gather_tile(stage, kt); };",
            ]
        lines += _wgrad_image_rows(p, b, itype, b_smem, aligned, tiles, slices)
    else:
        lines += [
            f"  const int k = {tile} * BK + a_chunk * 8;",
            f"  const bool k_ok = kt < {count} && k < GK;",
            *("  " + line for line in grad.dgrad_k(p, "k", "f")),
        ]
        a_setup, a_ok, a_src = grad.dgrad_a(p, itype)
        lines += copy_loop(chunks[0], a_setup, a_ok, dy, a_src, f"{a_smem} + {k_major_chunk}", aligned)
        if layout == "nk":
            lines.append(f"  const {itype} w_tap = {grad.dgrad_filter_offset(p, itype, 'f')};")
            lines += copy_loop(
                chunks[1], [], "b_row_ok[i] && k_ok", b, "b_row[i] + w_tap", f"{b_smem} + {k_major_chunk}", aligned
            )
        else:
            b_setup = [
                "const int id = tid + i * THREADS;",
                "const int kr = id / (BN / 8), nc = id % (BN / 8);",
                f"const int kk = {tile} * BK + kr, n = block_n + nc * 8;",
                *grad.dgrad_k(p, "kk", "g"),
            ]
            b_src = f"{grad.dgrad_filter_offset(p, itype, 'g')} + n"
            lines += copy_loop(
                chunks[1],
                b_setup,
                f"kt < {count} && kk < GK && n < GN",
                b,
                b_src,
                f"{b_smem} + {tiles.n_major}(kr, nc)",
                aligned,
            )
    lines.append("};")
    return lines


def _wgrad_image_rows(
    p: Problem, b: str, itype: str, b_smem: str, aligned: str, tiles: SmemTiles, slices: KSlices
) -> list[str]:
    """A wgrad's image tile [BK][BN], 8 threads per k row, each copying chunks tid % 8 + 8j of
    its rows: a row's pixel coordinates are found once for its BN / 64 chunks (not once per
    chunk), and a chunk's taps (from its column alone) are the same in every k tile; 8
    consecutive threads copy 128 contiguous bytes."""
    taps, pixel, checks, src = grad.wgrad_b(p, itype)
    tile, count = slices.tile("kt"), slices.count
    dst = f"{b_smem} + {tiles.n_major}(kr, nc)"
    return [
        '  static_assert(BN % 64 == 0 && BK * 8 % THREADS == 0, "8 threads a k row, 8 chunks apart");',
        "#pragma unroll",
        "  for (int i = 0; i < BK * 8 / THREADS; ++i) {  // k rows tid/8 + i * THREADS/8",
        "    const int kr = (tid >> 3) + i * (THREADS / 8);",
        f"    const int kk = {tile} * BK + kr;",
        *("    " + line for line in grad.wgrad_k(p, "kk")),
        f"    const bool k_ok = kt < {count} && kk < GK;",
        "#pragma unroll",
        "    for (int j = 0; j < BN / 64; ++j) {",
        "      const int nc = (tid & 7) + 8 * j, nn = block_n + nc * 8;",
        *("      " + line for line in taps + pixel),
        f"      const bool ok = {' && '.join(['k_ok && nn < GN', *checks])};",
        f"      const T* src = ok ? {b} + {src} : {b};",
        *_copy_chunk(dst, "src", "ok", aligned, 8, "T", depth=3),
        "    }",
        "  }",
    ]


def element_types(p: Problem) -> list[str]:
    """The C type aliases the loaders copy: ``T`` for A, and ``TB`` for B where its type differs
    (fp8 e4m3 by e5m2)."""
    lines = [f"using T = {cuda_type(p.a.data_type)};"]
    if p.b.data_type is not p.a.data_type:
        lines.append(f"using TB = {cuda_type(p.b.data_type)};")
    return lines


def _b_element(p: Problem) -> str:
    return "T" if p.b.data_type is p.a.data_type else "TB"


def _thread_row(tiles: SmemTiles) -> str:
    """The first k-major row a thread copies (tid / lanes)."""
    return f"(tid >> {tiles.lanes.bit_length() - 1})"


def copy_loop(
    chunks: int,
    setup: list[str],
    ok: str,
    base: str,
    src: str,
    dst: str,
    aligned: str,
    width: int = 8,
    element: str = "T",
) -> list[str]:
    """Each of a thread's ``chunks`` chunks i: after ``setup``, the 16 bytes (``width`` elements
    of C type ``element``) at ``base + src`` to ``dst`` where ``ok``, else zeros."""
    return [
        "#pragma unroll",
        f"  for (int i = 0; i < {chunks}; ++i) {{",
        *("    " + line for line in setup),
        f"    const bool ok = {ok};",
        f"    const {element}* src = ok ? {base} + {src} : {base};",
        *_copy_chunk(dst, "src", "ok", aligned, width, element, depth=2),
        "  }",
    ]


def _copy_chunk(dst: str, src: str, ok: str, aligned: str, width: int, element: str, depth: int) -> list[str]:
    pad = "  " * depth
    return [
        f"{pad}if ({aligned}) {{",
        f"{pad}  copy16(smem_addr({dst}), {src}, {ok});",
        f"{pad}}} else {{  // unaligned pointers: the same 16 bytes, element by element",
        f"{pad}  gd::Vec<{element}, {width}> chunk;",
        "#pragma unroll",
        f"{pad}  for (int e = 0; e < {width}; ++e) chunk.v[e] = {ok} ? {src}[e] : gd::from<{element}>(0.0f);",
        f"{pad}  gd::store_vec<{element}, {width}>(reinterpret_cast<{element}*>({dst}), chunk);",
        f"{pad}}}",
    ]
