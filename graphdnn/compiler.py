"""``gd.compile``: a graph to a plan, through the plan cache.

validate -> key (signature, target, codegen and compiler versions) -> plan cache hit:
a plan from the stored program and cubins, with no fusion or code generation at all;
miss: fuse -> emit -> NVRTC (each distinct kernel once, in parallel) -> store -> plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .arch import arch_name, resolve_arch, runs_on
from .cache.entries import KernelBinary, PlanEntry
from .cache.key import KeyFields, key_fields
from .cache.plan_cache import DEFAULT, CachedPlan, PlanCache, resolve_cache
from .env import env_flag
from .errors import CacheMissError, GraphError, UnsupportedError
from .ir import Graph, Tensor
from .plan import Plan, PlanBase
from .program import Program
from .reference_plan import ReferencePlan
from .signature import canonical_tensor_order, signature_and_order

BACKENDS = ("gpu", "reference")


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
    ``autotune``: time the families' launch candidates on the current GPU and keep the
    fastest (a cached plan built without tuning is then rebuilt, unless require_cached).
    ``tuning``: explicit launch choices by fused-node name (as ``graphdnn inspect --fused``
    names them), e.g. ``{"conv_bn_act_0": {"block_m": 64, "block_n": 64, "stages": 4}}``;
    for experiments and tests, so such a plan bypasses the cache.
    """
    ir: Graph = graph if isinstance(graph, Graph) else graph.validate()
    if backend == "reference":
        return ReferencePlan(ir)
    if backend != "gpu":
        raise GraphError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    target = resolve_arch(arch)
    plan_cache = resolve_cache(cache)
    require = env_flag("GRAPHDNN_REQUIRE_CACHED") if require_cached is None else require_cached
    graph_signature, order = signature_and_order(ir)
    fields = key_fields(ir, target, disable, graph_signature)
    if tuning is not None:
        return _build(ir, target, fields, order, None, disable, jobs, False, _positions(ir, target, disable, tuning))
    found = plan_cache.lookup(fields.key, canonical_tensors(ir, order)) if plan_cache is not None else None
    if found is not None and (not autotune or found.entry.tuned_on is not None or require):
        return _from_cache(ir, target, found, order)
    if require:
        raise CacheMissError(_miss_message(ir, fields, plan_cache))
    return _build(ir, target, fields, order, plan_cache, disable, jobs, autotune)


def canonical_tensors(ir: Graph, order: tuple[int, ...]) -> tuple[Tensor, ...]:
    """``ir``'s tensors in canonical order: what a stored plan's tensor positions index."""
    return tuple(ir.tensors[tensor_id] for tensor_id in order)


def _from_cache(ir: Graph, target: int, found: CachedPlan, order: tuple[int, ...]) -> Plan:
    program = found.entry.program.relabel(dict(enumerate(order)))
    return Plan(
        ir, target, program, found.kernels, key=found.entry.key, origin=found.origin, tuned_on=found.entry.tuned_on
    )


def _build(
    ir: Graph,
    target: int,
    fields: KeyFields,
    order: tuple[int, ...],
    plan_cache: PlanCache | None,
    disable: Iterable[str],
    jobs: int | None,
    autotune: bool,
    tuning: Mapping[int, Mapping[str, Any]] | None = None,
) -> Plan:
    from .kernel_build import build_kernels
    from .lower import lower

    tuned_on = None
    if autotune:
        tuning, tuned_on = tuned_choices(ir, target, fields, disable, plan_cache, jobs)
    lowered = lower(ir, target, fields.kernel_key, disable=disable, tuning=tuning)
    binaries, compiled = build_kernels(lowered.sources, target, plan_cache, jobs)
    if plan_cache is not None:
        store_plan(plan_cache, ir, fields, lowered.program, binaries, order, tuned_on)
    return Plan(
        ir, target, lowered.program, binaries, key=fields.key, origin="compiled", compiled=compiled, tuned_on=tuned_on
    )


def _positions(
    ir: Graph, target: int, disable: Iterable[str], tuning: Mapping[str, Mapping[str, Any]]
) -> dict[int, Mapping[str, Any]]:
    """Launch choices by fused-node name -> by position in the partition."""
    from fusion_rules import fuse

    names = [fused.name for fused in fuse(ir, arch=target, disable=disable).nodes]
    unknown = sorted(set(tuning) - set(names))
    if unknown:
        raise GraphError(f"no fused node named {unknown[0]!r} in graph '{ir.name}'; fused nodes: {', '.join(names)}")
    return {names.index(name): choice for name, choice in tuning.items()}


def tuned_choices(
    ir: Graph, target: int, fields: KeyFields, disable: Iterable[str], plan_cache: PlanCache | None, jobs: int | None
) -> tuple[dict[int, dict[str, Any]], str]:
    """Autotuned launch choices by fused-node position, and the GPU they were timed on."""
    from .autotune import gpu_measure, tune
    from .runtime.driver import current_gpu_arch

    current = current_gpu_arch()
    if current is None or not runs_on(target, current):
        found = "no usable GPU" if current is None else f"the current GPU is {arch_name(current)}"
        raise UnsupportedError(f"autotuning times kernels on a GPU that runs {arch_name(target)}: {found}")
    measure, device_name = gpu_measure(ir)
    return tune(ir, target, fields.kernel_key, measure, disable=disable, cache=plan_cache, jobs=jobs), device_name


def store_plan(
    plan_cache: PlanCache,
    ir: Graph,
    fields: KeyFields,
    program: Program,
    binaries: dict[str, KernelBinary],
    order: tuple[int, ...] | None = None,
    tuned_on: str | None = None,
) -> OSError | None:
    """Store ``program`` (tensors by id of ``ir``) under ``fields``, tensors renamed to canonical
    positions; the error if it could not be written to disk."""
    positions = {tid: position for position, tid in enumerate(order or canonical_tensor_order(ir))}
    return plan_cache.add_plan(PlanEntry.new(fields, program.relabel(positions), ir.name, tuned_on), binaries)


def _miss_message(ir: Graph, fields: KeyFields, plan_cache: PlanCache | None) -> str:
    where = f"the plan cache at {plan_cache.directory}" if plan_cache and plan_cache.directory else "the plan cache"
    if plan_cache is None:
        where = "a plan cache (caching is off)"
    return (
        f"graph '{ir.name}' is not in {where} and require_cached is set (GRAPHDNN_REQUIRE_CACHED); "
        f"warm it first (graphdnn warmup). Key fields:\n{fields.describe()}"
    )
