"""The GEMM family's problem: the anchor (conv_fprop or matmul) seen as a batched GEMM, which
path can take it, its kernel parameters, and the output / batch coordinates every path writes.

As a GEMM, out[m, n] = sum_k A[m, k] * B[k, n]:
- conv_fprop: m runs over output pixels (n_img, p, q...), n over output channels, k over
  (r, s..., c) taps with c fastest; A is gathered from the image on the fly (never
  materialised), B is the filter.
- conv_dgrad: m runs over dx pixels (n_img, h, w...), n over dx channels, k over (r, s..., k_out)
  taps with k_out fastest; A is gathered from the loss (only the taps that land on an output
  pixel of the stride contribute: predicated in the gather), B is the filter;
- conv_wgrad: m runs over output channels, n over filter taps (r, s..., c) with c fastest, k
  over the loss's (n_img, p, q...); A is the loss read m-contiguous, B gathered from the image;
- matmul: m, n, k as named, one grid layer (blockIdx.z) per output batch index.

A dynamic graph's matmul may have a symbolic M (rows of A and C) and symbolic batch dims, and
its convolution forward a symbolic batch N, so a symbolic M = N*P*Q.. (gemm.extents_refusal
refuses the rest): ``m`` and ``batch`` are then their values at the symbols' maxima, which the
launch choices are made for, and the kernels read the call's values from their EXTENT
arguments (``m_extent``, the batch coordinates and strides). A convolution's strides stay
static (a packed layout's strides never hold its outermost dim), and the image index is the
outermost coordinate of M, found without dividing by N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusion_rules import FusedNode
from fusion_rules.conv_grad_gemm import CONV_GRADS, b_layout, operands, refusal
from graphdnn.ir import Node, Tensor
from graphdnn.ops.block_scaled import BLOCK, MX_BLOCK, k_block, per_column
from graphdnn.ops.conv import ConvAttributes
from graphdnn.symbolic import Extent, Sym, upper

from ..context import KernelParams
from ..indexing import c_extent, coordinates, divides, index_type
from ..kernel import DynamicGrid
from .tensor_core import OperandTypes, operand_types

MAX_GRID_Z = 65535


@dataclass(frozen=True)
class Problem:
    """The anchor seen as a (batched) GEMM."""

    node: Node
    a: Tensor  # image or A
    b: Tensor  # weight or B
    out: Tensor
    m: int  # at the symbols' maxima in a dynamic graph
    n: int
    k: int  # per group for a convolution
    groups: int
    batch: tuple[int, ...]  # output batch dims (matmul; at the symbols' maxima); () for convolution
    a_scale: Tensor | None = None  # a block-scaled matmul's scales (graphdnn/ops/block_scaled.py)
    b_scale: Tensor | None = None

    @property
    def block_scaled(self) -> bool:
        return self.a_scale is not None

    @property
    def is_dynamic(self) -> bool:
        """A matmul whose M or batch dims are symbols, or a convolution over a symbolic batch: its
        kernels take them as runtime extents."""
        return bool(self.out.symbols)

    @property
    def m_extent(self) -> Extent:
        """M as the kernels see it: a number, or a product of symbols (a matmul's rows, a
        convolution's N times its output pixels per image)."""
        if not self.is_dynamic:
            return self.m
        if self.image_output:
            return self.out.dim[0] * math.prod(upper(d) for d in self.out.dim[2:])  # static spatial dims
        return self.out.dim[-2]

    @property
    def channels(self) -> int:
        """A convolution's image channels (static: of its dims only N may be symbolic)."""
        return upper(self.a.dim[1])

    @property
    def batch_count(self) -> Extent:
        """The output batch matrices (a matmul's grid layers): 1 for a convolution."""
        return 1 if self.image_output else math.prod(self.out.dim[:-2])

    @property
    def is_conv(self) -> bool:
        return self.node.op == "conv_fprop"

    @property
    def is_grad(self) -> bool:
        """conv_dgrad or conv_wgrad (the GEMM family takes them only on the tensor-core path)."""
        return self.node.op in CONV_GRADS

    @property
    def image_output(self) -> bool:
        """The output is an image [N, C, spatial...]: m runs over its pixels, n over its channels."""
        return self.node.op in ("conv_fprop", "conv_dgrad")

    @property
    def a_layout(self) -> str:
        """How A is read: "mk" (k contiguous) or "km" (m contiguous: the loss of a wgrad)."""
        return "km" if self.node.op == "conv_wgrad" else "mk"

    @property
    def attrs(self) -> ConvAttributes:
        assert isinstance(self.node.attributes, ConvAttributes)
        return self.node.attributes


def problem_of(node: Node) -> Problem:
    out = node.outputs[0][1]
    if node.op == "conv_fprop":
        x, w = node.input("image"), node.input("weight")
        assert x is not None and w is not None
        groups = upper(x.dim[1]) // w.static_dim[1]
        return Problem(
            node,
            x,
            w,
            out,
            math.prod(upper(d) for d in (out.dim[0], *out.dim[2:])),  # N at its maximum in a dynamic graph
            w.static_dim[0],
            w.static_dim[1] * math.prod(w.static_dim[2:]),
            groups,
            (),
        )
    if node.op in CONV_GRADS:
        return _grad_problem(node)
    a, b = node.input("A"), node.input("B")
    assert a is not None and b is not None
    m, n, k = upper(out.dim[-2]), upper(out.dim[-1]), upper(a.dim[-1])  # n, k: symbolic ones are refused before
    batch = tuple(upper(d) for d in out.dim[:-2])
    return Problem(node, a, b, out, m, n, k, 1, batch, node.input("A_scale"), node.input("B_scale"))


def _grad_problem(node: Node) -> Problem:
    """dgrad: m = N*H*W..., n = C, k = K*R*S...; wgrad: m = K, n = C*R*S..., k = N*P*Q..."""
    dy, b, out = operands(node)
    if node.op == "conv_dgrad":
        filt = b.static_dim
        return Problem(
            node,
            dy,
            b,
            out,
            out.static_dim[0] * math.prod(out.static_dim[2:]),
            out.static_dim[1],
            filt[0] * math.prod(filt[2:]),
            1,
            (),
        )
    return Problem(
        node,
        dy,
        b,
        out,
        out.static_dim[0],
        math.prod(out.static_dim[1:]),
        dy.static_dim[0] * math.prod(dy.static_dim[2:]),
        1,
        (),
    )


def tensor_core_types(p: Problem) -> OperandTypes | None:
    """The tensor cores' view of ``p``'s operand types, or None when no tensor-core path takes them."""
    return operand_types(p.a.data_type, p.b.data_type)


def tensor_core_layout(p: Problem) -> str | None:
    """How B is laid out for the tensor-core path ("nk": k contiguous, "kn": n contiguous),
    or None when the problem needs the SIMT path. Every contiguous run is read in 16-byte
    chunks (8 16-bit or 16 8-bit elements); 8-bit operands are read K-major only (the 8-bit
    tensor-core instructions have no transposed B; ``eight_bit_refusal`` says so)."""
    if p.is_grad:
        return None if refusal(p.node) is not None else b_layout(p.node)
    types = tensor_core_types(p)
    if types is None or p.groups != 1:
        return None
    if math.prod(p.batch) > MAX_GRID_Z:  # one grid layer per batch index
        return None
    chunk = types.chunk
    if p.is_conv:
        channels = p.a.dim[1]
        if channels % chunk or p.a.stride[1] != 1 or p.b.stride[1] != 1:
            return None
        if any(s % chunk for axis, s in enumerate(p.a.stride) if axis != 1 and p.a.dim[axis] != 1):
            return None
        if any(s % chunk for axis, s in enumerate(p.b.stride) if axis != 1 and p.b.dim[axis] > 1):
            return None
        return "nk"
    if p.k % chunk or p.a.stride[-1] != 1 or not all(divides(s, chunk) for s in p.a.stride[:-1]):
        return None
    if p.b.stride[-2] == 1 and all(divides(s, chunk) for i, s in enumerate(p.b.stride) if i != len(p.b.dim) - 2):
        return "nk"
    if not types.eight_bit and p.b.stride[-1] == 1 and p.n % 8 == 0 and all(divides(s, 8) for s in p.b.stride[:-1]):
        return "kn"
    return None


def on_tensor_cores(p: Problem, arch: int) -> bool:
    """A tensor-core path takes ``p`` on sm_``arch``: its layout, and its types on that arch."""
    types = tensor_core_types(p)
    return types is not None and arch >= types.min_arch and tensor_core_layout(p) is not None


def eight_bit_slow_path(p: Problem, arch: int) -> str | None:
    """Why the 8-bit matmul ``p`` cannot take the tensor cores on sm_``arch`` (int8 from sm_80,
    fp8 from sm_89) although they exist there, or None. Such a matmul is valid and runs on the
    SIMT kernel, many times slower, so the reason is logged with what the layout needs. fp8
    before sm_89 has no tensor cores at all: it takes the SIMT path (each element widened to
    fp32 in the kernel) with nothing to say, as does a convolution the tensor cores cannot read."""
    types = tensor_core_types(p)
    if types is None or not types.eight_bit or p.is_conv or arch < types.min_arch:
        return None
    if tensor_core_layout(p) is not None:
        return None
    a, b, chunk = p.a, p.b, types.chunk
    problems = []
    if a.stride[-1] != 1:
        problems.append(f"A '{a.name}' (strides {list(a.stride)}) needs stride 1 along K, its last dim")
    if b.stride[-2] != 1:
        problems.append(
            f"B '{b.name}' (dims {list(b.dim)}, strides {list(b.stride)}) needs stride 1 along K, its "
            "second-to-last dim (B^T stored row-major, the column-major B of torch._scaled_mm): transpose it "
            "before the matmul"
        )
    if p.k % chunk:
        problems.append(f"K = {p.k} is not a multiple of {chunk}")
    for role, t, k_axis in (("A", a, len(a.dim) - 1), ("B", b, len(b.dim) - 2)):
        if not all(divides(s, chunk) for axis, s in enumerate(t.stride) if axis != k_axis and t.dim[axis] != 1):
            problems.append(f"{role} '{t.name}' has strides {list(t.stride)}, not all multiples of {chunk} but along K")
    if math.prod(p.batch) > 65535:
        problems.append(f"its {math.prod(p.batch)} batch matrices are more than 65535")
    return (
        f"matmul '{p.node.name}' multiplies {a.data_type.value} by {b.data_type.value} on the SIMT kernel, not on "
        f"tensor cores, which read both operands K-major in 16-byte chunks: " + "; ".join(problems)
    )


def scale_block(p: Problem) -> int:
    """The k elements one scale covers: 128 (float scales) or 32 (fp8_e8m0, MXFP8)."""
    assert p.a_scale is not None
    return k_block(p.a_scale)


def mxfp8(p: Problem) -> bool:
    """Whether ``p`` is an MXFP8 matmul (fp8_e8m0 scales per 32 k)."""
    return p.block_scaled and scale_block(p) == MX_BLOCK


def scale_columns(p: Problem) -> int:
    """The columns of C one B_scale column covers: 1 (128 x 1 blocks) or 128 (128 x 128 ones)."""
    assert p.b_scale is not None
    return 1 if per_column(p.b_scale, p.n) else BLOCK


def declare(fused: FusedNode, problem: Problem) -> tuple[KernelParams, dict[int, str]]:
    params = KernelParams()
    names = {t.id: params.tensor(t) for t in fused.inputs}
    names.update({t.id: params.tensor(t, writable=True) for t in fused.outputs})
    return params, names


def index_type_of(fused: FusedNode, p: Problem) -> str:
    """The index type of the tensor-core kernels of ``p`` (offsets into every tensor, m * n)."""
    return index_type([*fused.inputs, *fused.outputs], p.m * max(p.n, 1))


def batch_offsets(p: Problem, itype: str, batch_index: str = "blockIdx.z") -> list[str]:
    """Matmul: batch coordinates from ``batch_index``, and the A/B batch offsets `a_base`/`b_base`."""
    if not p.batch:
        return [f"const {itype} a_base = 0;", f"const {itype} b_base = 0;"]
    return [*batch_coords(p, itype, batch_index), *batch_offsets_from_coords(p, itype)]


def pixel_coordinates(p: Problem, m: str, itype: str) -> list[str]:
    """Conv: output coordinates c0 (image), c2.. (spatial) of output pixel m (the image, outermost,
    is what is left after the spatial divisions: a symbolic N is never divided by)."""
    rank = len(p.out.dim)
    dims = (p.out.dim[0], *p.out.dim[2:])
    lines = coordinates(m, dims, range(len(dims)), "u", itype)
    lines.append(f"const {itype} c0 = u0;")
    lines += [f"const {itype} c{axis + 1} = u{axis};" for axis in range(1, rank - 1)]
    return lines


def batch_offsets_from_coords(p: Problem, itype: str) -> list[str]:
    """Matmul batch offsets of A and B from the output coordinates c0.. (broadcast dims skip)."""
    lines = []
    for name, t in (("a_base", p.a), ("b_base", p.b)):
        shift = len(p.batch) - (len(t.dim) - 2)
        terms = [
            f"c{axis + shift} * {c_extent(s)}" for axis, (d, s) in enumerate(zip(t.dim[:-2], t.stride[:-2])) if d != 1
        ]
        lines.append(f"const {itype} {name} = {' + '.join(terms) if terms else '0'};")
    return lines


def batch_coords(p: Problem, itype: str, batch_index: str = "blockIdx.z") -> list[str]:
    """Matmul: output batch coordinates c0.. of the grid layer's batch index (a split-K kernel
    folds its slice into blockIdx.z too)."""
    rank = len(p.out.dim)
    if not p.batch:
        return []
    return coordinates(f"({itype}){batch_index}", p.out.dim[:-2], range(rank - 2), "c", itype)


def dynamic_grid(p: Problem, block_m: int) -> DynamicGrid | None:
    """The grid extent a dynamic matmul's non-persistent kernels (one block per BM rows, per
    batch index) compute at launch; None for a static one. Along x, ``ceil(M / block_m)``, when
    only M is symbolic; along z, the batch count, when the batch is, x then staying at the
    tiles of the largest M and the blocks past the call's M returning at once (a launch has
    one dynamic grid extent)."""
    if not p.is_dynamic:
        return None
    batch = p.batch_count
    if isinstance(batch, Sym):
        return DynamicGrid(batch, 1, MAX_GRID_Z, grid_axis=2)
    assert isinstance(p.m_extent, Sym)
    return DynamicGrid(p.m_extent, block_m, 2**31 - 1)
