"""How the host-side stages scale with the size of the graph (no GPU needed).

    PYTHONPATH=. python benchmarks/graph_scale.py                  # 1k, 10k and 65,536 nodes
    PYTHONPATH=. python benchmarks/graph_scale.py --sizes 1000 --budget 30
    PYTHONPATH=. python benchmarks/graph_scale.py --builder 100000   # the builder alone

Builds three shapes of graph at each size and times every stage a graph file goes
through before codegen: the builder adding the nodes, validation, writing JSON,
loading it back (which validates), the signature and fusion, and with ``--lower``
fusion plus CUDA emission (``graphdnn.lower``). A stage that runs past
``--budget`` seconds is stopped and shown as ``>budget``. Every stage should grow
linearly with the node count (docs/architecture.md, "Linear cost").
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import graphdnn as gd
from graphdnn.serialize import graph_to_json
from graphdnn.signature import signature

DIM = (8, 64)


def chain(nodes: int) -> gd.OperationGraphSpec:
    """A single chain of pointwise ops: fusion grows one elementwise group over all of it."""
    g = gd.OperationGraphSpec(f"chain{nodes}", io_data_type="float")
    scale = g.tensor(dim=(1, DIM[1]), name="scale")
    t = g.tensor(dim=DIM, name="x")
    for i in range(nodes):
        t = (g.relu, lambda v: g.mul(v, scale), lambda v: g.add(v, 0.5))[i % 3](t)
    t.set_output(True)
    return g


def residual(nodes: int) -> gd.OperationGraphSpec:
    """Pre-norm residual blocks, x + W2 relu(W1 layernorm(x)): five nodes each, weights per block."""
    g = gd.OperationGraphSpec(f"residual{nodes}", io_data_type="float")
    gamma = g.tensor(dim=(1, DIM[1]), name="gamma")
    beta = g.tensor(dim=(1, DIM[1]), name="beta")
    x = g.tensor(dim=DIM, name="x")
    for _ in range(nodes // 5):
        w1 = g.tensor(dim=(DIM[1], DIM[1]))
        w2 = g.tensor(dim=(DIM[1], DIM[1]))
        y = g.layernorm("inference", x, gamma, beta, 1e-5)[0]
        assert y is not None
        x = g.add(x, g.matmul(g.relu(g.matmul(y, w1)), w2))
    for _ in range(nodes % 5):
        x = g.relu(x)
    x.set_output(True)
    return g


def wide(nodes: int, length: int = 15) -> gd.OperationGraphSpec:
    """Many parallel pointwise branches of one input, summed: wide, with long-range joins."""
    g = gd.OperationGraphSpec(f"wide{nodes}", io_data_type="float")
    x = g.tensor(dim=DIM, name="x")
    total = None
    added = 0
    while added < nodes:
        t = x
        for i in range(min(length, nodes - added - (total is not None))):
            t = g.relu(t) if i % 2 else g.mul(t, 1.0 + i)
            added += 1
        total = t if total is None else g.add(total, t)
        added += total is not t
    assert total is not None
    total.set_output(True)
    return g


SHAPES: dict[str, Callable[[int], gd.OperationGraphSpec]] = {"chain": chain, "residual": residual, "wide": wide}
STAGES = ("build", "validate", "to_json", "load", "sign", "fuse", "lower")


class _Budget(Exception):
    pass


def _timed(budget: float, work: Callable[[], Any]) -> tuple[float | None, Any]:
    """(seconds, result), or (None, None) when ``work`` ran past ``budget`` seconds."""

    def stop(signum: int, frame: Any) -> None:
        raise _Budget

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, budget)
    start = time.perf_counter()
    try:
        result = work()
    except _Budget:
        return None, None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.perf_counter() - start, result


def measure(shape: str, nodes: int, budget: float, lowered: bool) -> dict[str, float | None]:
    """Seconds per stage for one graph; None where the stage ran out of budget (or was not run)."""
    times: dict[str, float | None] = dict.fromkeys(STAGES)
    times["build"], spec = _timed(budget, lambda: SHAPES[shape](nodes))
    if spec is None:
        return times
    times["validate"], ir = _timed(budget, spec.validate)
    if ir is None:
        return times
    times["to_json"], text = _timed(budget, lambda: graph_to_json(ir))
    if text is not None:
        times["load"], _ = _timed(budget, lambda: gd.OperationGraphSpec.from_json(text))
    times["sign"], _ = _timed(budget, lambda: signature(ir))
    from fusion_rules import fuse
    from graphdnn.lower import lower

    times["fuse"], _ = _timed(budget, lambda: fuse(ir))
    if lowered:
        graph_signature = signature(ir)
        times["lower"], _ = _timed(  # fuse and emit, as compiling a plan does
            budget, lambda: lower(fuse(ir, arch=90), 90, graph_signature, lambda content_hash: content_hash)
        )
    return times


def time_builder(shapes: list[str], nodes: int, budget: float, repeat: int) -> None:
    """Print the seconds each shape's builder takes to add ``nodes`` nodes (fastest of ``repeat``)."""
    print(f"{'graph':<10} {'nodes':>6} {'build':>9}")
    for shape in shapes:
        runs = [_timed(budget, partial(SHAPES[shape], nodes))[0] for _ in range(repeat)]
        best = min((r for r in runs if r is not None), default=None)
        cell = f"{best:9.3f}" if best is not None else f"{'>' + format(budget, 'g'):>9}"
        print(f"{shape:<10} {nodes:>6} {cell}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 65_536])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--budget", type=float, default=60.0, help="seconds a stage may take before it is stopped")
    parser.add_argument("--repeat", type=int, default=1, help="runs per graph; the fastest is shown")
    parser.add_argument(
        "--lower", action="store_true", help="also fuse and emit CUDA for sm_90 (slow: one kernel each)"
    )
    parser.add_argument("--builder", type=int, metavar="NODES", help="only time the builder adding NODES nodes")
    args = parser.parse_args()
    if args.builder:
        time_builder(args.shapes, args.builder, args.budget, args.repeat)
        return

    stages = STAGES if args.lower else STAGES[:-1]
    print(f"{'graph':<10} {'nodes':>6} " + " ".join(f"{s:>9}" for s in stages) + f" {'total*':>9}")
    for shape in args.shapes:
        for nodes in args.sizes:
            runs = [measure(shape, nodes, args.budget, args.lower) for _ in range(args.repeat)]
            best = {s: min((r[s] for r in runs if r[s] is not None), default=None) for s in stages}
            cells = [
                f"{best[s]:9.3f}" if best[s] is not None else f"{'>' + format(args.budget, 'g'):>9}" for s in stages
            ]
            # The target: a file loads (and so validates), is signed and fused.
            core = [best[s] for s in ("load", "sign", "fuse")]
            total = f"{sum(core):9.3f}" if None not in core else f"{'-':>9}"  # type: ignore[arg-type]
            print(f"{shape:<10} {nodes:>6} " + " ".join(cells) + f" {total}", flush=True)
    print("* total = load (parse + validate) + sign + fuse, in seconds; the fastest of --repeat runs")


if __name__ == "__main__":
    main()
