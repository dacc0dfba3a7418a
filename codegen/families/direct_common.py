"""What the direct family's kernels share: the launch shape, grid-stride loops, declarations.

Every direct kernel is one 1-D block of THREADS threads per tile of work. Loops over
elements are grid-stride loops, so a grid capped at MAX_BLOCKS still covers any size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fusion_rules import FusedNode
from graphdnn.ir import Node, Tensor

from .. import indexing
from ..context import EmitContext, KernelParams, compute_of, indent, kernel_source, scalar_value
from ..cuda_types import load, load_packed
from ..kernel import Kernel

THREADS = 256
MAX_BLOCKS = 65535


def anchor_of(fused: FusedNode) -> Node:
    assert fused.anchor is not None
    return fused.anchor


def tensors_of(fused: FusedNode) -> list[Tensor]:
    return [*fused.inputs, *fused.outputs]


def compute_for(fused: FusedNode) -> str:
    """float, or double when a tensor or the node's compute type is double."""
    return compute_of(tensors_of(fused), [anchor_of(fused).compute_data_type])


def written(fused: FusedNode, tensor: Tensor | None) -> bool:
    """Whether the fused node must store ``tensor`` (an unread virtual output is never stored)."""
    return tensor is not None and any(t.id == tensor.id for t in fused.outputs)


def declare(params: KernelParams, tensors: Iterable[Tensor | None], *, writable: bool = False) -> dict[int, str]:
    """Declare each distinct tensor once per kernel (an op may read one tensor through two roles,
    and two parts of a kernel may read the same one): those ``params`` has are reused."""
    names = {
        binding.tensor: declaration.split()[-1]
        for declaration, binding in zip(params.declarations, params.bindings)
        if binding.tensor is not None
    }
    for t in tensors:
        if t is not None and t.id not in names:
            names[t.id] = params.tensor(t, writable=writable)
    return {t.id: names[t.id] for t in tensors if t is not None}


def read(tensor: Tensor, name: str, offset: str, compute: str) -> str:
    """The element at ``offset`` as the compute type (a pass-by-value scalar is its value)."""
    if tensor.is_pass_by_value:
        return scalar_value(tensor, name, compute)
    if tensor.data_type.is_packed:
        return load_packed(tensor.data_type, name, offset, compute)
    return load(tensor.data_type, f"{name}[{offset}]", compute)


def loop_index_type(tensors: Sequence[Tensor], count: int, *extents: int) -> str:
    """int or long long for a kernel with a grid-stride loop over ``count``: the index passes
    ``count`` by up to a grid's worth of threads before the loop test stops it."""
    return indexing.loop_index_type(tensors, count, MAX_BLOCKS * THREADS, *extents)


def blocks_for(count: int, per_block: int = THREADS) -> int:
    return min(max(1, -(-count // per_block)), MAX_BLOCKS)


def grid_stride(index: str, start: str, count: int, itype: str, body: Sequence[str]) -> list[str]:
    """``for`` over ``index`` = start + k * (all threads of the grid), below ``count``."""
    return [
        f"for ({itype} {index} = {start}; {index} < {count}; {index} += ({itype})gridDim.x * blockDim.x) {{",
        *("  " + line for line in body),
        "}",
    ]


def warp_stride(index: str, count: int, itype: str, body: Sequence[str]) -> list[str]:
    """``for`` over ``index`` = this warp + k * (all warps of the grid), below ``count``: one
    warp per item, the same ``index`` on all 32 lanes (so warp shuffles inside stay converged),
    with ``lane`` its position in the warp."""
    warps = f"({itype})gridDim.x * (blockDim.x / 32)"
    return [
        "const int lane = threadIdx.x % 32;",
        f"for ({itype} {index} = ({first_thread(itype)}) / 32; {index} < {count}; {index} += {warps}) {{",
        *("  " + line for line in body),
        "}",
    ]


def first_thread(itype: str) -> str:
    """The grid-wide index of this thread."""
    return f"({itype})blockIdx.x * blockDim.x + threadIdx.x"


def make_kernel(
    ctx: EmitContext,
    fused: FusedNode,
    pattern: str,
    params: KernelParams,
    body: Sequence[str],
    grid: tuple[int, int, int],
    *,
    alignment: int = 16,
    min_blocks: int = 0,
) -> Kernel:
    """``min_blocks``: blocks per SM that must fit at once (kernel_source's), for resident grids."""
    name, source = kernel_source(ctx, fused, pattern, params, THREADS, indent(body, 1), min_blocks)
    return Kernel(name, source, grid, (THREADS, 1, 1), 0, tuple(params.bindings), alignment=alignment)
