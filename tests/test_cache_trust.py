"""Cache entries are checked field by field, not only by checksum: a re-sealed entry (valid
checksum, tampered content) is a miss that is rebuilt, never executed; reads are bounded.

Tampered entries are written with ``container.encode``, so their checksums are valid: what
rejects them is graphdnn.cache.trust. The rebuild reuses the stored kernels, so the whole
file costs the four NVRTC compiles of its session fixture.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphdnn.cache import container
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.cache.store import CacheWarning, DiskStore
from graphdnn.cache.trust import MAX_SHARED_OPT_IN, trusted_kernel
from graphdnn.compiler import compile as gd_compile
from tests import plan_graphs
from tests.cache_dirs import private_copy, warm

ARCH = "sm_90"
GRAPHS = {
    "sum_then_add": plan_graphs.sum_then_add,
    "scaled": plan_graphs.scaled,
    "dynamic_rows": plan_graphs.dynamic_rows,
}


@pytest.fixture(scope="session")
def trusted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding sum_then_add (2 kernels, a workspace intermediate), scaled (a scalar
    argument) and dynamic_rows (an extent argument and a dynamic grid)."""
    directory = tmp_path_factory.mktemp("trust") / "cache"
    cache = warm(directory, GRAPHS.values(), ARCH)
    assert cache.counters.compiles == 4
    return directory


@pytest.fixture
def cache_dir(trusted_dir: Path, tmp_path: Path) -> Path:
    return private_copy(trusted_dir, tmp_path)


def _plan_path(directory: Path, graph: str) -> Path:
    ir = GRAPHS[graph]().validate()
    from graphdnn.cache.key import key_fields

    return DiskStore(directory).plan_path(key_fields(ir, 90).key)


def _reseal_plan(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the plan document and write it back with a valid checksum."""
    sections = container.decode(path.read_bytes(), "plan")
    document = json.loads(sections["plan"])
    change(document)
    path.write_bytes(container.encode("plan", {"plan": json.dumps(document).encode()}))


def _reseal_kernel(path: Path, change: Callable[[dict[str, Any], dict[str, bytes]], None]) -> None:
    sections = container.decode(path.read_bytes(), "kernel")
    meta = json.loads(sections["meta"])
    change(meta, sections)
    sections["meta"] = json.dumps(meta).encode()
    path.write_bytes(container.encode("kernel", sections))


def _assert_rebuilt(directory: Path, graph: str, reason: str) -> None:
    """Looking the graph up is a miss with a warning matching ``reason``; the rebuilt plan is valid."""
    cache = PlanCache(directory)
    with pytest.warns(CacheWarning, match=reason):
        plan = gd_compile(GRAPHS[graph](), arch=ARCH, cache=cache)
    assert plan.origin == "compiled" and cache.counters.misses == 1 and cache.counters.rejected >= 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        again = gd_compile(GRAPHS[graph](), arch=ARCH, cache=PlanCache(directory), require_cached=True)
    assert again.origin == "disk cache"


def _launch(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["program"]["launches"][index].update(fields)

    return change


def _arg(index: int, arg: int, value: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["program"]["launches"][index]["args"][arg] = value

    return change


def _swap_kind(index: int, arg: int, kind: str) -> Callable[[dict[str, Any]], None]:
    """Bind argument ``arg``'s own tensor as ``kind`` (a scalar's tensor as a tensor, or
    the reverse): positions come from the stored plan, whatever the canonical order is."""

    def change(document: dict[str, Any]) -> None:
        stored = document["program"]["launches"][index]["args"][arg]
        assert stored[0] != kind, stored
        stored[0] = kind

    return change


def _program(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["program"].update(fields)

    return change


def _buffer(value: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["program"]["workspace"][0] = value

    return change


def _dropped_arg(index: int) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        document["program"]["launches"][index]["args"].pop()

    return change


def _blocks(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    """Change fields of launch ``index``'s dynamic grid; ``axis`` / ``tensor``: of its first dim."""

    def change(document: dict[str, Any]) -> None:
        blocks = document["program"]["launches"][index]["blocks"]
        for field, value in fields.items():
            if field in ("tensor", "axis"):
                blocks["dims"][0][("tensor", "axis").index(field)] = value
            else:
                blocks[field] = value

    return change


