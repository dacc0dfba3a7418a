"""What a cache entry must satisfy, beyond its checksum, before anything in it is used.

A checksum proves an entry was not damaged, not that graphdnn wrote it: anyone who can
write the cache directory can seal any content. Every decoded field is therefore checked
against what graphdnn itself could have produced (keys are SHA-256 hex, a launch's kernel
key is derived from its content hash, launch shapes are within the CUDA limits of the
target, workspace buffers lie inside the workspace, each cubin exports its entry point
and takes as many argument bytes as the launch passes, each argument names a tensor of
the graph in the role it can play, each runtime extent and dynamic grid reads a dim of an
input that is one symbol). An entry that fails
raises :class:`EntryError` and is treated as a miss. The cubin's machine code itself is
trusted: the cache directory must be as trusted as the code (docs/plan-cache.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from codegen.cubin import CubinError, exports, parameter_bytes

from ..layout import largest_storage_extent
from ..program import ArgKind, DimRef, GridExtent, LaunchBucket, LaunchProgram
from ..symbolic import Sym
from .container import EntryError
from .entries import KernelBinary, PlanEntry

if TYPE_CHECKING:
    from ..ir import Tensor

KEY = re.compile(r"[0-9a-f]{64}")
ARCH = re.compile(r"sm_(\d{2,3})a?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,1023}")

# CUDA launch limits (CUDA C++ Programming Guide, "Compute capabilities" table), the same
# for every architecture graphdnn targets: grid x < 2^31, grid y and z < 2^16, a block of
# at most 1024 threads with z <= 64.
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
# The most dynamic shared memory a block may opt into, per architecture (same table);
# an architecture not listed gets the largest of them.
MAX_SHARED_OPT_IN = {
    70: 96 * 1024,
    72: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    103: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}
MAX_ALIGNMENT = 4096


def trusted_kernel(data: bytes, kernel_key: str) -> KernelBinary:
    """The kernel entry ``data``, decoded and checked (:func:`check_kernel`); EntryError if
    it cannot be used."""
    binary = KernelBinary.decode(data, kernel_key)
    check_kernel(binary)
    return binary


def trusted_plan(data: bytes, key: str) -> PlanEntry:
    """The plan entry ``data``, decoded and checked on its own (:func:`check_plan`);
    EntryError if it cannot be used. Its kernels and the graph that looks it up are checked
    by the caller (:func:`check_kernels`, :func:`check_binding`)."""
    entry = PlanEntry.decode(data, key)
    check_plan(entry)
    return entry


def check_kernel(binary: KernelBinary) -> None:
    """A kernel entry: well-formed key, name and target, and a cubin that exports its name."""
    if not KEY.fullmatch(binary.kernel_key) or not KEY.fullmatch(binary.content_hash):
        raise EntryError("kernel key or content hash is not a SHA-256 hex digest")
    if not _IDENTIFIER.fullmatch(binary.name):
        raise EntryError(f"entry point {binary.name[:64]!r} is not a C identifier")
    if not ARCH.fullmatch(binary.arch):
        raise EntryError(f"target {binary.arch[:16]!r} is not an sm_XY architecture")
    if not exports(binary.cubin, binary.name):
        raise EntryError(f"the cubin does not export its entry point '{binary.name}'")


def check_plan(entry: PlanEntry) -> None:
    """A plan entry on its own: kernel keys derived from its fields, launch shapes within the
    target's limits, workspace buffers inside the workspace, scratch arguments on a buffer."""
    found = ARCH.fullmatch(entry.fields.arch)
    if found is None:
        raise EntryError(f"target {entry.fields.arch[:16]!r} is not an sm_XY architecture")
    max_shared = MAX_SHARED_OPT_IN.get(int(found.group(1)), max(MAX_SHARED_OPT_IN.values()))
    program = entry.program
    size = _count(program.workspace_size, "workspace size")
    for b in program.workspace:
        offset, nbytes = _count(b.offset, "workspace offset"), _count(b.bytes, "workspace buffer size")
        if offset + nbytes > size:
            raise EntryError(f"workspace buffer [{offset}, {offset + nbytes}) lies outside the workspace of {size} B")
        if (b.tensor is None) == (b.scratch is None):
            raise EntryError("a workspace buffer must hold exactly one of a tensor and a scratch buffer")
        if b.tensor is not None:
            _count(b.tensor, "workspace tensor position")
        elif not isinstance(b.scratch, str) or not isinstance(b.fused_index, int):
            raise EntryError("a scratch buffer needs a name and a fused-node index")
    scratch = {b.offset for b in program.workspace if b.scratch is not None}
    for number, launch in enumerate(program.launches):
        where = f"launch {number}"
        if not KEY.fullmatch(launch.kernel_key) or launch.kernel_key != entry.fields.kernel_key(launch.content_hash):
            raise EntryError(
                f"{where}: kernel key {launch.kernel_key[:16]!r} does not belong to its content and target"
            )
        if not _IDENTIFIER.fullmatch(launch.name):
            raise EntryError(f"{where}: entry point {launch.name[:64]!r} is not a C identifier")
        _count(launch.fused_index, f"{where}: fused-node index")
        _launch_shape(launch.grid, launch.block, launch.shared_bytes, max_shared, where)
        if launch.blocks is not None:
            _grid_extent(launch.blocks, where)
        if launch.bucket is not None:
            _bucket(launch.bucket, where)
        if not 1 <= launch.alignment <= MAX_ALIGNMENT or launch.alignment & (launch.alignment - 1):
            raise EntryError(f"{where}: alignment {launch.alignment} is not a power of two up to {MAX_ALIGNMENT}")
        for arg in launch.args:
            if arg.kind is ArgKind.SCRATCH:
                if arg.tensor is not None or _count(arg.offset, f"{where}: scratch offset") not in scratch:
                    raise EntryError(f"{where}: a scratch argument at offset {arg.offset!r} names no scratch buffer")
            elif arg.kind is ArgKind.ALIGNED:
                if arg.tensor is not None or arg.offset is not None:
                    raise EntryError(f"{where}: the aligned flag carries a tensor or an offset")
            elif arg.kind is ArgKind.EXTENT:
                if arg.offset is not None or arg.tensor_map is not None:
                    raise EntryError(f"{where}: an extent argument carries a workspace offset or a tensor map")
                _count(arg.tensor, f"{where}: extent tensor position")
                _count(arg.axis, f"{where}: extent axis")
            elif (arg.kind is ArgKind.TENSOR_MAP) != (arg.tensor_map is not None):
                raise EntryError(
                    f"{where}: a {arg.kind.value} argument with{'out' if arg.tensor_map is None else ''} a tensor map"
                )
            elif arg.tensor_map is not None and arg.tensor_map.problems():
                raise EntryError(f"{where}: a tensor map with {', '.join(arg.tensor_map.problems())}")
            elif arg.tensor_map is not None and arg.offset is not None:  # a map of scratch
                if arg.tensor is not None or _count(arg.offset, f"{where}: scratch offset") not in scratch:
                    raise EntryError(f"{where}: a scratch tensor map at offset {arg.offset!r} names no scratch buffer")
            elif arg.offset is not None:
                raise EntryError(f"{where}: a {arg.kind.value} argument carries a workspace offset")
            else:
                _count(arg.tensor, f"{where}: tensor position")


