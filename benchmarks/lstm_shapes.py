"""LSTM inference beside torch.nn.LSTM (cuDNN's RNN, its weights flattened once, as a module
keeps them), at benchmarks/classic.py's shape and at issue 13's target (2 layers, hidden 1024,
batch 64, 512 steps), fp16, with the step kernel's product on the tensor cores (the default
for 16-bit weights) and on the CUDA cores (the ``rnn_step_product`` launch choice "fma").
Outputs are compared with torch's (the NumPy reference of the target shape takes minutes;
tests/test_codegen_direct.py checks smaller ones against it).

The floor: every step reads its layer's W_hh (4 H x H fp16) once, at the device's copy
bandwidth (measured in the same run; W_hh may sit in L2, so this floor is generous), and the
projections run at the bf16 matrix rate; each step launch waits for the previous one, so the
steps' floors add up.

    PYTHONPATH=. python3 benchmarks/lstm_shapes.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.classic import _lstm_graph, _lstm_weight_dims  # noqa: E402
from benchmarks.measure import Ceilings, measure_ceilings, median_us  # noqa: E402
from codegen.families.rnn_step_mma import PRODUCT  # noqa: E402
from fusion_rules import fuse  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

SHAPES = [(64, 32, 256, 2), (512, 64, 1024, 2)]  # steps, batch, hidden, layers


def floor_us(ceilings: Ceilings, steps: int, batch: int, hidden: int, layers: int) -> float:
    """Sum of the steps' W_hh reads and the projections' products at the ceilings."""
    w_hh = 4 * hidden * hidden * 2
    projection_flops = 2 * steps * batch * 4 * hidden * hidden
    return layers * (steps * ceilings.floor_us(w_hh) + ceilings.floor_us(0, projection_flops))


def measure(ceilings: Ceilings, steps: int, batch: int, hidden: int, layers: int) -> dict[str, object]:
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
    with torch.no_grad():
        expected = lstm(x)[0].float()
        theirs = median_us(lambda: lstm(x))
    row: dict[str, object] = {
        "case": f"lstm {layers}x{hidden} n{batch} t{steps} fp16",
        "device": torch.cuda.get_device_name(),
        "torch_cudnn_us": round(theirs, 1),
        "copy_tb_s": round(ceilings.copy_bytes_per_s / 1e12, 2),
        "w_hh_mib_per_step": 4 * hidden * hidden * 2 / 2**20,
        "floor_us": round(floor_us(ceilings, steps, batch, hidden, layers), 1),
    }
    (fused,) = fuse(ir).nodes
    for product in ("mma", "fma"):
        outputs = {t.name: empty_torch(t) for t in ir.outputs}
        plan = gd.compile(graph, tuning={fused.name: {PRODUCT: product}})
        bound = plan.bind({**inputs, **outputs}, cuda_graph=True)
        bound()
        torch.cuda.synchronize()
        got = outputs["y"].float()
        ours = median_us(bound)
        row[f"{product}_relative_error_vs_torch"] = float((got - expected).norm() / expected.norm())
        row[f"{product}_us"] = round(ours, 1)
        row[f"{product}_torch_time_over_ours"] = round(theirs / ours, 2)
        row[f"{product}_fraction_of_floor"] = round(float(row["floor_us"]) / ours, 3)
        row["launches"] = len(plan.kernels)
    return row


def main() -> int:
    ceilings = measure_ceilings()
    for shape in SHAPES:
        print(json.dumps(measure(ceilings, *shape)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
