"""The benchmark suite's dry mode builds its cases without a GPU, so it cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _benchmark(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_benchmark_cases_build_without_a_gpu() -> None:
    result = _benchmark("run.py", "--dry", "--only", "4096x1024")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("kernel(s), built in") == 2


def test_the_few_tile_matmul_cases_build_with_split_k_or_the_engine() -> None:
    """On sm_90 (the dry run's target) the decode-like case splits K (the slices, then their
    reduction); fc2 fills half the SMs with 128x128 tiles and runs whole on the engine."""
    result = _benchmark("run.py", "--dry", "--only", "matmul m")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("2 kernel(s), built in") == 1
    assert result.stdout.count("1 kernel(s), built in") == 1


def test_the_dynamic_cases_build_one_plan_for_the_range() -> None:
    """Three sizes of each dynamic case: a static plan each, and one dynamic plan built once,
    with a variant per size bucket (3 for the row norms; for the matmul, on the engine, 128 x 256
    tiles, 128 x 128 tiles, and two K slices with their reduction: 4 kernels; for the conv over N
    in 1..64, the engine with TMA im2col and mma.sync's two K slices with their reduction: 3).
    The static matmul of 64 rows takes the engine's split-K (2 kernels), as the dynamic plan's
    bucket does, and the static conv of N = 1 mma.sync's split-K (2 kernels)."""
    result = _benchmark("run.py", "--dry", "--only", "dynamic")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("1 kernel(s), built in") == 10
    assert result.stdout.count("2 kernel(s), built in") == 2
    assert result.stdout.count("its dynamic graph's plan: 3 kernel(s), from compiled (3 compiled)") == 3
    assert result.stdout.count("its dynamic graph's plan: 4 kernel(s), from compiled (4 compiled)") == 1
    assert result.stdout.count("its dynamic graph's plan: 3 kernel(s), from memory cache (0 compiled)") == 6
    assert result.stdout.count("its dynamic graph's plan: 4 kernel(s), from memory cache (0 compiled)") == 2


def test_execute_cost_runs_on_the_fake_driver() -> None:
    result = _benchmark("execute_cost.py", "--fake-driver", "--calls", "20")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("µs per call") == 5


def test_the_norm_backward_cases_build_as_one_pass_and_a_reduction() -> None:
    result = _benchmark("run.py", "--dry", "--only", "backward")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("2 kernel(s), built in") == 4  # layer and RMS norm, two sizes each
    assert "drelu+dadd+batchnorm backward n4 c16 56²: 3 kernel(s)" in result.stdout  # sums, finalize, dx


def test_the_attention_benchmark_builds_forward_and_backward_plans() -> None:
    result = _benchmark("attention.py", "--dry")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("sdpa_backward_") == 4 and result.stdout.count(": 3 kernel(s)") == 4


def test_the_paged_prefill_benchmark_builds_one_kernel_per_chunk() -> None:
    result = _benchmark("attention.py", "--prefill", "--dry")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("paged_prefill_") == result.stdout.count(": 1 kernel(s)") == 3


def test_the_conv_backward_cases_build_on_the_tensor_core_gemm() -> None:
    """dgrad is one implicit-GEMM kernel; wgrad (64 x 576 or 256 x 64 outputs, K = 32*56*56)
    splits K: the slices, then their reduction."""
    result = _benchmark("run.py", "--dry", "--only", "grad")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if "built in" in line and ("dgrad" in line or "wgrad" in line)]
    assert len(lines) == 4
    assert all(("1 kernel(s)" if "dgrad" in line else "2 kernel(s)") in line for line in lines), lines


def test_the_wgrad_benchmark_builds_its_default_plans() -> None:
    """benchmarks/wgrad.py --dry: the stride-2 1x1 downsample's default plan on sm_90, the wgmma
    slices and their reduction."""
    result = _benchmark("wgrad.py", "--dry", "--default", "--only", "s2 wgrad 256")
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    assert "| default |" in line and "_wgmma_splitk_" in line and "_splitk_reduce_" in line


def test_the_grouped_conv_benchmark_builds_every_pass_of_every_layer() -> None:
    """benchmarks/grouped_conv.py --dry: forward, dgrad and wgrad of each depthwise and grouped layer."""
    result = _benchmark("grouped_conv.py", "--dry")
    assert result.returncode == 0, result.stderr[-2000:]
    passes = [line.split(" | ")[1] for line in result.stdout.splitlines()]
    assert len(passes) >= 6 and passes == ["fprop", "dgrad", "wgrad"] * (len(passes) // 3), result.stdout


def test_the_8bit_gemm_benchmark_plans_take_the_engine() -> None:
    """fp8 (per-tensor and row / column scales, block-scaled and MXFP8 as a matmul and as
    dequantize -> matmul) and int8 at 4096³ and 8192³, MXFP8 at 128 x 8192 x 8192 too: one
    warp-specialised kernel each, the scales in it (the skinny MXFP8 shape's in two K slices,
    then their reduction)."""
    result = _benchmark("lowp_gemm.py", "--dry")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    kernels = {line.split(": ")[0]: line.split(": ")[1].split(", ") for line in lines}
    skinny = [names for shape, names in kernels.items() if shape.endswith(" 128 x 8192 x 8192")]
    assert len(kernels) == 16 and len(skinny) == 2
    assert all(len(names) == 1 and "_ws_" in names[0] for names in kernels.values() if names not in skinny)
    assert all("_ws_" in ws and "_splitk_reduce_" in reduce for ws, reduce in skinny)


def test_the_weight_only_benchmark_plans_take_the_tensor_core_kernel() -> None:
    """int4 weights, 1 to 16 tokens, 4096 x 4096 and 4096 x 14336: one mma.sync kernel each."""
    result = _benchmark("weight_only_gemm.py", "--dry")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and all(line.count("gd_weight_only_gemm_mma_") == 1 for line in lines)


def test_the_int8_weight_only_benchmark_plans_take_the_tensor_core_kernel() -> None:
    """int8 weights with one scale per column: one mma.sync kernel each as well."""
    result = _benchmark("weight_only_gemm.py", "--dry", "--weight", "int8", "--group", "channel")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and all(line.count("gd_weight_only_gemm_mma_") == 1 for line in lines)


def test_the_classic_cudnn_cases_build() -> None:
    """LRN, the spatial transformer (grid, then sampler), CTC (one kernel) and a 2-layer LSTM (a
    projection GEMM and a launch per step for each layer)."""
    result = _benchmark("run.py", "--dry", "--only", "")
    assert result.returncode == 0, result.stderr[-2000:]
    for line in (
        "lrn n32 c96 55²: 1 kernel(s)",
        "spatial transformer n32 c64 64² -> 56²: 2 kernel(s)",
        "ctc loss + gradient t400 n32 a29 s80: 1 kernel(s)",
        "lstm inference 2x256 n32 t64: 130 kernel(s)",  # per layer a projection and 64 steps
    ):
        assert line in result.stdout
