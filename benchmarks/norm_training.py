"""Training norms (bf16): adaptive layer norm forward and backward, instance and group norm
backward, each checked against torch (fp32 autograd) first, then timed beside torch's autograd
(F.layer_norm with the per-sample affine; F.instance_norm / F.group_norm backward). Prints a
markdown table with the HBM roofline: the bytes every tensor is read or written once, over the
device-to-device copy bandwidth measured in the same run (issue 13).

    PYTHONPATH=. python benchmarks/norm_training.py               # every case
    PYTHONPATH=. python benchmarks/norm_training.py --only group  # cases whose name contains "group"
    PYTHONPATH=. python benchmarks/norm_training.py --dry         # anywhere: build every plan for sm_90
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

ARCH = 90
EPS = 1e-5


@dataclass(frozen=True)
class Case:
    op: str  # adalayernorm, adalayernorm_backward, instancenorm_backward, groupnorm_backward
    dims: tuple[int, ...]
    groups: int = 0
    layout: str = "nchw"

    @property
    def name(self) -> str:
        shape = "x".join(map(str, self.dims))
        return f"{self.op} {shape}{f' g{self.groups}' if self.groups else ''}{'' if self.ada else ' ' + self.layout}"

    @property
    def ada(self) -> bool:
        return self.op.startswith("adalayernorm")

    @property
    def params(self) -> list[int]:
        d = self.dims
        return [d[0], 1, d[-1]] if self.ada else [1, d[1], 1, 1]

    @property
    def stats(self) -> list[int]:
        d = self.dims
        return [d[0], d[1], 1] if self.ada else [d[0], self.groups or d[1], 1, 1]

    @property
    def bytes(self) -> int:
        """bf16 x and y (forward) or dy, x and dx (backward), plus the parameters (bf16), their
        gradients and the fp32 statistics, each once."""
        big, params, stats = math.prod(self.dims), math.prod(self.params), math.prod(self.stats)
        if self.op == "adalayernorm":
            return 2 * 2 * big + 2 * 2 * params + 2 * 4 * stats
        return 3 * 2 * big + 3 * 2 * params + 2 * 4 * stats

    def graph(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=self.name.replace(" ", "_"), io_data_type="bf16")
        dims = list(self.dims)
        stride = gd.nhwc_strides(dims) if self.layout == "nhwc" else gd.nchw_strides(dims)
        x, scale = g.tensor(dims, stride=stride, name="x"), g.tensor(self.params, name="scale")
        if self.op == "adalayernorm":
            y, mean, inv = g.adalayernorm("training", x, scale, g.tensor(self.params, name="bias"), EPS)
            outputs = {"y": y, "mean": mean, "inv": inv}
        else:
            dy = g.tensor(dims, stride=stride, name="dy")
            mean, inv = (g.tensor(self.stats, name=n, data_type="float") for n in ("mean", "inv"))
            extra = {"groups": self.groups} if self.groups else {}
            dx, dscale, dbias = getattr(g, self.op)(dy, x, scale, mean, inv, **extra)
            outputs = {"dx": dx, "dscale": dscale, "dbias": dbias}
        for name, t in outputs.items():
            assert t is not None
            t.set_name(name).set_output(True)
            if name in ("y", "dx"):
                t.set_stride(stride)
            if name in ("mean", "inv"):
                t.set_data_type("float")
        return g

    def torch_fn(self, t: dict[str, Any], fp32: bool = False) -> Callable[[], dict[str, Any]]:
        """torch's forward (y, mean, inv) or autograd backward (dx, dscale, dbias) of the same op."""
        import torch
        import torch.nn.functional as F

        cast = (lambda v: v.float()) if fp32 else (lambda v: v)
        x, scale = cast(t["x"]), cast(t["scale"])
        if self.op == "adalayernorm":
            bias = cast(t["bias"])

            def forward() -> dict[str, Any]:
                return {"y": F.layer_norm(x, (self.dims[-1],), eps=EPS) * scale + bias}

            return forward
        dy = cast(t["dy"])
        leaf_x, leaf_scale = x.detach().requires_grad_(), scale.detach().reshape(-1).requires_grad_()
        leaf_bias = torch.zeros_like(leaf_scale).requires_grad_()
        mean, inv = t["mean"], t["inv"]
        if self.op == "adalayernorm_backward":
            leaf_scale = scale.detach().requires_grad_()
            leaf_bias = torch.zeros_like(leaf_scale).requires_grad_()

            def run(v: Any) -> Any:
                return F.layer_norm(v, (self.dims[-1],), eps=EPS) * leaf_scale + leaf_bias
        elif self.op == "instancenorm_backward":

            def run(v: Any) -> Any:
                return F.instance_norm(v, weight=leaf_scale, bias=leaf_bias, eps=EPS)
        else:

            def run(v: Any) -> Any:
                return F.group_norm(v, self.groups, leaf_scale, leaf_bias, EPS)

        del mean, inv  # torch recomputes its statistics inside autograd

        def backward() -> dict[str, Any]:
            grads = torch.autograd.grad(run(leaf_x), (leaf_x, leaf_scale, leaf_bias), dy)
            return dict(zip(("dx", "dscale", "dbias"), grads))

        return backward


