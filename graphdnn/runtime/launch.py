"""Kernel parameters packed once, launched many times.

Every kernel parameter is one or more 8-byte words (codegen.kernel), so a launch's parameters
are a NumPy array of uint64 slots (pointers, doubles by bit pattern, the aligned flag, tensor
maps) and a second array holding the address of each parameter's first slot: the ``void**``
that cuLaunchKernel takes as an int. :class:`BoundPlan` keeps both alive with the buffers
they point into.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..program import ArgKind, DimRef, Launch
from . import driver, graph_nodes, nvtx_ranges, tensor_map
from .device_array import DeviceMemory
from .modules import LoadedKernel


def pack_arguments(
    launch: Launch,
    pointers: Mapping[int, int],
    scalars: Mapping[int, float],
    workspace: int,
    extents: Mapping[DimRef, int] | None = None,
) -> np.ndarray:
    """The 8-byte parameter slots of ``launch``: ``pointers`` by tensor id (caller buffers and
    intermediates), ``scalars`` by tensor id, scratch at ``workspace`` + offset, tensor maps
    encoded from their tensor's pointer (or their scratch's address), a dynamic graph's symbols from the call's ``extents``.
    The aligned flag is 1 when every pointer of the launch is a multiple of the kernel's
    alignment (a tensor map takes any: runtime.tensor_map)."""
    starts = launch.slot_starts
    slots = np.zeros(starts[-1] if starts else 0, dtype=np.uint64)
    doubles = slots.view(np.float64)
    addresses = []
    flags = []
    for i, arg in zip(starts, launch.args):
        if arg.kind is ArgKind.TENSOR_MAP:
            assert arg.tensor_map is not None and (arg.tensor is None) != (arg.offset is None)
            address = pointers[arg.tensor] if arg.tensor is not None else workspace + arg.offset  # type: ignore[operator]
            slots[i : i + arg.words] = tensor_map.encode(arg.tensor_map, address)
        elif arg.kind is ArgKind.TENSOR:
            assert arg.tensor is not None
            addresses.append(pointers[arg.tensor])
            slots[i] = addresses[-1]
        elif arg.kind is ArgKind.SCRATCH:
            assert arg.offset is not None
            addresses.append(workspace + arg.offset)
            slots[i] = addresses[-1]
        elif arg.kind is ArgKind.SCALAR:
            assert arg.tensor is not None
            doubles[i] = scalars[arg.tensor]
        elif arg.kind is ArgKind.EXTENT:
            assert arg.tensor is not None and arg.axis is not None and extents is not None
            slots[i] = extents[(arg.tensor, arg.axis)]
        else:
            flags.append(i)
    aligned = all(address % launch.alignment == 0 for address in addresses)
    for i in flags:
        slots[i] = int(aligned)
    return slots


def slot_addresses(launch: Launch, slots: np.ndarray) -> np.ndarray:
    """The address of each parameter's first slot: the kernelParams array."""
    return np.uint64(slots.ctypes.data) + np.array(launch.slot_starts[:-1], dtype=np.uint64) * np.uint64(8)


@dataclass(frozen=True)
class Copy:
    """An input copied to memory of the bound plan before the first launch (runtime.schedule)."""

    destination: DeviceMemory
    source: int  # device address of the input's first byte; ``destination.nbytes`` bytes are copied


