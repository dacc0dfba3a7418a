"""The tensor-core GEMM loaders of the convolution gradients (gemm_problem.py gives the GEMMs):
each thread's 16-byte ``cp.async`` copies of a k tile of A and B into shared memory, in the tile
layouts of gemm_loaders.py (which dispatches here), so the mma.sync main loop and the epilogue
are those of convolution forward and matmul.

- dgrad: A[m = (n, h, w...), k = (r, s..., k_out)] = dy[n, k_out, p, q...] where
  h + pad - r * dilation = p * stride. Stride > 1 is *predicated* in the gather: a tap that
  lands between output pixels, or outside the loss, copies zeros (one code path for every
  pixel; the tensor cores multiply those zeros, up to 1 - 1/stride^2 of the taps);
  B[k, n = c] = filter[k_out, c, r, s...] (flipped taps for true convolution), read along c
  ("kn", a KRSC filter) or along k_out ("nk").
- wgrad: A[m = k_out, k = (n, p, q...)] = dy[n, k_out, p, q...], read along k_out into an
  m-contiguous tile ("km"); B[k, n = (r, s..., c)] = x[n, c, p * stride + r * dilation - pad,
  ...], read along c ("kn"); zeros in the padding.
"""

from __future__ import annotations

from graphdnn.ops.conv import ConvMode

from ..indexing import coordinates
from .gemm_problem import Problem, pixel_coordinates


def a_setup(p: Problem, itype: str, chunks: int, threads: int, lanes: int, first_row: str) -> list[str]:
    """Per-thread precomputation for its A rows (dgrad; a wgrad thread's rows change per tile)."""
    if p.node.op == "conv_wgrad":
        return [f"// A (the loss, m contiguous): each thread copies {chunks} chunks of the [BK][BM] tile."]
    spatial = len(p.out.dim) - 2
    lines = [
        f"// A (the loss, gathered): each thread copies {chunks} chunks per tile, rows tid/{lanes} + i*{threads // lanes}, chunk tid%{lanes}.",
        f"const int a_chunk = tid & {lanes - 1};",
        f"{itype} a_base[{chunks}]; bool a_row_ok[{chunks}];",
        *(f"int a_reach{axis}[{chunks}];  // h + pre-padding: p * stride + r * dilation" for axis in range(spatial)),
        "#pragma unroll",
        f"for (int i = 0; i < {chunks}; ++i) {{",
        f"  const {itype} m = block_m + {first_row} + i * {threads // lanes};",
        "  a_row_ok[i] = m < GM;",
        f"  const {itype} mm = a_row_ok[i] ? m : 0;",
        *("  " + s for s in pixel_coordinates(p, "mm", itype)),
        f"  a_base[i] = c0 * {p.a.stride[0]};",
        *(f"  a_reach{axis}[i] = (int)c{axis + 2} + {p.attrs.pre_padding[axis]};" for axis in range(spatial)),
        "}",
    ]
    return lines


def b_setup(p: Problem, itype: str, chunks: int, threads: int, lanes: int, layout: str, first_row: str) -> list[str]:
    if layout == "kn":
        return [f"// B (n contiguous): each thread copies {chunks} chunks of the [BK][BN] tile."]
    if p.node.op == "conv_wgrad":
        return ["// B (the image, gathered element by element into a k-contiguous tile: gemm_wgrad_gather.py)."]
    return [
        f"// B (the filter, k_out contiguous): each thread copies {chunks} chunks, rows tid/{lanes} + i*{threads // lanes}, chunk tid%{lanes}.",
        f"{itype} b_row[{chunks}]; bool b_row_ok[{chunks}];",
        "#pragma unroll",
        f"for (int i = 0; i < {chunks}; ++i) {{",
        f"  const int n = block_n + {first_row} + i * {threads // lanes};",
        "  b_row_ok[i] = n < GN;",
        f"  b_row[i] = (b_row_ok[i] ? n : 0) * ({itype}){p.b.stride[1]};",
        "}",
    ]


def filter_tap(p: Problem, axis: int, tap: str) -> str:
    """The filter index tap ``tap`` of spatial ``axis`` reads (flipped for true convolution)."""
    extent = p.b.static_dim[axis + 2] if p.node.op == "conv_dgrad" else p.out.static_dim[axis + 2]
    return f"({extent - 1} - {tap})" if p.attrs.convolution_mode is ConvMode.CONVOLUTION else tap


