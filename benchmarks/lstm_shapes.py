"""LSTM inference beside torch.nn.LSTM (cuDNN's RNN, its weights flattened once, as a module
keeps them), at benchmarks/classic.py's shape and at issue 13's target (2 layers, hidden 1024,
batch 64, 512 steps), fp16, for several launch choices of graphdnn's rnn kernels (VARIANTS:
the step's product on the tensor cores or the CUDA cores, the projection's staging, the
step's hidden units per block). Outputs are compared with torch's (the NumPy reference of the
target shape takes minutes; tests/test_codegen_direct.py checks smaller ones against it).

Where the time goes: one call of each (graphdnn's CUDA graph replay, torch's module) under
torch.profiler, its kernels' device time summed by kind (graphdnn: projection, step; cuDNN:
its GEMMs and its recurrent kernels) and the span from the first kernel's start to the last's
end, so span - busy is the time between kernels (launch gaps).

The floor: every step reads its layer's W_hh (4 H x H fp16) once, at the device's copy
bandwidth (measured in the same run; W_hh may sit in L2, so this floor is generous), and the
projections run at the bf16 matrix rate; each step launch waits for the previous one, so the
steps' floors add up.

    PYTHONPATH=. python3 benchmarks/lstm_shapes.py [--variants default,units16,...] [--shapes 0,1]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.classic import _lstm_graph, _lstm_weight_dims  # noqa: E402
from benchmarks.measure import Ceilings, measure_ceilings, median_us  # noqa: E402
from codegen.families.rnn_projection import STAGING  # noqa: E402
from codegen.families.rnn_step import SCHEDULE, UNITS  # noqa: E402
from codegen.families.rnn_step_mma import PRODUCT  # noqa: E402
from fusion_rules import fuse  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "fma": {PRODUCT: "fma"},
    "element": {STAGING: "element"},
    "serial": {SCHEDULE: "serial"},
    "serial_element": {SCHEDULE: "serial", STAGING: "element"},  # both as before issue 13's session 7
    "units4": {UNITS: 4},
    "units16": {UNITS: 16},
    "units32": {UNITS: 32},
}
SHAPES = [(64, 32, 256, 2), (512, 64, 1024, 2)]  # steps, batch, hidden, layers


def floor_us(ceilings: Ceilings, steps: int, batch: int, hidden: int, layers: int) -> float:
    """Sum of the steps' W_hh reads and the projections' products at the ceilings."""
    w_hh = 4 * hidden * hidden * 2
    projection_flops = 2 * steps * batch * 4 * hidden * hidden
    return layers * (steps * ceilings.floor_us(w_hh) + ceilings.floor_us(0, projection_flops))


def breakdown(fn: Callable[[], object], kinds: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """One call of ``fn`` under torch.profiler: device microseconds of its kernels by kind (the
    first kind whose words a kernel's name contains; "other" for the rest), their sum ("busy")
    and the span from the first kernel's start to the last's end."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {kind: 0.0 for kind in [*kinds, "other"]}
    counts: dict[str, int] = {kind: 0 for kind in times}
    starts, ends = [], []
    for event in prof.events():
        if str(getattr(event, "device_type", "")).split(".")[-1] != "CUDA":
            continue
        name = event.name.lower()
        kind = next((k for k, words in kinds.items() if any(w in name for w in words)), "other")
        if kind == "other" and ("memcpy" in name or "memset" in name):
            continue
        times[kind] += event.time_range.elapsed_us()
        counts[kind] += 1
        starts.append(event.time_range.start)
        ends.append(event.time_range.end)
    out = {f"{kind}_us": round(value, 1) for kind, value in times.items()}
    out.update({f"{kind}_kernels": count for kind, count in counts.items()})
    out["busy_us"] = round(sum(times.values()), 1)
    out["span_us"] = round(max(ends) - min(starts), 1) if starts else 0.0
    return out


def measure(
    ceilings: Ceilings, variants: list[str], steps: int, batch: int, hidden: int, layers: int
) -> list[dict[str, object]]:
    import torch

    graph = _lstm_graph(steps, batch, hidden, layers)()
    ir = graph.validate()
    feeds = random_inputs(ir, seed=1)
    inputs = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs}
    lstm = torch.nn.LSTM(hidden, hidden, layers).cuda().half()
    with torch.no_grad():
        for parameter, (name, _) in zip(lstm._flat_weights, _lstm_weight_dims(hidden, hidden, layers)):
            parameter.copy_(inputs[name])
    lstm.flatten_parameters()
    x = inputs["x"]
    case = f"lstm {layers}x{hidden} n{batch} t{steps} fp16"
    with torch.no_grad():
        expected = lstm(x)[0].float()
        theirs = median_us(lambda: lstm(x))
        cudnn = breakdown(
            lambda: lstm(x),
            {"gemm": ("gemm", "gemv", "cutlass", "xmma"), "recurrent": ("rnn", "lstm", "persist", "elemwise")},
        )
    rows: list[dict[str, object]] = [
        {
            "case": case,
            "device": torch.cuda.get_device_name(),
            "torch_cudnn_us": round(theirs, 1),
            "copy_tb_s": round(ceilings.copy_bytes_per_s / 1e12, 2),
            "w_hh_mib_per_step": 4 * hidden * hidden * 2 / 2**20,
            "floor_us": round(floor_us(ceilings, steps, batch, hidden, layers), 1),
            **{f"cudnn_{key}": value for key, value in cudnn.items()},
        }
    ]
    (fused,) = fuse(ir).nodes
    for variant in variants:
        outputs = {t.name: empty_torch(t) for t in ir.outputs}
        plan = gd.compile(graph, tuning={fused.name: VARIANTS[variant]})
        bound = plan.bind({**inputs, **outputs}, cuda_graph=True)
        bound()
        torch.cuda.synchronize()
        got = outputs["y"].float()
        ours = median_us(bound)
        rows.append(
            {
                "case": case,
                "variant": variant,
                "relative_error_vs_torch": float((got - expected).norm() / expected.norm()),
                "us": round(ours, 1),
                "torch_time_over_ours": round(theirs / ours, 2),
                "fraction_of_floor": round(float(rows[0]["floor_us"]) / ours, 3),
                "launches": len(plan.kernels),
                **breakdown(bound, {"projection": ("projection",), "step": ("step",)}),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="default,serial,fma", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))), help="indices into SHAPES")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    ceilings = measure_ceilings()
    for index in args.shapes.split(","):
        for row in measure(ceilings, variants, *SHAPES[int(index)]):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
