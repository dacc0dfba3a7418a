"""Serving shapes drawn from a dynamic graph's range: compiles after warm-up, and the host cost
of a call against a static plan's.

    PYTHONPATH=. python benchmarks/dynamic_serving.py [--calls 1000] [--only sdpa]     # on a GPU

For each dynamic graph of the benchmark cases (LN + GELU over rows 1..4096, the [rows, 1024] @
[1024, 1024] projection over rows 1..4096, conv 3x3 128->128 @28² + BN + ReLU over a batch
1..64, GQA decode attention over a batch 1..64; bf16; ``--only`` those whose name holds a
word), ``--calls`` sizes are drawn at random from the range (seeded). One plan is built
through a PlanCache; warm-up binds it once at each size drawn (a server's bound plan per size)
and runs it. Then the calls are served in the drawn order, and counted:

- compiles after warm-up: every NVRTC compile of the process (codegen.nvrtc.compile_cubin,
  counted by a wrapper) and the PlanCache's ``counters.compiles``; both must stay 0;
- host µs per call: the wall time of the call alone (it enqueues the kernels and returns; the
  GPU is drained between calls, outside the timed span, so no call waits on a full queue),
  median and 99th percentile, of the dynamic plan's bound call at the drawn size against the
  static plan's bound call at one size of the range (the middle), of the dynamic plan's bound
  call at that same size (the same kernels: what a symbol costs a call, apart from the sizes'
  kernels), and of ``plan.execute`` with a fresh pack per call (it binds anew when the size's
  binding is not among the 256 it remembers).

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.cases import (  # noqa: E402
    DYNAMIC_CONV,
    DYNAMIC_MAX_BATCH,
    _conv_graph,
    _ln_gelu_graph,
    _square_matmul_graph,
)
from benchmarks.dynamic_attention import Shape  # noqa: E402
from benchmarks.dynamic_attention import graph as attention_graph  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402
from graphdnn.specialize import specialize  # noqa: E402

MAX_ROWS, HIDDEN = 4096, 1024


@dataclass(frozen=True)
class Served:
    """A dynamic graph of the range 1..``top`` and the static graph of one size."""

    name: str
    graph: Callable[[int, int], gd.OperationGraphSpec]  # (size, top) -> graph; top 0: the static graph
    top: int


GRAPHS = [
    Served("layernorm+gelu [rows, 1024]", lambda n, top: _ln_gelu_graph(n, HIDDEN, top)(), MAX_ROWS),
    Served("matmul [rows, 1024] @ [1024, 1024]", lambda n, top: _square_matmul_graph(n, HIDDEN, top)(), MAX_ROWS),
    Served(
        "conv3x3+bn+relu 128->128 @28², NHWC",
        lambda n, top: _conv_graph(n, *DYNAMIC_CONV, max_n=top)(),
        DYNAMIC_MAX_BATCH,
    ),
    Served(
        "sdpa decode, GQA 32/8 heads, 1024 keys, D 128",
        lambda n, top: attention_graph(Shape("batch", 32, 8, n, 1, 1024, 128, False, (), top or 1), None if top else n),
        DYNAMIC_MAX_BATCH,
    ),
]


class CompileCounter:
    """Every NVRTC compile of the process: codegen.nvrtc.compile_cubin, wrapped."""

    def __init__(self) -> None:
        import codegen.nvrtc as nvrtc

        self.count = 0
        original = nvrtc.compile_cubin

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(*args, **kwargs)

        nvrtc.compile_cubin = counted  # type: ignore[assignment]


def host_us(calls: list[Callable[[], object]]) -> list[float]:
    """The wall time of each call alone, the GPU drained before each."""
    import torch

    times = []
    for call in calls:
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return times


def _full_buffers(graph: gd.OperationGraphSpec) -> dict[str, Any]:
    """Inputs (random) and outputs at the range's maximum; a call's pack slices their dim 0."""
    ir = graph.validate()
    static = specialize(ir, {s.name: s.max for s in ir.symbols})
    feeds = random_inputs(static, 0)
    return {t.name: to_torch(feeds[t.name], t) for t in static.inputs} | {
        t.name: empty_torch(t) for t in static.outputs
    }


def _pack(full: dict[str, Any], ir: gd.Graph, size: int) -> dict[str, Any]:
    symbolic = {t.name for t in (*ir.inputs, *ir.outputs) if t.symbols}
    return {name: buffer[:size] if name in symbolic else buffer for name, buffer in full.items()}


def _stats(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _by_launches(times: list[float], launches: list[int]) -> str:
    """The median of the calls of each launch count: "1: 5.1, 2: 7.9"."""
    groups: dict[int, list[float]] = {}
    for t, n in zip(times, launches):
        groups.setdefault(n, []).append(t)
    return ", ".join(f"{n} kernel(s) {statistics.median(g):.1f} ({len(g)} calls)" for n, g in sorted(groups.items()))


def serve(served: Served, calls: int, counter: CompileCounter, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes = [int(v) for v in rng.integers(1, served.top + 1, calls)]
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = gd.PlanCache(cache_dir)
        graph = served.graph(1, served.top)
        ir = graph.validate()
        plan = gd.compile(graph, cache=cache)
        full = _full_buffers(graph)
        bound = {size: plan.bind(_pack(full, ir, size)) for size in sorted(set(sizes))}
        for each in bound.values():  # warm-up: every size drawn, once
            each()
        packs = [_pack(full, ir, size) for size in sizes]
        nvrtc, cached = counter.count, cache.counters.compiles
        dynamic = host_us([bound[size] for size in sizes])
        execute = host_us([lambda p=p: plan.execute(p) for p in packs])
        after = {"nvrtc": counter.count - nvrtc, "cache": cache.counters.compiles - cached}
        middle = (served.top + 1) // 2
        static_plan = gd.compile(served.graph(middle, 0), cache=cache)
        static_pack = _pack(full, ir, middle)
        static_bound = static_plan.bind(static_pack)
        static = host_us([static_bound] * calls)
        same = host_us([plan.bind(static_pack)] * calls)
        static_execute = host_us([lambda: static_plan.execute(static_pack)] * calls)
    return {
        "name": served.name,
        "range": f"1..{served.top}",
        "distinct": len(bound),
        "kernels": len(plan.kernels),
        "compiles": after,
        "dynamic": _stats(dynamic),
        "static": _stats(static),
        "same": _stats(same),
        "by_launches": _by_launches(dynamic, [len(bound[size].launches) for size in sizes]),
        "execute": _stats(execute),
        "static_execute": _stats(static_execute),
        "middle": middle,
    }


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--only", default="", help="the graphs whose name holds this word (default: all)")
    args = parser.parse_args()
    counter = CompileCounter()
    rows = []
    for served in (s for s in GRAPHS if args.only in s.name):
        try:  # one broken graph must not hide the others' numbers
            rows.append(serve(served, args.calls, counter, args.seed))
        except Exception as error:
            rows.append({"name": served.name, "failure": f"{type(error).__name__}: {str(error)[:200]}"})
    print(f"{torch.cuda.get_device_name()}: {args.calls} calls per graph, sizes drawn uniformly from the range")
    print()
    print(
        "| graph | range | sizes drawn (distinct) | kernels | NVRTC compiles after warm-up | plan-cache compiles "
        "after warm-up | dynamic bound call µs (median / p99) | static bound call µs (median / p99) | "
        "dynamic − static µs | dynamic bound call at the static's size µs (median / p99) | dynamic bound call "
        "µs by kernels per call (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failure" in r:
            print(f"| {r['name']} | failed: {r['failure']} | | | | | | | | | |")
            continue
        (dm, dp), (sm, sp), (am, ap) = r["dynamic"], r["static"], r["same"]
        print(
            f"| {r['name']} | {r['range']} | {args.calls} ({r['distinct']}) | {r['kernels']} | "
            f"{r['compiles']['nvrtc']} | {r['compiles']['cache']} | {dm:.1f} / {dp:.1f} | {sm:.1f} / {sp:.1f} "
            f"(size {r['middle']}) | {dm - sm:+.1f} | {am:.1f} / {ap:.1f} | {r['by_launches']} |"
        )
    print()
    print(
        "| graph | dynamic plan.execute µs, fresh pack per call (median / p99) | static plan.execute µs (median / p99) |"
    )
    print("|---|---|---|")
    for r in rows:
        if "failure" not in r:
            (em, ep), (sm, sp) = r["execute"], r["static_execute"]
            print(f"| {r['name']} | {em:.1f} / {ep:.1f} | {sm:.1f} / {sp:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
