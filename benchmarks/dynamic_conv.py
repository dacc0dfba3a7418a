"""A dynamic convolution's plan (conv + BN + ReLU over a batch in 1..max, one plan) against the
static plan of each batch, on the same buffers.

    PYTHONPATH=. python benchmarks/dynamic_conv.py            # on a GPU

ResNet-50's 3x3 128->128 at 28², NHWC bf16 (benchmarks/cases.py, the dynamic conv cases), at
the batches of the issue (1, 13, 64) and at the edges of the plan's size buckets. Both plans
take their heuristic choices; each is checked against torch's conv + BN + ReLU from a
NaN-poisoned output, then timed as the median of CUDA events (triton's do_bench, L2 flushed),
the two plans in turn ROUNDS times, each plan's figure the median of its rounds (so that a
drift of the GPU's clocks falls on both); torch eager (cuDNN) is the peer. Prints a markdown
table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.cases import DYNAMIC_CONV, DYNAMIC_MAX_BATCH, _conv_graph, _conv_torch  # noqa: E402
from benchmarks.measure import against_cells, median_us, static_against_dynamic  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

BATCHES = (1, 2, 10, 11, 13, 64)
ROUNDS = 3


def _kernels(bound: Any) -> str:
    return " + ".join(launch.name.rsplit("_", 1)[0].removeprefix("gd_conv_bn_relu_") for launch in bound.launches)


def main() -> int:
    import torch

    c, hw, k, size = DYNAMIC_CONV
    dynamic = gd.compile(_conv_graph(1, *DYNAMIC_CONV, max_n=DYNAMIC_MAX_BATCH)())
    print(
        f"{torch.cuda.get_device_name()}: conv{size}x{size}+bn+relu {c}->{k} @{hw}², NHWC bf16, batch 1..{DYNAMIC_MAX_BATCH}"
    )
    print()
    print("| batch | kernels (dynamic) | dynamic µs | static µs | dynamic / static | torch eager µs |")
    print("|---|---|---|---|---|---|")
    for n in BATCHES:
        graph = _conv_graph(n, *DYNAMIC_CONV)()
        ir = graph.validate()
        feeds = random_inputs(ir, seed=n)
        inputs = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs}
        out = empty_torch(ir.outputs[0])
        expected = _conv_torch(inputs).float()
        try:  # one broken batch must not hide the others' numbers
            plans = {"static": gd.compile(graph), "dynamic": dynamic}
            times, bound = static_against_dynamic(plans, {**inputs, "y": out}, out, expected, ROUNDS)
            kernels = _kernels(bound)
            eager = median_us(lambda inputs=inputs: _conv_torch(inputs))
            print(f"| {n} | {kernels} | {against_cells(times, eager)}", flush=True)
        except Exception as error:
            print(f"| {n} | failed: {type(error).__name__}: {str(error)[:200]} | | | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
