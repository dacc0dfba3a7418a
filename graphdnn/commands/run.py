"""``graphdnn run FILE [--backend gpu|reference] [--check]``: build a graph, run it on random inputs.

On the GPU (the default where there is one): inputs are uploaded with the graph's
strides, outputs are poisoned (every byte 0xFF: NaN for floats) so an unwritten element
fails the check, and a table gives each kernel's GPU time (CUDA events) and the host
time of a pre-bound call. ``--check`` compares every output with the reference backend.
A dynamic graph is compiled once for its range and run at extents drawn in range (from the
seed), or given with ``--symbol NAME=VALUE``.
On the reference backend, ``--check`` runs the fused partition the way its kernels
compute (folded batch norms, single-pass norms: fusion_rules.partition_reference) and compares
that with the plain reference, which checks the fusion without a GPU; the plain
reference runs once, and fused members computed as the plain reference computes them,
from identical inputs, take its values.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..compare import relative_error, tolerance
from ..compiler import compile
from ..errors import FeedError
from ..files import load_graph
from ..ir import Graph
from ..names import printable
from ..plan import Plan, PlanBase
from ..random_inputs import random_inputs
from ..reference import evaluate, execute, output_arrays
from ..reference_plan import host_array
from ..runtime.driver import current_gpu_arch
from ..specialize import specialize
from . import add_cache_dir, chosen_cache, positive, target


def add(commands: Any) -> None:
    run = commands.add_parser("run", help="build a graph, run it on random inputs, time it, check it")
    run.add_argument("file", metavar="FILE")
    run.add_argument(
        "--backend", choices=["gpu", "reference"], default=None, help="default: gpu where a GPU is present"
    )
    run.add_argument("--check", action="store_true", help="compare every output with the reference backend")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (and of a dynamic graph's extents)")
    run.add_argument(
        "--symbol",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a dynamic graph's symbol value (repeatable; default: drawn in its range from the seed)",
    )
    run.add_argument("--arch", type=target, default=None, help="target (default: the current GPU's)")
    run.add_argument("--repeat", type=positive, default=20, metavar="N", help="timed rounds per kernel")
    run.add_argument("--autotune", action="store_true", help="time launch candidates on the GPU, keep the fastest")
    add_cache_dir(run)
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    ir = load_graph(args.file)
    backend = args.backend or ("gpu" if current_gpu_arch() is not None else "reference")
    why = "" if args.backend else (" (a GPU is present)" if backend == "gpu" else " (no GPU found)")
    print(printable(f"graph '{ir.name}' ({args.file}): {len(ir.nodes)} nodes; backend {backend}{why}"))
    if backend == "gpu":
        from ..runtime import driver

        driver.current_device()  # no GPU: fail now (CudaError says why), not after compiling
    start = time.perf_counter()
    options = {"autotune": args.autotune} if backend == "gpu" else {}
    plan = compile(ir, backend=backend, arch=args.arch, cache=chosen_cache(args), **options)
    print(f"plan: {printable(_origin(plan))} in {(time.perf_counter() - start) * 1e3:.1f} ms")
    ir = _at_extents(ir, args.symbol, args.seed)  # a dynamic graph: the static graph of this run's extents
    feeds = random_inputs(ir, args.seed)
    if isinstance(plan, Plan):
        results = _run_gpu(plan, ir, feeds, args.repeat)
        return _check(ir, results, execute(ir, feeds)) if args.check else 0
    if not args.check:
        _run_reference(plan, ir, feeds)
        return 0
    plain = _run_plain(ir, feeds)
    return _check(ir, _run_fused(ir, feeds, args.arch, plain), output_arrays(ir, plain))


def _at_extents(ir: Graph, given: list[str], seed: int) -> Graph:
    """The static graph of ``ir`` at its symbols' values: ``given`` as NAME=VALUE, the others
    drawn in range from ``seed``; ``ir`` itself when it is static."""
    ranges = {s.name: s for s in ir.symbols}
    values: dict[str, int] = {}
    for item in given:
        name, _, value = item.partition("=")
        if name not in ranges:
            known = ", ".join(ranges) or "none"
            raise FeedError(f"--symbol {item}: graph '{ir.name}' has no symbol '{name}' (its symbols: {known})")
        s = ranges[name]
        if not value.isdigit() or not s.min <= int(value) <= s.max:
            raise FeedError(f"--symbol {item}: the value must be an integer in {s.min}..{s.max}")
        values[name] = int(value)
    if not ranges:
        return ir
    rng = np.random.default_rng(seed)
    for s in ir.symbols:
        values.setdefault(s.name, int(rng.integers(s.min, s.max + 1)))
    print("extents: " + ", ".join(f"{printable(s.name)} = {values[s.name]} ({s.min}..{s.max})" for s in ir.symbols))
    return specialize(ir, values)


def _origin(plan: PlanBase) -> str:
    if not isinstance(plan, Plan):
        return "reference (NumPy)"
    source = f"built ({plan.compiled} kernels compiled)" if plan.origin == "compiled" else f"from the {plan.origin}"
    key = f"key {plan.key[:16]}…" if plan.key else "not cached"
    tuning = f"tuned on {plan.tuned_on}" if plan.tuned_on else "heuristic launch choices"
    return (
        f"{len(plan.program.launches)} kernel launches for {plan.arch_name}, workspace {plan.workspace_size} bytes, "
        f"{tuning}; {source}, {key}"
    )


def _run_gpu(plan: Plan, ir: Graph, feeds: dict[str, np.ndarray], repeat: int) -> dict[str, np.ndarray]:
    from ..runtime import driver
    from ..runtime.device_array import DeviceArray
    from ..runtime.timing import host_us_per_call, kernel_times_us

    device = driver.current_device()
    print(f"device: cuda:{device.ordinal} {device.name} (sm_{device.arch})")
    pack: dict[str, Any] = {
        t.name: _number(feeds[t.name])
        if t.is_pass_by_value
        else DeviceArray.from_numpy(feeds[t.name], t.static_stride, t.data_type, device)
        for t in ir.inputs
    }
    outputs = {t.name: DeviceArray(t.static_dim, t.static_stride, t.data_type, device) for t in ir.outputs}
    for array in outputs.values():
        array.fill_bytes(0xFF)
    bound = plan.bind({**pack, **outputs})
    bound()
    bound.synchronize()
    results = {name: array.to_numpy() for name, array in outputs.items()}  # before timing reruns the plan
    times = kernel_times_us(bound, repeat)
    print(f"  {'#':>2}  {'kernel':<40} {'grid':<16} {'block':<14} {'GPU time':>10}")
    for i, (launch, us) in enumerate(zip(bound.launches, times)):  # as launched: a dynamic graph's grids for this call
        print(f"  {i:>2}  {launch.name:<40} {list(launch.grid)!s:<16} {list(launch.block)!s:<14} {us:>7.1f} µs")
    print(f"  {'':>2}  {'total':<40} {'':<16} {'':<14} {sum(times):>7.1f} µs")
    print(f"host time per pre-bound call: {host_us_per_call(bound):.1f} µs")
    return results


def _number(value: np.ndarray) -> float:
    """A pass-by-value scalar's random value (drawn in its data type) as a plan takes it: a
    Python number, since a one-element array of a type NumPy lacks (bf16, fp8) is refused."""
    return float(value.reshape(-1)[0])


def _run_reference(plan: PlanBase, ir: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    pack = {t.name: _number(feeds[t.name]) if t.is_pass_by_value else host_array(t, feeds[t.name]) for t in ir.inputs}
    start = time.perf_counter()
    outputs = plan.execute(pack)
    print(f"reference: {len(ir.nodes)} nodes in {(time.perf_counter() - start) * 1e3:.1f} ms")
    return {name: np.asarray(value) for name, value in outputs.items()}


def _run_plain(ir: Graph, feeds: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Every tensor's reference value: the expected outputs, and what the fused partition shares."""
    start = time.perf_counter()
    values = evaluate(ir, feeds)
    print(f"reference: {len(ir.nodes)} nodes in {(time.perf_counter() - start) * 1e3:.1f} ms")
    return values


