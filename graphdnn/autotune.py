"""Autotuning: time each fused node's launch candidates on the GPU, keep the fastest.

A family may offer candidate launch choices for a fused node (``codegen.emit.candidates``:
the GEMM family's tile shapes, for instance); without autotuning it takes its documented
heuristic choice, which is also what a machine without a GPU gets. With
``gd.compile(graph, autotune=True)`` every candidate of every node that has two or more
is emitted and compiled (into the plan cache, so the winner costs nothing more when the
plan is built), then run alone on the GPU on random inputs and timed with CUDA events
(median of rounds); the choices of the fastest are stored in the plan-cache entry with
the plan, together with the name of the GPU model they were timed on: a tuned plan is
stored per model (two sm_90 models keep one each), beside the untuned plan of the arch.

A dynamic graph's plan serves its whole range, so one size's timings cannot choose for it:
each candidate is timed at sizes across the range (:func:`sample_values`), the heuristic's
size-bucketed variants competing as one more candidate, and the candidate with the least
mean time relative to the fastest at each size wins (:func:`fastest`). A tuned choice is
one variant for the whole range, so it replaces the buckets only when it beats them by
HEURISTIC_MARGIN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .cache.entries import KernelBinary
from .cache.plan_cache import PlanCache
from .compilation import Compilation
from .ir import Graph, Tensor
from .kernel_build import build_kernels
from .lower import assemble
from .program import LaunchProgram
from .random_inputs import random_inputs
from .specialize import specialize
from .variant_pack import scalar_value

# Times a program (one fused node's launches, its own workspace layout) in µs.
Measure = Callable[[LaunchProgram, Mapping[str, KernelBinary]], float]
ROUNDS = 20
SAMPLES = 5  # sizes a dynamic graph's candidates are timed at
# A dynamic graph keeps its heuristic's size buckets unless a candidate, one variant for the whole
# range, is this much faster on average. Measured on an H200 (LN+GELU over rows 1..16384): the
# choices that won at the sampled sizes with no margin, then with 3%, ran 1-13% slower than the
# buckets at 64, 1531 and 16384 rows, as differences of a few % between ~5 µs kernels are noise
HEURISTIC_MARGIN = 0.10


def tune(
    job: Compilation, measures: Sequence[Measure], *, cache: PlanCache | None = None, jobs: int | None = None
) -> dict[int, dict[str, Any]]:
    """The fastest candidate choices, by fused-node position, for nodes with several
    candidates of ``job``'s partition, each timed by every one of ``measures`` (one per size
    of a dynamic graph's range). A dynamic node whose heuristic wins keeps it (no entry)."""
    from codegen.context import EmitContext
    from codegen.emit import candidates, emitter

    partition, arch = job.partition, job.target
    chosen: dict[int, dict[str, Any]] = {}
    for index, fused in enumerate(partition.nodes):
        options = candidates(fused, arch)
        if job.ir.is_dynamic and options:
            options = [{}, *options]  # the heuristic: its size buckets, each with the static plan's choice
        if len(options) < 2:
            continue
        emit = emitter(fused.family)
        lowered = [
            assemble(
                partition,
                (emit(fused, EmitContext(job.ir, job.signature, arch, dict(option))),),
                job.fields.kernel_key,
                {},
            )
            for option in options
        ]
        sources = {key: source for each in lowered for key, source in each.sources.items()}
        binaries, _ = build_kernels(sources, arch, cache, jobs)  # every candidate at once, in parallel
        times = [[measure(each.program, binaries) for measure in measures] for each in lowered]
        best = options[fastest(times, HEURISTIC_MARGIN if job.ir.is_dynamic else 0.0)]
        if best:
            chosen[index] = dict(best)
    return chosen


def fastest(times: Sequence[Sequence[float]], margin: float = 0.0) -> int:
    """The candidate (row of ``times``, a column per size) whose time relative to the fastest
    at each size has the least mean: each size counts alike, however long it runs. The first
    candidate stays unless another's mean is lower by more than ``margin`` (a fraction); ties
    go to the first."""
    best_at = [min(column) for column in zip(*times, strict=True)]
    scores = [sum(t / b for t, b in zip(row, best_at, strict=True)) / len(best_at) for row in times]
    best = scores.index(min(scores))
    return best if scores[best] < scores[0] - margin else 0


