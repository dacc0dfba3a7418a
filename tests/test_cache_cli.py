"""Cache and CLI robustness: dangling links, read-only caches, unwritable archives, a bad
graph in a warmup batch, argument checking, boolean switches, escaped output, and several
warmers of one cache sharing the compiles.

Tests run as root, where chmod denies nothing: a read-only cache is simulated by making a
directory an entry must be written into a regular file (mkdir and mkstemp then fail for
root too), and a cache whose files cannot be removed by patching ``os.unlink``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import warnings
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn import cli
from graphdnn.cache import container
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.cache.store import DiskStore
from graphdnn.compilation import Compilation
from graphdnn.env import env_flag
from graphdnn.kernel_build import build_kernels
from graphdnn.lower import lower
from tests import plan_graphs
from tests.cache_dirs import private_copy, warm

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"


@pytest.fixture(scope="session")
def warm_cli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cli") / "cache"
    warm(directory, (plan_graphs.add_relu, plan_graphs.scaled), ARCH)
    return directory


@pytest.fixture
def cache_dir(warm_cli_dir: Path, tmp_path: Path) -> Path:
    return private_copy(warm_cli_dir, tmp_path)


def _read_only(directory: Path) -> None:
    """No entry can be written below ``directory``/v1 (as root too): its folders are files."""
    for folder in ("plans", "kernels"):
        shutil.rmtree(directory / "v1" / folder, ignore_errors=True)
        (directory / "v1").mkdir(parents=True, exist_ok=True)
        (directory / "v1" / folder).write_text("not a directory")


def _dangle(directory: Path) -> Path:
    link = directory / "v1" / "kernels" / "ab" / f"{'ab' * 32}.kernel"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(directory / "nowhere")
    return link


# -- dangling links ----------------------------------------------------------------------------
def test_a_dangling_link_does_not_crash_stats_ls_verify_or_export(
    cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = _dangle(cache_dir)
    (cache_dir / "v1" / "plans" / "cd").mkdir()
    (cache_dir / "v1" / "plans" / "cd" / f"{'cd' * 32}.plan").symlink_to("/nonexistent")
    assert cli.main(["cache", "stats", "--cache-dir", str(cache_dir)]) == 0
    assert "kernels:      3" in capsys.readouterr().out
    assert cli.main(["cache", "ls", "--cache-dir", str(cache_dir)]) == 0
    assert "BAD: a link to /nonexistent, outside the cache directory" in capsys.readouterr().out
    with pytest.warns(gd.CacheWarning, match="not exporting"):
        assert cli.main(["cache", "export", str(tmp_path / "out.tar"), "--cache-dir", str(cache_dir)]) == 0
    assert "exported 2 plans, 2 kernels (2 skipped)" in capsys.readouterr().out
    assert cli.main(["cache", "verify", "--remove", "--cache-dir", str(cache_dir)]) == 1
    out = capsys.readouterr().out
    assert "a symbolic link to a file that does not exist" in out and "2 bad" in out
    assert not link.is_symlink()
    assert cli.main(["cache", "verify", "--cache-dir", str(cache_dir)]) == 0


# -- read-only caches --------------------------------------------------------------------------
def test_clear_and_verify_remove_report_what_they_could_not_remove(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _dangle(cache_dir)

    def denied(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("graphdnn.cache.store.os.unlink", denied)
    assert cli.main(["cache", "verify", "--remove", "--cache-dir", str(cache_dir)]) == 1
    captured = capsys.readouterr()
    assert "could not remove it: Permission denied" in captured.err and "1 of them could not be removed" in captured.out
    assert cli.main(["cache", "clear", "--cache-dir", str(cache_dir)]) == 1
    captured = capsys.readouterr()
    assert "removed 0 entries" in captured.out and "7 could not be removed" in captured.out  # and 2 locks
    assert "cannot remove" in captured.err
    monkeypatch.undo()
    assert cli.main(["cache", "clear", "--cache-dir", str(cache_dir)]) == 0
    assert "removed 5 entries" in capsys.readouterr().out
    assert list(DiskStore(cache_dir).files()) == []


def test_import_into_a_read_only_cache_reports_what_it_did_not_write(
    cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "warm.tar.gz"
    assert cli.main(["cache", "export", str(archive), "--cache-dir", str(cache_dir)]) == 0
    target = tmp_path / "readonly"
    _read_only(target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["cache", "import", str(archive), "--cache-dir", str(target)]) == 1
    messages = [str(w.message) for w in caught]
    assert sum("cannot write" in m and "Not a directory" in m for m in messages) == 2  # the two kernels
    assert sum("in neither the archive nor the cache" in m for m in messages) == 2  # so their plans are not added
    out = capsys.readouterr().out
    assert "imported 0 plans, 0 kernels" in out and "could not be written" in out


def test_warmup_into_a_read_only_cache_says_the_cache_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tmp_path / "add_relu.json"
    gd.save(plan_graphs.add_relu(cols=17), graph)
    _read_only(tmp_path / "cache")
    args = ["warmup", str(graph), "--arch", ARCH, "--jobs", "1", "--cache-dir", str(tmp_path / "cache")]
    with pytest.warns(gd.CacheWarning, match="cannot write"):
        assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert "compiled, but cannot be written to the cache" in err and "missing from the cache" not in err


@pytest.mark.parametrize("where", ["missing-directory/out.tar", "."])
def test_export_to_an_unwritable_path_is_an_error(
    cache_dir: Path, tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cache", "export", str(tmp_path / where), "--cache-dir", str(cache_dir)]) == 1
    assert "graphdnn: error: cannot write cache archive" in capsys.readouterr().err


# -- warmup batches ----------------------------------------------------------------------------
def test_a_graph_that_breaks_the_compiler_does_not_stop_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import graphdnn.lower

    real = graphdnn.lower.lower

    def lower(partition, *args, **kwargs):  # type: ignore[no-untyped-def]
        if partition.graph.name == "broken":
            raise KeyError("a defect in a code generator")
        return real(partition, *args, **kwargs)

    monkeypatch.setattr(graphdnn.lower, "lower", lower)
    assert _warm_up(tmp_path, plan_graphs.add_relu("broken"), plan_graphs.add_relu("fine", cols=9)) == 1
    captured = capsys.readouterr()
    assert "broken.json: internal error: KeyError" in captured.err
    assert "2 graphs (0 cache hits, 1 built, 1 failed)" in captured.out


def test_a_kernel_that_breaks_the_compiler_fails_its_graph_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import graphdnn.cache.warmup

    real = graphdnn.cache.warmup.compile_sources

    def compile_sources(sources, *args, **kwargs):  # type: ignore[no-untyped-def]
        if any("graph 'crash'" in source.source for source in sources.values()):
            raise RuntimeError("NVRTC fell over")
        return real(sources, *args, **kwargs)

    monkeypatch.setattr(graphdnn.cache.warmup, "compile_sources", compile_sources)
    assert _warm_up(tmp_path, plan_graphs.add_relu("crash", cols=3), plan_graphs.add_relu("fine", cols=11)) == 1
    captured = capsys.readouterr()
    assert "crash.json: internal error: RuntimeError: NVRTC fell over" in captured.err
    assert "2 graphs (0 cache hits, 1 built, 1 failed)" in captured.out


def _warm_up(tmp_path: Path, *graphs: gd.OperationGraphSpec) -> int:
    """``graphdnn warmup`` of these graphs' files into a new cache; its exit status."""
    files = []
    for graph in graphs:
        files.append(tmp_path / f"{graph.name}.json")
        gd.save(graph, files[-1])
    return cli.main(["warmup", *map(str, files), "--arch", ARCH, "--jobs", "1", "--cache-dir", str(tmp_path / "c")])


