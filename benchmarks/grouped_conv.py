"""Depthwise and grouped convolutions (NHWC bf16): forward, data gradient and weight gradient
side by side with torch's (cuDNN), per layer and default plan, each checked against torch in
fp32 first; prints a markdown table with the roofline (every tensor read or written once;
2*N*K*P*Q*(C/groups)*R*S FLOPs). Issue 13's target: >= 0.8x cuDNN.

    PYTHONPATH=. python benchmarks/grouped_conv.py                # every layer and pass
    PYTHONPATH=. python benchmarks/grouped_conv.py --only dw      # layers whose name contains "dw"
    PYTHONPATH=. python benchmarks/grouped_conv.py --dry          # anywhere: build every plan for sm_90
    PYTHONPATH=. python benchmarks/grouped_conv.py --passes wgrad --tuning '{"blocks_per_sm": 1}'
        # the wgrad rows, each also with that tuning choice (a row per --tuning)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.conv_shapes import SquareConv  # noqa: E402
from fusion_rules import fuse  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

ARCH = 90
PASSES = ("fprop", "dgrad", "wgrad")


@dataclass(frozen=True)
class Layer(SquareConv):
    """A convolution of ``groups`` groups (depthwise: groups == c == k)."""

    groups: int = 1

    @property
    def name(self) -> str:
        kind = "dw" if self.groups == self.c == self.k else f"g{self.groups}"
        return f"{kind} {self.size}x{self.size}{f' s{self.stride}' if self.stride > 1 else ''} {self.c}->{self.k} @{self.hw}²"

    @property
    def dims(self) -> dict[str, list[int]]:
        return {
            "x": [self.n, self.c, self.hw, self.hw],
            "w": [self.k, self.c // self.groups, self.size, self.size],
            "y": [self.n, self.k, self.out_hw, self.out_hw],
        }

    @property
    def flops(self) -> int:
        return 2 * self.n * self.k * self.out_hw**2 * (self.c // self.groups) * self.size**2

    @property
    def bytes(self) -> int:
        return 2 * sum(math.prod(d) for d in self.dims.values())

    def graph(self, kind: str) -> gd.OperationGraphSpec:
        """The pass ``kind`` alone: y from x and w, dx from dy and w, or dw from x and dy."""
        g = gd.OperationGraphSpec(name=f"{kind}_{self.name.replace(' ', '_')}", io_data_type="bf16")
        d = self.dims

        def tensor(name: str) -> gd.TensorSpec:
            return g.tensor(name=name, dim=d[name.removeprefix("d")], stride=gd.nhwc_strides(d[name.removeprefix("d")]))

        conv = {"padding": [self.pad] * 2, "stride": [self.stride] * 2}
        if kind == "fprop":
            out, dim = g.conv_fprop(tensor("x"), tensor("w"), **conv), d["y"]
        elif kind == "dgrad":
            out, dim = g.conv_dgrad(tensor("dy"), tensor("w"), image_dim=d["x"], **conv), d["x"]
        else:
            out, dim = g.conv_wgrad(tensor("x"), tensor("dy"), filter_dim=d["w"], **conv), d["w"]
        out.set_name("out").set_output(True).set_stride(gd.nhwc_strides(dim))
        return g

    def torch_fn(self, kind: str, t: dict[str, Any], fp32: bool = False) -> Callable[[], Any]:
        import torch
        import torch.nn.functional as F

        cast = (lambda v: v.float()) if fp32 else (lambda v: v)
        conv = {"stride": self.stride, "padding": self.pad, "groups": self.groups}
        if kind == "fprop":
            x, w = cast(t["x"]), cast(t["w"])
            return lambda: F.conv2d(x, w, **conv)
        if kind == "dgrad":
            dy, w = cast(t["dy"]), cast(t["w"])
            return lambda: torch.nn.grad.conv2d_input(self.dims["x"], w, dy, **conv)
        x, dy = cast(t["x"]), cast(t["dy"])
        return lambda: torch.nn.grad.conv2d_weight(x, self.dims["w"], dy, **conv)


LAYERS = [
    Layer(32, 144, 56, 144, 3, groups=144),  # MobileNetV2's depthwise 3x3 at 56²
    Layer(32, 144, 56, 144, 3, stride=2, groups=144),  # and its stride-2 one
    Layer(32, 576, 14, 576, 3, groups=576),
    Layer(32, 128, 56, 128, 3, groups=32),  # ResNeXt-50 32x4d's grouped 3x3s: 4 and 8 channels a group
    Layer(32, 256, 28, 256, 3, groups=32),
]


def measure(layer: Layer, kind: str, peak: Any, choice: dict[str, Any] | None = None) -> str:
    """A markdown row: the default plan (or the tuning ``choice``) checked against torch (fp32,
    no TF32), then timed."""
    import torch

    from benchmarks.measure import median_us

    torch.backends.cudnn.allow_tf32 = False
    label = "" if choice is None else f"{json.dumps(choice)}: "
    graph = layer.graph(kind)
    ir = graph.validate()
    feeds = random_inputs(ir, seed=1)
    t = {x.name: to_torch(feeds[x.name], x) for x in ir.inputs}
    want = layer.torch_fn(kind, t, fp32=True)()
    try:
        tuning = None if choice is None else {node.name: choice for node in fuse(ir).nodes}
        plan = gd.compile(graph, cache=None, tuning=tuning)
        out = empty_torch(ir.outputs[0])
        bound = plan.bind({**t, "out": out}, cuda_graph=len(plan.kernels) > 1)
        out.fill_(float("nan"))
        bound()
        torch.cuda.synchronize()
        error = ((out.double() - want.double()).norm() / want.double().norm()).item()
        if not error <= 1e-2:
            raise AssertionError(f"relative error {error:.3g}")
        us = median_us(bound, rep_ms=100)
    except Exception as error:  # one failing pass must not hide the others
        return f"| {layer.name} | {kind} | {label}failed: {type(error).__name__}: {str(error)[:160]} |  |  |  |  |"
    torch_us = median_us(layer.torch_fn(kind, t), rep_ms=100)
    kernels = label + " + ".join(k.name.removeprefix("gd_").rsplit("_", 1)[0] for k in plan.kernels)
    roof = peak.floor_us(layer.bytes, layer.flops)
    return f"| {layer.name} | {kind} | {kernels} | {us:.1f} | {100 * roof / us:.0f}% | {torch_us:.1f} | {torch_us / us:.2f}x |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="layers whose name contains this text")
    parser.add_argument("--dry", action="store_true", help="build every plan for sm_90 without a GPU; time nothing")
    parser.add_argument("--passes", default=",".join(PASSES), help="comma-separated passes to run")
    parser.add_argument("--tuning", action="append", default=[], help="a JSON tuning choice timed besides the default")
    args = parser.parse_args()
    layers = [x for x in LAYERS if args.only in x.name]
    passes = [kind for kind in args.passes.split(",") if kind]
    choices = [None, *map(json.loads, args.tuning)]
    if args.dry:
        for layer in layers:
            for kind in passes:
                plan = gd.compile(layer.graph(kind), arch=ARCH, cache=None)
                print(f"{layer.name} | {kind} | {[(k.name, k.grid, k.block) for k in plan.kernels]}", flush=True)
        return 0
    from benchmarks.measure import measure_ceilings

    peak = measure_ceilings()
    print(
        f"{peak.device}: copy {peak.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 {peak.bf16_flops_per_s / 1e12:.0f} TFLOP/s"
    )
    print("| layer | pass | kernels | µs | % of roofline | torch µs | torch / ours |")
    print("|---|---|---|---|---|---|---|")
    for layer in layers:
        for kind in passes:
            for choice in choices:
                print(measure(layer, kind, peak, choice), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
