"""The Hopper attention backward's two memory passes around its dK/dV kernel: before it ``delta``
(the row sums of dO * O) with ``dq_accum`` zeroed, after it dQ = scale * ``dq_accum`` in dQ's type
and layout.

Each pass reads or writes B·H·S·D elements (two of them in fp32), so at short sequences they
are a noticeable part of the backward: a thread takes 8 consecutive columns of one row, as 16-byte
loads and stores where the rows copy as 16-byte chunks and every pointer is aligned (the
``aligned`` flag, at run time), else element by element, with the same rows and columns per
thread. The wgmma path has no padding or packed sequences and D = Dv (attention_backward_wgmma's
``unsupported``): row r of ``delta`` and ``dq_accum`` is (b, h, i) = (r / SQ / HQ, r / SQ % HQ,
r % SQ).
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, indent, kernel_source, pattern_name
from ..cuda_types import load
from ..kernel import Kernel
from .attention_backward_problem import DELTA, DQ_ACCUM, AttentionBackward, declare, gradient_store
from .attention_backward_tile import unpack_function
from .attention_flash import pack_function, vectorizable
from .attention_problem import constants, coordinates, element, sequence_setup

THREADS = 256
CHUNK = 8  # columns a thread: 16 bytes of a 16-bit row


def preprocess_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """``delta[r] = sum_d dO[r, d] O[r, d]`` and ``dq_accum[r, :] = 0``: D / 8 threads a row (a
    lane group of 8 or 16 within a warp, summed by shuffles)."""
    a = ab.problem
    declared = declare(ab, dq_accum=True)
    names, params = declared.names, declared.params
    aligned = params.aligned_flag()
    vector = vectorizable((ab.o, ab.d_o)) and ab.o.data_type is ab.d_o.data_type is a.q.data_type

    def at(role: str, tensor: Tensor, col: str = "c") -> str:
        return element(tensor, names[role], coordinates(a, role, "h", "i", col))

    def scalar_sum() -> list[str]:
        o, d_o = (load(t.data_type, at(role, t, "c + e"), "float") for role, t in (("O", ab.o), ("DO", ab.d_o)))
        return ["#pragma unroll", f"for (int e = 0; e < {CHUNK}; ++e) sum += {d_o} * {o};"]

    sums = scalar_sum()
    if vector:
        sums = [
            f"if ({aligned}) {{",
            f"  const uint4 ov = *reinterpret_cast<const uint4*>(&{at('O', ab.o)});",
            f"  const uint4 dov = *reinterpret_cast<const uint4*>(&{at('DO', ab.d_o)});",
            "  const unsigned ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dov.x, dov.y, dov.z, dov.w};",
            "#pragma unroll",
            "  for (int e = 0; e < 4; ++e) {",
            "    const float2 of = unpack2(ow[e]), df = unpack2(dw[e]);",
            "    sum += df.x * of.x + df.y * of.y;",
            "  }",
            "} else {",
            *indent(scalar_sum(), 1).splitlines(),
            "}",
        ]
    lanes = a.d // CHUNK
    body = [
        *constants(a),
        f"constexpr int LANES = {lanes};  // threads a row",
        f"const long long r = ((long long)blockIdx.x * {THREADS} + threadIdx.x) / LANES;",
        f"const int c = (int)(threadIdx.x % LANES) * {CHUNK};",
        "const int i = (int)(r % SQ), h = (int)(r / SQ % HQ), b = (int)(r / SQ / HQ);",
        f"const bool live = r < {ab.rows}LL;",
        "float sum = 0.0f;",
        "if (live) {",
        *indent(sums, 1).splitlines(),
        f"  float4* const zero = reinterpret_cast<float4*>({names[DQ_ACCUM]} + r * D + c);",
        "  zero[0] = zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);",
        "}",
        "#pragma unroll",
        "for (int step = LANES / 2; step > 0; step /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, step);",
        f"if (live && c == 0) {names[DELTA]}[r] = sum;",
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_delta",
        params,
        THREADS,
        indent(body, 1),
        device_functions=unpack_function(a.q.data_type),
    )
    grid = -(-ab.rows * lanes // THREADS)
    return Kernel(name, source, (grid, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))


def dq_kernel(fused: FusedNode, ctx: EmitContext, ab: AttentionBackward) -> Kernel:
    """dQ = scale * dq_accum: 8 columns of a row a thread, two float4 loads and one 16-byte store
    where dQ's rows take them."""
    a = ab.problem
    declared = declare(ab, dq_accum=True)
    names, params = declared.names, declared.params
    aligned = params.aligned_flag()
    value = "scale * acc[e]"
    scalar = [
        "#pragma unroll",
        f"for (int e = 0; e < {CHUNK}; ++e)",
        f"  {gradient_store(a, 'DQ', ab.dq, names['DQ'], 'h', 'i', 'c + e', value)}",
    ]
    stores = scalar
    if vectorizable((ab.dq,)) and ab.dq.data_type is a.q.data_type:
        dq_at = element(ab.dq, names["DQ"], coordinates(a, "DQ", "h", "i", "c"))
        pairs = ", ".join(f"pack2(scale * acc[{e}], scale * acc[{e + 1}])" for e in range(0, CHUNK, 2))
        stores = [
            f"if ({aligned}) {{",
            f"  *reinterpret_cast<uint4*>(&{dq_at}) = make_uint4({pairs});",
            "} else {",
            *indent(scalar, 1).splitlines(),
            "}",
        ]
    elements = ab.rows * a.d
    body = [
        *constants(a),
        f"const long long at = ((long long)blockIdx.x * {THREADS} + threadIdx.x) * {CHUNK};",
        f"if (at >= {elements}LL) return;",
        "const int c = (int)(at % D), i = (int)(at / D % SQ), h = (int)(at / D / SQ % HQ), b = (int)(at / D / SQ / HQ);",
        *sequence_setup(a, names),
        f"const float4* const from = reinterpret_cast<const float4*>({names[DQ_ACCUM]} + at);",
        "const float4 lo = from[0], hi = from[1];",
        "const float acc[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};",
        *stores,
    ]
    name, source = kernel_source(
        ctx,
        fused,
        pattern_name(fused) + "_dq_convert",
        params,
        THREADS,
        indent(body, 1),
        device_functions=pack_function(a.q.data_type),
    )
    grid = -(-elements // (THREADS * CHUNK))
    return Kernel(name, source, (grid, 1, 1), (THREADS, 1, 1), 0, tuple(params.bindings))
