"""Convolution weight gradients (conv_wgrad, NHWC bf16) side by side with torch's (cuDNN): per
layer, the default plan and a sweep of launch choices (the mma.sync and wgmma tiles, K slices
filling one or two waves of the SMs), each checked against torch in fp32 first; prints a
markdown table with the roofline (x and dy read once, dw written; 2*K*C*R*S*N*P*Q FLOPs).

    PYTHONPATH=. python benchmarks/wgrad.py                # every layer, every choice
    PYTHONPATH=. python benchmarks/wgrad.py --only 3x3     # layers whose name contains "3x3"
    PYTHONPATH=. python benchmarks/wgrad.py --default      # the default plans only
    PYTHONPATH=. python benchmarks/wgrad.py --dry          # anywhere: build every choice for sm_90
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

import fusion_rules as fr  # noqa: E402
import graphdnn as gd  # noqa: E402
from benchmarks.conv_shapes import SquareConv  # noqa: E402
from graphdnn.arch import sm_count  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402

ARCH = 90


@dataclass(frozen=True)
class Layer(SquareConv):
    @property
    def name(self) -> str:
        s = f" s{self.stride}" if self.stride > 1 else ""
        return f"conv{self.size}x{self.size}{s} wgrad {self.c}->{self.k} @{self.hw}² n{self.n}"

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of dw = dy^T x: output channels, R*S*C taps, N*P*Q pixels."""
        return self.k, self.c * self.size**2, self.n * self.out_hw**2

    @property
    def flops(self) -> int:
        m, n, k = self.gemm
        return 2 * m * n * k

    @property
    def bytes(self) -> int:
        return 2 * (self.n * self.c * self.hw**2 + self.n * self.k * self.out_hw**2 + self.k * self.c * self.size**2)

    def graph(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"wgrad{self.size}_{self.c}to{self.k}_s{self.stride}", io_data_type="bf16")
        x_dim, w_dim = [self.n, self.c, self.hw, self.hw], [self.k, self.c, self.size, self.size]
        y_dim = [self.n, self.k, self.out_hw, self.out_hw]
        x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
        dy = g.tensor(name="dy", dim=y_dim, stride=gd.nhwc_strides(y_dim))
        dw = g.conv_wgrad(x, dy, padding=[self.pad] * 2, stride=[self.stride] * 2, filter_dim=w_dim)
        dw.set_name("dw").set_output(True).set_stride(gd.nhwc_strides(w_dim))
        return g

    def torch_fn(self, t: dict[str, Any]) -> Callable[[], Any]:
        import torch

        shape = [self.k, self.c, self.size, self.size]
        return lambda: torch.nn.grad.conv2d_weight(t["x"], shape, t["dy"], stride=self.stride, padding=self.pad)


LAYERS = [
    Layer(32, 64, 56, 64, 3),  # benchmarks/cases.py GRAD_LAYERS
    Layer(32, 64, 56, 256, 1),
    Layer(32, 256, 56, 512, 1, 2),  # ResNet-50's downsample 1x1, 56² -> 28²
    Layer(32, 128, 28, 128, 3),
    Layer(32, 3, 224, 64, 7, 2),  # the stem: C = 3, the image gathered element by element
    Layer(32, 12, 56, 64, 3),  # C not a multiple of 8 (no ResNet layer): element by element too
]


