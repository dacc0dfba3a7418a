"""Run benchmark cases once each inside a profiler range, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        python3 benchmarks/profile_case.py --only "conv3x3"

Plans are built (and autotuned) before the range opens, so only the chosen kernels are
profiled, once per case.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.cases import cases  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="the cases whose name contains this text")
    args = parser.parse_args()
    import torch
    from cuda.bindings import driver

    bound = []
    for case in (c for c in cases() if args.only in c.name):
        graph = case.graph()
        ir = graph.validate()
        feeds = random_inputs(ir, seed=1)
        pack = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs} | {t.name: empty_torch(t) for t in ir.outputs}
        plan = gd.compile(graph, autotune=True)
        print(f"{case.name}: " + ", ".join(f"{k.name} grid {list(k.grid)} block {list(k.block)}" for k in plan.kernels))
        bound.append(plan.bind(pack))
    for run in bound:
        run()
    torch.cuda.synchronize()
    driver.cuProfilerStart()
    for run in bound:
        run()
    torch.cuda.synchronize()
    driver.cuProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
