"""Warming a plan cache ahead of time, for many graphs, on a machine with or without a GPU.

Three steps: look every graph up (a hit needs nothing more) and lower the missing ones
(fuse + emit); compile the distinct kernels none of them has in the cache, in a process
pool (each worker writes its cubins to the cache directory, atomically); then store the
plans. A kernel shared by several graphs is compiled once. A graph that fails is
reported and the others go on.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .arch import arch_name, resolve_arch
from .cache.entries import KernelBinary
from .cache.key import KeyFields, key_fields
from .cache.plan_cache import DEFAULT, PlanCache, resolve_cache
from .cache.store import DiskStore
from .compiler import canonical_tensors, store_plan, tuned_choices
from .errors import GraphError
from .ir import Graph
from .lower import KernelSource, Lowered
from .progress import Progress
from .signature import signature_and_order


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
    ir: Graph
    fields: KeyFields
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
    candidates on the current GPU (see graphdnn.autotune); plans cached untuned are redone."""
    start = time.perf_counter()
    plan_cache = resolve_cache(cache)
    if plan_cache is None or plan_cache.store is None:
        raise GraphError("warmup needs a plan cache with a directory (cache=None keeps nothing)")
    target = resolve_arch(arch)
    report = WarmupReport(arch_name(target), plan_cache.directory)
    pending = _lower_missing(list(graphs), target, plan_cache, tuple(disable), autotune, report, progress)
    sources = {key: source for p in pending for key, source in p.lowered.sources.items()}
    report.unique_kernels = len(sources)
    missing = {key: source for key, source in sources.items() if plan_cache.kernel(key) is None}
    report.reused = len(sources) - len(missing)
    failed_kernels = _compile(missing, target, plan_cache, jobs, report, progress)
    for p in pending:
        _store(p, plan_cache, failed_kernels, report)
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
    from .lower import lower

    bar = Progress("graphs ", len(graphs), stream) if stream is not None else None
    pending: list[_Pending] = []
    for graph in graphs:
        label = str(graph) if isinstance(graph, (str, os.PathLike)) else getattr(graph, "name", repr(graph))
        report.graphs += 1
        try:
            ir = _validated(graph)
            graph_signature, order = signature_and_order(ir)
            fields = key_fields(ir, target, disable, graph_signature)
            found = plan_cache.lookup(fields.key, canonical_tensors(ir, order))
            if found is not None and (not autotune or found.entry.tuned_on is not None):
                report.cached += 1
            else:
                tuning, tuned_on = (
                    tuned_choices(ir, target, fields, disable, plan_cache, None) if autotune else ({}, None)
                )
                lowered = lower(ir, target, fields.kernel_key, disable=disable, tuning=tuning)
                pending.append(_Pending(label, ir, fields, lowered, tuned_on))
        except GraphError as error:
            report.failures.append((label, str(error)))
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
    """Compile ``missing`` into the cache; return {kernel key: error} for the ones that failed."""
    if not missing:
        return {}
    assert plan_cache.store is not None
    bar = Progress("kernels", len(missing), stream) if stream is not None else None
    workers = max(1, min(jobs or os.cpu_count() or 1, len(missing)))
    tasks = [(key, source, target, str(plan_cache.store.directory)) for key, source in missing.items()]
    failed: dict[str, str] = {}
    if workers == 1:
        outcomes = (_compile_one(task) for task in tasks)
        for key, error in outcomes:
            _count(key, error, plan_cache, report, failed, bar, missing)
        return failed
    context = multiprocessing.get_context("spawn")  # no inherited threads or CUDA state
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        for future in as_completed([pool.submit(_compile_one, task) for task in tasks]):
            key, error = future.result()
            _count(key, error, plan_cache, report, failed, bar, missing)
    return failed


def _count(
    key: str,
    error: str | None,
    plan_cache: PlanCache,
    report: WarmupReport,
    failed: dict[str, str],
    bar: Progress | None,
    missing: dict[str, KernelSource],
) -> None:
    if error is None:
        report.compiled += 1
        plan_cache.counters.compiles += 1
    else:
        failed[key] = error
    if bar is not None:
        bar.advance(missing[key].name)


def _compile_one(task: tuple[str, KernelSource, int, str]) -> tuple[str, str | None]:
    """In a worker: compile one kernel and write it to the cache directory."""
    from .kernel_build import compile_sources

    key, source, target, directory = task
    try:
        (binary,) = compile_sources({key: source}, target, jobs=1)
    except GraphError as error:
        return key, str(error)
    DiskStore(directory).write_kernel(binary)
    return key, None


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
    store_plan(plan_cache, p.ir, p.fields, p.lowered.program, binaries, tuned_on=p.tuned_on)
    report.built += 1


def _validated(graph: Any) -> Graph:
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, (str, os.PathLike)):
        from .serialize import load

        return load(graph).validate()
    validated: Graph = graph.validate()
    return validated
