"""Packed (ragged) attention outputs, made whole before the attention kernel runs.

The attention kernels write only the rows each sequence uses (graphdnn/ops/attention_ragged.py):
its rows past its length, and tokens that no sequence owns, belong to no block. This kernel
first stores O = 0 and STATS = -inf at every token (one pass over the outputs, small beside
the attention itself), so that every element of a packed output is defined.
"""

from __future__ import annotations

from fusion_rules import FusedNode

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import Kernel
from .attention_problem import Attention
from .direct_common import blocks_for, first_thread, grid_stride, loop_index_type, make_kernel

NEG_INF = "__int_as_float(0xff800000)"


def fill_kernel(fused: FusedNode, ctx: EmitContext, a: Attention) -> Kernel:
    params = KernelParams()
    body: list[str] = []
    largest = 0
    for tensor, value in ((a.o, "0.0f"), (a.stats, NEG_INF)):
        if tensor is None:
            continue
        name = params.tensor(tensor, writable=True)
        _, heads, tokens, width = tensor.static_dim
        count = heads * tokens * width
        largest = max(largest, count)
        itype = loop_index_type([tensor], count)
        coordinates = ["0", f"e / {tokens * width}", f"e / {width} % {tokens}", f"e % {width}"]
        at = offset_at(tensor, coordinates)
        body += grid_stride(
            "e", first_thread(itype), count, itype, [f"{name}[{at}] = {store(tensor.data_type, value)};"]
        )
    return make_kernel(ctx, fused, "sdpa_ragged_fill", params, body, (blocks_for(largest), 1, 1))
