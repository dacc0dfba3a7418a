"""What a GPU plan runs: kernel launches with their argument bindings and the workspace layout.

A :class:`LaunchProgram` is plain data: tensors are named by id, workspace buffers by byte
offset, kernels by the key of their cubin. It is what the plan cache stores, with the
ids replaced by positions in the graph's canonical form (:meth:`LaunchProgram.relabel`), so
that a graph declared with other names or in another order finds the same entry.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

WORKSPACE_ALIGNMENT = 256  # bytes; every workspace buffer starts on such a boundary


TENSOR_MAP_WORDS = 16  # a CUtensorMap: 128 bytes, 64-byte aligned
TENSOR_MAP_ALIGNMENT = 16  # bytes: TMA needs the tensor's address (and strides) in 16-byte steps
TENSOR_MAP_SWIZZLES = (0, 32, 64, 128)  # bytes; 0: none
MAX_TENSOR_MAP_RANK = 5


# im2col maps (cuTensorMapEncodeIm2col): by tensor rank, the bounding box corners' range and the
# largest im2col offset (a filter tap's dilated position) an instruction can carry
IM2COL_CORNERS = {3: 2**15, 4: 2**7, 5: 2**4}  # corners lie in [-c, c - 1]
IM2COL_OFFSETS = {3: 2**16 - 1, 4: 2**8 - 1, 5: 2**5 - 1}
MAX_TRAVERSAL_STRIDE = 8


@dataclass(frozen=True)
class Im2colWindow:
    """What makes a tensor map an im2col one: over the spatial dims (innermost first, as the map's
    dims), the bounding box of the filter window's first tap, as offsets from the tensor's first
    pixel (``lower``) and from its last (``upper``), and the convolution's strides, which the copy
    steps by (the driver's traversal strides)."""

    lower: tuple[int, ...]
    upper: tuple[int, ...]
    strides: tuple[int, ...]

    def to_json(self) -> list[Any]:
        return [list(self.lower), list(self.upper), list(self.strides)]

    @classmethod
    def from_json(cls, value: list[Any]) -> Im2colWindow:
        lower, upper, strides = value
        return cls(tuple(map(int, lower)), tuple(map(int, upper)), tuple(map(int, strides)))

    def problems(self, rank: int) -> list[str]:
        """What cuTensorMapEncodeIm2col would refuse in a map of ``rank`` dims."""
        spatial = rank - 2
        if rank not in IM2COL_CORNERS or not len(self.lower) == len(self.upper) == len(self.strides) == spatial:
            return [f"an im2col window {self.to_json()} for rank {rank} (3 to 5, one entry per spatial dim)"]
        corner = IM2COL_CORNERS[rank]
        found = []
        if any(not -corner <= c < corner for c in (*self.lower, *self.upper)):
            found.append(f"im2col corners {list(self.lower)}, {list(self.upper)} (within [{-corner}, {corner - 1}])")
        if any(not 1 <= s <= MAX_TRAVERSAL_STRIDE for s in self.strides):
            found.append(f"im2col strides {list(self.strides)} (1 to {MAX_TRAVERSAL_STRIDE})")
        return found


DimRef = tuple[int, int]  # (tensor id, axis): a whole dim that is one symbol, read from the call's buffers


@dataclass(frozen=True)
class CallExtent:
    """A size known at each call of a dynamic graph's plan: ``coefficient`` times the product
    of the call's values of ``dims`` (whole dims of inputs, each one symbol)."""

    coefficient: int
    dims: tuple[DimRef, ...]

    def value(self, extents: Mapping[DimRef, int]) -> int:
        return self.coefficient * math.prod(extents[d] for d in self.dims)

    def relabel(self, mapping: Mapping[int, int]) -> CallExtent:
        return CallExtent(self.coefficient, tuple((mapping[t], a) for t, a in self.dims))


@dataclass(frozen=True)
class TensorMap:
    """What is static about a TMA tensor map (the driver's encoding arguments but the address):
    dims innermost first, the byte strides of dims 1.., the box copied per load, the swizzle.
    A tiled map (cuTensorMapEncodeTiled) copies ``box``; an im2col one (``im2col`` set,
    cuTensorMapEncodeIm2col) copies ``box[0]`` channels of each of ``box[1]`` pixels.
    The address must be TENSOR_MAP_ALIGNMENT-aligned: binding copies an input that is not
    (runtime.bind).

    A dynamic graph's map may have sizes that depend on symbols: ``symbolic`` lists them as
    (position, value at each call), a position indexing ``dims + strides``; ``dims`` and
    ``strides`` then hold their values at the symbols' maxima. :meth:`at` resolves them from a
    call's extents (binding does, before encoding)."""

    element_bytes: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int
    im2col: Im2colWindow | None = None
    symbolic: tuple[tuple[int, CallExtent], ...] = ()

    @property
    def dim_refs(self) -> tuple[DimRef, ...]:
        return tuple(ref for _, size in self.symbolic for ref in size.dims)

    def at(self, extents: Mapping[DimRef, int]) -> TensorMap:
        """The map of one call: its symbolic sizes at the call's ``extents`` (a static map as it is)."""
        if not self.symbolic:
            return self
        sizes = [*self.dims, *self.strides]
        for position, size in self.symbolic:
            sizes[position] = size.value(extents)
        rank = len(self.dims)
        return dataclasses.replace(self, dims=tuple(sizes[:rank]), strides=tuple(sizes[rank:]), symbolic=())

    def relabel(self, mapping: Mapping[int, int]) -> TensorMap:
        symbolic = tuple((position, size.relabel(mapping)) for position, size in self.symbolic)
        return dataclasses.replace(self, symbolic=symbolic)

    def to_json(self) -> list[Any]:
        """``[element_bytes, dims, strides, box, swizzle]``, then, where there are any, an object of
        the im2col window (``"im2col"``) and the symbolic sizes (``"symbolic"``, each
        ``[position, coefficient, [[tensor, axis], ...]]``)."""
        value: list[Any] = [self.element_bytes, list(self.dims), list(self.strides), list(self.box), self.swizzle]
        extra: dict[str, Any] = {}
        if self.im2col is not None:
            extra["im2col"] = self.im2col.to_json()
        if self.symbolic:
            extra["symbolic"] = [[p, s.coefficient, [list(d) for d in s.dims]] for p, s in self.symbolic]
        return [*value, extra] if extra else value

    @classmethod
    def from_json(cls, value: list[Any]) -> TensorMap:
        element_bytes, dims, strides, box, swizzle, *rest = value
        extra = rest[0] if rest else {}
        if not isinstance(extra, dict) or set(extra) - {"im2col", "symbolic"}:
            raise ValueError(f"a tensor map's sixth field is an object of 'im2col' and 'symbolic', not {extra!r}")
        window = extra.get("im2col")
        symbolic = tuple(
            (int(p), CallExtent(int(c), tuple((int(t), int(a)) for t, a in refs)))
            for p, c, refs in extra.get("symbolic", ())
        )
        return cls(
            int(element_bytes),
            tuple(map(int, dims)),
            tuple(map(int, strides)),
            tuple(map(int, box)),
            int(swizzle),
            None if window is None else Im2colWindow.from_json(window),
            symbolic,
        )

    def problems(self) -> list[str]:
        """What the driver would refuse (cuTensorMapEncodeTiled's or cuTensorMapEncodeIm2col's
        rules), for checks of cache entries and of each call's map; a symbolic size that is not a
        size of the map."""
        rank = len(self.dims)
        found = []
        positions = [p for p, _ in self.symbolic]
        if any(not 0 <= p < 2 * rank - 1 for p in positions) or len(set(positions)) != len(positions):
            found.append(f"symbolic sizes at positions {positions}")
        if any(s.coefficient < 1 or not s.dims for _, s in self.symbolic):
            found.append("a symbolic size without a positive coefficient or a dim")
        if self.element_bytes not in (1, 2, 4, 8):
            found.append(f"element size {self.element_bytes}")
        box_rank = rank if self.im2col is None else 2
        if not 1 <= rank <= MAX_TENSOR_MAP_RANK or len(self.strides) != rank - 1 or len(self.box) != box_rank:
            found.append(f"rank {rank} with {len(self.strides)} strides and a box of rank {len(self.box)}")
        if any(not 1 <= d < 2**32 for d in self.dims):
            found.append(f"dims {list(self.dims)}")
        if any(s <= 0 or s % 16 or s >= 2**40 for s in self.strides):
            found.append(f"strides {list(self.strides)} (multiples of 16 bytes below 2^40)")
        longest = 256 if self.im2col is None else 1024  # the pixels of an im2col box: up to 1024
        if (
            any(not 1 <= b <= 256 for b in self.box[:1])
            or any(not 1 <= b <= longest for b in self.box[1:])
            or (self.box and self.box[0] * self.element_bytes % 16)
        ):
            found.append(f"box {list(self.box)}")
        if self.swizzle not in TENSOR_MAP_SWIZZLES or (
            self.swizzle and self.box and self.box[0] * self.element_bytes > self.swizzle
        ):
            found.append(f"swizzle {self.swizzle}")
        return found + (self.im2col.problems(rank) if self.im2col is not None else [])


class ArgKind(enum.Enum):
    """How the runtime fills one kernel parameter (codegen.ParamKind, by value)."""

    TENSOR = "tensor"  # device pointer of a graph tensor (caller's buffer, or an intermediate in the workspace)
    SCALAR = "scalar"  # a pass-by-value scalar as a double
    SCRATCH = "scratch"  # device pointer into the workspace, at ``offset``
    ALIGNED = "aligned"  # 1 when every pointer of the launch is aligned to the kernel's alignment
    TENSOR_MAP = "tensor_map"  # a TMA tensor map of a tensor, encoded at bind time (TENSOR_MAP_WORDS words)
    EXTENT = "extent"  # a dynamic graph's symbol value in this call, as a 64-bit integer: dim ``axis`` of ``tensor``


@dataclass(frozen=True)
class Arg:
    kind: ArgKind
    tensor: int | None = None  # tensor id (TENSOR, SCALAR, TENSOR_MAP, EXTENT: an input holding the symbol)
    offset: int | None = None  # workspace byte offset (SCRATCH, or a TENSOR_MAP of scratch: no tensor)
    tensor_map: TensorMap | None = None  # TENSOR_MAP
    axis: int | None = None  # EXTENT: the dim of ``tensor`` that is the symbol

    @property
    def words(self) -> int:
        """8-byte words the parameter takes."""
        return TENSOR_MAP_WORDS if self.kind is ArgKind.TENSOR_MAP else 1

    @property
    def reads_memory(self) -> bool:
        """The kernel reaches the tensor's memory through this parameter (a pointer or a tensor map)."""
        return self.kind in (ArgKind.TENSOR, ArgKind.TENSOR_MAP)

    def to_json(self) -> list[Any]:
        """``[kind, tensor, offset]``, then the tensor map (TENSOR_MAP) or the axis (EXTENT)."""
        base = [self.kind.value, self.tensor, self.offset]
        if self.kind is ArgKind.EXTENT:
            return [*base, self.axis]
        return base if self.tensor_map is None else [*base, self.tensor_map.to_json()]

    @classmethod
    def from_json(cls, value: list[Any]) -> Arg:
        kind, tensor, offset, *rest = value
        if ArgKind(kind) is ArgKind.EXTENT:
            return cls(ArgKind.EXTENT, tensor, offset, axis=rest[0] if rest else None)
        return cls(ArgKind(kind), tensor, offset, TensorMap.from_json(rest[0]) if rest else None)


@dataclass(frozen=True)
class GridExtent:
    """A grid extent computed at each call of a dynamic graph's plan: ``ceil(coefficient *
    the product of the dims / divisor) * multiplier * the product of the times`` blocks, at
    least 1 and at most ``cap`` (kernels walk the rest with a grid-stride loop), along
    ``grid_axis`` (0: x; 2: z, a batched matmul's batch). The dims and times are whole dims of
    inputs, each one symbol. ``multiplier``: a persistent GEMM's tiles are ``ceil(M / BM)`` tile
    rows times its tile columns and K slices; ``times``: an attention prefill's blocks are
    ``ceil(Sq / rows)`` row blocks times its heads and its batch."""

    coefficient: int
    dims: tuple[DimRef, ...]
    divisor: int
    cap: int
    grid_axis: int = 0
    multiplier: int = 1
    times: tuple[DimRef, ...] = ()

    def blocks(self, extents: Mapping[DimRef, int]) -> int:
        work = self.coefficient * math.prod(extents[d] for d in self.dims)
        scale = self.multiplier * math.prod(extents[d] for d in self.times)
        return min(max(1, -(-work // self.divisor)) * scale, self.cap)

    def relabel(self, mapping: Mapping[int, int]) -> GridExtent:
        dims = tuple((mapping[t], a) for t, a in self.dims)
        return dataclasses.replace(self, dims=dims, times=tuple((mapping[t], a) for t, a in self.times))

    def to_json(self) -> dict[str, Any]:
        dims = [list(d) for d in self.dims]
        value: dict[str, Any] = {
            "coefficient": self.coefficient,
            "dims": dims,
            "divisor": self.divisor,
            "cap": self.cap,
        }
        # x and a multiplier of 1: written as before the fields existed
        if self.grid_axis != 0:
            value["grid_axis"] = self.grid_axis
        if self.multiplier != 1:
            value["multiplier"] = self.multiplier
        if self.times:
            value["times"] = [list(d) for d in self.times]
        return value

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> GridExtent:
        dims = tuple((int(t), int(a)) for t, a in value["dims"])
        grid_axis, multiplier = int(value.get("grid_axis", 0)), int(value.get("multiplier", 1))
        times = tuple((int(t), int(a)) for t, a in value.get("times", ()))
        return cls(
            int(value["coefficient"]), dims, int(value["divisor"]), int(value["cap"]), grid_axis, multiplier, times
        )


@dataclass(frozen=True)
class LaunchBucket:
    """The calls a launch of a dynamic graph's plan runs at, when its fused node has a variant
    per size bucket (codegen.buckets): ``low <= coefficient * the product of the dims <= high``.
    The variants of a fused node cover its range without overlap, so exactly one runs."""

    coefficient: int
    dims: tuple[DimRef, ...]
    low: int
    high: int

    def holds(self, extents: Mapping[DimRef, int]) -> bool:
        return self.low <= self.coefficient * math.prod(extents[d] for d in self.dims) <= self.high

    def relabel(self, mapping: Mapping[int, int]) -> LaunchBucket:
        return LaunchBucket(self.coefficient, tuple((mapping[t], a) for t, a in self.dims), self.low, self.high)

    def to_json(self) -> dict[str, Any]:
        dims = [list(d) for d in self.dims]
        return {"coefficient": self.coefficient, "dims": dims, "low": self.low, "high": self.high}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> LaunchBucket:
        dims = tuple((int(t), int(a)) for t, a in value["dims"])
        return cls(int(value["coefficient"]), dims, int(value["low"]), int(value["high"]))


@dataclass(frozen=True)
class Launch:
    """One kernel launch: which cubin, its launch shape and how each parameter is filled."""

    name: str  # the extern "C" entry point
    kernel_key: str  # the compiled kernel (cubin) in the plan cache; see graphdnn.cache.key
    content_hash: str  # sha256 of the kernel source without its header comment
    fused_index: int  # position of the fused node (in execution order) this kernel belongs to
    grid: tuple[int, int, int]  # with ``blocks``: the grid at the symbols' maxima
    block: tuple[int, int, int]
    shared_bytes: int
    alignment: int  # bytes the ALIGNED flag checks
    args: tuple[Arg, ...]
    # Each thread reads the elements at an output position, then writes that position, and
    # nothing else: safe in place when an output is the same view as an input (see runtime.schedule).
    elementwise: bool = False
    blocks: GridExtent | None = None  # a dynamic graph's kernel: grid x computed at each call
    bucket: LaunchBucket | None = None  # one size bucket's variant: runs at the calls it holds

    def runs_at(self, extents: Mapping[DimRef, int]) -> bool:
        """Whether this call launches it: always, but a size bucket's variant outside its bucket."""
        return self.bucket is None or self.bucket.holds(extents)

    def at(self, extents: Mapping[DimRef, int]) -> Launch:
        """The launch for one call: its dynamic grid extent and its tensor maps' symbolic sizes
        computed from the call's ``extents`` (a static launch as it is)."""
        if self.blocks is None and not any(a.tensor_map is not None and a.tensor_map.symbolic for a in self.args):
            return self
        grid = list(self.grid)
        if self.blocks is not None:
            grid[self.blocks.grid_axis] = self.blocks.blocks(extents)
        args = tuple(
            dataclasses.replace(a, tensor_map=a.tensor_map.at(extents)) if a.tensor_map is not None else a
            for a in self.args
        )
        return dataclasses.replace(self, grid=(grid[0], grid[1], grid[2]), args=args)

    @property
    def dim_refs(self) -> tuple[DimRef, ...]:
        """The dims of the call this launch reads: its grid's, its extent arguments' and its
        tensor maps'."""
        refs = [(a.tensor, a.axis) for a in self.args if a.kind is ArgKind.EXTENT]
        refs += [ref for a in self.args if a.tensor_map is not None for ref in a.tensor_map.dim_refs]
        refs += [*self.blocks.dims, *self.blocks.times] if self.blocks is not None else []
        refs += list(self.bucket.dims) if self.bucket is not None else []
        return tuple(dict.fromkeys((t, x) for t, x in refs if t is not None and x is not None))

    @property
    def slot_starts(self) -> tuple[int, ...]:
        """The first 8-byte slot of each parameter, then the total: where packing puts them."""
        starts = [0]
        for arg in self.args:
            starts.append(starts[-1] + arg.words)
        return tuple(starts)

    @property
    def parameter_bytes(self) -> int:
        return 8 * self.slot_starts[-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kernel_key": self.kernel_key,
            "content_hash": self.content_hash,
            "fused_index": self.fused_index,
            "grid": list(self.grid),
            "block": list(self.block),
            "shared_bytes": self.shared_bytes,
            "alignment": self.alignment,
            "args": [a.to_json() for a in self.args],
            "elementwise": self.elementwise,
            **({"blocks": self.blocks.to_json()} if self.blocks is not None else {}),
            **({"bucket": self.bucket.to_json()} if self.bucket is not None else {}),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Launch:
        grid, block = value["grid"], value["block"]
        return cls(
            name=str(value["name"]),
            kernel_key=str(value["kernel_key"]),
            content_hash=str(value["content_hash"]),
            fused_index=int(value["fused_index"]),
            grid=(int(grid[0]), int(grid[1]), int(grid[2])),
            block=(int(block[0]), int(block[1]), int(block[2])),
            shared_bytes=int(value["shared_bytes"]),
            alignment=int(value["alignment"]),
            args=tuple(Arg.from_json(a) for a in value["args"]),
            elementwise=bool(value.get("elementwise", False)),  # absent in older cache entries: copy, never race
            blocks=GridExtent.from_json(value["blocks"]) if "blocks" in value else None,
            bucket=LaunchBucket.from_json(value["bucket"]) if "bucket" in value else None,
        )


@dataclass(frozen=True)
class WorkspaceBuffer:
    """A region of the workspace: a materialized intermediate tensor or a fused node's scratch."""

    offset: int
    bytes: int
    tensor: int | None = None  # tensor id of an intermediate
    scratch: str | None = None  # scratch name (of fused node ``fused_index``)
    fused_index: int | None = None

    def to_json(self) -> list[Any]:
        return [self.offset, self.bytes, self.tensor, self.scratch, self.fused_index]

    @classmethod
    def from_json(cls, value: list[Any]) -> WorkspaceBuffer:
        offset, size, tensor, scratch, fused_index = value
        return cls(int(offset), int(size), tensor, scratch, fused_index)


@dataclass(frozen=True)
class LaunchProgram:
    """The launches of a plan in execution order, its workspace and the tuning it was emitted with."""

    launches: tuple[Launch, ...]
    workspace: tuple[WorkspaceBuffer, ...]
    workspace_size: int
    tuning: tuple[dict[str, Any], ...]  # per fused node, in execution order: the family's launch choices

    @cached_property
    def dim_refs(self) -> tuple[DimRef, ...]:
        """The dims of a call that its launches read (none for a static graph's program): what a
        dynamic plan's bind evaluates at each call."""
        return tuple(dict.fromkeys(ref for launch in self.launches for ref in launch.dim_refs))

    @property
    def kernel_keys(self) -> tuple[str, ...]:
        """Distinct compiled kernels, in first-use order."""
        return tuple(dict.fromkeys(launch.kernel_key for launch in self.launches))

    def intermediate_offsets(self) -> dict[int, int]:
        return {b.tensor: b.offset for b in self.workspace if b.tensor is not None}

    def relabel(self, mapping: Mapping[int, int]) -> LaunchProgram:
        """The same program with every tensor id replaced through ``mapping``."""

        def arg(a: Arg) -> Arg:
            if a.tensor is None:
                return a
            tensor_map = a.tensor_map.relabel(mapping) if a.tensor_map is not None else None
            return dataclasses.replace(a, tensor=mapping[a.tensor], tensor_map=tensor_map)

        def buffer(b: WorkspaceBuffer) -> WorkspaceBuffer:
            if b.tensor is None:
                return b
            return WorkspaceBuffer(b.offset, b.bytes, mapping[b.tensor], b.scratch, b.fused_index)

        launches = tuple(
            dataclasses.replace(
                launch,
                args=tuple(arg(a) for a in launch.args),
                blocks=launch.blocks.relabel(mapping) if launch.blocks is not None else None,
                bucket=launch.bucket.relabel(mapping) if launch.bucket is not None else None,
            )
            for launch in self.launches
        )
        return LaunchProgram(launches, tuple(buffer(b) for b in self.workspace), self.workspace_size, self.tuning)

    def to_json(self) -> dict[str, Any]:
        return {
            "launches": [launch.to_json() for launch in self.launches],
            "workspace": [b.to_json() for b in self.workspace],
            "workspace_size": self.workspace_size,
            "tuning": list(self.tuning),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> LaunchProgram:
        return cls(
            launches=tuple(Launch.from_json(launch) for launch in value["launches"]),
            workspace=tuple(WorkspaceBuffer.from_json(b) for b in value["workspace"]),
            workspace_size=int(value["workspace_size"]),
            tuning=tuple(dict(t) for t in value["tuning"]),
        )


def align(offset: int, alignment: int = WORKSPACE_ALIGNMENT) -> int:
    return -(-offset // alignment) * alignment
