"""The benchmark suite's dry mode builds its cases without a GPU, so it cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_cases_build_without_a_gpu() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--dry", "--only", "4096x1024"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("kernel(s), built in") == 2


def test_execute_cost_runs_on_the_fake_driver() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "execute_cost.py"), "--fake-driver", "--calls", "20"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("µs per call") == 5
