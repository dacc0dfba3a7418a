"""``Plan``: a compiled graph: its kernels, workspace and tensor bindings, ready to execute.

``gd.compile(graph)`` (or ``graph.build()``) returns one. As in the cuDNN frontend,
``plan.execute(variant_pack, workspace=None, stream=None)`` runs it on the caller's
buffers and ``plan.bind(...)`` checks and packs everything once, returning a callable for
the hot path. The reference backend's plan (:mod:`graphdnn.reference_plan`) has the
same interface on NumPy arrays.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .arch import arch_name
from .ir import Graph, Tensor
from .program import ArgKind, GridExtent, LaunchBucket, LaunchProgram

if TYPE_CHECKING:
    from .cache.entries import KernelBinary
    from .runtime.device_array import DeviceMemory
    from .runtime.driver import Device
    from .runtime.launch import BoundPlan
    from .runtime.modules import LoadedKernel


@dataclass(frozen=True)
class Binding:
    """How one kernel parameter is filled at launch."""

    kind: ArgKind
    tensor: Tensor | None = None  # TENSOR, SCALAR, EXTENT
    workspace_offset: int | None = None  # SCRATCH, or TENSOR of an intermediate held in the workspace
    axis: int | None = None  # EXTENT: the dim of ``tensor`` whose value is passed

    def __str__(self) -> str:
        if self.kind is ArgKind.ALIGNED:
            return "aligned flag"
        if self.kind is ArgKind.EXTENT:
            assert self.tensor is not None and self.axis is not None
            return f"{self.tensor.dim[self.axis]} (dim {self.axis} of {self.tensor.name})"
        if self.kind is ArgKind.SCRATCH:
            return f"scratch at workspace+{self.workspace_offset}"
        assert self.tensor is not None
        if self.kind is ArgKind.SCALAR:
            return f"{self.tensor.name} (scalar)"
        where = f" at workspace+{self.workspace_offset}" if self.workspace_offset is not None else ""
        return f"{self.tensor.name}{where}"


@dataclass(frozen=True)
class PlanKernel:
    """A kernel of a plan: what it is, how it is launched and what each parameter is bound to."""

    name: str
    source: str
    grid: tuple[int, int, int]  # a dynamic graph's: at the symbols' maxima (see ``blocks``)
    block: tuple[int, int, int]
    shared_bytes: int
    params: tuple[Binding, ...]
    fused_index: int  # which fused node (in execution order) it belongs to
    alignment: int
    kernel_key: str  # names the cubin in the plan cache (content hash + target + compiler)
    content_hash: str  # sha256 of the source without its header comment
    cubin: bytes
    blocks: str | None = None  # a dynamic graph's grid, with the extent computed at each call
    bucket: str | None = None  # a size bucket's variant: the calls it runs at (``m in 1..527``)

    def __repr__(self) -> str:
        return f"PlanKernel({self.name} grid {list(self.grid)} block {list(self.block)} shared {self.shared_bytes})"


@dataclass(frozen=True)
class WorkspaceSlot:
    """A region of the workspace: an intermediate tensor, or a fused node's scratch buffer."""

    offset: int
    bytes: int
    tensor: Tensor | None
    scratch: str | None

    def __str__(self) -> str:
        what = f"tensor {self.tensor.name}" if self.tensor is not None else f"scratch {self.scratch}"
        return f"[{self.offset}, {self.offset + self.bytes}) {what}"


