"""Run every benchmark case side by side with its peers and the roofline; write RESULTS.md.

    PYTHONPATH=. python benchmarks/run.py            # on a GPU machine: time everything
    PYTHONPATH=. python benchmarks/run.py --dry      # anywhere: build every case, time nothing

Each case is first checked against the reference backend (relative error within the
output type's tolerance); a case that fails is reported as such and not timed. A dynamic case
(group "dynamic") also times, on the same buffers, the plan of its dynamic graph (one plan
for a range of rows) and the static graph's heuristic plan, and the dynamic plan autotuned
across its range (graphdnn.autotune) against the autotuned static plan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import graphdnn as gd  # noqa: E402
from benchmarks.cases import EAGER_CONV_US, Case, cases  # noqa: E402
from graphdnn import reference  # noqa: E402
from graphdnn.random_inputs import random_inputs  # noqa: E402
from graphdnn.runtime.frameworks import empty_torch, to_torch  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="build every case for sm_90 without a GPU; time nothing")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results.json"))
    parser.add_argument("--skip-compile", action="store_true", help="do not time torch.compile (slow to warm up)")
    args = parser.parse_args()
    selected = [c for c in cases() if args.only in c.name]
    if args.dry:
        return dry_run(selected)
    return timed_run(selected, args)


def dry_run(selected: list[Case]) -> int:
    with tempfile.TemporaryDirectory() as cache_dir:
        for case in selected:
            start = time.perf_counter()
            plan = gd.compile(case.graph(), arch="sm_90", cache=cache_dir)
            print(f"{case.name}: {len(plan.kernels)} kernel(s), built in {time.perf_counter() - start:.2f} s")
            if "dynamic" in case.extra:
                start = time.perf_counter()
                dynamic = gd.compile(case.extra["dynamic"](), arch="sm_90", cache=cache_dir)
                assert isinstance(dynamic, gd.Plan)
                print(
                    f"  its dynamic graph's plan: {len(dynamic.kernels)} kernel(s), from {dynamic.origin} "
                    f"({dynamic.compiled} compiled) in {time.perf_counter() - start:.2f} s"
                )
    return 0


# -- timed run ----------------------------------------------------------------------------------
def timed_run(selected: list[Case], args: argparse.Namespace) -> int:

    from benchmarks.measure import host_us_per_call, measure_ceilings, median_us

    ceilings = measure_ceilings()
    print(
        f"{ceilings.device}: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 mma {ceilings.bf16_flops_per_s / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    rows = []
    for case in selected:
        row = measure_case(case, ceilings, median_us, compile_peer=not args.skip_compile)
        rows.append(row)
        print(json.dumps(row), flush=True)
    extras = overhead_and_build(host_us_per_call)
    write_results(rows, extras, ceilings, Path(args.out), Path(args.json))
    return 0


def measure_case(case: Case, ceilings: Any, median_us: Any, *, compile_peer: bool) -> dict[str, Any]:
    """One row of the table: graphdnn checked against the reference, then every peer timed."""
    import torch

    row: dict[str, Any] = {"case": case.name, "group": case.group, "target": case.target}
    row["roofline_us"] = ceilings.floor_us(case.bytes, case.flops)
    try:
        graph = case.graph()
        ir = graph.validate()
        feeds = random_inputs(ir, seed=1)
        inputs = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs}
        outputs = {t.name: empty_torch(t) for t in ir.outputs}
        start = time.perf_counter()
        plan = gd.compile(graph, autotune=True)
        row["build_s"] = time.perf_counter() - start
        bound = plan.bind({**inputs, **outputs}, cuda_graph=len(plan.kernels) > 1)
        bound()
        torch.cuda.synchronize()
        row["error"] = check(ir, feeds, outputs, case.extra.get("tolerance"))
        row["kernels"] = [f"{k.name} grid {list(k.grid)} block {list(k.block)}" for k in plan.kernels]
        row["graphdnn_us"] = median_us(bound)
        row["eager_us"] = median_us(lambda: case.torch_fn(inputs))
        if compile_peer:
            compiled = torch.compile(case.torch_fn)
            for _ in range(3):
                compiled(inputs)
            row["compile_us"] = median_us(lambda: compiled(inputs))
        if case.cudnn is not None:
            row["cudnn_us"] = _cudnn_time(case.cudnn, inputs, ir, median_us, row)
        if case.cudnn_anchor is not None:
            row["cudnn_anchor_us"] = _cudnn_time(case.cudnn_anchor, inputs, ir, median_us, row)
        if "dynamic" in case.extra:
            dynamic = case.extra["dynamic"]
            for key, built in (
                ("static_us", gd.compile(graph)),
                ("dynamic_us", gd.compile(dynamic())),
                ("dynamic_tuned_us", gd.compile(dynamic(), autotune=True)),  # timed across its range, once
            ):
                bound = built.bind({**inputs, **outputs})
                for out in outputs.values():
                    out.fill_(float("nan"))  # the check below sees this plan's results only
                bound()
                torch.cuda.synchronize()
                check(ir, feeds, outputs)
                row[key] = median_us(bound)
    except Exception as error:  # one broken case must not hide the others' numbers
        row["failure"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    return row


def _cudnn_time(build: Any, inputs: dict[str, Any], ir: Any, median_us: Any, row: dict[str, Any]) -> float | None:
    try:
        runner = build(inputs, {t.name: empty_torch(t) for t in ir.outputs})
        runner()
        return float(median_us(runner))
    except Exception as error:
        row["cudnn_note"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return None


def check(ir: Any, feeds: dict[str, Any], outputs: dict[str, Any], tolerance: float | None = None) -> float:
    """The largest relative error of graphdnn's outputs against the reference; raises past
    ``tolerance`` (the output type's where None)."""
    import numpy as np

    from graphdnn.compare import TOLERANCE, relative_error

    expected = reference.execute(ir, feeds)
    worst = 0.0
    for t in ir.outputs:
        got = outputs[t.name].detach().float().cpu().numpy().astype(np.float64)
        error = relative_error(got, expected[t.name].astype(np.float64))
        if error > (tolerance if tolerance is not None else TOLERANCE.get(t.data_type, 0.0)):
            raise AssertionError(f"output '{t.name}' differs from the reference: relative error {error:.3g}")
        worst = max(worst, error)
    return worst


def overhead_and_build(host_us_per_call: Any) -> dict[str, Any]:
    """Host overhead of a pre-bound one-kernel plan against peers; cold build and warm load."""
    import torch
    import torch.nn.functional as F

    extras: dict[str, Any] = {}
    g = gd.OperationGraphSpec(name="ln_1x1024", io_data_type="bf16")
    x = g.tensor(name="x", dim=[1, 1024])
    y = g.layernorm("inference", x, g.tensor(name="scale", dim=[1, 1024]), g.tensor(name="bias", dim=[1, 1024]), 1e-5)
    y[0].set_output(True)  # type: ignore[union-attr]
    ir = g.validate()
    feeds = random_inputs(ir, 0)
    pack = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs} | {t.name: empty_torch(t) for t in ir.outputs}
    plan = gd.compile(g)
    bound = plan.bind(pack)
    extras["graphdnn bound execute, 1x1024 layernorm"] = host_us_per_call(bound)
    extras["graphdnn execute (every check; same buffers reuse their binding), 1x1024 layernorm"] = host_us_per_call(
        lambda: plan.execute(pack)
    )
    extras["graphdnn bind + call (every check and all packing anew), 1x1024 layernorm"] = host_us_per_call(
        lambda: plan.bind(pack)()
    )
    xt, w, b = pack["x"], pack["scale"].view(1024), pack["bias"].view(1024)
    extras["torch.nn.functional.layer_norm, 1x1024"] = host_us_per_call(lambda: F.layer_norm(xt, (1024,), w, b, 1e-5))
    try:
        from benchmarks.cases import _ln_gelu_cudnn

        runner = _ln_gelu_cudnn({"x": xt, "scale": pack["scale"], "bias": pack["bias"]}, {"y": torch.empty_like(xt)})
        extras["cuDNN frontend execute, 1x1024 layernorm+gelu"] = host_us_per_call(runner)
    except Exception as error:
        extras["cuDNN frontend execute, 1x1024 layernorm+gelu"] = (
            f"unavailable: {type(error).__name__}: {str(error)[:120]}"
        )
    for name in ("transformer_block", "resnet50_bottleneck", "conv_bn_relu_training", "layernorm_gelu"):
        path = ROOT / "examples" / "graphs" / f"{name}.json"
        with tempfile.TemporaryDirectory() as cache_dir:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "GRAPHDNN_CACHE_DIR": cache_dir}
            cold = (
                f"import time, graphdnn as gd; g = gd.load({str(path)!r}); s = time.perf_counter(); "
                "p = gd.compile(g); print(time.perf_counter() - s, p.arch)"
            )
            result = subprocess.run([sys.executable, "-c", cold], capture_output=True, text=True, env=env)
            if result.returncode != 0:
                extras[f"cold build s (new process), {name}"] = result.stderr[-200:]
                continue
            seconds, arch = result.stdout.split()
            extras[f"cold build s (new process), {name}"] = float(seconds)
            warm = (
                f"import time, graphdnn as gd; g = gd.load({str(path)!r}); s = time.perf_counter(); "
                f"gd.compile(g, arch={arch}, require_cached=True); print(time.perf_counter() - s)"
            )
            result = subprocess.run([sys.executable, "-c", warm], capture_output=True, text=True, env=env)
            key = f"warm load ms (new process), {name}"
            extras[key] = float(result.stdout) * 1e3 if result.returncode == 0 else result.stderr[-200:]
    return extras


