"""The MoE grouped GEMM (``moe_grouped_matmul``, issue 12) beside PyTorch's: bf16, top-2 routing
of T tokens to E experts (uniform random, so the experts' row counts vary as they do in a
model), hidden 4096 -> 1408 per expert (S = 2T rows, [S, 4096] x [E, 4096, 1408]).

Compared, in one run on one GPU, outputs checked against torch._grouped_mm:
- graphdnn's default plan (on sm_90 the warp-specialised TMA engine, gemm_grouped_ws.py;
  elsewhere the mma.sync grouped kernel), its other mma.sync tiles and, on sm_90, its engine
  and cp.async-fed wgmma tiles; with ``--simt`` the old SIMT kernel (``{"path": "simt"}``) at
  the smaller T only (it takes seconds at the larger);
- ``torch._grouped_mm`` (CUTLASS grouped GEMM), and a loop of per-expert ``torch.matmul``;
- the dense product of the same size, ``[S, 4096] x [4096, 1408]`` (one expert's weights for
  every row), by ``torch.matmul`` (cuBLAS) and by graphdnn's default matmul plan (on sm_90 the
  same engine): what the grouped kernels would reach without experts.

    PYTHONPATH=. python benchmarks/grouped_gemm.py          # on the GPU
    PYTHONPATH=. python benchmarks/grouped_gemm.py --only default "ws 128x256x4"   # those variants
    PYTHONPATH=. python benchmarks/grouped_gemm.py --dry    # lowers every variant for sm_90, no GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402

HIDDEN, FFN, TOP_K = 4096, 1408, 2
# (experts, tokens); one expert: the dense product's tiles, what the grouped schedule costs alone
CASES = ((8, 4096), (64, 4096), (8, 32768), (64, 32768), (1, 32768))
FAILURES: list[str] = []
SIMT_MAX_TOKENS = 4096
NODE = "experts"
VARIANTS: dict[str, dict[str, object] | None] = {
    "default": None,
    "ws 128x128x6": {"path": "ws", "block_n": 128, "stages": 6},
    "ws 128x256x4": {"path": "ws", "block_n": 256, "stages": 4},
    "ws 128x256x3": {"path": "ws", "block_n": 256, "stages": 3},
    "mma 64x128": {"path": "mma", "block_m": 64, "block_n": 128, "stages": 4},
    "mma 128x128": {"path": "mma", "block_m": 128, "block_n": 128, "stages": 3},
    "wgmma 128x128x4": {"path": "wgmma", "block_m": 128, "block_n": 128, "stages": 4},
    "wgmma 128x256x4": {"path": "wgmma", "block_m": 128, "block_n": 256, "stages": 4},
    "wgmma 64x128x4": {"path": "wgmma", "block_m": 64, "block_n": 128, "stages": 4},
}


def dense_graph(tokens: int) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"dense_{tokens}", io_data_type="bfloat16", intermediate_data_type="float")
    y = g.matmul(g.tensor([tokens * TOP_K, HIDDEN], name="token"), g.tensor([HIDDEN, FFN], name="weight"))
    y.set_name("out").set_output(True)
    return g


def graph(experts: int, tokens: int) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(
        name=f"grouped_{experts}x{tokens}", io_data_type="bfloat16", intermediate_data_type="float"
    )
    offsets = g.tensor([experts], name="offsets", data_type="int32")
    weight = g.tensor([experts, HIDDEN, FFN], name="weight")
    y = g.moe_grouped_matmul(g.tensor([tokens * TOP_K, HIDDEN], name="token"), weight, offsets, name=NODE)
    y.set_name("out").set_output(True)
    return g


def variants(
    experts: int, tokens: int, arch: int, only: list[str] | None = None, simt: bool = False
) -> dict[str, dict[str, object] | None]:
    """The variants to time: those named by ``only`` (every one when None) that run on sm_``arch``."""
    chosen = {
        name: v
        for name, v in VARIANTS.items()
        if (arch == 90 or v is None or v["path"] not in ("wgmma", "ws")) and (only is None or name in only)
    }
    if simt and tokens <= SIMT_MAX_TOKENS:
        chosen["old SIMT"] = {"path": "simt"}
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="lower every variant for sm_90 (no GPU, no NVRTC)")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), help="time these variants only")
    parser.add_argument("--simt", action="store_true", help="time the old SIMT kernel too (T = 4096 only)")
    args = parser.parse_args()
    return dry(args.only, args.simt) if args.dry else run(args.only, args.simt)


def dry(only: list[str] | None, simt: bool) -> int:
    from graphdnn.compilation import Compilation
    from graphdnn.lower import lower

    for experts, tokens in CASES:
        job = Compilation.of(graph(experts, tokens).validate(), 90)
        for name, choice in variants(experts, tokens, 90, only, simt).items():
            tuning = None if choice is None else {0: choice}
            lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key, tuning=tuning)
            print(f"E={experts} T={tokens} {name}: {', '.join(s.name for s in lowered.sources.values())}")
    return 0


def run(only: list[str] | None, simt: bool) -> int:
    import torch

    major, minor = torch.cuda.get_device_capability()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    if not hasattr(torch, "_grouped_mm"):
        raise SystemExit(f"torch {torch.__version__} has no torch._grouped_mm")
    print("| experts | tokens (rows) | variant | µs | TFLOP/s | / torch._grouped_mm | / loop of torch.matmul |")
    print("|---|---|---|---|---|---|---|")
    for experts, tokens in CASES:
        rows = tokens * TOP_K
        for name, us, torch_us, loop_us in case(experts, tokens, major * 10 + minor, only, simt):
            tflops = 2 * rows * HIDDEN * FFN / us / 1e6
            print(
                f"| {experts} | {tokens} ({rows}) | {name} | {us:.0f} | {tflops:.0f} | {torch_us / us:.2f} "
                f"| {loop_us / us:.2f} |",
                flush=True,
            )
    for failure in FAILURES:
        print(f"FAILED {failure}")
    return 1 if FAILURES else 0


def case(
    experts: int, tokens: int, arch: int, only: list[str] | None, simt: bool
) -> list[tuple[str, float, float, float]]:
    """(variant, µs, torch._grouped_mm's µs, the loop's µs) of each variant, outputs checked against torch."""
    import torch

    from benchmarks.measure import median_us

    rows = tokens * TOP_K
    generator = torch.Generator(device="cuda").manual_seed(experts + tokens)
    if experts >= TOP_K:
        choices = torch.rand(tokens, experts, device="cuda", generator=generator).topk(TOP_K, dim=1).indices
    else:  # one expert holds every row
        choices = torch.zeros(tokens, TOP_K, dtype=torch.long, device="cuda")
    counts = torch.bincount(choices.flatten(), minlength=experts)
    ends = torch.cumsum(counts, 0).to(torch.int32)
    starts = (ends - counts).to(torch.int32)
    token = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(experts, HIDDEN, FFN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    out = torch.empty(rows, FFN, device="cuda", dtype=torch.bfloat16)
    split = counts.tolist()
    theirs = weight
    try:
        torch._grouped_mm(token, theirs, offs=ends)
    except Exception as error:  # a layout it refuses: the same weights stored K-major
        print(f"torch._grouped_mm refused the [E, K, N] row-major weight ({error}); timing it K-major")
        theirs = weight.transpose(1, 2).contiguous().transpose(1, 2)
    want = torch._grouped_mm(token, theirs, offs=ends).double()
    torch_us = median_us(lambda: torch._grouped_mm(token, theirs, offs=ends))
    loop_us = median_us(lambda: torch.cat([a @ weight[e] for e, a in enumerate(torch.split(token, split))]))
    results = [("torch._grouped_mm", torch_us, torch_us, loop_us), ("loop of torch.matmul", loop_us, torch_us, loop_us)]
    dense = gd.compile(dense_graph(tokens)).bind({"token": token, "weight": weight[0], "out": out})
    for name, fn in (("dense torch.matmul", lambda: torch.matmul(token, weight[0])), ("dense graphdnn matmul", dense)):
        results.append((name, median_us(fn), torch_us, loop_us))
    g = graph(experts, tokens)
    for name, choice in variants(experts, tokens, arch, only, simt).items():
        try:
            bound = gd.compile(g, tuning=None if choice is None else {NODE: choice}).bind(
                {"token": token, "weight": weight, "offsets": starts, "out": out}
            )
            out.fill_(float("nan"))
            bound()
            error = ((out.double() - want).norm() / want.norm()).item()
            if not error <= 1e-2:
                raise AssertionError(f"relative error {error:.3g} against torch._grouped_mm")
        except Exception as failure:  # reported, and the run exits 1 once every variant is done
            FAILURES.append(f"E={experts} T={tokens} {name}: {type(failure).__name__}: {failure}")
            continue
        us = median_us(bound, rep_ms=100 if "SIMT" in name else 200)
        results.append((f"graphdnn {name}", us, torch_us, loop_us))
    return results


if __name__ == "__main__":
    raise SystemExit(main())