class PlanBase(abc.ABC):
    """What every backend's plan offers: tensor bindings, execute and bind."""

    backend: str

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """Tensors the caller must supply (including pass-by-value runtime scalars)."""
        return self.graph.inputs

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """Tensors the plan writes; the caller may supply them (written in place) or not (allocated)."""
        return self.graph.outputs

    @abc.abstractmethod
    def bind(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> Any:
        """Check the buffers once; return a callable that runs the plan on them."""

    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> dict[str, Any]:
        """Run the plan on the buffers of ``variant_pack``; returns every output by name
        (the caller's arrays, and new ones for outputs left out of the pack)."""
        bound = self.bind(variant_pack, workspace, stream)
        bound()
        return dict(bound.outputs)


class Plan(PlanBase):
    """A graph compiled for one GPU architecture."""

    backend = "gpu"

    def __init__(
        self,
        graph: Graph,
        arch: int,
        program: LaunchProgram,
        binaries: Mapping[str, KernelBinary],
        *,
        key: str | None,
        origin: str,
        compiled: int = 0,
        tuned_on: str | None = None,
    ) -> None:
        from .runtime.bind_cache import DYNAMIC_SIZE, SIZE, BindCache

        super().__init__(graph)
        self.arch = arch
        self.program = program
        self.key = key
        self.origin = origin  # "compiled", "memory cache" or "disk cache"
        self.compiled = compiled  # kernels this build compiled (the rest came from the cache)
        self.tuned_on = tuned_on  # the GPU its launch choices were timed on; None: heuristic choices
        self.binaries = dict(binaries)
        self._lock = threading.Lock()
        self._loaded: dict[int, list[LoadedKernel]] = {}
        self._workspaces: dict[int, DeviceMemory] = {}
        self._bound = BindCache(DYNAMIC_SIZE if graph.is_dynamic else SIZE)  # execute's recent bindings

    @property
    def arch_name(self) -> str:
        return arch_name(self.arch)

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace a call needs (intermediates and scratch, each 256-byte aligned); a
        dynamic graph's is laid out for its symbols' maxima, so one workspace serves every call."""
        return self.program.workspace_size

    @property
    def workspace(self) -> tuple[WorkspaceSlot, ...]:
        return tuple(
            WorkspaceSlot(b.offset, b.bytes, self.graph.tensors[b.tensor] if b.tensor is not None else None, b.scratch)
            for b in self.program.workspace
        )

    @property
    def kernels(self) -> tuple[PlanKernel, ...]:
        offsets = self.program.intermediate_offsets()
        kernels = []
        for launch in self.program.launches:
            binary = self.binaries[launch.kernel_key]
            params = tuple(
                Binding(
                    a.kind,
                    self.graph.tensors[a.tensor] if a.tensor is not None else None,
                    a.offset if a.kind is ArgKind.SCRATCH else offsets.get(a.tensor) if a.tensor is not None else None,
                    a.axis,
                )
                for a in launch.args
            )
            kernels.append(
                PlanKernel(
                    name=launch.name,
                    source=binary.source,
                    grid=launch.grid,
                    block=launch.block,
                    shared_bytes=launch.shared_bytes,
                    params=params,
                    fused_index=launch.fused_index,
                    alignment=launch.alignment,
                    kernel_key=launch.kernel_key,
                    content_hash=launch.content_hash,
                    cubin=binary.cubin,
                    blocks=self._blocks(launch.blocks, launch.grid) if launch.blocks is not None else None,
                    bucket=self._bucket(launch.bucket) if launch.bucket is not None else None,
                )
            )
        return tuple(kernels)

    def _bucket(self, bucket: LaunchBucket) -> str:
        """``rows in 1..511``: the calls a size bucket's variant runs at."""
        work = math.prod((self.graph.tensors[t].dim[axis] for t, axis in bucket.dims), start=bucket.coefficient)
        return f"{work} in {bucket.low}..{bucket.high}"

    def _blocks(self, grid: GridExtent, at_maxima: tuple[int, int, int]) -> str:
        """``[min(ceil(4*batch / 128), 65535), 1, 1]``: a dynamic grid over the graph's symbols."""
        work = math.prod((self.graph.tensors[t].dim[axis] for t, axis in grid.dims), start=grid.coefficient)
        extent = f"ceil({work} / {grid.divisor})" if grid.divisor > 1 else str(work)
        extent += f" * {grid.multiplier}" if grid.multiplier > 1 else ""
        extent += "".join(f" * {self.graph.tensors[t].dim[axis]}" for t, axis in grid.times)
        shape = [str(n) for n in at_maxima]
        shape[grid.grid_axis] = f"min({extent}, {grid.cap})"
        return f"[{', '.join(shape)}]"

    def bind(
        self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None, *, cuda_graph: bool = False
    ) -> BoundPlan:
        """Check and pack everything once; the returned callable launches the kernels.

        ``cuda_graph=True`` records the launches into a CUDA graph replayed with one
        ``cuGraphLaunch`` per call (worth it for plans of several kernels).
        """
        from .runtime.bind import bind

        bound = bind(self, variant_pack, workspace, stream)
        if cuda_graph:
            bound.capture()
        return bound

    def execute(self, variant_pack: Mapping[Any, Any], workspace: Any = None, stream: Any = None) -> dict[str, Any]:
        """Run the plan on the buffers of ``variant_pack``; returns every output by name.

        A pack whose buffers have the addresses, dims, strides and data types of one bound
        recently (the same tensors, or new ones in the same memory) reuses that binding:
        each check holds as it did then (runtime.bind_cache)."""
        key, entry = self._bound.lookup(variant_pack, workspace, stream)
        if entry is not None:
            entry.bound()
            return {name: variant_pack[pack_key] for name, pack_key in entry.outputs}
        bound = self.bind(variant_pack, workspace, stream)
        bound()
        if key is not None:
            self._bound.put(key, bound, variant_pack)
        return dict(bound.outputs)

    def loaded_kernels(self, device: Device) -> list[LoadedKernel]:
        """This plan's kernels loaded on ``device``, one per launch (loaded on first use)."""
        from .runtime import modules

        with self._lock:
            if device.ordinal not in self._loaded:
                self._loaded[device.ordinal] = [
                    modules.load(
                        device,
                        launch.kernel_key,
                        launch.name,
                        self.binaries[launch.kernel_key].cubin,
                        launch.shared_bytes,
                    )
                    for launch in self.program.launches
                ]
            return self._loaded[device.ordinal]

    def default_workspace(self, device: Device) -> int:
        """The plan's own workspace on ``device``: used by every call that passes none, so
        calls that overlap on different streams must pass their own."""
        from .runtime.device_array import DeviceMemory

        with self._lock:
            if device.ordinal not in self._workspaces:
                self._workspaces[device.ordinal] = DeviceMemory(device, self.workspace_size)
            return self._workspaces[device.ordinal].pointer

    def describe(self) -> str:
        """The plan: origin, kernels with launch shapes and bindings, workspace layout."""
        key = f"key {self.key[:16]}…" if self.key else "not cached"
        tuning = f"tuned on {self.tuned_on}" if self.tuned_on else "heuristic launch choices"
        lines = [
            f"plan for graph '{self.graph.name}' on {self.arch_name} ({self.origin}, {key}, {tuning}): "
            f"{len(self.program.launches)} kernel launches, workspace {self.workspace_size} bytes"
        ]
        for kernel in self.kernels:
            grid = kernel.blocks if kernel.blocks is not None else str(list(kernel.grid))
            when = f"  when {kernel.bucket}" if kernel.bucket is not None else ""
            lines.append(f"  {kernel.name}  grid {grid} block {list(kernel.block)} shared {kernel.shared_bytes}{when}")
            lines.append(f"    ({', '.join(str(p) for p in kernel.params)})")
        lines.extend(f"  workspace {slot}" for slot in self.workspace)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Plan('{self.graph.name}' {self.arch_name}, {len(self.program.launches)} kernels, {self.origin})"
