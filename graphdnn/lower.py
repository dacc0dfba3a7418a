"""From a validated graph to a :class:`~graphdnn.program.LaunchProgram` and its kernel sources.

The one place where graphdnn reaches into code generation: given the partition that
``fusion_rules.fuse`` made, ``codegen.emit_partition`` writes a CUDA program per fused node.
This module turns their output into plan data: workspace offsets for the intermediates
that cross fused nodes and for every scratch buffer, and each kernel parameter's binding.
A dynamic graph's workspace is laid out for the symbols' maxima (every call fits in it);
its kernels' symbols and grids refer to the input dims that hold each symbol in a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .arch import arch_name
from .ir import Graph, Tensor
from .layout import largest_storage_extent
from .program import (
    Arg,
    ArgKind,
    CallExtent,
    GridExtent,
    Launch,
    LaunchBucket,
    LaunchProgram,
    TensorMap,
    WorkspaceBuffer,
    align,
)
from .specialize import symbol_source
from .symbolic import Sym

if TYPE_CHECKING:
    from codegen import FusedProgram, Kernel
    from codegen.kernel import DynamicGrid, SizeBucket
    from fusion_rules import Partition


@dataclass(frozen=True)
class KernelSource:
    name: str
    source: str
    content_hash: str
    arch_suffix: str = ""  # "a": compiled for sm_XYa (see codegen.Kernel)

    def target(self, arch: int) -> str:
        """The NVRTC target this kernel is compiled for on sm_``arch``."""
        return f"{arch_name(arch)}{self.arch_suffix}"


@dataclass(frozen=True)
class Lowered:
    """A program plus the source of each of its kernels, by kernel key."""

    program: LaunchProgram
    sources: dict[str, KernelSource]


def lower(
    partition: Partition,
    arch: int,
    graph_signature: str,
    kernel_key: Callable[[str], str],
    *,
    tuning: Mapping[int, Mapping[str, Any]] | None = None,
) -> Lowered:
    """Emit the kernels of ``partition`` (fused for sm_``arch``; ``graph_signature`` is its
    graph's, named in each kernel's header); ``kernel_key`` names a kernel's cubin from its
    content hash; ``tuning`` gives launch choices by fused-node position."""
    from codegen import emit_partition

    by_name = {partition.nodes[i].name: dict(choice) for i, choice in (tuning or {}).items()}
    programs = emit_partition(partition, arch, by_name, graph_signature=graph_signature)
    return assemble(partition, programs, kernel_key, tuning or {})


def assemble(
    partition: Partition,
    programs: tuple[FusedProgram, ...],
    kernel_key: Callable[[str], str],
    tuning: Mapping[int, Mapping[str, Any]],
) -> Lowered:
    """Plan data from emitted programs: launches with bound arguments, workspace layout."""
    from fusion_rules import Family

    workspace = _layout(partition.materialized, programs)
    intermediates = {b.tensor: b for b in workspace if b.tensor is not None}
    scratch = {
        (b.fused_index, b.scratch): b.offset for b in workspace if b.scratch is not None and b.fused_index is not None
    }
    launches = []
    sources: dict[str, KernelSource] = {}
    for index, program in enumerate(programs):
        for kernel in program.kernels:
            key = kernel_key(kernel.content_hash)
            sources.setdefault(key, KernelSource(kernel.name, kernel.source, kernel.content_hash, kernel.arch_suffix))
            args = tuple(_arg(partition.graph, kernel, param, index, intermediates, scratch) for param in kernel.params)
            launches.append(
                Launch(
                    name=kernel.name,
                    kernel_key=key,
                    content_hash=kernel.content_hash,
                    fused_index=index,
                    grid=kernel.grid,
                    block=kernel.block,
                    shared_bytes=kernel.shared_bytes,
                    alignment=kernel.alignment,
                    args=args,
                    elementwise=partition.nodes[index].family is Family.ELEMENTWISE and len(program.kernels) == 1,
                    blocks=_grid(partition.graph, kernel.blocks) if kernel.blocks is not None else None,
                    bucket=_bucket(partition.graph, kernel.bucket) if kernel.bucket is not None else None,
                )
            )
    size = max((b.offset + b.bytes for b in workspace), default=0)
    chosen = tuple(dict(tuning.get(i, {})) for i in range(len(programs)))
    return Lowered(LaunchProgram(tuple(launches), workspace, align(size), chosen), sources)


def _layout(intermediates: tuple[Tensor, ...], programs: tuple[FusedProgram, ...]) -> tuple[WorkspaceBuffer, ...]:
    """Every intermediate, then every scratch buffer, each on a 256-byte boundary; an
    intermediate that a program aliases to its source (FusedProgram.aliases) at the source's."""
    aliases = dict(alias for program in programs for alias in program.aliases)
    buffers = []
    placed: dict[int, int] = {}
    offset = 0
    for t in intermediates:
        size = largest_storage_extent(t.dim, t.stride) * t.data_type.itemsize
        if t.id not in aliases:
            buffers.append(WorkspaceBuffer(offset, size, tensor=t.id))
            placed[t.id] = offset
            offset = align(offset + size)
    for t in intermediates:
        if t.id in aliases:
            source = aliases[t.id]
            while source in aliases:
                source = aliases[source]
            size = largest_storage_extent(t.dim, t.stride) * t.data_type.itemsize
            buffers.append(WorkspaceBuffer(placed[source], size, tensor=t.id))
    for index, program in enumerate(programs):
        for s in program.scratch:
            buffers.append(WorkspaceBuffer(offset, s.bytes, scratch=s.name, fused_index=index))
            offset = align(offset + s.bytes)
    return tuple(buffers)


