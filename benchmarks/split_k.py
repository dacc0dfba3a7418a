"""Split-K on few-tile matmuls: the best single-kernel tile against the heuristic's split and the
autotuned choice, beside cuBLAS (torch.matmul), in one run (bf16, L2 flushed by do_bench).

    PYTHONPATH=. python benchmarks/split_k.py

"best without split" times every mma.sync tile with split_k = 1 and keeps the fastest, so
the gain shown is split-K's alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from codegen.families.gemm_mma import TILE_CANDIDATES  # noqa: E402

SHAPES = [(128, 4096, 4096), (2048, 1024, 4096), (64, 8192, 8192), (4096, 4096, 4096)]  # (M, N, K)


def graph(m: int, n: int, k: int) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"splitk_{m}x{n}x{k}", io_data_type="bf16")
    g.matmul(g.tensor(name="a", dim=[m, k]), g.tensor(name="b", dim=[k, n]), name="mm").set_name("c").set_output(True)
    return g


def main() -> int:
    print("| M×N×K | best tile, no split µs | heuristic µs | autotuned µs | cuBLAS µs | speed vs cuBLAS |")
    print("|---|---|---|---|---|---|")
    for m, n, k in SHAPES:
        single, heuristic, tuned, cublas = row(m, n, k)
        print(f"| {m}×{n}×{k} | {single:.1f} | {heuristic:.1f} | {tuned:.1f} | {cublas:.1f} | {cublas / tuned:.2f}x |")
    return 0


def row(m: int, n: int, k: int) -> tuple[float, float, float, float]:
    import torch

    from benchmarks.measure import median_us

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()

    def timed(**options: object) -> float:
        bound = gd.compile(graph(m, n, k), **options).bind({"a": a, "b": b, "c": c})  # type: ignore[arg-type]
        bound()
        error = ((c.float() - want).norm() / want.norm()).item()
        assert error < 1e-2, f"{m}x{n}x{k} {options}: relative error {error:.3g}"
        return median_us(bound)

    fused = gd.fuse(graph(m, n, k)).nodes[0].name
    single = min(
        timed(tuning={fused: {"block_m": t.block_m, "block_n": t.block_n, "stages": t.stages, "split_k": 1}})
        for t in TILE_CANDIDATES
    )
    heuristic, tuned = timed(), timed(autotune=True)
    return single, heuristic, tuned, median_us(lambda: torch.matmul(a, b, out=c))


if __name__ == "__main__":
    raise SystemExit(main())
