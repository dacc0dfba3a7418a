"""The plan cache: keys, dedupe, the memory and disk tiers, corruption, concurrency, reuse, archives.

Kernels come from tiny elementwise graphs (tests/plan_graphs.py). A session fixture
compiles them once into a warm directory; tests that damage or extend a cache work on a
copy of it, so the whole file needs only a handful of NVRTC compiles.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import json
import multiprocessing
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

import graphdnn as gd
from graphdnn import cli
from graphdnn.cache import container
from graphdnn.cache.archive import export_cache, import_cache
from graphdnn.cache.key import FORMAT_VERSION, KeyFields, _source_files, headers_version, key_fields
from graphdnn.cache.lru import LRU
from graphdnn.cache.plan_cache import PlanCache, default_directory
from graphdnn.cache.store import CacheWarning, DiskStore
from graphdnn.cache.trust import trusted_plan
from graphdnn.program import ArgKind
from tests import plan_graphs
from tests.cache_dirs import private_copy, warm

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"


@pytest.fixture(scope="session")
def warm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding add_relu and two_groups for sm_90 (2 distinct kernels)."""
    directory = tmp_path_factory.mktemp("warm") / "cache"
    cache = warm(directory, (plan_graphs.add_relu, plan_graphs.add_relu_and_sigmoid), ARCH)
    assert cache.counters.compiles == 2
    return directory


