"""``gd.compile``: a graph to a plan, through the plan cache.

validate -> key (signature, target, codegen and compiler versions) -> plan cache hit:
a plan from the stored program and cubins, with no fusion or code generation at all;
miss: fuse -> emit -> NVRTC (each distinct kernel once, in parallel) -> store -> plan.
Each product (signature, canonical order, key, partition) is computed once, in a
:class:`~graphdnn.compilation.Compilation`, and handed to the stages that need it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .arch import arch_name, resolve_arch, runs_on
from .cache.entries import KernelBinary, PlanEntry
from .cache.key import KeyFields
from .cache.plan_cache import DEFAULT, CachedPlan, PlanCache, resolve_cache
from .compilation import Compilation
from .env import env_flag
from .errors import CacheMissError, GraphError, UnsupportedError
from .ir import Graph
from .plan import Plan, PlanBase
from .program import LaunchProgram
from .reference_plan import ReferencePlan

BACKENDS = ("gpu", "reference")
_LOG = logging.getLogger("graphdnn.compile")


def compile(
    graph: Any,
    *,
    arch: str | int | None = None,
    backend: str = "gpu",
    cache: Any = DEFAULT,
    disable: Iterable[str] = (),
    require_cached: bool | None = None,
    jobs: int | None = None,
    autotune: bool = False,
    tuning: Mapping[str, Mapping[str, Any]] | None = None,
) -> PlanBase:
    """Compile ``graph`` (an OperationGraphSpec or a validated Graph) into a plan.

    ``arch``: target such as 'sm_90' (default: the current GPU's, else sm_90; no GPU is
    needed to compile). ``backend``: 'gpu', or 'reference' for a plan with the same
    interface that runs the NumPy reference. ``cache``: the default PlanCache (under
    $GRAPHDNN_CACHE_DIR, else the user cache directory), a directory, a PlanCache, or
    None for no caching. ``disable``: fusion rules to turn off. ``require_cached``: make
    any cache miss an error (default: $GRAPHDNN_REQUIRE_CACHED=1). ``jobs``: NVRTC threads.
    ``autotune``: use the plan tuned on the current GPU's model, else time the families'
    launch candidates on that GPU and store the fastest for that model (under
    require_cached, the untuned plan serves when no tuned one is stored).
    ``tuning``: explicit launch choices by fused-node name (as ``graphdnn inspect --fused``
    names them), e.g. ``{"conv_bn_act_0": {"block_m": 64, "block_n": 64, "stages": 4}}``;
    for experiments and tests, so such a plan bypasses the cache.
    """
    ir: Graph = graph if isinstance(graph, Graph) else graph.validate()
    if backend == "reference":
        return ReferencePlan(ir)
    if backend != "gpu":
        raise GraphError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    plan_cache = resolve_cache(cache)
    require = env_flag("GRAPHDNN_REQUIRE_CACHED") if require_cached is None else require_cached
    job = Compilation.of(ir, resolve_arch(arch), disable)
    if tuning is not None:
        return _build(job, None, jobs, None, _positions(job, tuning))
    gpu = tuning_gpu(job.target) if autotune else None
    found = cached_plan(plan_cache, job, gpu, require)
    if found is not None:
        return _from_cache(job, found)
    if require:
        raise CacheMissError(_miss_message(ir, job.fields, plan_cache))
    return _build(job, plan_cache, jobs, gpu)


def cached_plan(plan_cache: PlanCache | None, job: Compilation, gpu: str | None, require: bool) -> CachedPlan | None:
    """The stored plan of ``job``: the untuned one shared by every GPU of the arch, or with
    autotuning (``gpu``: the model tuned on) the one tuned on that model; under
    ``require`` a missing tuned plan falls back to the untuned one."""
    if plan_cache is None:
        return None
    if gpu is not None:
        found = plan_cache.lookup(job.fields.tuned_key(gpu), job.canonical_tensors)
        if found is not None or not require:
            return found
    return plan_cache.lookup(job.fields.key, job.canonical_tensors)


def _from_cache(job: Compilation, found: CachedPlan) -> Plan:
    program = found.entry.program.relabel(dict(enumerate(job.order)))
    return Plan(
        job.ir,
        job.target,
        program,
        found.kernels,
        key=found.entry.key,
        origin=found.origin,
        tuned_on=found.entry.tuned_on,
    )


def _build(
    job: Compilation,
    plan_cache: PlanCache | None,
    jobs: int | None,
    tuned_on: str | None,
    tuning: Mapping[int, Mapping[str, Any]] | None = None,
) -> Plan:
    from .kernel_build import build_kernels
    from .lower import lower

    start = time.perf_counter()
    if tuned_on is not None:
        tuning = tuned_choices(job, plan_cache, jobs)
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key, tuning=tuning)
    binaries, compiled = build_kernels(lowered.sources, job.target, plan_cache, jobs)
    if plan_cache is not None:
        store_plan(plan_cache, job, lowered.program, binaries, tuned_on)
    _LOG.info(
        "built the plan of graph %r for %s in %.2f s: %d launches, %d kernels (%d compiled)",
        job.ir.name,
        arch_name(job.target),
        time.perf_counter() - start,
        len(lowered.program.launches),
        len(binaries),
        compiled,
    )
    return Plan(
        job.ir,
        job.target,
        lowered.program,
        binaries,
        key=job.fields.key if tuned_on is None else job.fields.tuned_key(tuned_on),
        origin="compiled",
        compiled=compiled,
        tuned_on=tuned_on,
    )


def _positions(job: Compilation, tuning: Mapping[str, Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Launch choices by fused-node name -> by position in the partition."""
    names = [fused.name for fused in job.partition.nodes]
    unknown = sorted(set(tuning) - set(names))
    if unknown:
        raise GraphError(
            f"no fused node named {unknown[0]!r} in graph '{job.ir.name}'; fused nodes: {', '.join(names)}"
        )
    return {names.index(name): choice for name, choice in tuning.items()}


