"""Binding a GPU plan to a variant pack: check every buffer, allocate what is missing, pack.

Everything that can be decided before the first launch is decided here, once: the
device (where the buffers are), a dynamic graph's symbols (read from the buffers' shapes
and checked against their ranges: the buffers are then checked against the static graph of
those values, and the grids and EXTENT arguments computed from them), each buffer against
its graph tensor (FeedError naming it), the order of the launches and the inputs to copy
when outputs share memory with inputs (:mod:`.schedule`) or when a TMA tensor map cannot
start at their address, the workspace, the loaded kernels and every kernel's parameter slots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ..arch import arch_name, runs_on
from ..errors import FeedError, UnsupportedError
from ..ir import Graph, Tensor
from ..program import TENSOR_MAP_ALIGNMENT, WORKSPACE_ALIGNMENT, ArgKind, DimRef, Launch, LaunchProgram
from ..specialize import concrete_tensor, symbol_values
from ..variant_pack import resolve, scalar_value
from . import buffers, driver, frameworks, nvtx_ranges
from .device_array import DeviceMemory
from .launch import AnnotatedBoundPlan, BoundPlan, Copy, pack_arguments
from .modules import LoadedKernel
from .overlap import View, overlap
from .schedule import schedule

B = TypeVar("B", bound=BoundPlan)


class Bindable(Protocol):
    """What binding needs of a compiled plan (:class:`graphdnn.plan.Plan` is one): the
    runtime sits below the plan and never imports it."""

    @property
    def graph(self) -> Graph: ...

    @property
    def arch(self) -> int: ...

    @property
    def program(self) -> LaunchProgram: ...

    @property
    def workspace_size(self) -> int: ...

    def loaded_kernels(self, device: driver.Device) -> list[LoadedKernel]: ...

    def default_workspace(self, device: driver.Device) -> int: ...


def bind(plan: Bindable, variant_pack: Mapping[Any, Any], workspace: Any, stream: Any) -> BoundPlan:
    nvtx = nvtx_ranges.ranges()
    if nvtx is None:
        return _bind(plan, variant_pack, workspace, stream, BoundPlan)
    with nvtx.annotate(f"bind {plan.graph.name}", domain=nvtx_ranges.DOMAIN):
        bound = _bind(plan, variant_pack, workspace, stream, AnnotatedBoundPlan)
    bound.annotate(nvtx, plan.graph.name)
    return bound


def _bind(plan: Bindable, variant_pack: Mapping[Any, Any], workspace: Any, stream: Any, kind: type[B]) -> B:
    pack = resolve(plan.graph, variant_pack)
    handle = driver.stream_handle(stream)
    driver.current_device()  # a context is current: pointer queries need one
    described = {tid: _describe(plan.graph.tensors[tid].name, value, handle) for tid, value in pack.buffers.items()}
    graph = plan.graph
    tensor, extents = concrete(graph, plan.program, {tid: b.shape for tid, b in described.items()})
    device = _device(plan, [b.device for b in described.values() if b.device is not None])
    outputs_written = {t.id for t in graph.outputs}
    for tid, buffer in described.items():
        buffers.check(tensor(tid), buffer, device.ordinal, written=tid in outputs_written)
    views = {
        tid: View(b.pointer, b.shape, b.strides, buffers.element_bytes(tensor(tid))) for tid, b in described.items()
    }
    names = {tid: graph.tensors[tid].name for tid in views}
    # A size bucket's variant runs only at the calls its bucket holds: exactly one of a fused node's.
    active = [i for i, launch in enumerate(plan.program.launches) if launch.runs_at(extents)]
    order = schedule(
        [plan.program.launches[i] for i in active], views, {t.id for t in graph.outputs if t.id in views}, names
    )
    library = frameworks.library_of(pack.buffers.values())
    allocated = {t.id: frameworks.allocate(tensor(t.id), device, library) for t in pack.missing_outputs}
    described.update({tid: _describe(graph.tensors[tid].name, value, handle) for tid, value in allocated.items()})

    base = _workspace(plan, workspace, device, handle, views, names)
    pointers = {tid: buffer.pointer for tid, buffer in described.items()}
    pointers.update({tid: base + offset for tid, offset in plan.program.intermediate_offsets().items()})
    # Inputs read from a copy of them as they were: for the kernels that read one after it is
    # written over, and for the TMA tensor maps that cannot start at its address.
    misaligned = _misaligned_map_operands(plan.program.launches, pointers)
    for tid in misaligned:
        if tid in order.copies:
            continue  # its copy is aligned
        if tid not in views or tid in outputs_written:
            raise FeedError(
                f"tensor '{names[tid]}' starts at {pointers[tid]:#x}; a kernel reads it through a TMA tensor map "
                f"after the plan writes it, which needs a {TENSOR_MAP_ALIGNMENT}-byte aligned buffer"
            )
    copies = []
    for tid in dict.fromkeys([*order.copies, *misaligned]):
        view = views[tid]
        copies.append(Copy(DeviceMemory(device, view.end - view.pointer), view.pointer))
        pointers[tid] = copies[-1].destination.pointer
    scalars = dict(pack.scalars)
    scalars.update({t.id: scalar_value(t, t.value) for t in graph.constants})
    positions = [active[i] for i in order.order]
    launches = [plan.program.launches[i].at(extents) for i in positions]
    kernels = plan.loaded_kernels(device)
    slots = [pack_arguments(launch, pointers, scalars, base, extents) for launch in launches]

    values = {**pack.buffers, **allocated}
    outputs = {t.name: values[t.id] for t in graph.outputs}
    keep_alive = [b.owner for b in described.values()] + [workspace, plan]  # the plan owns the default workspace
    return kind(device, handle, launches, [kernels[i] for i in positions], slots, outputs, keep_alive, copies)


def concrete(
    graph: Graph, program: LaunchProgram, shapes: Mapping[int, tuple[int, ...]]
) -> tuple[Callable[[int], Tensor], dict[DimRef, int]]:
    """This call's tensors, by id, and the extents its launches read (their grids and EXTENT
    arguments): a dynamic graph's symbols are read from the ``shapes`` of the buffers (by tensor
    id) and checked against their ranges (FeedError naming the tensor, the symbol and the range),
    and only the tensors a bind asks for are made static (its buffers': a few of the graph's); a
    static graph's tensors are its own, with no extents."""
    if not graph.is_dynamic:
        return graph.tensors.__getitem__, {}
    values = symbol_values(graph, shapes)
    made: dict[int, Tensor] = {}

    def tensor(tid: int) -> Tensor:
        if tid not in made:
            made[tid] = concrete_tensor(graph.tensors[tid], values)
        return made[tid]

    return tensor, {(t, axis): tensor(t).static_dim[axis] for t, axis in program.dim_refs}