@pytest.fixture
def cache_dir(warm_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the warm cache directory."""
    return private_copy(warm_dir, tmp_path)


def fresh(directory: Path) -> PlanCache:
    """A cache over ``directory`` with an empty memory tier (what a new process sees)."""
    return PlanCache(directory)


# -- the key ---------------------------------------------------------------------------------------
def test_every_key_field_changes_the_key() -> None:
    fields = key_fields(plan_graphs.add_relu().validate(), 90)
    changed = {
        "format": FORMAT_VERSION + 1,
        "signature": "0" * 64,
        "arch": "sm_80",
        "codegen": "1" * 64,
        "nvrtc": "99.9",
        "headers": "CUDART_VERSION 99090",
        "options": fields.options + ";extra",
        "disabled_rules": "pointwise_group",
    }
    assert set(changed) == {f.name for f in dataclasses.fields(KeyFields)}
    keys = {dataclasses.replace(fields, **{name: value}).key for name, value in changed.items()}
    assert len(keys | {fields.key}) == len(changed) + 1


def test_the_key_follows_the_graph_target_and_fusion_options() -> None:
    ir = plan_graphs.add_relu().validate()
    base = key_fields(ir, 90).key
    assert key_fields(plan_graphs.add_relu(cols=34).validate(), 90).key != base
    assert key_fields(plan_graphs.add_relu(dtype="bf16").validate(), 90).key != base
    assert key_fields(ir, 80).key != base
    assert key_fields(ir, 90, ["pointwise_group"]).key != base


def test_names_uids_and_declaration_order_do_not_change_the_key() -> None:
    base = key_fields(plan_graphs.add_relu().validate(), 90)
    renamed = plan_graphs.add_relu("other", names=("input", "bias", "out"), bias_first=True)
    assert key_fields(renamed.validate(), 90) == base


def test_the_cuda_headers_version_is_the_runtime_wheels() -> None:
    from codegen.nvrtc import include_paths

    fields = key_fields(plan_graphs.add_relu().validate(), 90)
    assert fields.headers == f"nvidia-cuda-runtime {importlib.metadata.version('nvidia-cuda-runtime')}"
    assert any(Path(d, "cuda_runtime_api.h").is_file() for d in include_paths())
    other = dataclasses.replace(fields, headers="nvidia-cuda-runtime 0.0.1")
    assert other.key != fields.key and other.kernel_key("0" * 64) != fields.kernel_key("0" * 64)


def test_a_plan_of_a_key_without_the_headers_field_is_refused_clearly(cache_dir: Path) -> None:
    stored = next(f for f in DiskStore(cache_dir).files() if f.kind == "plan")
    document = json.loads(container.decode(stored.path.read_bytes(), "plan")["plan"])
    del document["fields"]["headers"]  # as graphdnn wrote it before the headers' version was a field
    old = container.encode("plan", {"plan": json.dumps(document).encode()})
    with pytest.raises(container.EntryError, match="written by an older graphdnn: no key field headers"):
        trusted_plan(old, stored.key)


def test_toolkit_headers_are_known_by_their_version_macro(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the runtime wheel, NVRTC compiles against a toolkit's headers."""
    from codegen import nvrtc
    from graphdnn.cache import key

    (tmp_path / "cuda_runtime_api.h").write_text("#ifndef X\n#define CUDART_VERSION  12080\n#endif\n")
    monkeypatch.setattr(nvrtc, "include_paths", lambda: (str(tmp_path),))
    monkeypatch.setattr(key, "_nvidia_wheel_version", lambda project: None)
    headers_version.cache_clear()
    try:
        assert headers_version() == "CUDART_VERSION 12080"
        (tmp_path / "cuda_runtime_api.h").write_text("/* no version */\n")
        headers_version.cache_clear()
        with pytest.raises(gd.GraphError, match="defines no CUDART_VERSION"):
            headers_version()
    finally:
        headers_version.cache_clear()


def test_the_codegen_version_covers_codegen_fusion_rules_and_the_ir() -> None:
    labels = {label for label, _ in _source_files()}
    for expected in (
        "codegen/families/elementwise.py",
        "codegen/include/graphdnn.cuh",
        "codegen/nvrtc.py",
        "fusion_rules/manager.py",
        "graphdnn/ops/pointwise.py",
        "graphdnn/ir.py",
        "graphdnn/lower.py",
    ):
        assert expected in labels


def test_cache_key_command_prints_every_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    gd.save(plan_graphs.add_relu(), path)
    assert cli.main(["cache", "key", str(path), "--arch", "sm_80"]) == 0
    out = capsys.readouterr().out
    fields = key_fields(plan_graphs.add_relu().validate(), 80)
    for field in dataclasses.fields(KeyFields):
        assert field.name in out
    assert fields.signature in out and fields.codegen in out and "sm_80" in out
    assert out.strip().endswith(fields.key)


# -- hits, misses, dedupe ------------------------------------------------------------------------
def test_a_renamed_graph_reuses_the_plan_and_binds_its_own_tensors(warm_dir: Path) -> None:
    cache = fresh(warm_dir)
    renamed = plan_graphs.add_relu("other", names=("input", "bias", "out"), bias_first=True)
    plan = gd.compile(renamed, arch=ARCH, cache=cache)
    assert (plan.origin, cache.counters.compiles, cache.counters.loads) == ("disk cache", 0, 1)
    (kernel,) = plan.kernels
    bound = [p.tensor.name for p in kernel.params if p.kind is ArgKind.TENSOR]
    assert bound == ["input", "bias", "out"]  # the stored plan's x, b, y, mapped onto this graph
    assert gd.compile(renamed, arch=ARCH, cache=cache).origin == "memory cache"
    assert (cache.counters.hits, cache.counters.misses) == (2, 0)


def test_a_dynamic_plan_is_stored_once_for_its_range(tmp_path: Path) -> None:
    """The stored launch keeps its extent argument and grid over canonical positions: a graph
    with another symbol name finds it and binds them to its own input; another range misses."""
    gd.compile(plan_graphs.dynamic_rows(), arch=ARCH, cache=PlanCache(tmp_path))
    cache = fresh(tmp_path)
    plan = gd.compile(plan_graphs.dynamic_rows("other", symbol="tokens"), arch=ARCH, cache=cache)
    assert (plan.origin, cache.counters.compiles) == ("disk cache", 0)
    (launch,) = plan.program.launches
    (extent,) = [p for p in plan.kernels[0].params if p.kind is ArgKind.EXTENT]
    assert (str(extent), launch.blocks is not None) == ("tokens (dim 0 of x)", True)
    wider = gd.compile(plan_graphs.dynamic_rows(max_rows=65), arch=ARCH, cache=cache)
    assert wider.origin == "compiled" and cache.counters.misses == 1


def test_identical_fused_kernels_across_graphs_compile_once(tmp_path: Path) -> None:
    cache = PlanCache(tmp_path)
    first = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache)
    second = gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=cache)
    assert first.kernels[0].kernel_key == second.kernels[0].kernel_key
    assert (first.compiled, second.compiled) == (1, 1)
    assert (cache.counters.compiles, cache.counters.kernel_hits) == (2, 1)
    assert len(list(DiskStore(tmp_path).files())) == 2 + 2  # two plans, two kernels


def test_a_memory_only_cache_and_no_cache(tmp_path: Path) -> None:
    memory = PlanCache()
    gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=memory)
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=memory).origin == "memory cache"
    assert memory.directory is None
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=None).origin == "compiled"


def test_the_default_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GRAPHDNN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == tmp_path / "xdg" / "graphdnn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_directory() == tmp_path / "home" / ".cache" / "graphdnn"
    monkeypatch.setenv("GRAPHDNN_CACHE_DIR", str(tmp_path / "moved"))
    assert default_directory() == tmp_path / "moved"


def test_the_default_cache_follows_graphdnn_cache_dir(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    monkeypatch.setenv("GRAPHDNN_CACHE_DIR", str(cache_dir))
    plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, require_cached=True)
    assert plan.origin in ("disk cache", "memory cache")