# -- arguments and switches --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["warmup", "g.json", "--arch", "sm_12"], "argument --arch: sm_12 is not a target NVRTC compiles for"),
        (["cache", "key", "g.json", "--arch", "sm_ninety"], "argument --arch: unknown target architecture"),
        (["run", "g.json", "--arch", "sm_99"], "argument --arch: sm_99 is not a target"),
        (["warmup", "g.json", "--jobs", "0"], "argument --jobs: must be at least 1, got 0"),
        (["run", "g.json", "--repeat", "-5"], "argument --repeat: must be at least 1, got -5"),
        (["run", "g.json", "--repeat", "many"], "argument --repeat: 'many' is not an integer"),
    ],
)
def test_bad_arguments_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *[("1", True), ("true", True), ("Yes", True), (" ON ", True)],
        *[("0", False), ("False", False), ("no", False), ("off", False), ("", False)],
    ],
)
def test_boolean_switches(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("GRAPHDNN_REQUIRE_CACHED", value)
    assert env_flag("GRAPHDNN_REQUIRE_CACHED") is expected


def test_require_cached_false_means_off_and_a_typo_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRAPHDNN_REQUIRE_CACHED", "False")
    plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=PlanCache(tmp_path / "c"))  # a miss: built
    assert plan.origin == "compiled"
    monkeypatch.setenv("GRAPHDNN_REQUIRE_CACHED", "ture")
    with pytest.raises(gd.GraphError, match=r"GRAPHDNN_REQUIRE_CACHED='ture' is not a boolean"):
        gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=PlanCache(tmp_path / "c"))
    monkeypatch.setenv("GRAPHDNN_DISABLE_CACHE", "maybe")
    assert cli.main(["warmup", "x.json"]) == 1


