"""The disk cache's size cap: least recently used entries go first, readers in other
processes never see a damaged entry, and ``graphdnn cache stats`` reports the cap."""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import graphdnn as gd
from graphdnn import cli
from graphdnn.cache.evict import LOW_WATER, max_bytes_from_env, parse_size
from graphdnn.cache.plan_cache import PlanCache, cache_at
from graphdnn.cache.store import DiskStore
from tests import plan_graphs
from tests.cache_dirs import private_copy, warm

ARCH = "sm_90"


@pytest.fixture(scope="session")
def warm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_relu (kernel A) and two_groups (kernels A and B) for sm_90."""
    directory = tmp_path_factory.mktemp("warm-evict") / "cache"
    warm(directory, (plan_graphs.add_relu, plan_graphs.add_relu_and_sigmoid), ARCH)
    return directory


@pytest.fixture
def cache_dir(warm_dir: Path, tmp_path: Path) -> Path:
    return private_copy(warm_dir, tmp_path)


def _plan_files(directory: Path, graph: gd.OperationGraphSpec) -> list[Path]:
    """The plan file of ``graph`` and its kernel files."""
    store = DiskStore(directory)
    key = gd.compile(graph, arch=ARCH, cache=PlanCache(directory), require_cached=True).key
    assert key is not None
    entry = store.read_plan(key)
    assert entry is not None
    return [store.plan_path(key), *(store.kernel_path(k) for k in entry.program.kernel_keys)]


def _age(paths: list[Path], seconds_ago: float) -> None:
    for index, path in enumerate(paths):
        when = time.time_ns() - int(seconds_ago * 1e9) + index * 1000
        os.utime(path, ns=(when, when))


def _sizes(paths: object) -> int:
    return sum(Path(p).stat().st_size for p in paths)  # type: ignore[attr-defined]


def test_sizes_are_bytes_or_binary_units(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_size("1073741824", "x") == 2**30
    assert [parse_size(t, "x") for t in ("512M", "10g", "10GiB", "2 KiB", "7B")] == [
        512 * 2**20,
        10 * 2**30,
        10 * 2**30,
        2048,
        7,
    ]
    for bad in ("", "-1", "1.5G", "10X", "GiB", "5iB"):
        with pytest.raises(gd.GraphError, match="is not a size"):
            parse_size(bad, "GRAPHDNN_CACHE_MAX_BYTES")
    monkeypatch.delenv("GRAPHDNN_CACHE_MAX_BYTES", raising=False)
    assert max_bytes_from_env() is None
    monkeypatch.setenv("GRAPHDNN_CACHE_MAX_BYTES", "64M")
    assert max_bytes_from_env() == 64 * 2**20
    with pytest.raises(gd.GraphError, match="must be >= 0"):
        PlanCache("unused", max_bytes=-1)


def test_eviction_removes_the_least_recently_used_entries(cache_dir: Path) -> None:
    first = _plan_files(cache_dir, plan_graphs.add_relu())  # plan, kernel A
    second = _plan_files(cache_dir, plan_graphs.add_relu_and_sigmoid())  # plan, kernels A and B
    everything = {*first, *second}
    _age(sorted(everything), 1000)
    reader = PlanCache(cache_dir)
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=reader, require_cached=True).origin == "disk cache"
    # the lookup marked add_relu's plan and kernel used now: two_groups' plan and kernel B are older
    cap = int(_sizes(first) / LOW_WATER) + 1
    assert cap < _sizes(everything)
    store = DiskStore(cache_dir, cap)
    assert store.cap is not None
    eviction = store.cap.evict()
    assert eviction is not None and eviction.removed == 2 and eviction.remaining == _sizes(first)
    assert {p for p in everything if p.exists()} == set(first)
    again = PlanCache(cache_dir)
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=again, require_cached=True).origin == "disk cache"
    with pytest.raises(gd.CacheMissError):  # evicted: a miss, not a damaged entry
        gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=again, require_cached=True)
    assert again.counters.rejected == 0


def test_plans_left_without_a_kernel_go_with_it(cache_dir: Path) -> None:
    first = _plan_files(cache_dir, plan_graphs.add_relu())  # plan, kernel A
    second = _plan_files(cache_dir, plan_graphs.add_relu_and_sigmoid())  # plan, kernels A and B
    kernel_a, kernel_b = first[1], second[2]
    assert second[1] == kernel_a
    _age([kernel_a], 2000)  # the shared kernel is the least recently used entry
    _age([first[0], second[0], kernel_b], 1000)
    everything = {*first, *second}
    cap = int((_sizes(everything) - kernel_a.stat().st_size) / LOW_WATER) + 1
    assert cap < _sizes(everything)
    store = DiskStore(cache_dir, cap)
    assert store.cap is not None
    eviction = store.cap.evict()
    assert eviction is not None and eviction.removed == 3  # kernel A, then both plans that used it
    assert {p for p in everything if p.exists()} == {kernel_b}
    assert cli.main(["cache", "verify", "--cache-dir", str(cache_dir)]) == 0


def test_a_write_past_the_cap_evicts_and_stats_report_the_cap(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = list(
        dict.fromkeys(
            _plan_files(cache_dir, plan_graphs.add_relu())[:1]
            + _plan_files(cache_dir, plan_graphs.add_relu_and_sigmoid())
        )
    )  # oldest first: add_relu's plan, two_groups' plan, kernel A, kernel B
    _age(stored, 1000)
    cap = _sizes(stored)  # full: the next write goes past it
    monkeypatch.setenv("GRAPHDNN_CACHE_MAX_BYTES", str(cap))
    cache = cache_at(cache_dir)
    assert cache.store is not None and cache.store.cap is not None and cache.store.cap.limit == cap
    plan = gd.compile(plan_graphs.add_relu(cols=40), arch=ARCH, cache=cache)  # one more plan and kernel
    assert plan.origin == "compiled" and plan.key is not None
    assert cache.store.plan_path(plan.key).exists()  # the newest stay
    kept = [path.exists() for path in stored]
    assert not kept[0] and kept == sorted(kept)  # the least recently used went, oldest first
    assert cache.store.cap.evicted == kept.count(False) and cache.store.cap.usage() <= cap
    assert cli.main(["cache", "stats", "--cache-dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    assert f"size cap:  {cap / 1024:.1f} KiB (GRAPHDNN_CACHE_MAX_BYTES)" in out
    assert "least recently used evicted first" in out
    monkeypatch.delenv("GRAPHDNN_CACHE_MAX_BYTES")
    assert cli.main(["cache", "stats", "--cache-dir", str(cache_dir / "elsewhere")]) == 0
    assert "size cap:  none (GRAPHDNN_CACHE_MAX_BYTES sets one" in capsys.readouterr().out


def test_a_read_only_cache_over_its_cap_still_serves(cache_dir: Path) -> None:
    cache = PlanCache(cache_dir, max_bytes=1)
    os.chmod(cache_dir / "v1", 0o555)
    try:
        assert cache.store is not None and cache.store.cap is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache, require_cached=True)
        assert plan.origin == "disk cache"
    finally:
        os.chmod(cache_dir / "v1", 0o755)


# -- several processes ------------------------------------------------------------------------------
ROUNDS = 150


def _churn(directory: str, source: str, cap: int, start: Any) -> tuple[int, int, int, int]:
    """Write every entry of ``source`` into the capped ``directory`` again and again, reading
    another entry after each write: (entries read whole, reads that found nothing, entries
    rejected, files this process evicted)."""
    pristine, store = DiskStore(source), DiskStore(directory, cap)
    entries = [(f.kind, f.key, f.path.read_bytes()) for f in pristine.files()]
    whole = missing = 0
    start.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rejections are counted by the store
        for round_ in range(ROUNDS):
            kind, key, data = entries[round_ % len(entries)]
            store.write(store.plan_path(key) if kind == "plan" else store.kernel_path(key), data)
            kind, key, _ = entries[(round_ * 7 + os.getpid()) % len(entries)]
            found = store.read_plan(key) if kind == "plan" else store.read_kernel(key)
            whole += found is not None
            missing += found is None
    assert store.cap is not None
    return whole, missing, store.rejected, store.cap.evicted


def test_concurrent_writers_and_readers_under_a_cap_never_see_a_damaged_entry(warm_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "capped"
    cap = _sizes(f.path for f in DiskStore(warm_dir).files()) // 2  # about half the entries fit
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(3) as pool:
        start = manager.Barrier(3)
        results = pool.starmap(_churn, [(str(directory), str(warm_dir), cap, start)] * 3)
    whole, missing, rejected, evicted = (sum(column) for column in zip(*results, strict=True))
    assert rejected == 0, results  # an eviction never left a reader with part of an entry
    assert whole > 0 and missing > 0 and evicted > 0, results  # entries were read, evicted and missed
    assert not list(directory.rglob("*.tmp"))
    store = DiskStore(directory, cap)
    assert store.cap is not None
    store.cap.evict()
    assert store.cap.usage() <= cap
    assert cli.main(["cache", "verify", "--cache-dir", str(directory)]) == 0