def choices(layer: Layer) -> list[tuple[str, dict[str, object] | None]]:
    """The default plan, then wgmma tiles (64 rows where M is that short; 192 columns where N is
    a multiple of 192 but not of 256) with K slices for one wave of blocks (4 stages; 6 for a
    64-column tile, whose k tiles are small) and for two (3 stages: two blocks per SM), and
    three for 64-row tiles. Where C is not a multiple of 8 (the image gathered element by
    element into a k-contiguous tile): the direct kernel, and 128 columns and the narrowest width
    (160 a width too) that covers N, 3 stages, slices for two and three waves, the image's loads a tile
    ahead through registers or not ("prefetch")."""
    m, n, k = layer.gemm
    sms = sm_count(ARCH)
    bm = 64 if m <= 64 else 128
    widths = [64] if n <= 64 else [192, 128] if n % 192 == 0 and n % 256 else [128, 256]
    out: list[tuple[str, dict[str, object] | None]] = [("default", None)]
    if layer.c % 8:
        out.append(("direct", {"path": "direct"}))
        widths = sorted({128, next((w for w in (64, 128, 160, 192, 256) if w >= n), 256)})
    # mma.sync as its heuristic (sm_80's default, gemm_mma.tile_config) picks it for sm_90
    mma_m, mma_n = (64 if m <= 64 else 128), (64 if n <= 64 else 128)
    mma_split = max(1, min(-(-sms // (-(-m // mma_m) * -(-n // mma_n))), k // 512, 64))
    mma_stages = 3 if (mma_m, mma_n) == (128, 128) else 4
    mma = {"block_m": mma_m, "block_n": mma_n, "stages": mma_stages, "split_k": mma_split}
    out.append((f"mma.sync {mma_m}x{mma_n}x{mma_stages} split {mma_split}", mma))
    if layer.c % 8:
        return out + [
            (
                f"wgmma {bm}x{bn}x3 split {split}{'' if prefetch else ' no prefetch'}",
                {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": 3, "split_k": split, "prefetch": prefetch},
            )
            for bn in widths
            for split in (max(1, min(-(-waves * sms // -(-n // bn)), k // (4 * 64))) for waves in (2, 3))
            for prefetch in (True, False)
        ]
    for bn in widths:
        tiles = -(-m // bm) * -(-n // bn)
        shapes = [(4, 1), (3, 2)] + ([(6, 1)] if bn == 64 else []) + ([(3, 3)] if bm == 64 else [])
        for stages, waves in shapes:
            split = max(1, min(-(-waves * sms // tiles), k // (4 * 64)))
            choice: dict[str, object] = {"path": "wgmma", "block_m": bm, "block_n": bn, "stages": stages}
            if split > 1:
                choice["split_k"] = split
            out.append((f"wgmma {bm}x{bn}x{stages} split {split}", choice))
    return out


def fused_name(ir: gd.Graph) -> str:
    """The name of the fused node holding the conv_wgrad (what a tuning is keyed by)."""
    (name,) = [f.name for f in fr.fuse(ir, arch=ARCH).nodes if any(n.op == "conv_wgrad" for n in f.nodes)]
    return name


def measure(
    layer: Layer, selected: list[tuple[str, dict[str, object] | None]], peak: Any, profile: bool = False
) -> list[str]:
    """Markdown rows: each choice checked against torch (fp32, no TF32), then timed; with
    ``profile``, each kernel of the fastest choice too."""
    import torch

    from benchmarks.measure import median_us

    torch.backends.cudnn.allow_tf32 = False
    graph = layer.graph()
    ir = graph.validate()
    feeds = random_inputs(ir, seed=1)
    t = {x.name: to_torch(feeds[x.name], x) for x in ir.inputs}
    want = torch.nn.grad.conv2d_weight(
        t["x"].float(),
        [layer.k, layer.c, layer.size, layer.size],
        t["dy"].float(),
        stride=layer.stride,
        padding=layer.pad,
    )
    torch_first = torch_us = median_us(layer.torch_fn(t), rep_ms=100)
    name = fused_name(ir)
    roof = peak.floor_us(layer.bytes, layer.flops)
    rows: list[str] = []
    fastest: tuple[float, str, Any] = (math.inf, "", None)
    for label, choice in selected:
        try:
            plan = gd.compile(graph, cache=None) if choice is None else gd.compile(graph, tuning={name: choice})
            dw = empty_torch(ir.outputs[0])
            bound = plan.bind({**t, "dw": dw}, cuda_graph=len(plan.kernels) > 1)
            dw.fill_(float("nan"))
            bound()
            torch.cuda.synchronize()
            error = ((dw.double() - want.double()).norm() / want.double().norm()).item()
            if not error <= 1e-2:
                raise AssertionError(f"relative error {error:.3g}")
            us = median_us(bound, rep_ms=100)
            fastest = min(fastest, (us, label, plan), key=lambda f: f[0])
            grids = " + ".join(f"{k.name.removeprefix('gd_').rsplit('_', 1)[0]} {list(k.grid)}" for k in plan.kernels)
            rows.append(
                f"| {layer.name} | {label} | {grids} | {us:.1f} | {layer.flops / us / 1e6:.0f} | "
                f"{100 * roof / us:.0f}% | {torch_us:.1f} | {torch_us / us:.2f}x |"
            )
        except Exception as error:  # one failing choice must not hide the others
            rows.append(
                f"| {layer.name} | {label} | failed: {type(error).__name__}: {str(error)[:160]} |  |  |  |  |  |"
            )
        print(rows[-1], flush=True)
    # torch's time varied by up to 2x between runs (H200): timed again after graphdnn's, both shown
    torch_last = median_us(layer.torch_fn(t), rep_ms=100)
    rows.append(f"| {layer.name} | torch (cuDNN) |  |  |  |  | {torch_first:.1f} before, {torch_last:.1f} after |  |")
    print(rows[-1], flush=True)
    if profile and fastest[2] is not None:
        rows.append(f"| {layer.name} | {fastest[1]}: per kernel | {kernel_times(fastest[2].bind({**t, 'dw': dw}))} |")
        print(rows[-1], flush=True)
    return rows


def _device_us(event: Any) -> float:
    """A profiler average's total device time (µs): ``device_time_total``, ``cuda_time_total`` before torch 2.4."""
    total = getattr(event, "device_time_total", None)
    return float(total if total is not None else event.cuda_time_total)


def kernel_times(bound: Callable[[], Any], runs: int = 20) -> str:
    """Each kernel's mean GPU time over ``runs`` calls (torch.profiler: CUPTI sees every launch)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    bound()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            bound()
        torch.cuda.synchronize()
    found = [e for e in prof.key_averages() if e.key.startswith("gd_") and e.count]
    return ", ".join(f"{e.key.removeprefix('gd_').rsplit('_', 1)[0]} {_device_us(e) / e.count:.1f} µs" for e in found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="layers whose name contains this text")
    parser.add_argument("--default", action="store_true", help="time the default plans only")
    parser.add_argument("--dry", action="store_true", help="build every choice for sm_90 without a GPU; time nothing")
    parser.add_argument("--profile", action="store_true", help="time each kernel of the fastest choice too")
    args = parser.parse_args()
    layers = [x for x in LAYERS if args.only in x.name]
    if args.dry:
        for layer in layers:
            ir = layer.graph().validate()
            name = fused_name(ir)
            for label, choice in choices(layer)[: 1 if args.default else None]:
                tuning = None if choice is None else {name: choice}
                plan = gd.compile(ir, arch=ARCH, cache=None, tuning=tuning)
                print(f"{layer.name} | {label} | {[(k.name, k.grid, k.block) for k in plan.kernels]}", flush=True)
        return 0
    from benchmarks.measure import measure_ceilings

    peak = measure_ceilings()
    print(
        f"{peak.device}: copy {peak.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 {peak.bf16_flops_per_s / 1e12:.0f} TFLOP/s"
    )
    print("| layer | choice | kernels [grid] | µs | TFLOP/s | % of roofline | torch µs | torch / ours |")
    print("|---|---|---|---|---|---|---|---|")
    for layer in layers:
        selected = choices(layer)
        measure(layer, selected[:1] if args.default else selected, peak, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