class BoundPlan:
    """A plan with its buffers, workspace and stream fixed: calling it launches the kernels.

    All checks and argument packing were done by ``Plan.bind``; a call is one
    ``cuLaunchKernel`` per kernel with the packed parameters, or one ``cuGraphLaunch`` of
    the captured launches (``cuda_graph=True``). The buffers' contents may change between
    calls; the buffers themselves must stay (they are referenced here, so they stay alive).
    ``outputs`` maps every output name to its array (allocated ones included). ``copies``
    run before the launches: inputs that an output is written over, read from the copy.
    """

    def __init__(
        self,
        device: driver.Device,
        stream: int,
        launches: Sequence[Launch],
        kernels: Sequence[LoadedKernel],
        slots: Sequence[np.ndarray],
        outputs: dict[str, Any],
        keep_alive: list[Any],
        copies: Sequence[Copy] = (),
    ) -> None:
        api = driver.api()
        self.device = device
        self.stream = stream
        self.outputs = outputs
        self.launches = tuple(launches)
        self._keep_alive = keep_alive
        self._slots = list(slots)
        self._addresses = [slot_addresses(launch, s) for launch, s in zip(self.launches, slots)]
        self._kernels = list(kernels)  # keeps the modules loaded
        self._context = device.context_handle
        self._get_current = api.cuCtxGetCurrent
        self._launch_kernel = api.cuLaunchKernel
        self._graph_launch = api.cuGraphLaunch
        self._copy = api.cuMemcpyDtoDAsync
        self.copies = tuple(copies)
        self._graph_exec: Any = None
        self._cu_stream = api.CUstream(stream)
        self._calls = [self._arguments(i, self._cu_stream) for i in range(len(self.launches))]

    def __call__(self) -> None:
        if int(self._get_current()[1]) != self._context:
            with self.device.current():
                self._run()
        else:
            self._run()

    def _run(self) -> None:
        if self._graph_exec is not None:
            self._launch_graph()
            return
        self._copy_inputs(self._cu_stream)
        launch = self._launch_kernel
        for i, arguments in enumerate(self._calls):
            status = launch(*arguments)[0]
            if status:
                self._failed(i, status)

    def _launch_graph(self) -> None:
        status = self._graph_launch(self._graph_exec, self._cu_stream)[0]
        if status:
            raise driver.CudaError(f"cuGraphLaunch failed: {driver.describe(driver.api(), status)}")

    def detached(self) -> BoundPlan:
        """The same launches holding none of the caller's buffers (runtime.bind_cache): valid
        whenever buffers with the same addresses and layouts are passed again. Not for a
        captured plan (the copy would share its CUDA graph)."""
        assert self._graph_exec is None
        bound = copy.copy(self)
        bound.outputs = {}
        bound._keep_alive = []
        return bound

    def _copy_inputs(self, stream: Any) -> None:
        for step in self.copies:
            status = self._copy(step.destination.pointer, step.source, step.destination.nbytes, stream)[0]
            if status:
                raise driver.CudaError(
                    f"cuMemcpyDtoDAsync of {step.destination.nbytes} bytes (an input an output is written over) "
                    f"failed: {driver.describe(driver.api(), status)}"
                )

    def launch_kernel(self, index: int) -> None:
        """Launch kernel ``index`` alone (for per-kernel timing; without ``copies``); its context must be current."""
        status = self._launch_kernel(*self._calls[index])[0]
        if status:
            self._failed(index, status)

    def synchronize(self) -> None:
        with self.device.current():
            driver.call(driver.api().cuStreamSynchronize, driver.api().CUstream(self.stream))

    def capture(self) -> None:
        """Record the launches into a CUDA graph; later calls replay it with one cuGraphLaunch."""
        api = driver.api()
        with self.device.current():
            graph = driver.call(api.cuGraphCreate, 0)
            try:
                self._record(graph)
                self._graph_exec = driver.call(api.cuGraphInstantiate, graph, 0)
            finally:
                driver.call(api.cuGraphDestroy, graph)

    def record_into(self, graph: int) -> None:
        """Add the launches to the caller's empty CUDA graph (``populate_cuda_graph``). The
        graph refers to this binding's buffers: keep it alive while the graph may run."""
        api = driver.api()
        with self.device.current():
            held = len(graph_nodes.nodes(api.CUgraph(graph)))
            if held:
                raise driver.CudaError(
                    f"populate_cuda_graph takes an empty CUDA graph; this one holds {held} nodes (populate a new "
                    "graph and add it to yours as a child graph node, as the cuDNN frontend does)"
                )
            self._record(api.CUgraph(graph))

    def update_graph(self, graph: int) -> None:
        """Replace the nodes that :meth:`record_into` put in ``graph`` (or its clone) by this
        binding's launches (``update_cuda_graph``): the same chain, in the same insertion
        order, so an instantiated graph takes it as an update of its child graph node."""
        api = driver.api()
        with self.device.current():
            cu_graph = api.CUgraph(graph)
            expected = ["memcpy"] * len(self.copies) + ["kernel"] * len(self._calls)
            for node in graph_nodes.chain(cu_graph, expected):
                driver.call(api.cuGraphDestroyNode, node)
            self._record(cu_graph)

    def _record(self, graph: Any) -> None:
        """Capture the input copies and the launches, in order, into ``graph``."""
        api = driver.api()
        capture_stream = driver.call(api.cuStreamCreate, int(api.CUstream_flags.CU_STREAM_NON_BLOCKING))
        try:
            calls = [(*arguments[:8], capture_stream, *arguments[9:]) for arguments in self._calls]
            driver.call(
                api.cuStreamBeginCaptureToGraph,
                capture_stream,
                graph,
                None,
                None,
                0,
                api.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            try:
                self._copy_inputs(capture_stream)
                for i, arguments in enumerate(calls):
                    status = self._launch_kernel(*arguments)[0]
                    if status:
                        self._failed(i, status)
            finally:
                driver.call(api.cuStreamEndCapture, capture_stream)
        finally:
            driver.call(api.cuStreamDestroy, capture_stream)

    def _arguments(self, index: int, stream: Any) -> tuple[Any, ...]:
        launch = self.launches[index]
        parameters = int(self._addresses[index].ctypes.data) if len(launch.args) else None
        return (
            self._kernels[index].function,
            *launch.grid,
            *launch.block,
            launch.shared_bytes,
            stream,
            parameters,
            0,
        )

    def _failed(self, index: int, status: Any) -> None:
        launch = self.launches[index]
        raise driver.CudaError(
            f"cuLaunchKernel of {launch.name} (grid {list(launch.grid)}, block {list(launch.block)}, "
            f"{launch.shared_bytes} bytes of shared memory) failed: {driver.describe(driver.api(), status)}"
        )

    def __del__(self) -> None:
        graph_exec = getattr(self, "_graph_exec", None)
        if graph_exec is None:
            return
        try:
            with self.device.current():
                driver.call(driver.api().cuGraphExecDestroy, graph_exec)
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        mode = "CUDA graph" if self._graph_exec is not None else f"{len(self.launches)} launches"
        return f"BoundPlan({mode} on cuda:{self.device.ordinal}, stream {self.stream:#x})"


class AnnotatedBoundPlan(BoundPlan):
    """A bound plan whose calls push NVTX ranges (runtime.nvtx_ranges): one named after the
    plan around the call, and one per kernel named after its fused node when the launches
    are issued one by one (a replayed CUDA graph is one range)."""

    def annotate(self, nvtx: ModuleType, plan_name: str) -> None:
        self._nvtx = nvtx
        self._range_name = plan_name

    def _run(self) -> None:
        annotate = self._nvtx.annotate
        with annotate(self._range_name, domain=nvtx_ranges.DOMAIN):
            if self._graph_exec is not None:
                self._launch_graph()
                return
            self._copy_inputs(self._cu_stream)
            launch = self._launch_kernel
            for i, arguments in enumerate(self._calls):
                with annotate(self.launches[i].name, domain=nvtx_ranges.DOMAIN):
                    status = launch(*arguments)[0]
                if status:
                    self._failed(i, status)
