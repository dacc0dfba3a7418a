"""The spatial transformer's kernels: the affine grid generator, the bilinear sampler and
their backward, one output element per thread.

Every sum runs in a fixed order (no atomics): the sampler's dx gathers, one thread per dx
element walking every sample point of its image and taking the dy of those whose four
pixels hold it. That costs H' x W' grid reads per dx element (L1/L2-resident, shared by the
image's channels): simple and reproducible, fine for the small transformer grids it is
used with, and the place to start when a large one needs speed (bucket the sample points
by pixel first).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import stride_order

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset, offset_at
from ..kernel import FusedProgram, Kernel
from ..pointwise import literal
from .direct_common import (
    anchor_of,
    blocks_for,
    compute_for,
    declare,
    first_thread,
    grid_stride,
    loop_index_type,
    make_kernel,
    read,
    written,
)

# The four pixels around a sample point: (row step, column step).
CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))


def emit_grid_generator(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """grid[n, h, w, k] = theta[n, k, 0] * x_w + theta[n, k, 1] * y_h + theta[n, k, 2]."""
    node = anchor_of(fused)
    theta, grid = node.input("theta"), node.output("grid")
    assert theta is not None and grid is not None
    compute, itype = compute_for(fused), loop_index_type([theta, grid], grid.static_numel)
    params = KernelParams()
    matrix, out = params.tensor(theta), params.tensor(grid, writable=True)
    entry = [read(theta, matrix, offset_at(theta, ["c0", "c3", str(j)]), compute) for j in range(3)]
    body = coordinates("p", grid.static_dim, stride_order(grid.static_dim, grid.static_stride), "c", itype)
    body += [
        *_base_coordinates(grid.static_dim[1], grid.static_dim[2], "c1", "c2", compute),
        f"const {compute} value = {entry[0]} * bx + {entry[1]} * by + {entry[2]};",
        f"{out}[{offset(grid, grid.static_dim, 'c')}] = {store(grid.data_type, 'value')};",
    ]
    loop = grid_stride("p", first_thread(itype), grid.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "spatial_tf_grid", params, loop, (blocks_for(grid.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_grid_generator_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """dtheta[n, k, j]: the sum over the output pixels, row by row, of dgrid[n, h, w, k] * (x_w, y_h, 1)[j]."""
    node = anchor_of(fused)
    dgrid, dtheta = node.input("dgrid"), node.output("dtheta")
    assert dgrid is not None and dtheta is not None
    compute, itype = compute_for(fused), loop_index_type([dgrid, dtheta], dtheta.static_numel)
    params = KernelParams()
    gradient, out = params.tensor(dgrid), params.tensor(dtheta, writable=True)
    height, width = dgrid.static_dim[1:3]
    term = read(dgrid, gradient, offset_at(dgrid, ["c0", "h", "w", "c1"]), compute)
    body = coordinates("p", dtheta.static_dim, stride_order(dtheta.static_dim, dtheta.static_stride), "c", itype)
    body += [
        f"{compute} acc = {literal(0, compute)};",
        f"for (int h = 0; h < {height}; ++h)",
        f"for (int w = 0; w < {width}; ++w) {{",
        *("  " + line for line in _base_coordinates(height, width, "h", "w", compute)),
        f"  acc += {term} * (c2 == 0 ? bx : c2 == 1 ? by : {literal(1, compute)});",
        "}",
        f"{out}[{offset(dtheta, dtheta.static_dim, 'c')}] = {store(dtheta.data_type, 'acc')};",
    ]
    loop = grid_stride("p", first_thread(itype), dtheta.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "spatial_tf_dtheta", params, loop, (blocks_for(dtheta.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_sampler(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """y = the four pixels around the sample point, each weighted by its bilinear weight
    (pixels outside the image read zero and are never loaded)."""
    node = anchor_of(fused)
    x, grid, y = node.input("x"), node.input("grid"), node.output("y")
    assert x is not None and grid is not None and y is not None
    compute, itype = compute_for(fused), loop_index_type([x, grid, y], y.static_numel)
    params = KernelParams()
    names = declare(params, [x, grid])  # one tensor may be both
    image, points, out = names[x.id], names[grid.id], params.tensor(y, writable=True)
    body = coordinates("p", y.static_dim, stride_order(y.static_dim, y.static_stride), "c", itype)
    body += _sample_point(x, grid, points, "c2", "c3", compute)
    body.append(f"{compute} acc = {literal(0, compute)};")
    for row, column in CORNERS:
        pixel = read(x, image, offset_at(x, ["c0", "c1", f"({itype})r{row}", f"({itype})q{column}"]), compute)
        body.append(f"if (in_r{row} && in_q{column}) acc += wr{row} * wq{column} * {pixel};")
    body.append(f"{out}[{offset(y, y.static_dim, 'c')}] = {store(y.data_type, 'acc')};")
    loop = grid_stride("p", first_thread(itype), y.static_numel, itype, body)
    kernel = make_kernel(ctx, fused, "spatial_tf_sampler", params, loop, (blocks_for(y.static_numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))


def emit_sampler_backward(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    """dgrid (one thread per sample point, summing over channels) and dx (one thread per dx
    element, gathering from every sample point of its image), each only where it is written."""
    node = anchor_of(fused)
    dx, dgrid = node.output("dx"), node.output("dgrid")
    kernels = []
    if written(fused, dgrid):
        kernels.append(_dgrid_kernel(fused, ctx))
    if written(fused, dx):
        kernels.append(_dx_kernel(fused, ctx))
    return FusedProgram(fused.name, tuple(kernels))


def _dgrid_kernel(fused: FusedNode, ctx: EmitContext) -> Kernel:
    """d y / d ix at a corner is +-wr (the column step's sign), d / d iy +-wq; times dy and the
    pixel, summed over the corners and channels, times d ix / d gx = (W - 1) / 2."""
    node = anchor_of(fused)
    x, grid, dy, dgrid = node.input("x"), node.input("grid"), node.input("dy"), node.output("dgrid")
    assert x is not None and grid is not None and dy is not None and dgrid is not None
    compute = compute_for(fused)
    batch, height, width = grid.static_dim[:3]
    count = batch * height * width
    itype = loop_index_type([x, grid, dy, dgrid], count)
    params = KernelParams()
    names = declare(params, [x, grid, dy])
    image, points, gradient = names[x.id], names[grid.id], names[dy.id]
    out = params.tensor(dgrid, writable=True)
    body = coordinates("p", (batch, height, width), (0, 1, 2), "c", itype)
    body += _sample_point(x, grid, points, "c1", "c2", compute)
    body += [f"{compute} sx = {literal(0, compute)};", f"{compute} sy = {literal(0, compute)};"]
    body.append(f"for ({itype} k = 0; k < {x.static_dim[1]}; ++k) {{")
    body.append(f"  const {compute} d = {read(dy, gradient, offset_at(dy, ['c0', 'k', 'c1', 'c2']), compute)};")
    for row, column in CORNERS:
        pixel = read(x, image, offset_at(x, ["c0", "k", f"({itype})r{row}", f"({itype})q{column}"]), compute)
        body += [
            f"  if (in_r{row} && in_q{column}) {{",
            f"    const {compute} v = d * {pixel};",
            f"    sx {'+' if column else '-'}= v * wr{row};",
            f"    sy {'+' if row else '-'}= v * wq{column};",
            "  }",
        ]
    body.append("}")
    for k, (slope, extent) in enumerate((("sx", x.static_dim[3]), ("sy", x.static_dim[2]))):
        at = offset_at(dgrid, ["c0", "c1", "c2", str(k)])
        body.append(f"{out}[{at}] = {store(dgrid.data_type, f'{slope} * {literal((extent - 1) / 2, compute)}')};")
    loop = grid_stride("p", first_thread(itype), count, itype, body)
    return make_kernel(ctx, fused, "spatial_tf_sampler_dgrid", params, loop, (blocks_for(count), 1, 1))


def _dx_kernel(fused: FusedNode, ctx: EmitContext) -> Kernel:
    """dx[n, c, i, j] = the sum, over the sample points of image n in row-major order, of
    dy times the weight the point gives pixel (i, j) (zero unless it is one of its four)."""
    node = anchor_of(fused)
    x, grid, dy, dx = node.input("x"), node.input("grid"), node.input("dy"), node.output("dx")
    assert x is not None and grid is not None and dy is not None and dx is not None
    compute, itype = compute_for(fused), loop_index_type([grid, dy, dx], dx.static_numel)
    params = KernelParams()
    names = declare(params, [grid, dy])
    points, gradient, out = names[grid.id], names[dy.id], params.tensor(dx, writable=True)
    height, width = grid.static_dim[1:3]
    body = coordinates("p", dx.static_dim, stride_order(dx.static_dim, dx.static_stride), "c", itype)
    body += [
        f"const {compute} row = ({compute})c2;",
        f"const {compute} column = ({compute})c3;",
        f"{compute} acc = {literal(0, compute)};",
        f"for ({itype} h = 0; h < {height}; ++h)",
        f"for ({itype} w = 0; w < {width}; ++w) {{",
        *("  " + line for line in _sample_point(x, grid, points, "h", "w", compute)),
        f"  const {compute} wr = row == r0 ? wr0 : row == r1 ? wr1 : {literal(0, compute)};",
        f"  const {compute} wq = column == q0 ? wq0 : column == q1 ? wq1 : {literal(0, compute)};",
        f"  if (wr != {literal(0, compute)} && wq != {literal(0, compute)})",
        f"    acc += wr * wq * {read(dy, gradient, offset_at(dy, ['c0', 'c1', 'h', 'w']), compute)};",
        "}",
        f"{out}[{offset(dx, dx.static_dim, 'c')}] = {store(dx.data_type, 'acc')};",
    ]
    loop = grid_stride("p", first_thread(itype), dx.static_numel, itype, body)
    return make_kernel(ctx, fused, "spatial_tf_sampler_dx", params, loop, (blocks_for(dx.static_numel), 1, 1))


def _base_coordinates(height: int, width: int, row: str, column: str, compute: str) -> list[str]:
    """bx, by: the normalised coordinates of output pixel (row, column): -1 .. 1, 0 for one pixel."""

    def normalised(index: str, extent: int) -> str:
        if extent == 1:
            return literal(0, compute)
        return f"({compute}){index} * {literal(2 / (extent - 1), compute)} - {literal(1, compute)}"

    return [f"const {compute} bx = {normalised(column, width)};", f"const {compute} by = {normalised(row, height)};"]


def _sample_point(x: Tensor, grid: Tensor, points: str, h: str, w: str, compute: str) -> list[str]:
    """The sample point of grid position (n = c0, h, w) in x's pixels: r0, r1 (rows) and q0, q1
    (columns) around it, as the compute type, whether each is inside x (in_r0...), and their
    bilinear weights wr0, wr1, wq0, wq1 (a corner's weight is its row's times its column's)."""
    height, width = x.static_dim[2:]
    gx = read(grid, points, offset_at(grid, ["c0", h, w, "0"]), compute)
    gy = read(grid, points, offset_at(grid, ["c0", h, w, "1"]), compute)
    one = literal(1, compute)
    lines = [
        f"const {compute} ix = ({gx} + {one}) * {literal((width - 1) / 2, compute)};",
        f"const {compute} iy = ({gy} + {one}) * {literal((height - 1) / 2, compute)};",
        f"const {compute} r0 = floor(iy), q0 = floor(ix);",
        f"const {compute} r1 = r0 + {one}, q1 = q0 + {one};",
        f"const {compute} wr1 = iy - r0, wq1 = ix - q0;",
        f"const {compute} wr0 = {one} - wr1, wq0 = {one} - wq1;",
    ]
    for name, extent in (("r", height), ("q", width)):
        lines += [f"const bool in_{name}{k} = {name}{k} >= 0 && {name}{k} < {extent};" for k in (0, 1)]
    return lines