def check_kernels(entry: PlanEntry, kernels: Mapping[str, KernelBinary]) -> None:
    """The plan's launches against the kernels they run: same target, entry point and content,
    and as many 8-byte arguments as the cubin says the kernel takes."""
    for number, launch in enumerate(entry.program.launches):
        binary = kernels[launch.kernel_key]
        if binary.arch not in (entry.fields.arch, f"{entry.fields.arch}a"):
            raise EntryError(
                f"kernel {launch.kernel_key[:16]}… is built for {binary.arch}, the plan for {entry.fields.arch}"
            )
        if launch.name != binary.name or launch.content_hash != binary.content_hash:
            raise EntryError(
                f"launch of '{launch.name}' does not match kernel {launch.kernel_key[:16]}… ('{binary.name}')"
            )
        try:
            declared = parameter_bytes(binary.cubin, launch.name)
        except CubinError as error:
            raise EntryError(f"kernel {launch.kernel_key[:16]}…: {error}") from None
        if declared is not None and declared != launch.parameter_bytes:
            raise EntryError(
                f"launch {number}: its {len(launch.args)} arguments take {launch.parameter_bytes} bytes, "
                f"the kernel takes {declared} bytes"
            )


def check_binding(program: LaunchProgram, tensors: Sequence[Tensor]) -> None:
    """The program against the graph that looks it up (``tensors`` in canonical order): every
    argument names an existing tensor of the right kind, every intermediate it reads lives in
    a workspace buffer large enough to hold it."""
    buffers = {b.tensor: b.bytes for b in program.workspace if b.tensor is not None}
    for position, nbytes in buffers.items():
        if position >= len(tensors) or not tensors[position].is_virtual:
            raise EntryError(f"a workspace buffer holds tensor {position}, not an intermediate of this graph")
        t = tensors[position]
        if nbytes < largest_storage_extent(t.dim, t.stride) * t.data_type.itemsize:
            raise EntryError(f"the workspace buffer of tensor {position} ({nbytes} B) is smaller than the tensor")
    for number, launch in enumerate(program.launches):
        for ref in launch.dim_refs:
            _symbol_dim(ref, tensors, f"launch {number}")
        for arg in launch.args:
            if arg.tensor is None or arg.kind is ArgKind.EXTENT:
                continue
            if arg.tensor >= len(tensors):
                raise EntryError(f"launch {number}: argument names tensor {arg.tensor}; the graph has {len(tensors)}")
            t = tensors[arg.tensor]
            if (arg.kind is ArgKind.SCALAR) != t.is_pass_by_value:
                raise EntryError(f"launch {number}: tensor {arg.tensor} bound as a {arg.kind.value}")
            if t.is_virtual and arg.tensor not in buffers:
                raise EntryError(f"launch {number}: intermediate tensor {arg.tensor} has no workspace buffer")