# -- report -------------------------------------------------------------------------------------
def table_row(row: dict[str, Any]) -> str:
    if "failure" in row:
        return f"| {row['case']} | failed: {row['failure']} |  |  |  |  |  |  |  |  | {row['target']} |"
    ours = row["graphdnn_us"]

    def us(key: str) -> str:
        value = row.get(key)
        return f"{value:.1f}" if isinstance(value, float) else "-"

    def ratio(key: str) -> str:
        value = row.get(key)
        return f"{value / ours:.2f}x" if isinstance(value, float) else "-"

    return (
        f"| {row['case']} | {ours:.1f} | {row['roofline_us']:.1f} | {100 * row['roofline_us'] / ours:.0f}% | {us('eager_us')} | "
        f"{us('compile_us')} | {us('cudnn_us')} | {ratio('eager_us')} | {ratio('compile_us')} | {ratio('cudnn_us')} | {row['target']} |"
    )


def write_results(rows: list[dict[str, Any]], extras: dict[str, Any], ceilings: Any, md: Path, js: Path) -> None:
    js.write_text(
        json.dumps(
            {"device": ceilings.device, "ceilings": ceilings.__dict__, "cases": rows, "extras": extras}, indent=1
        )
    )
    lines = [
        "# Benchmark results",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {ceilings.device} by `benchmarks/run.py`, all in one run: copy bandwidth "
        f"{ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (read + write), bf16 matrix product {ceilings.bf16_flops_per_s / 1e12:.0f} TFLOP/s. "
        "Times are medians of CUDA-event timings (µs) with the L2 flushed; every graphdnn result was checked against the reference first. "
        "Ratios > 1 mean graphdnn is faster.",
        "",
        "| case | graphdnn µs | roofline µs | % of roofline | eager µs | torch.compile µs | cuDNN FE µs | vs eager | vs compile | vs cuDNN | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [table_row(row) for row in rows]
    conv = [r for r in rows if r["group"] == "conv" and isinstance(r.get("cudnn_us"), float) and "graphdnn_us" in r]
    if conv:
        geomean = math.exp(sum(math.log(r["cudnn_us"] / r["graphdnn_us"]) for r in conv) / len(conv))
        lines += [
            "",
            f"Convolution layers: geometric mean speed relative to the cuDNN frontend's fused kernel: {geomean:.2f}x.",
        ]
    notes = [f"- {r['case']}: cuDNN frontend: {r['cudnn_note']}" for r in rows if "cudnn_note" in r]
    notes += [
        f"- {r['case']}: the cuDNN frontend's layernorm alone (no GELU) takes {r['cudnn_anchor_us']:.1f} µs"
        for r in rows
        if isinstance(r.get("cudnn_anchor_us"), float)
    ]
    notes += [
        f"- {r['case']}: the dynamic plan takes {r['dynamic_us']:.1f} µs, the static plan of this shape "
        f"{r['static_us']:.1f} µs with the same heuristic launch choices (dynamic / static = "
        f"{r['dynamic_us'] / r['static_us']:.3f}; autotuned static: graphdnn µs); the dynamic plan autotuned "
        f"across its range {r['dynamic_tuned_us']:.1f} µs ({r['dynamic_tuned_us'] / r['graphdnn_us']:.3f} of the "
        "autotuned static plan)"
        for r in rows
        if isinstance(r.get("dynamic_us"), float) and isinstance(r.get("static_us"), float)
    ]
    if notes:
        lines += ["", "Notes:", *notes]
    lines += ["", "| other measurements | value |", "|---|---|"]
    for key, value in extras.items():
        lines.append(f"| {key} | {value:.2f} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", f"Orientation (issue 5, eager conv+BN+ReLU µs on an H200): {EAGER_CONV_US}."]
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
