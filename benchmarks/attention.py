"""Attention forward: graphdnn's sdpa beside PyTorch SDPA on its FlashAttention-2 and cuDNN
backends, on the issue's shapes (B4 H16, bf16), same inputs, L2 flushed by do_bench.

    PYTHONPATH=. python benchmarks/attention.py            # on a GPU
    PYTHONPATH=. python benchmarks/attention.py --dry      # anywhere: build the plans only

TFLOP/s count 4·B·H·Sq·Skv·D (two matmuls), halved for a causal mask (the work a
causal kernel skips). Every graphdnn plan is checked against torch's result first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from codegen.emit import candidates  # noqa: E402

# (batch, heads, sequence, head dim, causal)
SHAPES = [(4, 16, 1024, 128, False), (4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (4, 16, 2048, 64, False)]


def graph(b: int, h: int, s: int, d: int, causal: bool) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"sdpa_b{b}h{h}s{s}d{d}{'_causal' if causal else ''}", io_data_type="bf16")
    q, k, v = (g.tensor(name=n, dim=[b, h, s, d]) for n in "qkv")
    o, _ = g.sdpa(q, k, v, attn_scale=d**-0.5, use_causal_mask=causal)
    o.set_name("o").set_output(True)
    return g


def flops(b: int, h: int, s: int, d: int, causal: bool) -> float:
    return 4 * b * h * s * s * d / (2 if causal else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--autotune", action="store_true", help="time the flash launch choices first")
    args = parser.parse_args()
    if args.dry:
        for shape in SHAPES:
            plan = gd.compile(graph(*shape), arch="sm_90", cache=None)
            print(f"{graph(*shape).name}: {len(plan.kernels)} kernel(s)")
        return 0
    rows = [timed(shape, args.autotune) for shape in SHAPES]
    columns = list(rows[0])
    print("| shape | " + " | ".join(columns) + " | best / cuDNN |")
    print("|---|" + "---|" * (len(columns) + 1))
    for shape, times in zip(SHAPES, rows):
        b, h, s, d, causal = shape
        tflops = {name: flops(*shape) / us / 1e6 if us else float("nan") for name, us in times.items()}
        ours = max(v for name, v in tflops.items() if not name.startswith("torch"))
        print(
            f"| B{b} H{h} S{s} D{d}{' causal' if causal else ''} | "
            + " | ".join(f"{t:.0f}" for t in tflops.values())
            + f" | {ours / tflops['torch cuDNN']:.2f} |"
        )
    return 0


def timed(shape: tuple[int, int, int, int, bool], autotune: bool) -> dict[str, float | None]:
    """µs of the default plan (autotuned with ``autotune``), the mma.sync kernel, each choice of
    the wgmma one (sm_90: keys per stage, "pp" the consumers' turn-taking), FlashAttention-2 and
    cuDNN through torch."""
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

    times: dict[str, float | None] = {
        "default plan": ours(autotune=autotune),
        "mma.sync": ours(
            tuning={fused.name: {"warps": 4, "block_n": 64 if d <= 128 else 32, "m_tiles": 2 if d <= 128 else 1}}
        ),
    }
    for choice in (c for c in candidates(fused, 90) if c.get("path") == "wgmma"):
        label = f"wgmma bn{choice['block_n']}{' pp' if choice['pingpong'] else ''}"
        times[label] = ours(tuning={fused.name: choice})
    times["torch FA2"] = peer(SDPBackend.FLASH_ATTENTION)
    times["torch cuDNN"] = peer(SDPBackend.CUDNN_ATTENTION)
    return times


if __name__ == "__main__":
    raise SystemExit(main())
