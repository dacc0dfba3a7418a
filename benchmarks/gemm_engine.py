"""The GEMM engines side by side on the matmuls of issue 9, beside cuBLAS (torch.matmul), in one
run (bf16, L2 flushed by do_bench, outputs checked against fp32 torch):

- mma.sync: the heuristic's choice on the mma.sync path (what a plan gets without tuning);
- wgmma: the fastest tile of the cp.async-fed wgmma path (gemm_sm90.py), no split-K;
- TMA: each tile of the persistent warp-specialised engine (gemm_ws.py), with its split-K
  choices for the few-tile shapes.

Then the ResNet-50 conv + BN + ReLU layers: the default plan, the engine's tiles with the
gather producer and with the TMA im2col producer (gemm_im2col.py), the cuDNN frontend's fused
kernel where its wheel imports, and torch eager.

    PYTHONPATH=. python benchmarks/gemm_engine.py [--only matmul|conv] [--case TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.cases import cases  # noqa: E402
from codegen.families.gemm import candidates  # noqa: E402

# (M, N, K, B stored k-contiguous)
SHAPES = [
    (4096, 4096, 4096, False),
    (8192, 8192, 8192, False),
    (16384, 4096, 4096, False),
    (2048, 4096, 1024, False),  # MLP fc1
    (2048, 1024, 4096, False),  # MLP fc2
    (4096, 4096, 4096, True),  # x @ W^T, W row-major [N, K] as in torch.nn.Linear
    (128, 4096, 4096, False),  # decode-like: 32 tiles, split-K
    (128, 4096, 4096, True),
]


def graph(m: int, n: int, k: int, transposed: bool) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"gemm_{m}x{n}x{k}{'_t' if transposed else ''}", io_data_type="bf16")
    b = g.tensor(name="b", dim=[k, n], stride=[1, k] if transposed else [n, 1])
    g.matmul(g.tensor(name="a", dim=[m, k]), b, name="mm").set_name("c").set_output(True)
    return g


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("matmul", "conv"), help="one of the two tables")
    parser.add_argument("--case", default="", help="only the conv layers whose name holds TEXT")
    args = parser.parse_args(argv)
    if args.only != "conv":
        matmul_table()
    if args.only != "matmul":
        conv_table(args.case)
    return 0


def matmul_table() -> None:
    print("| M×N×K | B | default plan TFLOP/s | best wgmma | ws engine (best tile) | cuBLAS | ws / cuBLAS |")
    print("|---|---|---|---|---|---|---|")
    for m, n, k, transposed in SHAPES:
        mma, wgmma, (tma, tile), cublas = row(m, n, k, transposed)
        layout = "[N,K]" if transposed else "[K,N]"
        print(
            f"| {m}×{n}×{k} | {layout} | {mma:.0f} | {wgmma:.0f} | {tma:.0f} ({tile}) | {cublas:.0f} | {tma / cublas:.2f} |",
            flush=True,
        )


def conv_table(only: str = "") -> None:
    print(
        "\n| conv + BN + ReLU | default plan µs | ws gather µs (best tile) | ws im2col µs (best tile) "
        "| default / im2col | cuDNN FE fused µs | torch eager µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for case in cases():
        if case.group == "conv" and only in case.name:
            default, (ws, tile), (mapped, mapped_tile), cudnn, eager = conv_row(case)
            print(
                f"| {case.name} | {default:.1f} | {ws:.1f} ({tile}) | {mapped:.1f} ({mapped_tile}) "
                f"| {default / mapped:.2f} | {cudnn} | {eager:.1f} |",
                flush=True,
            )


def conv_row(case: Any) -> tuple[float, tuple[float, str], tuple[float, str], str, float]:

    from benchmarks.measure import median_us
    from graphdnn.random_inputs import random_inputs
    from graphdnn.runtime.frameworks import empty_torch, to_torch

    ir = case.graph().validate()
    feeds = random_inputs(ir, seed=1)
    inputs = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs}
    out = {t.name: empty_torch(t) for t in ir.outputs}
    want = case.torch_fn(inputs).float()

    def timed(**options: object) -> float:
        bound = gd.compile(case.graph(), **options).bind({**inputs, **out})  # type: ignore[arg-type]
        out["y"].fill_(float("nan"))
        bound()
        error = ((out["y"].float() - want).norm() / want.norm()).item()
        assert error < 2e-2, f"{case.name} {options}: relative error {error:.3g}"
        return median_us(bound)

    fused = next(f for f in gd.fuse(case.graph()).nodes if f.anchor is not None and f.anchor.op == "conv_fprop")
    engine = [c for c in candidates(fused, 90) if c.get("path") == "ws" and "split_k" not in c]

    def fastest(producer: str | None) -> tuple[float, str]:
        return min(
            (timed(tuning={fused.name: c}), f"{c['block_n']}, {c['stages']} stages")
            for c in engine
            if c.get("producer") == producer
        )

    try:
        cudnn = f"{median_us(case.cudnn(inputs, {t.name: empty_torch(t) for t in ir.outputs})):.1f}"
    except Exception as error:  # the frontend's wheel is optional
        cudnn = f"n/a ({type(error).__name__})"
    return timed(), fastest(None), fastest("im2col"), cudnn, median_us(lambda: case.torch_fn(inputs))


def split_label(choice: dict[str, object]) -> str:
    return f", split {choice['split_k']}" if "split_k" in choice else ""


def row(m: int, n: int, k: int, transposed: bool) -> tuple[float, float, tuple[float, str], float]:
    import torch

    from benchmarks.measure import median_us

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = w.t() if transposed else w.t().contiguous()
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()
    tflops = lambda us: 2 * m * n * k / us / 1e6  # noqa: E731

    def timed(**options: object) -> float:
        bound = gd.compile(graph(m, n, k, transposed), **options).bind({"a": a, "b": b, "c": c})  # type: ignore[arg-type]
        c.fill_(float("nan"))
        bound()
        error = ((c.float() - want).norm() / want.norm()).item()
        assert error < 1e-2, f"{m}x{n}x{k} {options}: relative error {error:.3g}"
        return tflops(median_us(bound))

    fused = gd.fuse(graph(m, n, k, transposed)).nodes[0]
    choices = candidates(fused, 90)
    wgmma = max(timed(tuning={fused.name: c}) for c in choices if c.get("path") == "wgmma" and "split_k" not in c)
    tma = max(
        (timed(tuning={fused.name: c}), f"{c['block_n']}, {c['stages']} stages{split_label(c)}")
        for c in choices
        if c.get("path") == "ws"
    )
    return timed(), wgmma, tma, tflops(median_us(lambda: torch.matmul(a, b, out=c)))


if __name__ == "__main__":
    raise SystemExit(main())
