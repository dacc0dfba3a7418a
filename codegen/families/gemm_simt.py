"""The GEMM family's SIMT path: one output element per thread, for every problem the tensor
cores do not take (fp32 and double data, grouped and depthwise convolution, C not a multiple
of 8, odd layouts). In a dynamic graph (a matmul's symbolic M or batch) the output's element
count is a product of EXTENT arguments and the grid is computed from it at launch."""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.layout import stride_order
from graphdnn.ops.conv import ConvMode
from graphdnn.symbolic import Sym, upper

from ..context import EmitContext, compute_of, indent, kernel_source, pattern_name
from ..cuda_types import load
from ..indexing import c_extent, coordinates, loop_index_type
from ..kernel import DynamicGrid, Kernel
from .gemm_epilogue import Epilogue
from .gemm_problem import Problem, batch_offsets_from_coords, declare, scale_block, scale_columns

SIMT_THREADS = 256
MAX_BLOCKS = 65535


def simt_kernel(fused: FusedNode, ctx: EmitContext, p: Problem) -> Kernel:
    params, names = declare(fused, p)
    tensors = [*fused.inputs, *fused.outputs]
    # Integer operands accumulate exactly: in double (exact to 2^53, as the float64 reference).
    integer = not (p.a.data_type.is_floating and p.b.data_type.is_floating)
    compute = compute_of([p.a, p.b, *fused.outputs], (DataType.DOUBLE,) if integer else ())
    out = p.out
    numel = upper(out.numel)
    blocks = min(max(1, -(-numel // SIMT_THREADS)), MAX_BLOCKS)
    itype = loop_index_type(tensors, numel, blocks * SIMT_THREADS)
    rank = len(out.dim)
    body = [
        f"const {itype} stride = ({itype})gridDim.x * blockDim.x;",
        f"for ({itype} e = ({itype})blockIdx.x * blockDim.x + threadIdx.x; e < {c_extent(out.numel)}; e += stride) {{",
    ]
    # A convolution's threads take the output in memory order: NHWC's consecutive channels,
    # so that the loads of x and the stores of y of a warp are contiguous (logical order put
    # consecutive threads a channel count apart: 10x slower on depthwise layers).
    order = stride_order(out.dim, out.stride) if p.is_conv else range(rank)
    inner = coordinates("e", out.dim, order, "c", itype)
    inner.append(f"{compute} acc = 0;")
    if p.is_conv:
        inner += _simt_conv_loop(p, names[p.a.id], names[p.b.id], compute, itype)
    else:
        inner += _simt_matmul_loop(p, names, compute, itype)
    inner += Epilogue(fused, p, names, compute).statements("acc")
    body += ["  " + line for line in inner] + ["}"]
    name, source = kernel_source(ctx, fused, pattern_name(fused) + "_simt", params, SIMT_THREADS, indent(body, 1))
    grid = DynamicGrid(out.numel, SIMT_THREADS, MAX_BLOCKS) if isinstance(out.numel, Sym) else None
    return Kernel(name, source, (blocks, 1, 1), (SIMT_THREADS, 1, 1), 0, tuple(params.bindings), blocks=grid)


def _simt_conv_loop(p: Problem, x: str, w: str, compute: str, itype: str) -> list[str]:
    a = p.attrs
    cg = p.b.dim[1]  # input channels per group
    kg = p.out.dim[1] // p.groups  # output channels per group
    spatial = len(p.out.dim) - 2
    filt = p.b.dim[2:]
    lines = [f"const {itype} g = c1 / {kg};", f"for (int ci = 0; ci < {cg}; ++ci) {{"]
    depth = 1
    for axis in range(spatial):
        lines.append("  " * depth + f"for (int f{axis} = 0; f{axis} < {filt[axis]}; ++f{axis}) {{")
        depth += 1
        pad, step, dil = a.pre_padding[axis], a.stride[axis], a.dilation[axis]
        lines.append("  " * depth + f"const {itype} h{axis} = c{axis + 2} * {step} - {pad} + f{axis} * {dil};")
        lines.append("  " * depth + f"if (h{axis} < 0 || h{axis} >= {p.a.dim[axis + 2]}) continue;")
    flip = a.convolution_mode is ConvMode.CONVOLUTION
    taps = [f"({filt[i] - 1} - f{i})" if flip else f"f{i}" for i in range(spatial)]
    x_offset = " + ".join(
        [
            f"c0 * {p.a.stride[0]}",
            f"(g * {cg} + ci) * {p.a.stride[1]}",
            *(f"h{i} * {p.a.stride[i + 2]}" for i in range(spatial)),
        ]
    )
    w_offset = " + ".join(
        [
            f"c1 * {p.b.stride[0]}",
            f"ci * {p.b.stride[1]}",
            *(f"{taps[i]} * {p.b.stride[i + 2]}" for i in range(spatial)),
        ]
    )
    lines.append(
        "  " * depth
        + f"acc += {load(p.a.data_type, f'{x}[{x_offset}]', compute)} * {load(p.b.data_type, f'{w}[{w_offset}]', compute)};"
    )
    for level in range(depth - 1, -1, -1):
        lines.append("  " * level + "}")
    return lines


def _simt_matmul_loop(p: Problem, names: dict[int, str], compute: str, itype: str) -> list[str]:
    rank = len(p.out.dim)
    lines = batch_offsets_from_coords(p, itype)
    a_off = f"a_base + c{rank - 2} * {c_extent(p.a.stride[-2])} + kk * {c_extent(p.a.stride[-1])}"
    b_off = f"b_base + kk * {c_extent(p.b.stride[-2])} + c{rank - 1} * {c_extent(p.b.stride[-1])}"
    a, b = (
        load(p.a.data_type, f"{names[p.a.id]}[{a_off}]", compute),
        load(p.b.data_type, f"{names[p.b.id]}[{b_off}]", compute),
    )
    if p.block_scaled:
        return lines + _block_scaled_loop(p, names, f"{a} * {b}", compute)
    return [*lines, f"for ({itype} kk = 0; kk < {p.k}; ++kk) {{", f"  acc += {a} * {b};", "}"]


def _block_scaled_loop(p: Problem, names: dict[int, str], product: str, compute: str) -> list[str]:
    """The k loop as block-scaled fp8 (rank 2: c0 the row, c1 the column): each k block's (128
    elements, or 32 for MXFP8) sum of ``product`` (of k index kk), times A's scale of (row,
    block) and B's of (block, column or 128 columns) (ops/block_scaled.py)."""
    assert p.a_scale is not None and p.b_scale is not None
    sa, sb = p.a_scale, p.b_scale
    block = scale_block(p)
    a_scale = f"{names[sa.id]}[c0 * {c_extent(sa.stride[0])} + kb * {c_extent(sa.stride[1])}]"
    b_scale = f"{names[sb.id]}[kb * {c_extent(sb.stride[0])} + c1 / {scale_columns(p)} * {c_extent(sb.stride[1])}]"
    return [
        f"for (int kb = 0; kb < {p.k // block}; ++kb) {{",
        f"  {compute} part = 0;",
        f"  for (int kk = kb * {block}; kk < kb * {block} + {block}; ++kk) {{",
        f"    part += {product};",
        "  }",
        f"  acc += part * {load(sa.data_type, a_scale, compute)} * {load(sb.data_type, b_scale, compute)};",
        "}",
    ]
