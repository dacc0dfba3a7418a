"""The weight-only 4-bit / int8 GEMM (graphdnn/ops/weight_only.py): C [rows, N] = A [rows, K]
(16-bit) @ dequantize(W [K, N], group or per-column scales), for at most 16 rows
(fusion_rules/rules/weight_only.py).

The problem is bound by the weights' bytes, so both kernels read every weight byte once and
dequantize in registers:
- the tensor-core kernel (gemm_weight_only_mma.py) where W is int4 or int8 k-contiguous (the
  [N, K] layout of a linear layer's weight) in 16-byte aligned columns, K a multiple of 32
  (int4) or 16 (int8), at most 16 rows, and A k-contiguous in 16-byte rows: wide loads,
  mma.sync, K split across warps;
- otherwise a SIMT kernel, one thread per column n summing every row over K in fp32: correct for
  any layout and for fp4_e2m1 (Hopper has no FP4 tensor cores; FP4 is storage here), not fast.
Both round each dequantized weight to A's type, as the reference does.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Node

from ..context import EmitContext, KernelParams, indent, kernel_source
from ..cuda_types import load, load_packed, store
from ..kernel import FusedProgram, Kernel
from . import gemm_weight_only_mma as mma
from .gemm_weight_only_problem import WeightOnly, problem_of, tensor_core_reason

SIMT_THREADS = 128


def emit(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    assert fused.anchor is not None
    p = problem_of(fused.anchor)
    reason = tensor_core_reason(p)
    if reason is None:
        return FusedProgram(fused.name, (mma.kernel(fused, ctx, p, mma.choice(p, ctx.tuning, p.node.name, ctx.arch)),))
    if ctx.tuning:
        raise UnsupportedError(
            f"weight-only GEMM tuning {ctx.tuning}: this problem runs on the SIMT kernel, which takes none ({reason})",
            node=p.node.name,
        )
    return FusedProgram(fused.name, (simt_kernel(fused, ctx, p),))


def candidates(node: Node, arch: int) -> list[dict[str, object]]:
    """Launch choices for autotuning: the tensor-core kernel's; none on the SIMT path."""
    p = problem_of(node)
    return mma.candidates(p, arch) if tensor_core_reason(p) is None else []


def simt_kernel(fused: FusedNode, ctx: EmitContext, p: WeightOnly) -> Kernel:
    """One thread per column n: ROWS fp32 sums over K of A[r, k] * round((q[k, n] - zero) * scale)."""
    params = KernelParams()
    a, w, scale = params.tensor(p.a), params.tensor(p.w), params.tensor(p.scale)
    out = params.tensor(p.out, writable=True)
    ws, ss = p.w.static_stride, p.scale.static_stride
    a_k, c_n = p.a.static_stride[-1], p.out.static_stride[-1]
    at = f"kk * {ws[0]}LL + n * {ws[1]}LL"
    weight = load_packed(p.w.data_type, w, at) if p.w.data_type.is_packed else load(p.w.data_type, f"{w}[{at}]")
    if p.zero_point is not None:
        zero_point, zs = params.tensor(p.zero_point), p.zero_point.static_stride
        weight = f"({weight} - gd::to<float>({zero_point}[(kk / GROUP) * {zs[0]}LL + n * {zs[1]}LL]))"
    body = [
        f"constexpr int ROWS = {p.rows}, K = {p.k}, N = {p.n}, GROUP = {p.group};",
        "const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "if (n >= N) return;",
        "float acc[ROWS] = {};",
        "for (int kk = 0; kk < K; ++kk) {",
        f"  const float sc = gd::to<float>({scale}[(kk / GROUP) * {ss[0]}LL + n * {ss[1]}LL]);",
        f"  const float wq = gd::rounded<{p.activation}, float>({weight} * sc);",
        "  #pragma unroll",
        "  for (int row = 0; row < ROWS; ++row) {",
        f"    acc[row] += gd::to<float>({a}[row * {p.a_row}LL + kk * {a_k}LL]) * wq;",
        "  }",
        "}",
        "#pragma unroll",
        "for (int row = 0; row < ROWS; ++row) {",
        f"  {out}[row * {p.c_row}LL + n * {c_n}LL] = {store(p.out.data_type, 'acc[row]')};",
        "}",
    ]
    name, source = kernel_source(ctx, fused, "weight_only_gemm_simt", params, SIMT_THREADS, indent(body, 1))
    grid = (-(-p.n // SIMT_THREADS), 1, 1)
    return Kernel(name, source, grid, (SIMT_THREADS, 1, 1), 0, tuple(params.bindings))