def dgrad_k(p: Problem, k: str, prefix: str) -> list[str]:
    """k = ((r * S + s) * K + k_out) into taps ``{prefix}0``.. and k_out ``{prefix}{spatial}``."""
    filt = p.b.static_dim
    return coordinates(k, (*filt[2:], filt[0]), range(len(filt) - 1), prefix, "int")


def dgrad_a(p: Problem, itype: str) -> tuple[list[str], str, str]:
    """(setup, validity, source offset) of a thread's A chunk i at taps f0.. and k_out f{spatial}."""
    spatial = len(p.out.dim) - 2
    setup, checks, terms = [], ["a_row_ok[i]", "k_ok"], []
    for axis in range(spatial):
        stride, extent = p.attrs.stride[axis], p.a.static_dim[axis + 2]
        setup.append(f"const int at{axis} = a_reach{axis}[i] - f{axis} * {p.attrs.dilation[axis]};  // p * stride")
        if stride == 1:
            setup.append(f"const int p{axis} = at{axis};")
            checks.append(f"(unsigned)p{axis} < {extent}u")
        else:  # at < 0 truncates towards zero: p * stride == at fails unless at == 0
            setup.append(f"const int p{axis} = at{axis} / {stride};")
            checks.append(f"at{axis} >= 0 && p{axis} * {stride} == at{axis} && p{axis} < {extent}")
        terms.append(f"({itype})p{axis} * {p.a.stride[axis + 2]}")
    return setup, " && ".join(checks), f"a_base[i] + {' + '.join(terms)} + f{spatial}"


def dgrad_filter_offset(p: Problem, itype: str, prefix: str) -> str:
    """The filter offset of taps ``{prefix}0``.. and k_out ``{prefix}{spatial}`` (no c term)."""
    spatial = len(p.out.dim) - 2
    terms = [f"({itype}){prefix}{spatial} * {p.b.stride[0]}"]
    terms += [f"{filter_tap(p, axis, f'{prefix}{axis}')} * {p.b.stride[axis + 2]}" for axis in range(spatial)]
    return " + ".join(terms)


def wgrad_k(p: Problem, k: str) -> list[str]:
    """k over the loss's (n, p, q...) into ``q0`` (image) and ``q1``.. (output pixel)."""
    dims = (p.a.static_dim[0], *p.a.static_dim[2:])
    return coordinates(k, dims, range(len(dims)), "q", "int")


def wgrad_b(p: Problem, itype: str) -> tuple[list[str], list[str], list[str], str]:
    """(tap setup, pixel setup, checks, source offset) of an image chunk at loss coordinates
    q0.. and dw column ``nn``: the tap setup finds taps g0.. and first channel g{spatial} from
    ``nn`` alone (the same in every k tile), the pixel setup the image coordinates h0..."""
    spatial = len(p.out.dim) - 2
    filt = p.out.static_dim
    taps = coordinates("nn", (*filt[2:], filt[1]), range(len(filt) - 1), "g", "int")
    setup: list[str] = []
    checks, terms = [], [f"({itype})q0 * {p.b.stride[0]}"]
    for axis in range(spatial):
        tap = filter_tap(p, axis, f"g{axis}")
        setup.append(
            f"const int h{axis} = q{axis + 1} * {p.attrs.stride[axis]} + {tap} * {p.attrs.dilation[axis]} - {p.attrs.pre_padding[axis]};"
        )
        checks.append(f"(unsigned)h{axis} < {p.b.static_dim[axis + 2]}u")
        terms.append(f"({itype})h{axis} * {p.b.stride[axis + 2]}")
    return taps, setup, checks, f"{' + '.join(terms)} + g{spatial}"


def wgrad_a(p: Problem, itype: str) -> tuple[list[str], str]:
    """(setup, source offset) of the loss chunk at k ``kk`` and first output channel ``m``. A loss
    whose pixels (n, p, q...) are one row-major run of equal steps (packed NHWC) is addressed
    from ``kk`` directly, without finding its coordinates."""
    dims = (p.a.static_dim[0], *p.a.static_dim[2:])
    strides = (p.a.static_stride[0], *p.a.static_stride[2:])
    if all(strides[i] == strides[i + 1] * dims[i + 1] for i in range(len(dims) - 1)):
        return [], f"({itype})kk * {strides[-1]} + m"
    terms = [f"({itype})q{axis} * {stride}" for axis, stride in enumerate(strides)]
    return wgrad_k(p, "kk"), f"{' + '.join(terms)} + m"