def sample_values(ir: Graph) -> list[dict[str, int]]:
    """Sizes across a dynamic graph's range to time candidates at: SAMPLES calls, each symbol
    spaced geometrically from its minimum to its maximum (fewer where values coincide), so
    that every factor of the range is timed alike (rows 1..16384: 1, 11, 128, 1448, 16384)."""
    points = [
        {s.name: value for s, value in zip(ir.symbols, values, strict=True)}
        for values in zip(*(_geometric(s.min, s.max) for s in ir.symbols), strict=True)
    ]
    return list({tuple(p.items()): p for p in points}.values())


def _geometric(low: int, high: int) -> list[int]:
    return [min(high, max(low, round(low * (high / low) ** (i / (SAMPLES - 1))))) for i in range(SAMPLES)]


def gpu_measures(ir: Graph) -> list[Measure]:
    """A Measure per size to time at: one for a static graph, one per :func:`sample_values`
    of a dynamic one."""
    if not ir.is_dynamic:
        return [gpu_measure(ir)]
    return [gpu_measure(ir, values) for values in sample_values(ir)]


def gpu_measure(ir: Graph, values: Mapping[str, int] | None = None, rounds: int = ROUNDS) -> Measure:
    """A Measure that runs programs on the current GPU (random graph inputs, zeroed workspace);
    a dynamic graph's at its symbols' ``values`` (the launches of those sizes' buckets, their
    grids and extents)."""
    from .runtime import driver, modules
    from .runtime.device_array import DeviceArray, DeviceMemory
    from .runtime.launch import BoundPlan, pack_arguments
    from .runtime.timing import kernel_times_us

    device = driver.current_device()
    ir = specialize(ir, values) if values is not None else ir
    feeds = random_inputs(ir, seed=0)
    arrays: dict[int, DeviceArray] = {}
    scalars = {t.id: scalar_value(t, t.value if t.is_constant else feeds[t.name]) for t in _scalars(ir)}

    def buffer(t: Tensor) -> int:
        if t.id not in arrays:
            if t.name in feeds:
                arrays[t.id] = DeviceArray.from_numpy(feeds[t.name], t.static_stride, t.data_type, device)
            else:
                arrays[t.id] = DeviceArray(t.static_dim, t.static_stride, t.data_type, device)
        return arrays[t.id].pointer

    def measure(program: LaunchProgram, binaries: Mapping[str, KernelBinary]) -> float:
        extents = {(t, axis): ir.tensors[t].static_dim[axis] for t, axis in program.dim_refs}
        launches = [launch.at(extents) for launch in program.launches if launch.runs_at(extents)]
        workspace = DeviceMemory(device, program.workspace_size)
        with device.current():
            driver.call(driver.api().cuMemsetD8, workspace.pointer, 0, max(program.workspace_size, 1))
        intermediates = program.intermediate_offsets()
        pointers = {tid: workspace.pointer + offset for tid, offset in intermediates.items()}
        for launch in launches:
            for arg in launch.args:
                if arg.reads_memory and arg.tensor is not None and arg.tensor not in intermediates:
                    pointers[arg.tensor] = buffer(ir.tensors[arg.tensor])
        kernels = [
            modules.load(device, launch.kernel_key, launch.name, binaries[launch.kernel_key].cubin, launch.shared_bytes)
            for launch in launches
        ]
        slots = [pack_arguments(launch, pointers, scalars, workspace.pointer, extents) for launch in launches]
        bound = BoundPlan(device, 0, launches, kernels, slots, {}, [workspace, arrays])
        return sum(kernel_times_us(bound, rounds))

    return measure


def _scalars(ir: Graph) -> list[Tensor]:
    return [t for t in ir.tensors if t.is_pass_by_value]