def test_require_cached_turns_a_miss_into_an_error(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> None:
    graph = plan_graphs.add_relu(cols=35)
    with pytest.raises(gd.CacheMissError, match=r"(?s)graph .add_relu. is not in the plan cache at .*signature"):
        gd.compile(graph, arch=ARCH, cache=fresh(cache_dir), require_cached=True)
    monkeypatch.setenv("GRAPHDNN_REQUIRE_CACHED", "1")
    with pytest.raises(gd.CacheMissError):
        gd.compile(graph, arch=ARCH, cache=fresh(cache_dir))
    with pytest.raises(gd.CacheMissError, match="caching is off"):
        gd.compile(graph, arch=ARCH, cache=None)
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=fresh(cache_dir)).origin == "disk cache"


def test_lru_keeps_the_most_recent_entries() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert ("a" in lru, "b" in lru, "c" in lru, len(lru)) == (True, False, True, 2)


def test_the_memory_tier_is_bounded(cache_dir: Path) -> None:
    cache = PlanCache(cache_dir, plans_in_memory=1)
    gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache)
    gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=cache)
    assert len(cache._plans) == 1
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache).origin == "disk cache"  # evicted, reloaded


# -- damaged entries --------------------------------------------------------------------------------
def _plan_file(directory: Path) -> Path:
    key = key_fields(plan_graphs.add_relu().validate(), 90).key
    return DiskStore(directory).plan_path(key)


def _kernel_file(directory: Path) -> Path:
    plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=fresh(directory))
    return DiskStore(directory).kernel_path(plan.kernels[0].kernel_key)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-20] ^= 0x40
    path.write_bytes(bytes(data))


def _flip_header_byte(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"kind"', b'"kinc"', 1))


def _other_version(path: Path) -> None:
    line, _, payload = path.read_bytes().partition(b"\n")
    header = json.loads(line)
    header["format"] = FORMAT_VERSION + 1
    header.pop("sha256")
    header["sha256"] = container._digest(header, payload)  # a valid entry, of another version
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize("damage", [_truncate, _flip_payload_byte, _flip_header_byte, _other_version])
@pytest.mark.parametrize("which", [_plan_file, _kernel_file])
def test_a_damaged_entry_is_reported_rebuilt_and_never_loaded(cache_dir: Path, damage, which) -> None:  # type: ignore[no-untyped-def]
    path = which(cache_dir)
    damage(path)
    cache = fresh(cache_dir)
    with pytest.warns(CacheWarning, match=f"ignoring {path}: .*it will be rebuilt"):
        plan = gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=cache)
    assert plan.origin == "compiled"
    assert cache.counters.rejected == 1
    assert (cache.counters.compiles, cache.counters.kernel_hits) == ((1, 0) if which is _kernel_file else (0, 1))
    assert gd.compile(plan_graphs.add_relu(), arch=ARCH, cache=fresh(cache_dir)).origin == "disk cache"  # rewritten


def test_decode_names_what_is_wrong() -> None:
    data = container.encode("plan", {"plan": b"{}"})
    with pytest.raises(container.EntryError, match="truncated"):
        container.decode(data[:-1], "plan")
    with pytest.raises(container.EntryError, match="'plan' entry where a 'kernel' entry belongs"):
        container.decode(data, "kernel")
    with pytest.raises(container.EntryError, match="not a graphdnn cache entry"):
        container.decode(b'{"magic": "x"}\n', "plan")
    assert container.decode(data, "plan") == {"plan": b"{}"}


# -- several processes ------------------------------------------------------------------------------
def _warm(directory: str, start: Any) -> int:
    cache = PlanCache(directory)
    start.wait()  # all processes miss the same kernels at once
    gd.compile(plan_graphs.add_relu(cols=41), arch=ARCH, cache=cache)
    gd.compile(plan_graphs.scaled(), arch=ARCH, cache=cache)
    return cache.counters.compiles


