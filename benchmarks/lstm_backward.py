"""LSTM training beside torch.nn.LSTM (cuDNN's RNN forward in training and its backward data
and weights): graphdnn's rnn_training then rnn_backward, each a CUDA graph replay, against
the module's forward with gradients on and ``torch.autograd.grad`` of y (x's and every
weight's gradient), at benchmarks/lstm_shapes.py's shapes (SHAPES: classic.py's and issue
13's target, 2 layers, hidden 1024, batch 64, 512 steps), fp16 data, float32 reserve.

graphdnn's gradients are compared with torch's in the same run (relative error of dx and of
the flat weight gradient); each backward row has its kernels' device time by kind (the
step kernels, the all-step GEMMs and their operands' rearrangement) from one call under torch.profiler, and ``--sequences``
times launch choices of the step kernel (sequences per thread) side by side. The floor of the backward: per step, W_hh (4 H x H fp16) read
once at the copy bandwidth (the recurrence, T launches a layer), plus the all-step products
(dW_ih, dW_hh, dx: 3 x 2 T N 4H H flops) at the bf16 matrix rate, both measured here.

    PYTHONPATH=. python3 benchmarks/lstm_backward.py [--shapes 0,1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.classic import _lstm_weight_dims  # noqa: E402
from benchmarks.lstm_shapes import SHAPES, breakdown  # noqa: E402
from benchmarks.measure import Ceilings, measure_ceilings, median_us  # noqa: E402
from codegen.families.rnn_backward_step import SEQUENCES  # noqa: E402
from fusion_rules import fuse  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

# The backward's kernels by kind, for the breakdown: the operands rearranged for the GEMMs
# (rnn_backward_operands.py), the step kernels, the all-step GEMMs.
KINDS = {
    "rearrange": ("dgates_t", "dgates_h_t", "input_t", "h_prev_t", "w_ih_t"),
    "step": ("backward_step",),
    "gemms": ("backward_weights", "backward_input"),
}


def graphs(steps: int, batch: int, hidden: int, layers: int) -> tuple[gd.OperationGraphSpec, gd.OperationGraphSpec]:
    """The forward in training (y, reserve out) and the backward (dx, dweights out) of one LSTM."""
    out = []
    for kind in ("rnn_training", "rnn_backward"):
        g = gd.OperationGraphSpec(name=f"lstm_{kind}_{layers}x{hidden}_n{batch}_t{steps}", io_data_type="half")
        x = g.tensor(name="x", dim=[steps, batch, hidden])
        weights = [g.tensor(name=name, dim=dims) for name, dims in _lstm_weight_dims(hidden, hidden, layers)]
        if kind == "rnn_training":
            y, _, _, reserve = g.rnn_training(x, weights, "lstm", hidden, num_layers=layers)
            named = {"y": y, "reserve": reserve}
        else:
            fields = [layers, steps, batch, 1, 6 * hidden]
            reserve = g.tensor(name="reserve", dim=fields, data_type="float")
            dy = g.tensor(name="dy", dim=[steps, batch, hidden])
            dx, _, _, dweights = g.rnn_backward(x, weights, reserve, dy, "lstm", hidden, num_layers=layers)
            named = {"dx": dx, "dweights": dweights}
        for name, tensor in named.items():
            tensor.set_name(name).set_output(True)  # type: ignore[union-attr]
        out.append(g)
    return out[0], out[1]


def floor_us(ceilings: Ceilings, steps: int, batch: int, hidden: int, layers: int) -> float:
    products = 3 * 2 * steps * batch * 4 * hidden * hidden
    return layers * (steps * ceilings.floor_us(4 * hidden * hidden * 2) + ceilings.floor_us(0, products))


def measure(
    ceilings: Ceilings, per_thread: list[int], steps: int, batch: int, hidden: int, layers: int
) -> list[dict[str, object]]:
    import torch

    forward_graph, backward_graph = graphs(steps, batch, hidden, layers)
    forward_ir, backward_ir = forward_graph.validate(), backward_graph.validate()
    feeds = random_inputs(backward_ir, seed=1)
    inputs = {t.name: to_torch(feeds[t.name], t) for t in backward_ir.inputs if t.name != "reserve"}
    lstm = torch.nn.LSTM(hidden, hidden, layers).cuda().half()
    with torch.no_grad():
        for parameter, (name, _) in zip(lstm._flat_weights, _lstm_weight_dims(hidden, hidden, layers)):
            parameter.copy_(inputs[name])
    lstm.flatten_parameters()
    x = inputs["x"].clone().requires_grad_(True)
    dy = inputs["dy"]
    wanted = [x, *lstm._flat_weights]
    y = lstm(x)[0]
    grads = torch.autograd.grad(y, wanted, dy, retain_graph=True)
    torch_forward = median_us(lambda: lstm(x))
    torch_backward = median_us(lambda: torch.autograd.grad(y, wanted, dy, retain_graph=True))

    forward_out = {t.name: empty_torch(t) for t in forward_ir.outputs}
    forward_in = {t.name: inputs[t.name] for t in forward_ir.inputs}
    forward = gd.compile(forward_graph).bind({**forward_in, **forward_out}, cuda_graph=True)
    forward()
    ours_forward = median_us(forward)

    def error(got: torch.Tensor, expected: torch.Tensor) -> float:
        return float((got.detach().float() - expected.detach().float()).norm() / expected.detach().float().norm())

    rows: list[dict[str, object]] = []
    (fused,) = fuse(backward_ir).nodes
    for choice in per_thread:  # 0: the default
        backward_out = {t.name: empty_torch(t) for t in backward_ir.outputs}
        backward_plan = gd.compile(backward_graph, tuning={fused.name: {SEQUENCES: choice}} if choice else None)
        backward = backward_plan.bind({**inputs, "reserve": forward_out["reserve"], **backward_out}, cuda_graph=True)
        backward()
        torch.cuda.synchronize()
        ours_backward = median_us(backward)
        rows.append(
            {
                "case": f"lstm {layers}x{hidden} n{batch} t{steps} fp16, reserve fp32",
                "device": torch.cuda.get_device_name(),
                "sequences_per_step_thread": choice or "default",
                "y_error_vs_torch": error(forward_out["y"], y),
                "dx_error_vs_torch": error(backward_out["dx"], grads[0]),
                "dweights_error_vs_torch": error(
                    backward_out["dweights"], torch.cat([g.reshape(-1) for g in grads[1:]])
                ),
                "torch_forward_us": round(torch_forward, 1),
                "torch_backward_us": round(torch_backward, 1),
                "forward_us": round(ours_forward, 1),
                "backward_us": round(ours_backward, 1),
                "torch_over_ours_forward": round(torch_forward / ours_forward, 3),
                "torch_over_ours_backward": round(torch_backward / ours_backward, 3),
                "torch_over_ours_training": round((torch_forward + torch_backward) / (ours_forward + ours_backward), 3),
                "backward_floor_us": round(floor_us(ceilings, steps, batch, hidden, layers), 1),
                "backward_launches": len(backward_plan.kernels),
                **breakdown(backward, KINDS),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))), help="indices into SHAPES")
    parser.add_argument("--sequences", default="0", help=f"{SEQUENCES} launch choices to time (0: the default)")
    args = parser.parse_args()
    ceilings = measure_ceilings()
    per_thread = [int(choice) for choice in args.sequences.split(",")]
    for index in args.shapes.split(","):
        for row in measure(ceilings, per_thread, *SHAPES[int(index)]):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