CASES = [
    Case("adalayernorm", (8, 4096, 1024)),
    Case("adalayernorm_backward", (8, 4096, 1024)),
    Case("instancenorm_backward", (16, 256, 64, 64), layout="nhwc"),
    Case("instancenorm_backward", (16, 256, 64, 64), layout="nchw"),
    Case("groupnorm_backward", (16, 256, 64, 64), 32, "nhwc"),
    Case("groupnorm_backward", (16, 256, 64, 64), 32, "nchw"),
]


def _feeds(case: Case, ir: Any) -> dict[str, Any]:
    """Random inputs; a backward case gets the statistics of its x (torch recomputes them)."""
    import torch

    feeds = random_inputs(ir, seed=1)
    t = {x.name: to_torch(feeds[x.name], x) for x in ir.inputs}
    if case.op != "adalayernorm":
        x = t["x"].float()
        sets = x.reshape(*case.stats[:2], -1)  # [B, S, D] or [N, groups, C/groups * spatial]
        mean, var = sets.mean(dim=-1), sets.var(dim=-1, unbiased=False)
        t["mean"] = mean.reshape(case.stats).contiguous()
        t["inv"] = torch.rsqrt(var + EPS).reshape(case.stats).contiguous()
    return t


def measure(case: Case, peak: Any) -> str:
    """A markdown row: the default plan checked against torch in fp32, then timed beside torch."""
    import torch

    from benchmarks.measure import median_us

    ir = case.graph().validate()
    t = _feeds(case, ir)
    want = case.torch_fn(t, fp32=True)()
    try:
        plan = gd.compile(case.graph(), cache=None)
        outputs = {o.name: empty_torch(o) for o in ir.outputs}
        bound = plan.bind({**t, **outputs}, cuda_graph=len(plan.kernels) > 1)
        for out in outputs.values():
            out.fill_(float("nan"))
        bound()
        torch.cuda.synchronize()
        for name, value in want.items():
            got = outputs[name].double().reshape(value.shape)
            error = ((got - value.double()).norm() / value.double().norm()).item()
            if not error <= 2e-2:
                raise AssertionError(f"{name}: relative error {error:.3g}")
        us = median_us(bound, rep_ms=100)
    except Exception as error:  # one failing case must not hide the others
        return f"| {case.name} | failed: {type(error).__name__}: {str(error)[:200]} |  |  |  |  |  |"
    torch_us = median_us(case.torch_fn(t), rep_ms=100)
    kernels = " + ".join(k.name.removeprefix("gd_").rsplit("_", 1)[0] for k in plan.kernels)
    roof = peak.floor_us(case.bytes)
    return (
        f"| {case.name} | {kernels} | {us:.1f} | {100 * roof / us:.0f}% | {torch_us:.1f} | "
        f"{100 * roof / torch_us:.0f}% | {torch_us / us:.2f}x |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="cases whose name contains this text")
    parser.add_argument("--dry", action="store_true", help="build every plan for sm_90 without a GPU; time nothing")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in c.name]
    if args.dry:
        for case in cases:
            plan = gd.compile(case.graph(), arch=ARCH, cache=None)
            print(f"{case.name} | {[(k.name, k.grid, k.block) for k in plan.kernels]}", flush=True)
        return 0
    from benchmarks.measure import measure_ceilings

    peak = measure_ceilings()
    print(f"{peak.device}: copy {peak.copy_bytes_per_s / 1e12:.2f} TB/s (read + write)")
    print("| case (bf16) | kernels | µs | % of HBM roofline | torch µs | torch % of roofline | torch / ours |")
    print("|---|---|---|---|---|---|---|")
    for case in cases:
        print(measure(case, peak), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
