"""One Llama decoder layer (examples/build_graphs.py ``llama_layer``) compiled whole by graphdnn,
against the same layer in eager PyTorch and under torch.compile (issue 10's end-to-end target).

    PYTHONPATH=. python benchmarks/llama_layer.py [--size example|1b|all] [--kernels]   # on a GPU

The graph is the example's: RMSNorm, the Q/K/V projections split into heads (reshape and
transpose, launching nothing), rotate-half RoPE written from primitives (folded into the
attention kernel by the rotary rule), causal GQA sdpa, the heads concatenated for the output
projection, the residual, RMSNorm, the SwiGLU MLP and its residual; bf16. The torch peer is the
same layer as Hugging Face's Llama writes it (cos/sin tables made once, outside the timing;
``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``). graphdnn's output is checked
against the eager layer (relative error <= 3e-2, bf16 throughout) before any timing; times are
medians of CUDA events with the L2 flushed (benchmarks/measure.py). ``--kernels`` adds
graphdnn's per-kernel times.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from build_graphs import llama_layer  # noqa: E402

import graphdnn as gd  # noqa: E402
from benchmarks.measure import measure_ceilings, median_us  # noqa: E402


@dataclass(frozen=True)
class Size:
    batch: int
    seq: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def flops(self) -> float:
        """Matmul FLOPs of the layer (causal attention counts half of S x S)."""
        tokens, d = self.batch * self.seq, self.head_dim
        projections = 2 * tokens * self.hidden * (self.heads + 2 * self.kv_heads) * d + 2 * tokens * self.hidden**2
        attention = 2 * 2 * self.batch * self.heads * self.seq * self.seq * d / 2
        return projections + attention + 3 * 2 * tokens * self.hidden * self.ffn


SIZES = {
    "example": Size(2, 128, 768, 8, 2, 2048),  # the example graph's own dims
    "1b": Size(1, 2048, 2048, 16, 4, 5632),  # a 1B-class layer over a 2048-token prompt
}


def inputs(size: Size) -> dict[str, Any]:
    """Random bf16 activations and weights scaled as an initialised layer's (unit-variance outputs)."""
    import torch

    torch.manual_seed(0)
    h, d = size.hidden, size.head_dim

    def weight(*dims: int, fan_in: int) -> Any:
        return (torch.randn(*dims, device="cuda") / math.sqrt(fan_in)).to(torch.bfloat16)

    return {
        "x": torch.randn(size.batch, size.seq, h, device="cuda", dtype=torch.bfloat16),
        "attn_norm.scale": (1 + 0.1 * torch.randn(1, 1, h, device="cuda")).to(torch.bfloat16),
        "mlp_norm.scale": (1 + 0.1 * torch.randn(1, 1, h, device="cuda")).to(torch.bfloat16),
        "wq": weight(h, size.heads * d, fan_in=h),
        "wk": weight(h, size.kv_heads * d, fan_in=h),
        "wv": weight(h, size.kv_heads * d, fan_in=h),
        "wo": weight(size.heads * d, h, fan_in=size.heads * d),
        "w_gate": weight(h, size.ffn, fan_in=h),
        "w_up": weight(h, size.ffn, fan_in=h),
        "w_down": weight(size.ffn, h, fan_in=size.ffn),
    }


def torch_layer(size: Size, t: dict[str, Any]) -> Any:
    """The layer as Hugging Face's Llama computes it."""
    import torch
    import torch.nn.functional as F

    b, s, h, d = size.batch, size.seq, size.hidden, size.head_dim
    position = torch.arange(s, device="cuda", dtype=torch.float32)
    inverse = torch.exp(torch.arange(d // 2, device="cuda", dtype=torch.float32) * (-2.0 * math.log(10000.0) / d))
    angle = torch.cat([torch.outer(position, inverse)] * 2, dim=1)
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    attn_scale, mlp_scale = t["attn_norm.scale"].view(h), t["mlp_norm.scale"].view(h)

    def rope(x: Any) -> Any:
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def heads(x: Any, count: int) -> Any:
        return x.view(b, s, count, d).transpose(1, 2)

    def layer(x: Any) -> Any:
        n = F.rms_norm(x, (h,), attn_scale, 1e-5)
        q, k = rope(heads(n @ t["wq"], size.heads)), rope(heads(n @ t["wk"], size.kv_heads))
        v = heads(n @ t["wv"], size.kv_heads)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(d), enable_gqa=True)
        residual = x + o.transpose(1, 2).reshape(b, s, h) @ t["wo"]
        m = F.rms_norm(residual, (h,), mlp_scale, 1e-5)
        return residual + (F.silu(m @ t["w_gate"]) * (m @ t["w_up"])) @ t["w_down"]

    return layer


def run(name: str, size: Size, kernels: bool, peak_flops: float) -> None:
    import torch

    from graphdnn.runtime.timing import kernel_times_us

    graph = llama_layer(size.batch, size.seq, size.hidden, size.heads, size.kv_heads, size.ffn)
    plan = gd.compile(graph)
    t = inputs(size)
    y = torch.full((size.batch, size.seq, size.hidden), float("nan"), device="cuda", dtype=torch.bfloat16)
    bound = plan.bind({**t, "y": y})
    bound()
    layer = torch_layer(size, t)
    want = layer(t["x"])
    torch.cuda.synchronize()
    error = ((y.double() - want.double()).norm() / want.double().norm()).item()
    assert error <= 3e-2, f"{name}: graphdnn against eager, relative error {error:.3g}"
    compiled = torch.compile(layer)
    compiled(t["x"])
    times = {
        "graphdnn": median_us(bound),
        "eager": median_us(lambda: layer(t["x"])),
        "torch.compile": median_us(lambda: compiled(t["x"])),
    }
    ours = times["graphdnn"]
    print(
        f"| {name}: B{size.batch} S{size.seq} hidden {size.hidden} heads {size.heads}/{size.kv_heads} "
        f"ffn {size.ffn} | {len(plan.kernels)} | {ours:.1f} | {times['eager']:.1f} | {times['torch.compile']:.1f} | "
        f"{times['eager'] / ours:.2f}x | {times['torch.compile'] / ours:.2f}x | "
        f"{size.flops / ours / 1e6:.0f} ({100 * size.flops / ours / 1e6 / peak_flops:.0f}%) | {error:.1e} |"
    )
    if kernels:
        per_kernel = kernel_times_us(bound)
        for launch, us in sorted(zip(bound.launches, per_kernel), key=lambda p: -p[1]):
            print(f"    {us:8.1f} µs  {launch.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=[*SIZES, "all"], default="all")
    parser.add_argument("--kernels", action="store_true", help="also print graphdnn's per-kernel times")
    args = parser.parse_args()
    ceilings = measure_ceilings()
    peak = ceilings.bf16_flops_per_s / 1e12
    print(f"{ceilings.device}; bf16 matmul peak measured {peak:.0f} TFLOP/s")
    print(
        "| layer | kernels | graphdnn µs | eager µs | torch.compile µs | vs eager | vs compile | "
        "graphdnn TFLOP/s (of peak) | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, size in SIZES.items():
        if args.size in (name, "all"):
            run(name, size, args.kernels, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