# -- output ------------------------------------------------------------------------------------
def test_stored_strings_are_escaped_when_printed(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A graph name from a re-sealed entry (names with controls cannot be built any more)."""
    (path,) = (
        f.path for f in DiskStore(cache_dir).files() if f.kind == "plan" and "scaled" in f.path.read_text("latin-1")
    )
    document = json.loads(container.decode(path.read_bytes(), "plan")["plan"])
    document["graph_name"] = "\x1b[31mred\u202eevil"
    path.write_bytes(container.encode("plan", {"plan": json.dumps(document).encode()}))
    assert cli.main(["cache", "ls", "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b[31mred\\u202eevil" in out


def test_run_feeds_a_bf16_pass_by_value_scalar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = gd.OperationGraphSpec(name="bf16_scaled", io_data_type="bf16")
    x = g.tensor(name="x", dim=[2, 8])
    alpha = g.tensor(name="alpha", dim=[1], is_pass_by_value=True)
    g.mul(x, alpha).set_output(True).set_name("y")
    path = tmp_path / "bf16_scaled.json"
    gd.save(g, path)
    assert cli.main(["run", str(path), "--backend", "reference", "--check", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "check: passed" in capsys.readouterr().out


# -- several warmers ---------------------------------------------------------------------------
def test_a_held_claim_is_busy_and_a_dead_holder_releases_it(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    key = "ef" * 32
    with store.claim(key, wait=True) as held:
        assert held
        with store.claim(key, wait=False) as again:
            assert not again
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path), key], stdout=subprocess.PIPE, cwd=ROOT, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with store.claim(key, wait=False) as held:
        assert not held
    os.kill(holder.pid, signal.SIGKILL)  # a crashed compiler: the kernel drops its flock
    holder.wait()
    with store.claim(key, wait=False) as held:
        assert held


def test_a_build_waits_for_a_held_kernel_and_compiles_it_when_the_holder_dies(tmp_path: Path) -> None:
    job = Compilation.of(plan_graphs.scaled().validate(), 90, ())
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key)
    (key,) = lowered.sources
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path), key], stdout=subprocess.PIPE, cwd=ROOT, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    threading.Timer(2.0, os.kill, (holder.pid, signal.SIGKILL)).start()  # it dies without storing the kernel
    cache = PlanCache(tmp_path)
    binaries, compiled = build_kernels(lowered.sources, 90, cache)
    assert holder.poll() == -signal.SIGKILL  # the build waited for the holder rather than compiling beside it
    assert (list(binaries), compiled, cache.counters.compiles) == ([key], 1, 1)
    assert DiskStore(tmp_path).read_kernel(key) == binaries[key]


_HOLD = """
import sys, time
from graphdnn.cache.store import DiskStore
from graphdnn.compilation import Compilation
with DiskStore(sys.argv[1]).claim(sys.argv[2], wait=True):
    print("held", flush=True)
    time.sleep(600)
"""


def test_concurrent_warmers_share_the_compiles(tmp_path: Path) -> None:
    files = []
    for graph in (plan_graphs.add_relu(cols=5), plan_graphs.scaled(), plan_graphs.sum_then_add()):
        files.append(tmp_path / f"{graph.name}.json")
        gd.save(graph, files[-1])
    cache = tmp_path / "shared"
    args = [sys.executable, "-m", "graphdnn.cli", "warmup", *map(str, files), "--arch", ARCH, "--jobs", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    warmers = [
        subprocess.Popen([*args, "--cache-dir", str(cache)], stdout=subprocess.PIPE, env=env, cwd=ROOT, text=True)
        for _ in range(4)
    ]
    compiled = []
    for warmer in warmers:
        out, _ = warmer.communicate(timeout=300)
        assert warmer.returncode == 0, out
        found = re.search(r"4 unique kernels \((\d+) compiled, (\d+) already cached\)", out)
        assert found is not None, out
        compiled.append(int(found.group(1)))
    assert sum(compiled) == 4, compiled  # each distinct kernel compiled by one warmer only
    for graph in (plan_graphs.add_relu(cols=5), plan_graphs.scaled(), plan_graphs.sum_then_add()):
        gd.compile(graph, arch=ARCH, cache=PlanCache(cache), require_cached=True)


def test_an_archive_member_over_the_entry_limit_is_not_read(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "warm.tar"
    assert cli.main(["cache", "export", str(archive), "--cache-dir", str(cache_dir)]) == 0
    with tarfile.open(archive) as tar:
        assert len(tar.getnames()) == 5
    monkeypatch.setattr("graphdnn.cache.archive.MAX_ENTRY_BYTES", 4096)  # the manifest fits, no cubin does
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["cache", "import", str(archive), "--cache-dir", str(tmp_path / "new")]) == 0
    messages = [str(w.message) for w in caught]
    assert sum("over the limit of 4096" in m for m in messages) == 2  # the kernels; the plans then lack them
    assert sum("in neither the archive nor the cache" in m for m in messages) == 2
    assert "imported 0 plans, 0 kernels (4 skipped)" in capsys.readouterr().out