def test_concurrent_compiles_build_each_kernel_once_and_leave_only_valid_entries(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(3) as pool:
        start = manager.Barrier(3)
        compiles = pool.starmap(_warm, [(str(tmp_path), start)] * 3)
    assert sum(compiles) == 2, compiles  # the kernel locks: each distinct kernel compiled by one process
    store = DiskStore(tmp_path)
    files = list(store.files())
    assert sorted(f.kind for f in files) == ["kernel", "kernel", "plan", "plan"]
    assert not list(tmp_path.rglob("*.tmp"))
    assert cli.main(["cache", "verify", "--cache-dir", str(tmp_path)]) == 0
    cache = fresh(tmp_path)
    gd.compile(plan_graphs.scaled(), arch=ARCH, cache=cache, require_cached=True)
    assert cache.counters.compiles == 0


def test_another_process_runs_from_the_cache_with_zero_compiles(cache_dir: Path) -> None:
    script = (
        "import sys, graphdnn as gd\n"
        "from graphdnn.cache.plan_cache import cache_at\n"
        "from tests import plan_graphs\n"
        f"plan = gd.compile(plan_graphs.add_relu_and_sigmoid(), arch='{ARCH}')\n"
        "counters = cache_at(sys.argv[1]).counters\n"
        "assert plan.origin == 'disk cache', plan.origin\n"
        "assert (counters.compiles, counters.misses, counters.loads) == (0, 0, 1), counters\n"
        "assert 'fusion_rules' not in sys.modules and 'codegen.emit' not in sys.modules\n"
        "assert 'cuda.bindings' not in sys.modules  # loading needs neither NVRTC nor the driver\n"
        "print('ok', len(plan.kernels))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRAPHDNN_CACHE_DIR": str(cache_dir), "GRAPHDNN_REQUIRE_CACHED": "1"}
    result = subprocess.run([sys.executable, "-c", script, str(cache_dir)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok 2"


# -- export / import ---------------------------------------------------------------------------------
def test_export_import_round_trip(cache_dir: Path, tmp_path: Path) -> None:
    archive = tmp_path / "warm.tar.gz"
    report = export_cache(DiskStore(cache_dir), archive)
    assert (report.plans, report.kernels, report.skipped) == (2, 2, 0)
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest["format"] == FORMAT_VERSION
    assert {p["graph"] for p in manifest["plans"]} == {"add_relu", "two_groups"}
    assert {p["arch"] for p in manifest["plans"]} == {ARCH}
    assert all(p["nvrtc"] and p["codegen"] and p["kernels"] for p in manifest["plans"])

    target = tmp_path / "elsewhere"
    assert str(import_cache(DiskStore(target), archive)) == "2 plans, 2 kernels (0 skipped)"
    cache = fresh(target)
    gd.compile(plan_graphs.add_relu_and_sigmoid(), arch=ARCH, cache=cache, require_cached=True)
    assert cache.counters.compiles == 0
    assert str(import_cache(DiskStore(target), archive)) == "0 plans, 0 kernels (4 skipped)"  # already there


def test_export_leaves_out_damaged_entries_and_the_plans_that_need_them(cache_dir: Path, tmp_path: Path) -> None:
    _flip_payload_byte(_kernel_file(cache_dir))  # add_relu's kernel; two_groups needs it too
    archive = tmp_path / "warm.tar"
    with pytest.warns(CacheWarning, match="not exporting"):
        report = export_cache(DiskStore(cache_dir), archive)
    assert (report.plans, report.kernels, report.skipped) == (0, 1, 3)


def test_import_checks_every_member_and_ignores_unlisted_paths(cache_dir: Path, tmp_path: Path) -> None:
    archive, tampered = tmp_path / "warm.tar", tmp_path / "tampered.tar"
    export_cache(DiskStore(cache_dir), archive)
    damaged_kernel = _kernel_file(cache_dir).name
    with tarfile.open(archive) as source, tarfile.open(tampered, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(damaged_kernel):
                data = data[:-20] + bytes([data[-20] ^ 0x40]) + data[-19:]
            member.size = len(data)
            target.addfile(member, io.BytesIO(data))
        escape = tarfile.TarInfo("plans/../../escape.plan")
        escape.size = 4
        target.addfile(escape, io.BytesIO(b"evil"))
    destination = tmp_path / "elsewhere"
    with pytest.warns(CacheWarning) as caught:
        report = import_cache(DiskStore(destination), tampered)
    messages = [str(w.message) for w in caught]
    assert sum("checksum mismatch" in m for m in messages) == 1
    assert sum("in neither the archive nor the cache" in m for m in messages) == 2
    assert (report.plans, report.kernels, report.skipped) == (0, 1, 3)  # both plans need the damaged kernel
    assert not list(tmp_path.rglob("escape.plan"))
    assert cli.main(["cache", "verify", "--cache-dir", str(destination)]) == 0


def test_import_refuses_another_format(tmp_path: Path) -> None:
    archive = tmp_path / "old.tar"
    with tarfile.open(archive, "w") as tar:
        manifest = tmp_path / "manifest.json"
        manifest.write_text(json.dumps({"graphdnn_cache_archive": 1, "format": 0, "plans": [], "kernels": []}))
        tar.add(manifest, arcname="manifest.json")
    with pytest.raises(gd.GraphError, match="format version 0; this graphdnn reads version"):
        import_cache(DiskStore(tmp_path / "c"), archive)


def test_plan_entries_survive_encode_decode(warm_dir: Path) -> None:
    path = _plan_file(warm_dir)
    entry = trusted_plan(path.read_bytes(), path.stem)
    assert trusted_plan(entry.encode(), entry.key) == entry
    assert entry.graph_name == "add_relu"