def _misaligned_map_operands(launches: Sequence[Launch], pointers: Mapping[int, int]) -> list[int]:
    """Tensors that kernels read through TMA tensor maps from addresses TMA cannot take."""
    found = {
        a.tensor
        for launch in launches
        for a in launch.args
        if a.kind is ArgKind.TENSOR_MAP and a.tensor is not None and pointers[a.tensor] % TENSOR_MAP_ALIGNMENT
    }
    return sorted(found)


def _describe(name: str, value: Any, stream: int) -> buffers.Buffer:
    try:
        return buffers.describe(value, stream)
    except FeedError as error:
        raise error.located(tensor=name) from None


def _device(plan: Bindable, ordinals: list[int]) -> driver.Device:
    """The device of the first buffer (the checks hold the others to it), else the current one."""
    device = driver.device(ordinals[0]) if ordinals else driver.current_device()
    if not runs_on(plan.arch, device.arch):
        raise UnsupportedError(
            f"plan for graph '{plan.graph.name}' was compiled for {arch_name(plan.arch)}; cuda:{device.ordinal} "
            f"({device.name}) is {arch_name(device.arch)}: build it with arch=None (the current GPU) or "
            f"arch='{arch_name(device.arch)}'"
        )
    return device


def _workspace(
    plan: Bindable, workspace: Any, device: driver.Device, stream: int, views: dict[int, View], names: dict[int, str]
) -> int:
    """The workspace's device address (0 when the plan needs none); a caller's workspace
    may not share memory with a buffer of the pack."""
    if plan.workspace_size == 0:
        return 0
    if workspace is None:
        return plan.default_workspace(device)
    if isinstance(workspace, int) and not isinstance(workspace, bool):
        pointer = workspace  # a raw device pointer: the caller vouches for its size and device
    else:
        try:
            buffer = buffers.describe(workspace, stream)
        except FeedError as error:
            raise FeedError(f"workspace {error.reason}") from None
        if buffer.device != device.ordinal:
            raise FeedError(f"workspace is in {buffer.where}; the plan runs on cuda:{device.ordinal}")
        if any(s < 0 for s in buffer.strides):
            raise FeedError(f"workspace has strides {list(buffer.strides)}: it must run forward from its address")
        if buffer.readonly:
            raise FeedError("workspace is read-only (its exporter set the read-only flag); the plan writes it")
        if buffer.nbytes < plan.workspace_size:
            raise FeedError(f"workspace has {buffer.nbytes} bytes; the plan needs {plan.workspace_size}")
        pointer = buffer.pointer
    if pointer % WORKSPACE_ALIGNMENT:
        raise FeedError(f"workspace address {pointer:#x} is not {WORKSPACE_ALIGNMENT}-byte aligned")
    region = View(pointer, (plan.workspace_size,), (1,), 1)
    for tid, view in views.items():
        if overlap(region, view):
            raise FeedError(f"workspace [{pointer:#x}, {region.end:#x}) shares memory with tensor '{names[tid]}'")
    return pointer