def _extent(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    """Change launch ``index``'s extent argument, stored as [kind, tensor, offset, axis]."""

    def change(document: dict[str, Any]) -> None:
        (stored,) = [a for a in document["program"]["launches"][index]["args"] if a[0] == "extent"]
        for field, value in fields.items():
            stored[("kind", "tensor", "offset", "axis").index(field)] = value

    return change


TAMPERED_PLANS = [
    ("sum_then_add", _arg(0, 0, ["tensor", 999, None]), "names tensor 999"),
    ("sum_then_add", _arg(0, 0, ["tensor", 1.5, None]), "tensor position 1.5"),
    ("sum_then_add", _arg(0, 0, ["scratch", None, 12345]), "names no scratch buffer"),
    ("scaled", _swap_kind(0, 1, "tensor"), "bound as a tensor"),
    ("scaled", _swap_kind(0, 0, "scalar"), "bound as a scalar"),
    ("sum_then_add", _launch(0, grid=[2**40, 1, 1]), "grid .* outside the CUDA limits"),
    ("sum_then_add", _launch(0, grid=[1, 65536, 1]), "grid .* outside the CUDA limits"),
    ("sum_then_add", _launch(0, grid=[0, 1, 1]), "grid .* outside the CUDA limits"),
    ("sum_then_add", _launch(0, block=[1024, 2, 1]), "more than 1024 threads"),
    ("sum_then_add", _launch(0, block=[1, 1, 65]), "block .* outside the CUDA limits"),
    ("sum_then_add", _launch(0, shared_bytes=MAX_SHARED_OPT_IN[90] + 1), "dynamic shared memory"),
    ("sum_then_add", _launch(0, shared_bytes=-1), "dynamic shared memory"),
    ("sum_then_add", _launch(0, alignment=3), "alignment 3"),
    ("sum_then_add", _launch(0, kernel_key="../../../../etc/passwd"), "does not belong to its content"),
    ("sum_then_add", _launch(0, kernel_key="0" * 64), "does not belong to its content"),
    ("sum_then_add", _launch(0, name="gd_not_in_the_cubin"), "does not match kernel"),
    ("sum_then_add", _launch(0, name="x; rm -rf /"), "not a C identifier"),
    ("sum_then_add", _program(workspace_size=-256), "workspace size -256"),
    ("sum_then_add", _program(workspace_size=0), "outside the workspace"),
    ("sum_then_add", _buffer([0, 4, 0, None, None]), "smaller than the tensor"),
    ("sum_then_add", _buffer([0, 16, 1, None, None]), "not an intermediate"),
    ("sum_then_add", _buffer([0, 4096, 0, None, None]), "outside the workspace"),
    ("sum_then_add", _dropped_arg(0), "its 2 arguments take 16 bytes, the kernel takes 24 bytes"),
    ("sum_then_add", _program(launches="xyz"), "malformed plan"),
    ("sum_then_add", _launch(0, grid=[1, 1]), "malformed plan: IndexError"),
    ("sum_then_add", _launch(0, grid=[1e400, 1, 1]), "malformed plan: OverflowError"),
    ("sum_then_add", _arg(0, 0, ["extent", 0, None, 0]), "an extent reads dim 0 of tensor 0, which is"),
    ("dynamic_rows", _blocks(0, divisor=0), "dynamic grid divisor 0 is not positive"),
    ("dynamic_rows", _blocks(0, coefficient=-33), "dynamic grid coefficient -33 is not a non-negative integer"),
    ("dynamic_rows", _blocks(0, cap=0), "dynamic grid cap 0 is outside 1..2147483647"),
    ("dynamic_rows", _blocks(0, cap=2**31), "dynamic grid cap 2147483648 is outside 1..2147483647"),
    ("dynamic_rows", _blocks(0, dims=[]), "a dynamic grid reads no dim"),
    ("dynamic_rows", _blocks(0, axis=1), "an extent reads dim 1 of tensor .*, which is 33, not a symbol"),
    (
        "dynamic_rows",
        _blocks(0, axis=7),
        "an extent reads dim 7 of tensor .*, which is no dim of a tensor the caller passes",
    ),
    ("dynamic_rows", _blocks(0, tensor=999), "an extent names tensor 999"),
    ("dynamic_rows", _launch(0, blocks="xyz"), "malformed plan"),
    ("dynamic_rows", _launch(0, blocks={"coefficient": 33, "dims": [[0]], "divisor": 1, "cap": 1}), "malformed plan"),
    ("dynamic_rows", _blocks(0, grid_axis=5), "dynamic grid axis 5 is not 0, 1 or 2"),
    ("dynamic_rows", _blocks(0, multiplier=0), "dynamic grid multiplier 0 is not positive"),
    ("dynamic_rows", _blocks(0, grid_axis=2, cap=70000), "dynamic grid cap 70000 is outside 1..65535"),
    (
        "dynamic_rows",
        _launch(0, bucket={"coefficient": 1, "dims": [], "low": 1, "high": 2}),
        "a size bucket reads no dim",
    ),
    (
        "dynamic_rows",
        _launch(0, bucket={"coefficient": 1, "dims": [[0, 0]], "low": 5, "high": 2}),
        "size bucket 5..2 is empty or starts below 1",
    ),
    ("dynamic_rows", _extent(0, axis=1), "an extent reads dim 1 of tensor .*, which is 33, not a symbol"),
    ("dynamic_rows", _extent(0, axis=None), "extent axis None"),
    ("dynamic_rows", _extent(0, tensor=-1), "extent tensor position -1"),
    ("dynamic_rows", _extent(0, offset=256), "an extent argument carries a workspace offset"),
    ("dynamic_rows", _extent(0, kind="scalar"), "malformed plan: TypeError"),  # its axis read as a tensor map
]


@pytest.mark.parametrize(("graph", "change", "reason"), TAMPERED_PLANS, ids=[r for _, _, r in TAMPERED_PLANS])
def test_a_resealed_plan_with_a_bad_field_is_a_miss(
    cache_dir: Path, graph: str, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    _reseal_plan(_plan_path(cache_dir, graph), change)
    _assert_rebuilt(cache_dir, graph, reason)


def test_a_resealed_kernel_with_a_foreign_cubin_is_a_miss(cache_dir: Path) -> None:
    """The scaled kernel's cubin sealed into the entry of sum_then_add's first kernel."""
    store = DiskStore(cache_dir)
    plans = {g: store.read_plan(_plan_path(cache_dir, g).stem) for g in GRAPHS}
    victim = plans["sum_then_add"].program.launches[0].kernel_key  # type: ignore[union-attr]
    donor = store.read_kernel(plans["scaled"].program.launches[0].kernel_key)  # type: ignore[union-attr]
    assert donor is not None

    def foreign(meta: dict[str, Any], sections: dict[str, bytes]) -> None:
        sections["cubin"] = donor.cubin

    _reseal_kernel(store.kernel_path(victim), foreign)
    _assert_rebuilt(cache_dir, "sum_then_add", "does not export its entry point")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("name", "gd_other_name", "does not export its entry point"),
        ("name", "../x", "not a C identifier"),
        ("arch", "sm_80", "built for sm_80, the plan for sm_90"),
        ("arch", "x86", "not an sm_XY architecture"),
        ("content_hash", "abc", "not a SHA-256 hex digest"),
    ],
)
def test_a_resealed_kernel_with_a_bad_field_is_a_miss(cache_dir: Path, field: str, value: str, reason: str) -> None:
    store = DiskStore(cache_dir)
    plan = store.read_plan(_plan_path(cache_dir, "scaled").stem)
    assert plan is not None
    _reseal_kernel(store.kernel_path(plan.program.launches[0].kernel_key), lambda meta, _: meta.update({field: value}))
    _assert_rebuilt(cache_dir, "scaled", reason)