def _bucket(bucket: LaunchBucket, where: str) -> None:
    """A size bucket: at least one dim, a positive coefficient, 1 <= low <= high."""
    if not bucket.dims:
        raise EntryError(f"{where}: a size bucket reads no dim")
    for t, axis in bucket.dims:
        _count(t, f"{where}: size bucket tensor position")
        _count(axis, f"{where}: size bucket axis")
    if _count(bucket.coefficient, f"{where}: size bucket coefficient") < 1:
        raise EntryError(f"{where}: size bucket coefficient {bucket.coefficient} is not positive")
    if not 1 <= _count(bucket.low, f"{where}: size bucket low") <= _count(bucket.high, f"{where}: size bucket high"):
        raise EntryError(f"{where}: size bucket {bucket.low}..{bucket.high} is empty or starts below 1")


def _grid_extent(grid: GridExtent, where: str) -> None:
    """A dynamic grid: positive factors, at least one dim, an axis and a cap within CUDA's grid limits."""
    if not grid.dims:
        raise EntryError(f"{where}: a dynamic grid reads no dim")
    for t, axis in (*grid.dims, *grid.times):
        _count(t, f"{where}: dynamic grid tensor position")
        _count(axis, f"{where}: dynamic grid axis")
    if _count(grid.coefficient, f"{where}: dynamic grid coefficient") < 1:
        raise EntryError(f"{where}: dynamic grid coefficient {grid.coefficient} is not positive")
    if _count(grid.divisor, f"{where}: dynamic grid divisor") < 1:
        raise EntryError(f"{where}: dynamic grid divisor {grid.divisor} is not positive")
    if _count(grid.multiplier, f"{where}: dynamic grid multiplier") < 1:
        raise EntryError(f"{where}: dynamic grid multiplier {grid.multiplier} is not positive")
    if grid.grid_axis not in (0, 1, 2):
        raise EntryError(f"{where}: dynamic grid axis {grid.grid_axis!r} is not 0, 1 or 2")
    if not 1 <= _count(grid.cap, f"{where}: dynamic grid cap") <= MAX_GRID[grid.grid_axis]:
        raise EntryError(f"{where}: dynamic grid cap {grid.cap} is outside 1..{MAX_GRID[grid.grid_axis]}")


def _symbol_dim(ref: DimRef, tensors: Sequence[Tensor], where: str) -> None:
    """A dim a launch reads at each call: of a tensor the caller passes, and one symbol (whose
    value the call's buffers give and binding checks against its range)."""
    position, axis = ref
    if position >= len(tensors):
        raise EntryError(f"{where}: an extent names tensor {position}; the graph has {len(tensors)}")
    t = tensors[position]
    if t.is_virtual or t.is_pass_by_value or axis >= len(t.dim):
        raise EntryError(
            f"{where}: an extent reads dim {axis} of tensor {position}, which is no dim of a tensor the caller passes"
        )
    extent = t.dim[axis]
    if not isinstance(extent, Sym) or extent.coefficient != 1 or len(extent.factors) != 1:
        raise EntryError(f"{where}: an extent reads dim {axis} of tensor {position}, which is {extent}, not a symbol")


def _launch_shape(grid: tuple[int, ...], block: tuple[int, ...], shared: int, max_shared: int, where: str) -> None:
    for name, sizes, limits in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK)):
        if any(not 1 <= size <= limit for size, limit in zip(sizes, limits, strict=True)):
            raise EntryError(f"{where}: {name} {list(sizes)} is outside the CUDA limits {list(limits)}")
    if block[0] * block[1] * block[2] > MAX_THREADS:
        raise EntryError(f"{where}: block {list(block)} has more than {MAX_THREADS} threads")
    if not 0 <= shared <= max_shared:
        raise EntryError(f"{where}: {shared} B of dynamic shared memory, the target allows 0 to {max_shared}")


def _count(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise EntryError(f"{what} {value!r} is not a non-negative integer")
    return value
