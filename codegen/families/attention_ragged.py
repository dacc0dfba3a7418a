"""Packed (ragged) attention outputs, made whole before the attention kernels run.

The attention kernels, forward and backward, write only the rows each sequence uses
(graphdnn/ops/attention_ragged.py): its rows past its length, and tokens that no sequence
owns, belong to no block. This kernel first stores a value at every token of each packed
output (O = 0 and STATS = -inf; dQ, dK and dV = 0: one pass over the outputs, small beside
the attention itself), so that every element of a packed output is defined.
"""

from __future__ import annotations

from collections.abc import Sequence

from fusion_rules import FusedNode
from graphdnn.ir import Tensor

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import Kernel
from .direct_common import blocks_for, first_thread, grid_stride, loop_index_type, make_kernel

NEG_INF = "__int_as_float(0xff800000)"


def fill_kernel(fused: FusedNode, ctx: EmitContext, outputs: Sequence[tuple[Tensor, str]]) -> Kernel:
    """Each packed ``[1, H, T, d]`` output set to its value (a C float expression)."""
    params = KernelParams()
    body: list[str] = []
    largest = 0
    for tensor, value in outputs:
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
