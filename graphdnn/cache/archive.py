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
import re
import tarfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import GraphError
from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .key import FORMAT_VERSION
from .store import CacheWarning, DiskStore

ARCHIVE_VERSION = 1
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ArchiveReport:
    plans: int
    kernels: int
    skipped: int  # entries left out: invalid, or (import) already present

    def __str__(self) -> str:
        return f"{self.plans} plans, {self.kernels} kernels ({self.skipped} skipped)"


def export_cache(store: DiskStore, archive: str | Path) -> ArchiveReport:
    """Write every valid entry of ``store`` to ``archive`` (.tar, or .tar.gz / .tgz to compress).

    A plan goes in only with all its kernels, so every plan of the archive can run."""
    plans: list[dict[str, object]] = []
    kernels: list[dict[str, object]] = []
    members: dict[str, bytes] = {}
    skipped = 0
    stored_files = sorted(store.files(), key=lambda f: f.kind != "kernel")  # kernels first
    for stored in stored_files:
        data = stored.path.read_bytes()
        try:
            if stored.kind == "kernel":
                binary = KernelBinary.decode(data, stored.key)
                kernels.append({"kernel_key": binary.kernel_key, "name": binary.name, "arch": binary.arch})
            else:
                entry = PlanEntry.decode(data, stored.key)
                absent = [k for k in entry.program.kernel_keys if f"kernels/{k}.kernel" not in members]
                if absent:
                    raise EntryError(f"{len(absent)} of its kernels are missing or damaged")
                plans.append({"key": entry.key, "graph": entry.graph_name, **asdict(entry.fields)})
                plans[-1]["kernels"] = list(entry.program.kernel_keys)
        except EntryError as error:
            skipped += 1
            warnings.warn(f"graphdnn plan cache: not exporting {stored.path}: {error}", CacheWarning, stacklevel=2)
            continue
        members[f"{stored.kind}s/{stored.key}.{stored.kind}"] = data
    manifest = {
        "graphdnn_cache_archive": ARCHIVE_VERSION,
        "format": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plans": plans,
        "kernels": kernels,
    }
    mode = "w:gz" if str(archive).endswith((".gz", ".tgz")) else "w"
    with tarfile.open(archive, mode) as tar:  # type: ignore[call-overload]
        _add(tar, "manifest.json", json.dumps(manifest, indent=1).encode())
        for name, data in members.items():
            _add(tar, name, data)
    return ArchiveReport(len(plans), len(kernels), skipped)


def import_cache(store: DiskStore, archive: str | Path) -> ArchiveReport:
    """Add the valid entries of ``archive`` to ``store`` (entries already present are kept);
    a plan is added only when all its kernels are in the store afterwards."""
    with _open(archive) as tar:
        manifest = _manifest(tar, archive)
        counts = {"plan": 0, "kernel": 0}
        skipped = 0
        entries = [("kernel", k["kernel_key"]) for k in manifest["kernels"]]
        entries += [("plan", p["key"]) for p in manifest["plans"]]
        for kind, key in entries:
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise GraphError(f"cache archive {archive}: bad {kind} key {key!r} in the manifest")
            target = store.plan_path(key) if kind == "plan" else store.kernel_path(key)
            data = _member(tar, f"{kind}s/{key}.{kind}")
            try:
                if data is None:
                    raise EntryError("listed in the manifest but missing from the archive")
                if kind == "kernel":
                    KernelBinary.decode(data, key)
                else:
                    absent = [
                        k for k in PlanEntry.decode(data, key).program.kernel_keys if not store.kernel_path(k).exists()
                    ]
                    if absent:
                        raise EntryError(f"{len(absent)} of its kernels are in neither the archive nor the cache")
            except EntryError as error:
                skipped += 1
                warnings.warn(
                    f"graphdnn plan cache: not importing {kind} {key[:16]}…: {error}", CacheWarning, stacklevel=2
                )
                continue
            if target.exists():
                skipped += 1
                continue
            store.write(target, data)
            counts[kind] += 1
    return ArchiveReport(counts["plan"], counts["kernel"], skipped)


def _open(archive: str | Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as error:
        raise GraphError(f"cannot read cache archive {archive}: {error}") from None


def _manifest(tar: tarfile.TarFile, archive: str | Path) -> dict[str, list[dict[str, str]]]:
    data = _member(tar, "manifest.json")
    try:
        manifest = json.loads(data or b"")
    except ValueError:
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
    handle = tar.extractfile(member) if member.isfile() else None
    return handle.read() if handle is not None else None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