def _run_fused(
    ir: Graph, feeds: dict[str, np.ndarray], arch: str | None, plain: dict[int, np.ndarray]
) -> dict[str, np.ndarray]:
    from fusion_rules import fuse
    from fusion_rules.partition_reference import execute_partition

    partition = fuse(ir, arch=arch)
    start = time.perf_counter()
    results = execute_partition(partition, feeds, plain)
    print(
        f"fused partition: {len(partition.nodes)} fused nodes, computed as their kernels do, "
        f"in {(time.perf_counter() - start) * 1e3:.1f} ms; checked against the reference:"
    )
    return results


def _check(ir: Graph, results: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> int:
    print(f"  {'output':<24} {'dims':<20} {'type':<10} {'rel. error':>10} {'tolerance':>10}")
    failed = []
    for t in ir.outputs:
        error = relative_error(results[t.name], expected[t.name])
        limit = tolerance(t.data_type)
        ok = error <= limit
        if not ok:
            failed.append(t.name)
        dims = "x".join(map(str, t.dim))
        print(
            f"  {printable(t.name):<24} {dims:<20} {t.data_type.value:<10} {error:>10.2e} {limit:>10.1e}  {'ok' if ok else 'FAIL'}"
        )
    print(
        "check: " + (f"FAILED ({printable(', '.join(failed))})" if failed else "passed (every output within tolerance)")
    )
    return 1 if failed else 0
