"""Shipping a warmed cache: export every valid entry to one tar file, import it elsewhere.

The archive holds ``manifest.json`` (archive version, entry format version, and for each
plan its key, graph, arch, NVRTC version, codegen version and kernels) and the entry
files. Import checks every entry as a read would (checksum, format, key) before writing
it, atomically, to the target cache; member paths inside the archive are never used as
destinations.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import GraphError
from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .key import FORMAT_VERSION
from .store import MAX_ENTRY_BYTES, CacheWarning, DiskStore, StoredFile, write_atomically
from .trust import KEY, check_kernels, trusted_kernel, trusted_plan

ARCHIVE_VERSION = 1


@dataclass(frozen=True)
class ArchiveReport:
    plans: int
    kernels: int
    skipped: int  # entries left out: invalid, or (import) already present
    failed: int = 0  # (import) valid entries that could not be written to the cache

    def __str__(self) -> str:
        failed = f", {self.failed} could not be written" if self.failed else ""
        return f"{self.plans} plans, {self.kernels} kernels ({self.skipped} skipped{failed})"


def export_cache(store: DiskStore, archive: str | Path) -> ArchiveReport:
    """Write every valid entry of ``store`` to ``archive`` (.tar, or .tar.gz / .tgz to compress).

    A plan goes in only with all its kernels, so every plan of the archive can run."""
    plans: list[dict[str, object]] = []
    kernels: list[dict[str, object]] = []
    members: dict[str, bytes] = {}
    found, skipped = valid_entries(store, "exporting")
    for stored, data, entry in found:
        if isinstance(entry, KernelBinary):
            kernels.append({"kernel_key": entry.kernel_key, "name": entry.name, "arch": entry.arch})
        else:
            plans.append({"key": entry.key, "graph": entry.graph_name, **asdict(entry.fields)})
            plans[-1]["kernels"] = list(entry.program.kernel_keys)
        members[f"{stored.kind}s/{stored.key}.{stored.kind}"] = data
    manifest = {
        "graphdnn_cache_archive": ARCHIVE_VERSION,
        "format": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plans": plans,
        "kernels": kernels,
    }
    buffer = io.BytesIO()
    mode = "w:gz" if str(archive).endswith((".gz", ".tgz")) else "w"
    with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
        _add(tar, "manifest.json", json.dumps(manifest, indent=1).encode())
        for name, data in members.items():
            _add(tar, name, data)
    try:
        if not Path(archive).parent.is_dir():
            raise FileNotFoundError(2, "its directory does not exist")
        write_atomically(Path(archive), buffer.getvalue())
    except OSError as error:
        raise GraphError(f"cannot write cache archive {archive}: {error.strerror or error}") from None
    return ArchiveReport(len(plans), len(kernels), skipped)


def import_cache(store: DiskStore, archive: str | Path) -> ArchiveReport:
    """Add the valid entries of ``archive`` to ``store`` (entries already present are kept);
    a plan is added only when all its kernels are in the store afterwards."""
    with _open(archive) as tar:
        manifest = _manifest(tar, archive)
        counts = {"plan": 0, "kernel": 0}
        skipped = failed = 0
        try:
            entries = [("kernel", k["kernel_key"]) for k in manifest["kernels"]]
            entries += [("plan", p["key"]) for p in manifest["plans"]]
        except (KeyError, TypeError) as error:
            raise GraphError(f"cache archive {archive}: malformed manifest ({type(error).__name__} {error})") from None
        for kind, key in entries:
            if not isinstance(key, str) or not KEY.fullmatch(key):
                raise GraphError(f"cache archive {archive}: bad {kind} key {key!r} in the manifest")
            try:
                data = _member(tar, f"{kind}s/{key}.{kind}")
                if data is None:
                    raise EntryError("listed in the manifest but missing from the archive")
                outcome = admit(store, kind, key, data, "the archive")
            except EntryError as error:
                skipped += 1
                warnings.warn(
                    f"graphdnn plan cache: not importing {kind} {key[:16]}…: {error}", CacheWarning, stacklevel=2
                )
                continue
            if outcome == "added":
                counts[kind] += 1
            elif outcome == "present":
                skipped += 1
            else:
                failed += 1
    return ArchiveReport(counts["plan"], counts["kernel"], skipped, failed)


def valid_entries(
    store: DiskStore, action: str
) -> tuple[list[tuple[StoredFile, bytes, KernelBinary | PlanEntry]], int]:
    """Every entry of ``store`` that a read would accept, kernels first, each plan only with
    all its kernels (so every plan listed can run), as (file, bytes, decoded entry); and how
    many were left out, each reported as a CacheWarning ("not <action> <file>: why")."""
    found: list[tuple[StoredFile, bytes, KernelBinary | PlanEntry]] = []
    binaries: dict[str, KernelBinary] = {}
    skipped = 0
    for stored in sorted(store.files(), key=lambda f: f.kind != "kernel"):
        try:
            data = store.read_bytes(stored.path)
            entry: KernelBinary | PlanEntry
            if stored.kind == "kernel":
                entry = binaries[stored.key] = trusted_kernel(data, stored.key)
            else:
                entry = trusted_plan(data, stored.key)
                absent = [k for k in entry.program.kernel_keys if k not in binaries]
                if absent:
                    raise EntryError(f"{len(absent)} of its kernels are missing or damaged")
                check_kernels(entry, binaries)
        except FileNotFoundError:  # removed since it was listed
            continue
        except EntryError as error:
            skipped += 1
            warnings.warn(f"graphdnn plan cache: not {action} {stored.path}: {error}", CacheWarning, stacklevel=3)
            continue
        found.append((stored, data, entry))
    return found, skipped


def admit(store: DiskStore, kind: str, key: str, data: bytes, source: str) -> str:
    """Add an entry from ``source`` ("the archive", "the remote cache") to ``store``, checked as a
    read would check it, at the path its key determines: "added", "present" (kept as it
    is), or "failed" (could not be written; a CacheWarning). A plan is added only when all
    its kernels are in the store. EntryError when the entry cannot be trusted."""
    target = store.plan_path(key) if kind == "plan" else store.kernel_path(key)
    if kind == "kernel":
        trusted_kernel(data, key)
    else:
        entry = trusted_plan(data, key)
        present = {k: store.read_kernel(k) for k in entry.program.kernel_keys}
        absent = [k for k, binary in present.items() if binary is None]
        if absent:
            raise EntryError(f"{len(absent)} of its kernels are in neither {source} nor the cache")
        check_kernels(entry, {k: b for k, b in present.items() if b is not None})
    if target.exists():
        return "present"
    return "added" if store.write(target, data) is None else "failed"


def _open(archive: str | Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as error:
        raise GraphError(f"cannot read cache archive {archive}: {error}") from None


def _manifest(tar: tarfile.TarFile, archive: str | Path) -> dict[str, list[dict[str, str]]]:
    try:
        manifest = json.loads(_member(tar, "manifest.json") or b"")
    except (EntryError, ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("graphdnn_cache_archive") != ARCHIVE_VERSION:
        raise GraphError(f"{archive} is not a graphdnn cache archive (no readable manifest.json)")
    if manifest.get("format") != FORMAT_VERSION:
        raise GraphError(
            f"{archive} holds cache entries of format version {manifest.get('format')}; "
            f"this graphdnn reads version {FORMAT_VERSION}"
        )
    return manifest


def _member(tar: tarfile.TarFile, name: str) -> bytes | None:
    try:
        member = tar.getmember(name)
    except KeyError:
        return None
    if member.size > MAX_ENTRY_BYTES:
        raise EntryError(f"{name} is {member.size} bytes, over the limit of {MAX_ENTRY_BYTES} for an entry")
    handle = tar.extractfile(member) if member.isfile() else None
    return handle.read(MAX_ENTRY_BYTES) if handle is not None else None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
