"""Training batch norm: per-channel batch statistics, running averages, then normalize + epilogue.

Three kernels, all fixed-order (reproducible, no float atomics):

1. statistics: the reduction walk of reduction_kernels.py over every axis but the channel (COLUMN
   for channels-last layouts, where a thread's 16-byte load covers VEC channels; ROW for
   channels-first ones, a group of threads per channel). For its channel c each thread sums,
   in float, d = x - k_c, d * d and x, where the shift k_c is x's first element of channel c.
   Numerics: var = E[d^2] - E[d]^2 does not cancel as E[x^2] - E[x]^2 does when |mean| >> std
   (k_c is a sample, so |mean - k_c| is about one std), and the chunk sums stay plain sums
   (nothing like Welford's per-chunk means to merge). The mean comes from whichever of
   sum(d), sum(x) is smaller in magnitude, hence has the smaller rounding error: sum(x) when
   the mean is near 0, sum(d) when |mean| >> std. Large inputs split the (N, spatial) extent
   into chunks over blockIdx.y that write partial sums to scratch;
2. finalize (when split): one thread column per channel merges the chunks' partial sums in
   double, in chunk order, and computes mean, inv_variance = 1/sqrt(var + eps) (var biased),
   the running averages (with the unbiased var * n / (n - 1); var itself when n is 1), and
   stores per channel, for kernel 3, mean (as hi + lo floats), scale * inv_variance and bias;
3. apply: y = ((x - mean_hi) - mean_lo) * (scale * inv_variance) + bias, rounded to y's type,
   then the epilogue (e.g. residual add + ReLU), over all elements in x's memory order, VEC at
   a time with 16-byte loads and stores when every full-size tensor allows it (NHWC; NCHW
   with H*W a multiple of VEC), else element by element through each tensor's strides. The
   hi + lo mean keeps x - mean exact enough when |mean| >> std. For NHWC the grid stride is
   a multiple of C: each thread's channels never change and their affine values stay in
   registers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.ir import Node, Tensor
from graphdnn.layout import stride_order

from .. import epilogue
from ..context import (
    EmitContext,
    KernelParams,
    compute_of,
    indent,
    kernel_source,
    operand_loader,
    pattern_name,
    scalar_value,
)
from ..cuda_types import cuda_type, load, rounded, store
from ..indexing import coordinates, loop_index_type, offset, row_major_index
from ..kernel import FusedProgram, Kernel, Scratch
from .reduction_fragments import Names, declare, type_bytes
from .reduction_kernels import Accumulator, Finish, epilogue_operands, refuse_tuning, walk_kernels
from .reduction_walk import plan_walk, widest_vector

THREADS = 256
MAX_BLOCKS = 65535
AFFINE = 4  # values per channel in the affine scratch: mean_hi, mean_lo, scale * inv_variance, bias


def _statistics(bn: Node, fused: FusedNode, count: int, compute: str) -> Finish:
    """Per channel, from the merged shifted sums: mean, inv_variance, the running averages, and
    the channel's (mean as hi + lo, scale * inv_variance, bias) in the ``affine`` scratch."""
    x, scale, bias = (bn.input(role) for role in ("input", "scale", "bias"))
    assert x is not None and scale is not None and bias is not None
    kept = tuple(d if axis == 1 else 1 for axis, d in enumerate(x.static_dim))
    channels = x.dim[1]
    written = {t.id for t in fused.outputs}
    stats = {role: t for role, t in bn.outputs if role != "y" and t.id in written}
    running = [bn.input(role) for role in ("in_running_mean", "in_running_var")]
    scalars = [t for t in (bn.input("epsilon"), bn.input("momentum")) if t is not None and not t.is_constant]
    inputs = tuple(t for t in (scale, bias, *running, *scalars) if t is not None)
    unbiased = f"var * {count}.0 / {count - 1}.0" if count > 1 else "var"

    def statements(names: Names, merged: list[str], prefix: str, shift: str | None) -> list[str]:
        epsilon = bn.input("epsilon")
        assert epsilon is not None
        channel = f"{prefix}1"
        lines = [
            f"const double d = (double){merged[0]} / {count}.0;  // mean of x - shift",
            f"const double var = fmax((double){merged[1]} / {count}.0 - d * d, 0.0);",
            "// The mean from the sum smaller in magnitude (smaller rounding error): the plain sum",
            "// when the mean is near 0, the shifted one when |mean| >> std.",
            f"const double mean = fabs((double){merged[2]}) < fabs((double){merged[0]}) ? "
            f"(double){merged[2]} / {count}.0 : (double){shift} + d;",
            f"const double inv = 1.0 / sqrt(var + {scalar_value(epsilon, names.get(epsilon.id), 'double')});",
            # mean = hi + lo in the compute type: x - mean keeps its precision when |mean| >> std.
            f"const {compute} mean_hi = ({compute})mean;",
            f"affine[{channel}] = mean_hi;",
            f"affine[{channels} + {channel}] = ({compute})(mean - (double)mean_hi);",
            f"affine[{2 * channels} + {channel}] = ({compute})({_channel(scale, names, kept, prefix)} * inv);",
            f"affine[{3 * channels} + {channel}] = ({compute}){_channel(bias, names, kept, prefix)};",
        ]
        values = {"mean": "mean", "inv_variance": "inv"}
        if "next_running_mean" in stats or "next_running_var" in stats:
            momentum = bn.input("momentum")
            assert momentum is not None
            lines.append(f"const double momentum = {scalar_value(momentum, names.get(momentum.id), 'double')};")
            for role, new in (("in_running_mean", "mean"), ("in_running_var", unbiased)):
                old = bn.input(role)
                assert old is not None
                values[f"next_{role[3:]}"] = (
                    f"(1.0 - momentum) * {_channel(old, names, kept, prefix)} + momentum * {new}"
                )
        for role, tensor in stats.items():
            lines.append(
                f"{names[tensor.id]}[{offset(tensor, kept, prefix)}] = {store(tensor.data_type, values[role])};"
            )
        return lines

    return Finish(inputs, tuple(stats.values()), statements, scratch=(("affine", compute),))


