"""The on-disk tier of the plan cache: one file per plan, one per compiled kernel.

Layout under the cache directory::

    v1/plans/<key[:2]>/<key>.plan          launch metadata, workspace layout, tuning
    v1/kernels/<kkey[:2]>/<kkey>.kernel    cubin + source, once per kernel key
    v1/kernels/<kkey[:2]>/<kkey>.lock      held (flock) by the process compiling it

Writes go to a temporary file in the same directory, then ``os.replace``: readers see
the old file or the new one, never half of one, so any number of processes can fill
the same directory at once. Reads are bounded (regular files inside the cache, of at
most MAX_ENTRY_BYTES). A file that fails its checks is reported (CacheWarning), treated
as absent and overwritten by the rebuild; it is never loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .evict import SizeCap, touch
from .key import FORMAT_VERSION
from .trust import KEY, trusted_kernel, trusted_plan

# The largest entry file read: a kernel's cubin is at most a few MiB and a plan of a graph
# of tens of thousands of nodes a few MiB of JSON; a file over this is refused unread.
MAX_ENTRY_BYTES = 64 * 1024 * 1024

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
        """Size of the file (of the link itself when it is a dangling link)."""
        try:
            return self.path.stat().st_size
        except OSError:
            return self.path.lstat().st_size if self.path.is_symlink() else 0


class DiskStore:
    """Entry files under ``directory``; ``max_bytes``: a size cap, past which the least
    recently used entries are removed (:mod:`.evict`; None: no cap)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.directory = Path(directory).expanduser()
        self.base = self.directory / f"v{FORMAT_VERSION}"
        self.cap = (
            SizeCap(max_bytes, self.base, self._entry_paths, self._kernel_files) if max_bytes is not None else None
        )
        self.rejected = 0  # entries that failed their checks, since this store was opened
        self._resolved: Path | None = None  # the directory with its links resolved, once known

    def plan_path(self, key: str) -> Path:
        return self.base / "plans" / _checked(key)[:2] / f"{key}.plan"

    def kernel_path(self, kernel_key: str) -> Path:
        return self.base / "kernels" / _checked(kernel_key)[:2] / f"{kernel_key}.kernel"

    def read_plan(self, key: str) -> PlanEntry | None:
        return self._read(self.plan_path(key), lambda data: trusted_plan(data, key))

    def read_kernel(self, kernel_key: str) -> KernelBinary | None:
        return self._read(self.kernel_path(kernel_key), lambda data: trusted_kernel(data, kernel_key))

    def write_kernel(self, binary: KernelBinary) -> OSError | None:
        return self.write(self.kernel_path(binary.kernel_key), binary.encode())

    @staticmethod
    def stamp(path: Path) -> tuple[int, int] | None:
        """(modification time in ns, size) of a file, None if it does not exist: a change detector."""
        try:
            status = path.stat()
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def files(self) -> Iterator[StoredFile]:
        """Every entry file (or link, dangling or not), plans first."""
        for kind, folder, suffix in (("plan", "plans", ".plan"), ("kernel", "kernels", ".kernel")):
            for path in sorted((self.base / folder).glob(f"*/*{suffix}")):
                yield StoredFile(kind, path.name.removesuffix(suffix), path)

    def _entry_paths(self) -> Iterator[Path]:
        return (stored.path for stored in self.files())

    def _kernel_files(self, path: Path) -> list[Path] | None:
        """The kernel files the plan file at ``path`` uses; None when it is no readable plan."""
        if path.suffix != ".plan":
            return None
        try:
            entry = PlanEntry.decode(self.read_bytes(path), path.stem)
            return [self.kernel_path(kernel_key) for kernel_key in entry.program.kernel_keys]
        except (OSError, EntryError):
            return None

    def read_bytes(self, path: Path) -> bytes:
        """An entry file's bytes. FileNotFoundError when there is none; EntryError when it is
        not a regular file inside the cache directory of at most MAX_ENTRY_BYTES (a link out
        of the cache, a dangling link, a device such as /dev/zero, a FIFO) or cannot be read."""
        try:
            resolved = path.resolve()
            inside = resolved.is_relative_to(self._resolved_directory())
        except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop (Python < 3.13)
            raise EntryError(f"cannot resolve the path: {error}") from None
        if not inside:
            raise EntryError(f"a link to {resolved}, outside the cache directory")
        try:
            handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (FileNotFoundError, NotADirectoryError):
            if path.is_symlink():
                raise EntryError("a symbolic link to a file that does not exist") from None
            raise FileNotFoundError(2, "no such entry", str(path)) from None
        except OSError as error:
            raise EntryError(f"cannot open: {error.strerror}") from None
        try:
            status = os.fstat(handle)
            if not stat.S_ISREG(status.st_mode):
                raise EntryError("not a regular file")
            if status.st_size > MAX_ENTRY_BYTES:
                raise EntryError(f"{status.st_size} bytes, over the limit of {MAX_ENTRY_BYTES} for an entry")
            with os.fdopen(handle, "rb", closefd=False) as stream:
                data = stream.read(MAX_ENTRY_BYTES + 1)
        except OSError as error:
            raise EntryError(f"cannot read: {error.strerror}") from None
        finally:
            os.close(handle)
        if len(data) > MAX_ENTRY_BYTES:
            raise EntryError(f"over the limit of {MAX_ENTRY_BYTES} bytes for an entry")
        return data

    def _resolved_directory(self) -> Path:
        if self._resolved is None:
            self._resolved = self.directory.resolve()
        return self._resolved

    def clear(self) -> tuple[int, list[tuple[Path, str]]]:
        """Remove every entry (of every format version), and the lock and temporary files
        beside them: (entries removed, [(file, why it could not be removed)])."""
        removed, failed = 0, []
        for version in sorted(self.directory.glob("v*")) if self.directory.is_dir() else []:
            if version.is_symlink() or not version.is_dir():
                continue
            for root, folders, names in os.walk(version, topdown=False):
                for name in names + [f for f in folders if Path(root, f).is_symlink()]:
                    try:
                        os.unlink(Path(root, name))
                        removed += name.endswith((".plan", ".kernel"))
                    except FileNotFoundError:
                        pass
                    except OSError as error:
                        failed.append((Path(root, name), error.strerror or str(error)))
                with contextlib.suppress(OSError):  # not empty when something could not be removed
                    os.rmdir(root)
        return removed, failed

    def remove(self, path: Path) -> OSError | None:
        """Delete one entry file; the error when it could not be deleted."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            return error
        return None

    @contextlib.contextmanager
    def claim(self, kernel_key: str, *, wait: bool) -> Iterator[bool]:
        """Hold the compile lock of a kernel: yields True once held (this process compiles it),
        False when ``wait`` is off and another process holds it. The lock is an flock on
        ``<kernel file>.lock``, so a holder that dies releases it; where no lock file can be
        made (a read-only cache) it yields True without locking (the write will fail anyway)."""
        path = self.kernel_path(kernel_key).with_suffix(".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            handle = None
        if handle is None:
            yield True
            return
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(handle)  # releases the lock

    def _read(self, path: Path, decode: Callable[[bytes], T]) -> T | None:
        """A lookup's read: the decoded entry, marked used now (its last use decides eviction)."""
        try:
            entry = decode(self.read_bytes(path))
            touch(path)
            return entry
        except FileNotFoundError:
            return None
        except EntryError as error:
            self.rejected += 1
            warnings.warn(
                f"graphdnn plan cache: ignoring {path}: {error}; it will be rebuilt", CacheWarning, stacklevel=4
            )
            return None

    def write(self, path: Path, data: bytes) -> OSError | None:
        """Write an entry file atomically; a failure is a warning (the cache is an optimisation),
        and returned so that callers for whom the write is the point (warmup, import) can report it."""
        try:
            write_atomically(path, data)
        except OSError as error:
            warnings.warn(f"graphdnn plan cache: cannot write {path}: {error}", CacheWarning, stacklevel=4)
            return error
        if self.cap is not None:
            self.cap.added(len(data))
        return None


def _checked(key: str) -> str:
    """A key used in a path: SHA-256 hex only, so that no key can name a file outside the cache."""
    if not KEY.fullmatch(key):
        raise EntryError(f"{key[:80]!r} is not a cache key (64 hexadecimal digits)")
    return key


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
