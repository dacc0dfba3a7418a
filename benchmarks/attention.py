"""Attention forward: graphdnn's sdpa beside PyTorch SDPA on its FlashAttention-2 and cuDNN
backends, on the issue's shapes (B4 H16, bf16), same inputs, L2 flushed by do_bench; with
``--backward``, graphdnn's sdpa_backward beside torch's SDPA backward on the same backends.

    PYTHONPATH=. python benchmarks/attention.py            # on a GPU
    PYTHONPATH=. python benchmarks/attention.py --backward # the backward pass, on a GPU
    PYTHONPATH=. python benchmarks/attention.py --dry      # anywhere: build the plans only

TFLOP/s count 4·B·H·Sq·Skv·D (two matmuls) forward and 10·B·H·Sq·Skv·D backward (five:
S again, dP, dV, dQ, dK), halved for a causal mask (the work a causal kernel skips). Every
graphdnn plan is checked against torch's result first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402

# (batch, heads, sequence, head dim, causal)
SHAPES = [(4, 16, 1024, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (4, 16, 2048, 64, False)]


def graph(b: int, h: int, s: int, d: int, causal: bool, stats: bool = False) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"sdpa_b{b}h{h}s{s}d{d}{'_causal' if causal else ''}", io_data_type="bf16")
    q, k, v = (g.tensor(name=n, dim=[b, h, s, d]) for n in "qkv")
    o, lse = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal, generate_stats=stats)
    o.set_name("o").set_output(True)
    if lse is not None:
        lse.set_name("stats").set_output(True)
    return g


def backward_graph(b: int, h: int, s: int, d: int, causal: bool) -> gd.OperationGraphSpec:
    """sdpa_backward alone: Q, K, V, O, dO and the forward's STATS in, dQ, dK, dV out."""
    g = gd.OperationGraphSpec(name=f"sdpa_backward_b{b}h{h}s{s}d{d}{'_causal' if causal else ''}", io_data_type="bf16")
    q, k, v, o, d_o = (g.tensor(name=n, dim=[b, h, s, d]) for n in ("q", "k", "v", "o", "do"))
    stats = g.tensor(name="stats", dim=[b, h, s, 1], data_type="float")
    grads = g.sdpa_backward(q, k, v, o, d_o, stats, attn_scale=d**-0.5, use_causal_mask=causal)
    for name, grad in zip(("dq", "dk", "dv"), grads):
        grad.set_name(name).set_output(True)
    return g


