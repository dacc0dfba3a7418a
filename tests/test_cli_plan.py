"""The plan-cache and execution commands: warmup, cache stats|ls|verify|clear|export|import, run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn import cli
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.cache.store import DiskStore
from graphdnn.runtime.driver import current_gpu_arch
from tests import plan_graphs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def graph_files(tmp_path: Path) -> list[Path]:
    files = []
    for graph in (plan_graphs.add_relu(), plan_graphs.add_relu_and_sigmoid(), plan_graphs.scaled()):
        path = tmp_path / f"{graph.name}.json"
        gd.save(graph, path)
        files.append(path)
    return files


def test_warmup_compiles_each_distinct_kernel_once_in_a_process_pool(
    graph_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    args = ["warmup", *map(str, graph_files), "--arch", "sm_90", "--jobs", "2", "--cache-dir", str(cache)]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "kernels [##############################] 3/3" in captured.err  # the progress bar
    assert (
        "warmup for sm_90: 3 graphs (0 cache hits, 3 built), 3 unique kernels (3 compiled, 0 already cached)"
        in captured.out
    )
    assert cli.main(args) == 0
    assert "3 graphs (3 cache hits, 0 built), 0 unique kernels" in capsys.readouterr().out
    for graph in (plan_graphs.add_relu(), plan_graphs.add_relu_and_sigmoid(), plan_graphs.scaled()):
        gd.compile(graph, arch="sm_90", cache=PlanCache(cache), require_cached=True)


def test_warmup_reports_a_bad_file_and_goes_on(
    graph_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    args = ["warmup", str(bad), str(graph_files[0]), "--arch", "sm_80", "--jobs", "1", "--cache-dir", str(tmp_path)]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert f"graphdnn: error: {bad}: " in captured.err
    assert "2 graphs (0 cache hits, 1 built, 1 failed)" in captured.out


def test_cache_stats_ls_verify_clear(
    graph_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = str(tmp_path / "cache")
    assert cli.main(["warmup", str(graph_files[0]), str(graph_files[2]), "--jobs", "1", "--cache-dir", cache]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "stats", "--cache-dir", cache]) == 0
    stats = capsys.readouterr().out
    assert "plans:      2" in stats and "kernels:      2" in stats
    assert cli.main(["cache", "ls", "--cache-dir", cache]) == 0
    listing = capsys.readouterr().out
    assert "add_relu" in listing and "scaled" in listing and "sm_90" in listing
    assert cli.main(["cache", "verify", "--cache-dir", cache]) == 0
    assert "verified 2 plans and 2 kernels" in capsys.readouterr().out

    kernel = next(f for f in DiskStore(cache).files() if f.kind == "kernel")
    kernel.path.write_bytes(kernel.path.read_bytes()[:100])
    assert cli.main(["cache", "verify", "--cache-dir", cache]) == 1
    report = capsys.readouterr().out
    assert f"BAD kernel {kernel.path}: truncated" in report
    assert "uses 1 kernel(s) missing or bad" in report and ": 2 bad" in report
    assert cli.main(["cache", "verify", "--remove", "--cache-dir", cache]) == 1
    assert cli.main(["cache", "verify", "--cache-dir", cache]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "clear", "--cache-dir", cache]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert not list(DiskStore(cache).files())


def test_cache_export_import(graph_files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, target, archive = tmp_path / "a", tmp_path / "b", tmp_path / "warm.tgz"
    assert cli.main(["warmup", str(graph_files[2]), "--jobs", "1", "--cache-dir", str(source)]) == 0
    assert cli.main(["cache", "export", str(archive), "--cache-dir", str(source)]) == 0
    assert "exported 1 plans, 1 kernels (0 skipped)" in capsys.readouterr().out
    assert cli.main(["cache", "import", str(archive), "--cache-dir", str(target)]) == 0
    assert "imported 1 plans, 1 kernels (0 skipped)" in capsys.readouterr().out
    gd.compile(plan_graphs.scaled(), cache=PlanCache(target), require_cached=True)
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert cli.main(["cache", "import", str(tmp_path / "junk.tar"), "--cache-dir", str(target)]) == 1
    assert "cannot read cache archive" in capsys.readouterr().err


@pytest.mark.skipif(current_gpu_arch() is not None, reason="checks the fallback where there is no GPU")
def test_run_without_a_gpu_uses_the_reference_backend_and_says_so(
    graph_files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", str(graph_files[2]), "--check"]) == 0
    out = capsys.readouterr().out
    assert "backend reference (no GPU found)" in out
    assert "check: passed" in out
    assert cli.main(["run", str(graph_files[2]), "--backend", "gpu", "--cache-dir", "/nonexistent/x"]) == 1
    assert "graphdnn: error: no NVIDIA driver found" in capsys.readouterr().err


def test_run_reference_checks_every_output(graph_files: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(graph_files[1]), "--backend", "reference", "--check", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "backend reference\n" in out
    for name in ("y", "s"):
        assert f"  {name} " in out
    assert out.count(" ok\n") == 2


def test_the_warmup_example_script(graph_files: list[Path], tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "warmup.py"),
            str(tmp_path / "deploy"),
            "--arch",
            "sm_90",
            str(graph_files[0]),
            str(graph_files[2]),
            "--jobs",
            "1",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verified in a fresh process: 2 graphs loaded from the cache, 0 kernels compiled" in result.stdout