def _arg(
    ir: Graph,
    kernel: Kernel,
    param: Any,
    index: int,
    intermediates: Mapping[int, WorkspaceBuffer],
    scratch: Mapping[tuple[int, str], int],
) -> Arg:
    kind = ArgKind(param.kind.value)
    if kind is ArgKind.EXTENT:
        tensor, axis = symbol_source(ir, param.symbol)
        return Arg(kind, tensor=tensor, axis=axis)
    if param.scratch is not None:  # a pointer into the fused node's scratch, or a tensor map of it
        if (index, param.scratch) not in scratch:
            raise AssertionError(f"kernel {kernel.name} binds scratch '{param.scratch}' its fused node did not declare")
        return Arg(kind, offset=scratch[(index, param.scratch)], tensor_map=param.tensor_map)
    if kind in (ArgKind.TENSOR, ArgKind.TENSOR_MAP):
        t = ir.tensors[param.tensor]
        if t.is_pass_by_value:
            raise AssertionError(f"kernel {kernel.name} binds scalar '{t.name}' as a pointer")
        if t.is_virtual and t.id not in intermediates:
            raise AssertionError(f"kernel {kernel.name} reads virtual tensor '{t.name}', which no fused node writes")
    return Arg(kind, tensor=param.tensor, tensor_map=_tensor_map(ir, param))


def _bucket(ir: Graph, bucket: SizeBucket) -> LaunchBucket:
    """The calls a kernel variant runs at, over the input dims that hold its symbols."""
    dims = tuple(symbol_source(ir, s) for s in bucket.count.factors)
    return LaunchBucket(bucket.count.coefficient, dims, bucket.low, bucket.high)


def _grid(ir: Graph, grid: DynamicGrid) -> GridExtent:
    """The launch's grid over the input dims that hold its symbols in a call."""
    dims = tuple(symbol_source(ir, s) for s in grid.count.factors)
    times = tuple(symbol_source(ir, s) for s in grid.times)
    return GridExtent(grid.count.coefficient, dims, grid.per_block, grid.cap, grid.grid_axis, grid.multiplier, times)


def _tensor_map(ir: Graph, param: Any) -> TensorMap | None:
    """A parameter's tensor map, its symbolic sizes over the input dims that hold their symbols."""
    tensor_map: TensorMap | None = param.tensor_map
    if tensor_map is None or not param.map_sizes:
        return tensor_map
    symbolic = tuple(
        (position, CallExtent(size.coefficient, tuple(symbol_source(ir, s) for s in size.factors)))
        for position, size in enumerate(param.map_sizes)
        if isinstance(size, Sym)
    )
    return dataclasses.replace(tensor_map, symbolic=symbolic)