def flops(b: int, h: int, s: int, d: int, causal: bool, backward: bool = False) -> float:
    return (10 if backward else 4) * b * h * s * s * d / (2 if causal else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--autotune", action="store_true", help="time the flash launch choices first")
    parser.add_argument("--backward", action="store_true", help="sdpa_backward against torch's SDPA backward")
    args = parser.parse_args()
    if args.dry:
        for shape in SHAPES:
            for build in (graph, backward_graph):
                plan = gd.compile(build(*shape), arch="sm_90", cache=None)
                print(f"{build(*shape).name}: {len(plan.kernels)} kernel(s)")
        return 0
    if args.backward:
        print("| shape | graphdnn TFLOP/s | torch FA2 | torch cuDNN | graphdnn / cuDNN |")
        print("|---|---|---|---|---|")
        for shape in SHAPES:
            b, h, s, d, causal = shape
            tflops = [flops(*shape, backward=True) / us / 1e6 if us else float("nan") for us in timed_backward(shape)]
            print(
                f"| B{b} H{h} S{s} D{d}{' causal' if causal else ''} | "
                + " | ".join(f"{t:.0f}" for t in tflops)
                + f" | {tflops[0] / tflops[2]:.2f} |"
            )
        return 0
    rows = [timed(shape, args.autotune) for shape in SHAPES]
    print("| shape | default plan TFLOP/s | mma.sync | wgmma | torch FA2 | torch cuDNN | best / cuDNN |")
    print("|---|---|---|---|---|---|---|")
    for shape, times in zip(SHAPES, rows):
        b, h, s, d, causal = shape
        tflops = [flops(*shape) / us / 1e6 if us else float("nan") for us in times]
        print(
            f"| B{b} H{h} S{s} D{d}{' causal' if causal else ''} | "
            + " | ".join(f"{t:.0f}" for t in tflops)
            + f" | {max(tflops[:3]) / tflops[4]:.2f} |"
        )
    return 0


def timed(shape: tuple[int, int, int, int, bool], autotune: bool) -> tuple[float | None, ...]:
    """µs of the default plan (autotuned with ``autotune``), the mma.sync and wgmma kernels
    (sm_90), FlashAttention-2 and cuDNN through torch."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.measure import median_us

    b, h, s, d, causal = shape
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5)
    fused = next(f for f in gd.fuse(graph(*shape)).nodes if f.anchor is not None and f.anchor.op == "sdpa")

    def ours(**options: Any) -> float:
        bound = gd.compile(graph(*shape), **options).bind({"q": q, "k": k, "v": v, "o": o})
        o.fill_(float("nan"))
        bound()
        error = ((o.float() - want.float()).norm() / want.float().norm()).item()
        assert error < 2e-2, f"{shape} {options}: graphdnn differs from torch by {error:.3g}"
        return median_us(bound)

    def peer(backend: Any) -> float | None:
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5)
                return median_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=d**-0.5))
        except RuntimeError as error:  # a backend this build or GPU lacks
            print(f"{shape}: {backend} unavailable: {str(error).splitlines()[0]}")
            return None

    mma = ours(tuning={fused.name: {"warps": 4, "block_n": 64 if d <= 128 else 32, "m_tiles": 2 if d <= 128 else 1}})
    return (
        ours(autotune=autotune),
        mma,
        ours(tuning={fused.name: {"path": "wgmma"}}),
        peer(SDPBackend.FLASH_ATTENTION),
        peer(SDPBackend.CUDNN_ATTENTION),
    )


def timed_backward(shape: tuple[int, int, int, int, bool]) -> tuple[float | None, ...]:
    """µs of graphdnn's sdpa_backward plan, and of torch's SDPA backward (autograd.grad of a
    recorded forward) on FlashAttention-2 and cuDNN, all from the same Q, K, V and dO."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.measure import median_us

    b, h, s, d, causal = shape
    q, k, v, d_o = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=d**-0.5)
    want = torch.autograd.grad(o, leaves, d_o)
    stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)  # the forward's, from graphdnn's sdpa
    gd.compile(graph(*shape, stats=True)).execute({"q": q, "k": k, "v": v, "o": torch.empty_like(q), "stats": stats})
    grads = [torch.empty_like(q) for _ in range(3)]
    pack = {
        "q": q,
        "k": k,
        "v": v,
        "o": o.detach(),
        "do": d_o,
        "stats": stats,
        "dq": grads[0],
        "dk": grads[1],
        "dv": grads[2],
    }
    bound = gd.compile(backward_graph(*shape)).bind(pack)
    bound()
    for name, got, ref in zip(("dQ", "dK", "dV"), grads, want):
        error = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        assert error < 3e-2, f"{shape}: graphdnn's {name} differs from torch by {error:.3g}"

    def peer(backend: Any) -> float | None:
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=d**-0.5)
                return median_us(lambda: torch.autograd.grad(out, leaves, d_o, retain_graph=True))
        except RuntimeError as error:  # a backend this build or GPU lacks
            print(f"{shape}: {backend} unavailable: {str(error).splitlines()[0]}")
            return None

    return median_us(bound), peer(SDPBackend.FLASH_ATTENTION), peer(SDPBackend.CUDNN_ATTENTION)


if __name__ == "__main__":
    raise SystemExit(main())