def tuning_gpu(target: int) -> str:
    """The model of the current GPU (its name, e.g. 'NVIDIA H100 80GB HBM3'): autotuning times
    kernels on it, and stores the plan for that model. UnsupportedError unless it runs ``target``."""
    from .runtime.driver import current_device, current_gpu_arch

    current = current_gpu_arch()
    if current is None or not runs_on(target, current):
        found = "no usable GPU" if current is None else f"the current GPU is {arch_name(current)}"
        raise UnsupportedError(f"autotuning times kernels on a GPU that runs {arch_name(target)}: {found}")
    return current_device().name


def tuned_choices(job: Compilation, plan_cache: PlanCache | None, jobs: int | None) -> dict[int, dict[str, Any]]:
    """Launch choices by fused-node position, autotuned on the current GPU (see tuning_gpu); a
    dynamic graph's timed at sizes across its range (graphdnn.autotune)."""
    from .autotune import gpu_measures, tune

    return tune(job, gpu_measures(job.ir), cache=plan_cache, jobs=jobs)


def store_plan(
    plan_cache: PlanCache,
    job: Compilation,
    program: LaunchProgram,
    binaries: dict[str, KernelBinary],
    tuned_on: str | None = None,
) -> OSError | None:
    """Store ``program`` (tensors by id of ``job.ir``) under ``job.fields``, tensors renamed to
    canonical positions; the error if it could not be written to disk."""
    positions = {tid: position for position, tid in enumerate(job.order)}
    return plan_cache.add_plan(PlanEntry.new(job.fields, program.relabel(positions), job.ir.name, tuned_on), binaries)


def _miss_message(ir: Graph, fields: KeyFields, plan_cache: PlanCache | None) -> str:
    where = f"the plan cache at {plan_cache.directory}" if plan_cache and plan_cache.directory else "the plan cache"
    if plan_cache is None:
        where = "a plan cache (caching is off)"
    return (
        f"graph '{ir.name}' is not in {where} and require_cached is set (GRAPHDNN_REQUIRE_CACHED); "
        f"warm it first (graphdnn warmup). Key fields:\n{fields.describe()}"
    )
