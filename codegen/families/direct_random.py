"""``rng``: one thread per element (grid-stride), Philox4x32-10 on the element's row-major index
(gd::philox4x32_10, the same integer arithmetic as graphdnn.ops.random), so the mask is
bit-identical to the reference's. The Bernoulli test is on integers: with k = word0 >> 8,
u = k / 2^24 < p exactly when k < ceil(p * 2^24).
"""

from __future__ import annotations

import math

from fusion_rules import FusedNode
from graphdnn.ops.random import PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import coordinates, offset
from ..kernel import FusedProgram
from .direct_common import anchor_of, blocks_for, first_thread, grid_stride, loop_index_type, make_kernel, read

# The device function must use the reference's constants: checked here, where both are in view.
assert (PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, PHILOX_ROUNDS) == (
    0xD2511F53,
    0xCD9E8D57,
    0x9E3779B9,
    0xBB67AE85,
    10,
), "gd::philox4x32_10 in graphdnn.cuh hard-codes the Random123 constants"


def emit_rng(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    y = node.output("y")
    assert y is not None
    params = KernelParams()
    words = {}
    for role in ("seed", "offset"):
        t = node.input(role)
        assert t is not None
        name = None if t.is_constant else params.tensor(t)
        # as graphdnn.ops.random.as_uint64: truncated, two's complement in 64 bits
        words[role] = f"(unsigned long long)(long long)({read(t, name or '', '0', 'double')})"
    out = params.tensor(y, writable=True)
    params.aligned_flag()
    itype = loop_index_type([y], y.numel)
    threshold = math.ceil(node.attributes.bernoulli_probability * 2**24)  # type: ignore[attr-defined]
    element = [
        *coordinates("p", y.dim, tuple(range(len(y.dim))), "c", itype),
        "const uint4 r = gd::philox4x32_10(",
        "    make_uint4((unsigned)p, (unsigned)((unsigned long long)p >> 32), (unsigned)offset, (unsigned)(offset >> 32)),",
        "    make_uint2((unsigned)seed, (unsigned)(seed >> 32)));",
        f"{out}[{offset(y, y.dim, 'c')}] = {store(y.data_type, f'((r.x >> 8) < {threshold}u ? 1.0f : 0.0f)')};",
    ]
    body = [
        f"const unsigned long long seed = {words['seed']};",
        f"const unsigned long long offset = {words['offset']};",
        *grid_stride("p", first_thread(itype), y.numel, itype, element),
    ]
    kernel = make_kernel(ctx, fused, "rng_bernoulli", params, body, (blocks_for(y.numel), 1, 1))
    return FusedProgram(fused.name, (kernel,))
