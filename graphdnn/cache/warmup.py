"""Warming a plan cache ahead of time, for many graphs, on a machine with or without a GPU.

Three steps: look every graph up (a hit needs nothing more) and lower the missing ones
(fuse + emit); compile the distinct kernels none of them has in the cache, in a process
pool (each worker writes its cubins to the cache directory, atomically); then store the
plans. A kernel shared by several graphs is compiled once. A graph that fails is
reported and the others go on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..arch import arch_name, resolve_arch
from ..compilation import Compilation
from ..compiler import cached_plan, store_plan, tuned_choices, tuning_gpu
from ..errors import GraphError
from ..ir import Graph
from ..kernel_build import claimed, compile_sources, matches
from ..lower import KernelSource, Lowered
from ..progress import Progress
from .entries import KernelBinary
from .plan_cache import DEFAULT, PlanCache, resolve_cache
from .store import DiskStore


@dataclass
class WarmupReport:
    arch: str
    directory: Path | None
    graphs: int = 0
    cached: int = 0  # graphs whose plan was already in the cache
    built: int = 0  # plans built and stored
    unique_kernels: int = 0  # distinct kernels over the graphs built
    compiled: int = 0  # kernels compiled by NVRTC
    reused: int = 0  # kernels of built plans already in the cache
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (graph, reason)

    def summary(self) -> str:
        failed = f", {len(self.failures)} failed" if self.failures else ""
        return (
            f"warmup for {self.arch}: {self.graphs} graphs ({self.cached} cache hits, {self.built} built{failed}), "
            f"{self.unique_kernels} unique kernels ({self.compiled} compiled, {self.reused} already cached), "
            f"{self.seconds:.1f} s; cache {self.directory}"
        )


@dataclass
class _Pending:
    label: str
    job: Compilation
    lowered: Lowered
    tuned_on: str | None


def warmup(
    graphs: Iterable[Any],
    *,
    arch: str | int | None = None,
    jobs: int | None = None,
    cache: Any = DEFAULT,
    disable: Iterable[str] = (),
    progress: TextIO | None = None,
    autotune: bool = False,
) -> WarmupReport:
    """Compile and store the plans of ``graphs`` (graph files, OperationGraphSpecs or
    validated Graphs) for ``arch``; ``jobs`` compiler processes (default: one per CPU).
    ``progress``: a stream for the progress bar (None: no bar). ``autotune``: time launch
    candidates on the current GPU (see graphdnn.autotune) and store plans tuned for its model."""
    start = time.perf_counter()
    plan_cache = resolve_cache(cache)
    if plan_cache is None or plan_cache.store is None:
        raise GraphError("warmup needs a plan cache with a directory (cache=None keeps nothing)")
    target = resolve_arch(arch)
    report = WarmupReport(arch_name(target), plan_cache.directory)
    pending = _lower_missing(list(graphs), target, plan_cache, tuple(disable), autotune, report, progress)
    sources = {key: source for p in pending for key, source in p.lowered.sources.items()}
    report.unique_kernels = len(sources)
    missing = {key: source for key, source in sources.items() if not _cached(plan_cache.kernel(key), source, target)}
    report.reused = len(sources) - len(missing)
    for key in missing:  # the workers write them to disk: a stale copy in memory must not be used
        plan_cache.forget_kernel(key)
    failed_kernels = _compile(missing, target, plan_cache, jobs, report, progress)
    for p in pending:
        try:
            _store(p, plan_cache, failed_kernels, report)
        except Exception as error:  # a defect in graphdnn: reported for this graph, the batch goes on
            report.failures.append((p.label, f"internal error: {type(error).__name__}: {error}"))
    report.seconds = time.perf_counter() - start
    return report


def _lower_missing(
    graphs: Sequence[Any],
    target: int,
    plan_cache: PlanCache,
    disable: tuple[str, ...],
    autotune: bool,
    report: WarmupReport,
    stream: TextIO | None,
) -> list[_Pending]:
    from ..lower import lower

    bar = Progress("graphs ", len(graphs), stream) if stream is not None else None
    pending: list[_Pending] = []
    for graph in graphs:
        label = str(graph) if isinstance(graph, (str, os.PathLike)) else getattr(graph, "name", repr(graph))
        report.graphs += 1
        try:
            job = Compilation.of(_validated(graph), target, disable)
            gpu = tuning_gpu(target) if autotune else None
            if cached_plan(plan_cache, job, gpu, require=False) is not None:
                report.cached += 1
            else:
                tuning = tuned_choices(job, plan_cache, None) if gpu is not None else {}
                lowered = lower(job.partition, target, job.signature, job.fields.kernel_key, tuning=tuning)
                pending.append(_Pending(label, job, lowered, gpu))
        except GraphError as error:
            report.failures.append((label, str(error)))
        except Exception as error:  # a defect in graphdnn: reported for this graph, the batch goes on
            report.failures.append((label, f"internal error: {type(error).__name__}: {error}"))
        if bar is not None:
            bar.advance(Path(label).name)
    return pending


def _compile(
    missing: dict[str, KernelSource],
    target: int,
    plan_cache: PlanCache,
    jobs: int | None,
    report: WarmupReport,
    stream: TextIO | None,
) -> dict[str, str]:
    """Compile ``missing`` into the cache; return {kernel key: error} for the ones that failed.

    Each kernel is compiled under its lock (DiskStore.claim), so warmers of one cache share
    the work: a kernel another process is compiling is put back and waited for at the end,
    and then taken from the cache rather than compiled again."""
    if not missing:
        return {}
    assert plan_cache.store is not None
    bar = Progress("kernels", len(missing), stream) if stream is not None else None
    workers = max(1, min(jobs or os.cpu_count() or 1, len(missing)))
    directory = str(plan_cache.store.directory)
    failed: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            context = multiprocessing.get_context("spawn")  # no inherited threads or CUDA state
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=context))
        keys = list(missing)
        for wait in (False, True):
            busy = []
            for key, outcome in _run(pool, [(key, missing[key], target, directory, wait) for key in keys]):
                if outcome == _BUSY:
                    busy.append(key)
                    continue
                if outcome == _COMPILED:
                    report.compiled += 1
                    plan_cache.counters.compiles += 1
                elif outcome == _CACHED:
                    report.reused += 1
                else:
                    failed[key] = outcome
                if bar is not None:
                    bar.advance(missing[key].name)
            keys = busy
    return failed


# What a compile task did besides failing (an error message): compiled the kernel, found it
# in the cache (another warmer compiled it meanwhile), or left it to the process holding its lock.
_COMPILED, _CACHED, _BUSY = "compiled", "cached", "busy"
_Task = tuple[str, KernelSource, int, str, bool]


def _run(pool: ProcessPoolExecutor | None, tasks: list[_Task]) -> Iterator[tuple[str, str]]:
    """(kernel key, outcome) of each task, in completion order; a worker that dies is a failure."""
    if pool is None:
        yield from map(_compile_one, tasks)
        return
    futures = {pool.submit(_compile_one, task): task[0] for task in tasks}
    for future in as_completed(futures):
        try:
            yield future.result()
        except Exception as error:  # the worker process died (BrokenProcessPool) or could not run the task
            yield futures[future], f"the compiler process failed: {type(error).__name__}: {error}"


def _compile_one(task: _Task) -> tuple[str, str]:
    """In a worker: compile one kernel under its lock and write it to the cache directory."""
    key, source, target, directory, wait = task
    store = DiskStore(directory)
    with claimed(store, {key: source}, target, wait=wait) as claim:
        if claim.busy:
            return key, _BUSY
        if claim.cached:
            return key, _CACHED
        try:
            (binary,) = compile_sources(claim.todo, target, jobs=1)
        except GraphError as error:
            return key, str(error)
        except Exception as error:  # a defect in graphdnn: a failure of this kernel, the batch goes on
            return key, f"internal error: {type(error).__name__}: {error}"
        failure = store.write_kernel(binary)
    if failure is not None:
        return key, f"kernel {source.name} compiled, but cannot be written to the cache: {failure}"
    return key, _COMPILED


def _store(p: _Pending, plan_cache: PlanCache, failed_kernels: dict[str, str], report: WarmupReport) -> None:
    binaries: dict[str, KernelBinary] = {}
    for key in p.lowered.program.kernel_keys:
        if key in failed_kernels:
            report.failures.append((p.label, failed_kernels[key]))
            return
        binary = plan_cache.kernel(key)
        if binary is None:
            report.failures.append((p.label, f"kernel {p.lowered.sources[key].name} is missing from the cache"))
            return
        binaries[key] = binary
    failure = store_plan(plan_cache, p.job, p.lowered.program, binaries, tuned_on=p.tuned_on)
    if failure is not None:
        report.failures.append((p.label, f"cannot write its plan to the cache: {failure}"))
        return
    report.built += 1


def _cached(binary: KernelBinary | None, source: KernelSource, target: int) -> bool:
    return binary is not None and matches(binary, source, target)


def _validated(graph: Any) -> Graph:
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, (str, os.PathLike)):
        from ..files import load_graph

        return load_graph(graph)
    validated: Graph = graph.validate()
    return validated
