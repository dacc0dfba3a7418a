"""The on-disk tier of the plan cache: one file per plan, one per compiled kernel.

Layout under the cache directory::

    v1/plans/<key[:2]>/<key>.plan          launch metadata, workspace layout, tuning
    v1/kernels/<kkey[:2]>/<kkey>.kernel    cubin + source, once per kernel key

Writes go to a temporary file in the same directory, then ``os.replace``: readers see
the old file or the new one, never half of one, so any number of processes can fill
the same directory at once. A file that fails its checks is reported (CacheWarning),
treated as absent and overwritten by the rebuild; it is never loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .key import FORMAT_VERSION

T = TypeVar("T")


class CacheWarning(UserWarning):
    """A cache entry was rejected (and will be rebuilt), or the cache could not be written."""


@dataclass(frozen=True)
class StoredFile:
    kind: str  # "plan" or "kernel"
    key: str
    path: Path

    @property
    def bytes(self) -> int:
        return self.path.stat().st_size


class DiskStore:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()
        self.base = self.directory / f"v{FORMAT_VERSION}"
        self.rejected = 0  # entries that failed their checks, since this store was opened

    def plan_path(self, key: str) -> Path:
        return self.base / "plans" / key[:2] / f"{key}.plan"

    def kernel_path(self, kernel_key: str) -> Path:
        return self.base / "kernels" / kernel_key[:2] / f"{kernel_key}.kernel"

    def read_plan(self, key: str) -> PlanEntry | None:
        return self._read(self.plan_path(key), lambda data: PlanEntry.decode(data, key))

    def read_kernel(self, kernel_key: str) -> KernelBinary | None:
        return self._read(self.kernel_path(kernel_key), lambda data: KernelBinary.decode(data, kernel_key))

    def write_plan(self, entry: PlanEntry) -> None:
        self.write(self.plan_path(entry.key), entry.encode())

    def write_kernel(self, binary: KernelBinary) -> None:
        self.write(self.kernel_path(binary.kernel_key), binary.encode())

    @staticmethod
    def stamp(path: Path) -> tuple[int, int] | None:
        """(modification time in ns, size) of a file, None if it does not exist: a change detector."""
        try:
            status = path.stat()
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def files(self) -> Iterator[StoredFile]:
        """Every entry file, plans first."""
        for kind, folder, suffix in (("plan", "plans", ".plan"), ("kernel", "kernels", ".kernel")):
            for path in sorted((self.base / folder).glob(f"*/*{suffix}")):
                yield StoredFile(kind, path.name.removesuffix(suffix), path)

    def clear(self) -> int:
        """Remove every entry (of every format version); return how many files went."""
        count = sum(1 for p in self.directory.glob("v*/*/*/*") if p.is_file()) if self.directory.is_dir() else 0
        for version in self.directory.glob("v*"):
            if version.is_dir():
                shutil.rmtree(version, ignore_errors=True)
        return count

    def _read(self, path: Path, decode: Callable[[bytes], T]) -> T | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            warnings.warn(f"graphdnn plan cache: cannot read {path}: {error.strerror}", CacheWarning, stacklevel=4)
            return None
        try:
            return decode(data)
        except EntryError as error:
            self.rejected += 1
            warnings.warn(
                f"graphdnn plan cache: ignoring {path}: {error}; it will be rebuilt", CacheWarning, stacklevel=4
            )
            return None

    def write(self, path: Path, data: bytes) -> None:
        """Write an entry file atomically; a failure is a warning (the cache is an optimisation)."""
        try:
            write_atomically(path, data)
        except OSError as error:
            warnings.warn(f"graphdnn plan cache: cannot write {path}: {error}", CacheWarning, stacklevel=4)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