def _channel(tensor: Tensor, names: Names, kept: tuple[int, ...], prefix: str) -> str:
    return load(tensor.data_type, f"{names[tensor.id]}[{offset(tensor, kept, prefix)}]", "double")


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    refuse_tuning(fused, ctx)
    bn = fused.anchor
    assert bn is not None
    x, y = bn.input("input"), bn.output("y")
    assert x is not None and y is not None
    compute = compute_of([*fused.inputs, *fused.outputs])
    kept = tuple(d if axis == 1 else 1 for axis, d in enumerate(x.static_dim))
    statistics = _statistics(bn, fused, x.numel // x.dim[1], compute)
    walk = plan_walk(x, kept, [*statistics.inputs, *statistics.outputs], slot_bytes=3 * type_bytes(compute))

    def fold(slot: str, value: str) -> list[str]:
        """sum(x - shift), sum((x - shift)^2), sum(x) of the channel in output slot ``slot``."""
        return [
            f"const {compute} d = {value} - shift[{slot}];",
            f"acc[{slot} * 3] += d;",
            f"acc[{slot} * 3 + 1] += d * d;",
            f"acc[{slot} * 3 + 2] += {value};",
        ]

    acc = Accumulator(compute, 3, 0.0, "add", fold, "double", shifted=True)
    pattern = pattern_name(fused)
    kernels, scratch = walk_kernels(ctx, fused, walk, acc, statistics, pattern)
    affine = Scratch("affine", AFFINE * x.static_dim[1] * type_bytes(compute))
    normalized = {y.id, *(t.id for node in fused.epilogue for t in node.output_tensors())}
    full = [t for t in fused.outputs if t.id in normalized]
    if full:

        def normalize(values: epilogue.Values, channel: list[str]) -> None:
            high, low, scale, bias = channel
            normalized = f"(({values.get(x)} - {high}) - {low}) * {scale} + {bias}"
            values.define(y, rounded(y.data_type, normalized, compute))

        reads = [x, *(t for t in epilogue_operands(fused) if t.id != x.id)]
        per_channel = PerChannel("affine", AFFINE, normalize)
        kernels.append(apply_kernel(ctx, fused, x, reads, full, compute, f"{pattern}_apply", per_channel))
    return FusedProgram(fused.name, tuple(kernels), (*scratch, affine))


@dataclass(frozen=True)
class PerChannel:
    """What an apply kernel computes from ``count`` values per channel, read from the scratch
    buffer ``scratch`` laid out [count][C]: ``define(values, channel)`` defines the anchor's
    output in ``values`` from the C expressions of the element's channel's values."""

    scratch: str
    count: int
    define: Callable[[epilogue.Values, list[str]], None]


def _inner_run(x: Tensor, order: Sequence[int]) -> list[int]:
    """The innermost axes of x (outermost first) that form one contiguous run of memory ending
    at stride 1: NCHW's H and W, NHWC's C (and W, H, N when packed)."""
    run: list[int] = []
    span = 1
    for axis in reversed([a for a in order if x.dim[a] > 1]):
        if x.stride[axis] != span:
            break
        run.insert(0, axis)
        span *= x.static_dim[axis]
    return run


def _run_vector(full: Sequence[Tensor], x: Tensor, run: Sequence[int]) -> int:
    """Elements that move as one access in every full-size tensor: within x's inner run (every
    tensor laid out like x there), with every other stride a multiple of the vector."""
    extent = math.prod(x.dim[a] for a in run)

    def fits(vec: int) -> bool:
        return (
            bool(run)
            and extent % vec == 0
            and all(
                all(t.stride[a] == x.stride[a] for a in run)
                and all(s % vec == 0 for a, (d, s) in enumerate(zip(t.dim, t.stride)) if d > 1 and a not in run)
                for t in full
            )
        )

    return widest_vector(full, fits)


def apply_kernel(
    ctx: EmitContext,
    fused: FusedNode,
    x: Tensor,
    reads: list[Tensor],
    outputs: list[Tensor],
    compute: str,
    pattern: str,
    per_channel: PerChannel,
) -> Kernel:
    """Each thread computes VEC consecutive elements (in x's memory order) per step of a
    grid-stride loop from ``reads`` and the channel's values (scratch, L1-resident), then the
    epilogue, and stores ``outputs`` (every one the size of x)."""
    dims, order = x.static_dim, stride_order(x.static_dim, x.static_stride)
    params = KernelParams()
    names = declare(params, reads, outputs)
    params.scratch(per_channel.scratch, f"const {compute}")
    params.aligned_flag()
    tensors = [*reads, *outputs]
    count, values_of = per_channel.count, per_channel.scratch
    full = [t for t in tensors if not t.is_pass_by_value and t.dim == dims]
    # Vectors within the axes inside the channel (NCHW: H*W; NHWC: C itself), so that a
    # vector's channels follow from its first element; across the whole inner run otherwise.
    whole = _inner_run(x, order)
    inside_channel = (whole[whole.index(1) + 1 :] or [1]) if 1 in whole else whole
    run, vec = inside_channel, _run_vector(full, x, inside_channel)
    if vec == 1:
        run, vec = whole, _run_vector(full, x, whole)
    channels = dims[1]
    blocks = min(max(1, -(-x.numel // (vec * THREADS))), MAX_BLOCKS)
    # Vectors along the channels (NHWC): with a grid stride a multiple of C, each thread keeps
    # the same channels at every step, so their affine values stay in registers.
    period = channels // math.gcd(channels, THREADS * vec)
    stationary = vec > 1 and run == [1] and -(-blocks // period) * period <= MAX_BLOCKS
    if stationary:
        blocks = -(-blocks // period) * period
    itype = loop_index_type(tensors, x.static_numel, blocks * THREADS * vec)

    def element(prefix: str, vector: bool) -> list[str]:
        """Statements normalizing and storing the element at coordinates ``{prefix}*``."""

        def load_operand(t: Tensor) -> str:
            if vector and t.dim == dims and not t.is_pass_by_value:
                return load(t.data_type, f"a{t.id}.v[e]", compute)
            return operand_loader(names, dims, prefix, compute)(t)

        values = epilogue.Values(compute, load_operand, lambda t: row_major_index(t, dims, prefix))
        if vector and stationary:
            channel = [f"channel[{k}][e]" for k in range(count)]
        else:
            channel = [f"{values_of}[{k * channels} + {prefix}1]" for k in range(count)]
        per_channel.define(values, channel)
        epilogue.apply(fused.epilogue, values)
        if vector:
            stores = [f"r{t.id}.v[e] = {store(t.data_type, values.get(t))};" for t in outputs]
        else:
            stores = [
                f"{names[t.id]}[{offset(t, dims, prefix)}] = {store(t.data_type, values.get(t))};" for t in outputs
            ]
        return values.statements + stores

    body = [
        f"const {itype} stride = ({itype})gridDim.x * blockDim.x;",
        f"const {itype} first = ({itype})blockIdx.x * blockDim.x + threadIdx.x;",
        f"{itype} tail = 0;",
    ]
    if vec > 1:
        vectors = x.numel // vec
        loads = [
            f"const gd::Vec<{cuda_type(t.data_type)}, {vec}> a{t.id} = "
            f"gd::load_vec<{cuda_type(t.data_type)}, {vec}>({names[t.id]} + {offset(t, dims, 'b')});"
            for t in full
            if t.id in names and t not in outputs
        ]
        results = [f"gd::Vec<{cuda_type(t.data_type)}, {vec}> r{t.id};" for t in outputs]
        stores = [
            f"gd::store_vec<{cuda_type(t.data_type)}, {vec}>({names[t.id]} + {offset(t, dims, 'b')}, r{t.id});"
            for t in outputs
        ]
        # Element e of the vector: the run's coordinates of (inside + e); the other axes' are the base's.
        per_element = coordinates("(inside + e)", dims, run, "q", itype)
        per_element += [f"const {itype} q{a} = b{a};" for a in range(len(dims)) if a not in run]
        per_element += element("q", True)
        base = coordinates(f"v * {vec}", dims, order, "b", itype)
        base.append(f"const {itype} inside = v * {vec} % {math.prod(dims[a] for a in run)};")
        body.append("if (aligned) {")
        if stationary:
            body += [
                f"  const {itype} c0 = first * {vec} % {channels};  // the thread's channels, the same at every step",
                f"  {compute} channel[{count}][{vec}];",
                "#pragma unroll",
                f"  for (int e = 0; e < {vec}; ++e)",
                "#pragma unroll",
                f"    for (int k = 0; k < {count}; ++k) channel[k][e] = {values_of}[k * {channels} + c0 + e];",
            ]
        body += [
            f"  for ({itype} v = first; v < {vectors}; v += stride) {{",
            *("    " + s for s in base + loads + results),
            "#pragma unroll",
            f"    for (int e = 0; e < {vec}; ++e) {{",
            *("      " + s for s in per_element),
            "    }",
            *("    " + s for s in stores),
            "  }",
            f"  tail = {x.numel};",
            "}",
        ]
    body += [
        f"for ({itype} p = tail + first; p < {x.numel}; p += stride) {{",
        *("  " + s for s in coordinates("p", dims, order, "q", itype) + element("q", False)),
        "}",
    ]
    name, source = kernel_source(ctx, fused, pattern, params, THREADS, indent(body, 1))
    return Kernel(name, source, (blocks, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))