def test_a_header_with_negative_section_lengths_is_refused() -> None:
    data = container.encode("kernel", {"meta": b"{}", "cubin": b"12345"})
    line, _, payload = data.partition(b"\n")
    header = json.loads(line)
    header["sections"] = [["meta", -3], ["cubin", len(payload) + 3]]
    header["sha256"] = container._digest({k: v for k, v in header.items() if k != "sha256"}, payload)
    with pytest.raises(container.EntryError, match="non-negative length"):
        container.decode(json.dumps(header).encode() + b"\n" + payload, "kernel")


def test_kernel_paths_only_come_from_keys() -> None:
    store = DiskStore("/tmp/unused")
    with pytest.raises(container.EntryError, match="not a cache key"):
        store.kernel_path("../../../../etc/passwd")


def test_an_entry_linked_to_dev_zero_is_refused_without_reading_it(cache_dir: Path) -> None:
    path = _plan_path(cache_dir, "scaled")
    path.unlink()
    path.symlink_to("/dev/zero")
    _assert_rebuilt(cache_dir, "scaled", "outside the cache directory")


def test_an_entry_that_is_a_device_or_fifo_inside_the_cache_is_refused(cache_dir: Path) -> None:
    path = _plan_path(cache_dir, "scaled")
    path.unlink()
    os.mkfifo(path)  # opening it blocks without O_NONBLOCK; reading it never ends
    _assert_rebuilt(cache_dir, "scaled", "not a regular file")


def test_an_oversized_entry_is_refused(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("graphdnn.cache.store.MAX_ENTRY_BYTES", 100)
    cache = PlanCache(cache_dir)
    with pytest.warns(CacheWarning, match="over the limit of 100"):
        assert cache.lookup(_plan_path(cache_dir, "scaled").stem) is None


def test_a_good_entry_passes_every_check(trusted_dir: Path) -> None:
    store = DiskStore(trusted_dir)
    kernels = [trusted_kernel(f.path.read_bytes(), f.key) for f in store.files() if f.kind == "kernel"]
    assert len(kernels) == 4 and all(k.name.startswith("gd_") for k in kernels)
