"""8-bit GEMMs (issue 12) beside PyTorch's: fp8 against torch._scaled_mm (cuBLASLt), int8
against torch._int_mm, on H100 (sm_90), L2 flushed by do_bench, outputs checked against torch.

- fp8 e4m3, bf16 output, per-tensor scales (``matmul(a, b) * scale_a * scale_b``) and per-row /
  per-column scales (``* row_scale[M, 1] * column_scale[1, N]``, _scaled_mm's rowwise mode);
- int8, int32 output (exact sums).

For each: the default plan (the warp-specialised TMA engine at these sizes) and the engine's
best tile. B is stored K-major ([N, K] row-major, seen as [K, N]: what the 8-bit tensor cores
read and what _scaled_mm wants).

    PYTHONPATH=. python benchmarks/lowp_gemm.py          # on the GPU
    PYTHONPATH=. python benchmarks/lowp_gemm.py --dry    # emits the plans' kernels for sm_90, no GPU
    PYTHONPATH=. python benchmarks/lowp_gemm.py --block-scaled  # block-scaled fp8 only (block_scaled_gemm.py)
    PYTHONPATH=. python benchmarks/lowp_gemm.py --mxfp8  # its MXFP8 rows only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks import block_scaled_gemm  # noqa: E402
from codegen.families.gemm import candidates  # noqa: E402

SIZES = (4096, 8192)
# (name, operand type, output type, scales)
KINDS = (
    ("fp8 e4m3, per-tensor scales", "fp8_e4m3", "bfloat16", ("a", "b")),
    ("fp8 e4m3, row / column scales", "fp8_e4m3", "bfloat16", ("row", "column")),
    ("int8 -> int32", "int8", "int32", ()),
)


def graph(size: int, operand: str, out: str, scales: tuple[str, ...]) -> gd.OperationGraphSpec:
    """matmul(a, b) [* scales] -> c, B stored K-major."""
    m = n = k = size
    g = gd.OperationGraphSpec(
        name=f"lowp_{operand}_{size}", io_data_type=operand, intermediate_data_type="float", compute_data_type="float"
    )
    y = g.matmul(g.tensor(name="a", dim=[m, k]), g.tensor(name="b", dim=[k, n], stride=[1, k]), name="mm")
    shapes = {"a": [1, 1], "b": [1, 1], "row": [m, 1], "column": [1, n]}
    for scale in scales:
        y = g.mul(y, g.tensor(name=f"scale_{scale}", dim=shapes[scale], data_type="float"))
    y.set_name("c").set_output(True).set_data_type(out)
    return g


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="emit each plan's kernels for sm_90 (no GPU, no NVRTC)")
    parser.add_argument("--block-scaled", action="store_true", help="the block-scaled fp8 table only")
    parser.add_argument("--mxfp8", action="store_true", help="the block-scaled table's MXFP8 rows only")
    args = parser.parse_args()
    if args.dry:
        return dry()
    if args.mxfp8:
        block_scaled_gemm.table(block_scaled_gemm.MX_FORMS)
        return 0
    if args.block_scaled:
        block_scaled_gemm.table()
        return 0
    print("| GEMM | M=N=K | default plan TFLOP/s | engine, best tile | torch | best / torch |")
    print("|---|---|---|---|---|---|")
    for name, operand, out, scales in KINDS:
        for size in SIZES:
            default, (best, tile), torch_rate = row(size, operand, out, scales)
            print(
                f"| {name} | {size} | {default:.0f} | {best:.0f} ({tile}) | {torch_rate:.0f} | {best / torch_rate:.2f} |",
                flush=True,
            )
    print()
    block_scaled_gemm.table()
    return 0


def dry() -> int:
    from fusion_rules import fuse
    from graphdnn.lower import lower
    from graphdnn.signature import signature

    graphs = [(name, size, graph(size, operand, out, scales)) for name, operand, out, scales in KINDS for size in SIZES]
    graphs += [
        (f"block-scaled, {form}", " x ".join(map(str, shape)), block_scaled_gemm.graph(shape, form))
        for form in block_scaled_gemm.FORMS
        for shape in block_scaled_gemm.shapes(form)
    ]
    for name, size, spec in graphs:
        g = spec.validate()
        sources = lower(fuse(g, arch=90), 90, signature(g), lambda content_hash: content_hash).sources
        kernels = ", ".join(source.name for source in sources.values())
        print(f"{name} {size}: {kernels}")
    return 0


def row(size: int, operand: str, out: str, scales: tuple[str, ...]) -> tuple[float, tuple[float, str], float]:
    import torch

    from benchmarks.measure import median_us

    m = n = k = size
    tflops = lambda us: 2 * m * n * k / us / 1e6  # noqa: E731
    if operand == "int8":
        a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
        b = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8).t()  # K-major [K, N]
        inputs: dict[str, Any] = {"a": a, "b": b}
        c = torch.empty(m, n, device="cuda", dtype=torch.int32)
        want = torch._int_mm(a, b)
        theirs = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
        if scales == ("a", "b"):
            scale_a, scale_b = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
            inputs = {"a": a, "b": b, "scale_a": scale_a.reshape(1, 1), "scale_b": scale_b.reshape(1, 1)}
        else:
            scale_a = torch.rand(m, 1, device="cuda") + 0.5
            scale_b = torch.rand(1, n, device="cuda") + 0.5
            inputs = {"a": a, "b": b, "scale_row": scale_a, "scale_column": scale_b}
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def theirs() -> Any:
            result = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
            return result[0] if isinstance(result, tuple) else result  # torch < 2.5 returned (out, amax)

        want = theirs()

    def timed(tuning: dict[str, dict[str, object]] | None = None) -> float:
        bound = gd.compile(graph(size, operand, out, scales), tuning=tuning).bind({**inputs, "c": c})
        c.zero_()
        bound()
        error = ((c.double() - want.double()).norm() / want.double().norm()).item()
        assert error <= (0 if operand == "int8" else 1e-2), f"{operand} {size} {tuning}: relative error {error:.3g}"
        return tflops(median_us(bound))

    fused = next(f for f in gd.fuse(graph(size, operand, out, scales)).nodes if f.anchor is not None)
    best = max(
        (timed(tuning={fused.name: choice}), f"{choice['block_n']}, {choice['stages']} stages")
        for choice in candidates(fused, 90)
        if choice.get("path") == "ws"
    )
    return timed(), best, tflops(median_us(theirs))


if __name__ == "__main__":
    raise SystemExit(main())
