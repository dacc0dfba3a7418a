"""Weight-only int4 / int8 GEMM (issue 12) beside torch's bf16 GEMM of the same shape, on one GPU.

C [M, N] = A [M, K] (bf16) @ dequantize(W int4 or int8 [K, N] stored as [N, K], bf16 scales per
128 k per column, or one per column), written as the graph block_scale_dequantize(W) -> matmul,
which the weight_only_matmul rule fuses: M = 1 to 16 tokens, (K, N) = (4096, 4096) and
(4096, 14336), LLM decode. The problem is bound by the weights' bytes: ours reads K * N / 2 of
them (int4) or K * N (int8), the bf16 GEMM 2 * K * N, so 4x (2x) is the memory-bound ideal.
Each row gives the time, the bytes moved per second against the device-to-device copy rate
measured in the same run (the HBM roofline), torch.matmul(A, W_bf16ᵀ) in the same run, and
with 8-bit weights torch's dequantize-then-matmul (what a plain PyTorch layer runs:
_dequantize_then_matmul). Outputs are checked
against torch's fp32 product of the dequantized weights. ``--zero-points`` gives W bf16 zero
points per group too (asymmetric int4, as AWQ / GPTQ checkpoints): W = (code - zero) * scale.

    PYTHONPATH=. python benchmarks/weight_only_gemm.py            # on the GPU
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --sweep    # and every launch choice
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --choices 1/8/2/0/2/0,1/8/1/0/1/4  # and these
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --clean-flush  # L2 flushed by a read
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --zero-points
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --weight int8 [--group channel]
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --weight fp8_e4m3 --rows 1,16
    PYTHONPATH=. python benchmarks/weight_only_gemm.py --dry      # the plans' kernels for sm_90, no GPU
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import graphdnn as gd

SHAPES = ((4096, 4096), (4096, 14336))  # (K, N)
ROWS = (1, 4, 8, 16)


@dataclass(frozen=True)
class Weights:
    """How W is stored: int4, int8 or fp8_e4m3 codes, scales per ``group`` k (K itself: per
    column), and bf16 zero points per group (int4) or none."""

    weight: str = "int4"
    group: int | None = 128  # None: one scale per column
    zero_points: bool = False

    @property
    def bits(self) -> int:
        return 4 if self.weight == "int4" else 8

    def block(self, k: int) -> int:
        return self.group or k


def graph(m: int, k: int, n: int, weights: Weights = Weights()) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(
        name=f"weight_only_{m}x{k}x{n}", io_data_type="bfloat16", intermediate_data_type="bfloat16"
    )
    a = g.tensor(name="a", dim=[m, k])
    w = g.tensor(name="w", dim=[k, n], stride=[1, k], data_type=weights.weight)
    block = weights.block(k)
    scale = g.tensor(name="scale", dim=[k // block, n], data_type="bfloat16")
    zero = g.tensor(name="zero", dim=[k // block, n], data_type="bfloat16") if weights.zero_points else None
    c = g.matmul(a, g.block_scale_dequantize(w, scale, block, axis=0, zero_point=zero, name="deq"), name="mm")
    c.set_name("c").set_output(True)
    return g


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="emit each plan's kernels for sm_90 (no GPU, no NVRTC)")
    parser.add_argument("--sweep", action="store_true", help="also time every launch choice (shorter timings)")
    parser.add_argument(
        "--clean-flush", action="store_true", help="flush L2 by reading between repetitions (measure.median_us)"
    )
    parser.add_argument(
        "--choices",
        default="",
        help="also time these launch choices, tiles/warps/unroll/early_a/split/stages, comma-separated",
    )
    parser.add_argument("--zero-points", action="store_true", help="asymmetric int4: bf16 zero points per group")
    parser.add_argument("--weight", choices=("int4", "int8", "fp8_e4m3"), default="int4", help="W's type")
    parser.add_argument("--group", choices=("32", "64", "128", "channel"), default="128", help="k per scale")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="the M (tokens) to time, comma-separated")
    args = parser.parse_args()
    if args.zero_points and args.weight != "int4":
        parser.error("--zero-points: 8-bit weights are symmetric")
    weights = Weights(args.weight, None if args.group == "channel" else int(args.group), args.zero_points)
    if args.dry:
        return dry(weights)
    from benchmarks.measure import measure_ceilings

    ceilings = measure_ceilings()
    copy = ceilings.copy_bytes_per_s / 1e9
    print(f"{ceilings.device}: device-to-device copy {copy:.0f} GB/s (read + written)\n")
    chosen = [_choice(text) for text in args.choices.split(",") if text]
    best = " best choice µs (tiles/warps/unroll/early_a/split/stages) | speedup |" if args.sweep or chosen else ""
    dequantized = " torch dequantize + bf16 µs |" if weights.bits == 8 else ""
    print(f"{args.weight} weights, scales per {args.group if weights.group else 'column'}")
    print(f"| M | K x N | ours µs | ours GB/s | % of copy | torch bf16 µs | torch GB/s | speedup |{dequantized}{best}")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if dequantized else "") + ("---|---|" if best else ""))
    for k, n in SHAPES:
        for m in map(int, args.rows.split(",")):
            print(row(m, k, n, copy, args.sweep, chosen, weights, args.clean_flush), flush=True)
    return 0


def dry(weights: Weights) -> int:
    from fusion_rules import fuse
    from graphdnn.lower import lower
    from graphdnn.signature import signature

    for k, n in SHAPES:
        for m in ROWS:
            g = graph(m, k, n, weights).validate()
            sources = lower(fuse(g, arch=90), 90, signature(g), lambda content_hash: content_hash).sources
            print(f"M={m} K={k} N={n}: {', '.join(source.name for source in sources.values())}")
    return 0


def row(
    m: int,
    k: int,
    n: int,
    copy_gbs: float,
    sweep: bool,
    chosen: list[dict[str, object]],
    weights: Weights,
    clean: bool,
) -> str:
    from benchmarks.measure import checked_plan_us, median_us

    inputs, want, w16 = _inputs(m, k, n, weights)
    ours = checked_plan_us(graph(m, k, n, weights), inputs, want, clean=clean)
    best = _sweep(m, k, n, inputs, want, weights, None if sweep else chosen, clean) if sweep or chosen else None
    a = inputs["a"]
    theirs = median_us(lambda: a @ w16.t(), clean=clean)
    dequantized = ""
    if weights.bits == 8:
        dequantized = f" {median_us(_dequantize_then_matmul(a, inputs, weights), clean=clean):.1f} |"
    group_bytes = 2 * (k // weights.block(k)) * n * (2 if weights.zero_points else 1)
    ours_bytes = k * n * weights.bits // 8 + group_bytes + 2 * m * k + 2 * m * n
    torch_bytes = 2 * k * n + 2 * m * k + 2 * m * n
    ours_gbs, torch_gbs = ours_bytes / ours / 1e3, torch_bytes / theirs / 1e3
    shown = f" {best[0]:.1f} ({best[1]}) | {theirs / best[0]:.2f} |" if best else ""
    return (
        f"| {m} | {k} x {n} | {ours:.1f} | {ours_gbs:.0f} | {100 * ours_gbs / copy_gbs:.0f}% | {theirs:.1f} | "
        f"{torch_gbs:.0f} | {theirs / ours:.2f} |{dequantized}{shown}"
    )


def _dequantize_then_matmul(a: Any, inputs: dict[str, Any], weights: Weights) -> Any:
    """torch's plain form of the layer: per column, the bf16 product of the widened codes times
    the scales (torchao's int8 weight-only form); per group, the codes widened times their
    scales (expanded once beforehand, [N, K] contiguous), then the bf16 GEMM."""
    codes, scale = inputs["w"].t(), inputs["scale"]  # codes [N, K]
    if weights.group is None:
        return lambda: (a @ codes.to(a.dtype).t()) * scale
    groups = scale.repeat_interleave(weights.group, 0).t().contiguous()
    return lambda: a @ (codes.to(a.dtype) * groups).t()


def _sweep(
    m: int,
    k: int,
    n: int,
    inputs: dict[str, Any],
    want: Any,
    weights: Weights,
    chosen: list[dict[str, object]] | None,
    clean: bool,
) -> tuple[float, str]:
    """The ``chosen`` launch choices (None: every one) timed, printed on one line; the fastest."""
    from benchmarks.measure import checked_plan_us
    from codegen.families.gemm import candidates

    fused = next(f for f in gd.fuse(graph(m, k, n, weights)).nodes if f.anchor is not None)
    timed = []
    for c in candidates(fused, 90) if chosen is None else chosen:
        try:
            us = checked_plan_us(graph(m, k, n, weights), inputs, want, {fused.name: c}, rep_ms=50, clean=clean)
        except Exception as error:  # a choice the problem refuses, or a wrong result: said, and the rest timed
            print(f"  M={m} K={k} N={n} {_short(c)}: {type(error).__name__}: {str(error)[:300]}")
            continue
        timed.append((us, _short(c)))
    timed.sort()
    print(f"  M={m} K={k} N={n} (µs {'/'.join(KEYS)}): " + ", ".join(f"{us:.1f} {c}" for us, c in timed))
    return timed[0] if timed else (float("nan"), "none")


KEYS = ("column_tiles", "warps", "unroll", "early_a", "split", "stages")


def _short(choice: dict[str, object]) -> str:
    """A launch choice as tiles/warps/unroll/early_a/split/stages."""
    return "/".join(str(choice[key]) for key in KEYS)


def _choice(text: str) -> dict[str, object]:
    """tiles/warps/unroll/early_a/split/stages as a launch choice."""
    values = text.split("/")
    if len(values) != len(KEYS) or not all(v.isdigit() for v in values):
        raise SystemExit(f"--choices: {text!r} is not six integers tiles/warps/unroll/early_a/split/stages")
    return dict(zip(KEYS, map(int, values)))


def _inputs(m: int, k: int, n: int, weights: Weights) -> tuple[dict[str, Any], Any, Any]:
    """The feeds, the fp32 product of the dequantized weights (bf16), and W dequantized as a
    bf16 [N, K] matrix (the peer's operand, the same layout as ours)."""
    import torch

    block = weights.block(k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    scale = (torch.rand(k // block, n, device="cuda") * 0.02 + 0.01).to(torch.bfloat16)
    zero = (torch.rand(k // block, n, device="cuda") * 4 - 2).to(torch.bfloat16)
    if weights.weight == "fp8_e4m3":
        stored = (torch.randn(n, k, device="cuda") * 64).to(torch.float8_e4m3fn)  # [N, K]: k-contiguous
        codes = stored.float()
    elif weights.weight == "int8":
        stored = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
        codes = stored.float()
    else:
        stored = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8)  # [N, K / 2]: packed along K
        codes = ((torch.stack([stored & 15, stored >> 4], dim=-1).reshape(n, k).to(torch.int32) ^ 8) - 8).float()
    values = codes - (zero.float().repeat_interleave(block, 0).t() if weights.zero_points else 0.0)
    w16 = (values * scale.float().repeat_interleave(block, 0).t()).to(torch.bfloat16)
    want = (a.float() @ w16.float().t()).to(torch.bfloat16)
    feeds = {"a": a, "w": stored.t(), "scale": scale, **({"zero": zero} if weights.zero_points else {})}
    return feeds, want, w16


if __name__ == "__main__":
    raise SystemExit(main())
