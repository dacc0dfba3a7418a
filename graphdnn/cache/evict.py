"""A size cap on the disk cache: past it, the least recently used entries are removed.

An entry's last use is its file's modification time: writing it sets it, and every read
of it from disk by a lookup sets it to now (reads for listings, verify and export do
not). When a process's writes take the cache over its cap it removes entry files oldest
first until they fill at most ``LOW_WATER`` of the cap, so that a full cache is not
rescanned at every write.

Removing is safe beside other processes: entries are replaced atomically and never
edited, so a reader that has opened a file reads it whole even when it is unlinked
meanwhile; one that opens it later finds nothing, which is a miss (the plan is rebuilt),
never a damaged entry. A file is removed only if it is still the one that was scanned
(same inode and modification time), so an entry rewritten or used meanwhile stays (up to
the instant between that check and the unlink, where the worst outcome is, again, a
miss). One process evicts at a time (an ``flock`` on ``evict.lock``); the others go on
writing, so the cap can be exceeded until the next write past it. Lock and temporary
files are left alone: a lock file may be held, a temporary file is a write in progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import GraphError

LOW_WATER = 0.9  # an eviction leaves the entries at most this fraction of the cap
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(i?b)?", re.IGNORECASE)


def parse_size(text: str, what: str) -> int:
    """A byte count written as ``1073741824``, ``512M``, ``10GiB`` or ``2G`` (binary units)."""
    found = _SIZE.fullmatch(text.strip())
    if found is None or (found.group(3) and found.group(3).lower() == "ib" and not found.group(2)):
        raise GraphError(f"{what}={text!r} is not a size; write bytes (1073741824) or with a unit: 512M, 10G, 10GiB")
    return int(found.group(1)) * _UNITS[found.group(2).lower()]


def max_bytes_from_env() -> int | None:
    """``$GRAPHDNN_CACHE_MAX_BYTES`` as a byte count; None (no cap) when it is unset or empty."""
    text = os.environ.get("GRAPHDNN_CACHE_MAX_BYTES", "").strip()
    return parse_size(text, "GRAPHDNN_CACHE_MAX_BYTES") if text else None


@dataclass(frozen=True)
class Eviction:
    removed: int  # entry files removed
    freed: int  # their bytes
    remaining: int  # bytes of the entry files left


@dataclass(frozen=True)
class _Scanned:
    path: Path
    size: int
    used: int  # modification time, ns
    inode: int


class SizeCap:
    """The cap of one cache directory (``base``: its ``v<format>`` folder); ``entries``
    lists its entry files."""

    def __init__(
        self,
        limit: int,
        base: Path,
        entries: Callable[[], Iterable[Path]],
        kernels_of: Callable[[Path], list[Path] | None],
    ) -> None:
        if limit < 0:
            raise GraphError(f"the plan cache's size cap must be >= 0 bytes, got {limit}")
        self.limit = limit
        self.evicted = 0  # entry files this process removed
        self._base = base
        self._entries = entries
        self._kernels_of = kernels_of  # the kernel files a plan file uses; None: not a readable plan
        self._usage: int | None = None  # this process's estimate of the entries' bytes; None: not scanned yet

    def added(self, nbytes: int) -> None:
        """Account for an entry file just written; evict when the cache is over its cap. The
        estimate misses other processes' writes; every eviction rescans."""
        self._usage = self.usage() if self._usage is None else self._usage + nbytes
        if self._usage > self.limit:
            self.evict()

    def usage(self) -> int:
        return sum(entry.size for entry in self._scan())

    def evict(self) -> Eviction | None:
        """Remove the least recently used entries until they fill at most LOW_WATER of the cap
        (none when under it), then every plan left without one of its kernels (it could only
        be rebuilt); None when another process is evicting or the lock cannot be made."""
        try:
            self._base.mkdir(parents=True, exist_ok=True)
            handle = os.open(self._base / "evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None  # a cache this process cannot write: nothing it could remove either
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            return self._evict()
        finally:
            os.close(handle)  # releases the lock

    def _evict(self) -> Eviction:
        entries = sorted(self._scan(), key=lambda entry: entry.used)
        total = sum(entry.size for entry in entries)
        goal = int(self.limit * LOW_WATER) if total > self.limit else total
        gone: set[Path] = set()
        freed = 0
        for entry in entries:
            if total - freed <= goal:
                break
            if _remove_if_unchanged(entry):
                gone.add(entry.path)
                freed += entry.size
        for entry in entries:
            kernels = None if entry.path in gone else self._kernels_of(entry.path)
            if kernels is not None and not all(k.exists() for k in kernels) and _remove_if_unchanged(entry):
                gone.add(entry.path)
                freed += entry.size
        removed = len(gone)
        self.evicted += removed
        self._usage = total - freed
        return Eviction(removed, freed, total - freed)

    def _scan(self) -> list[_Scanned]:
        scanned = []
        for path in self._entries():
            with contextlib.suppress(OSError):  # removed meanwhile
                status = path.stat(follow_symlinks=False)
                scanned.append(_Scanned(path, status.st_size, status.st_mtime_ns, status.st_ino))
        return scanned


def _remove_if_unchanged(entry: _Scanned) -> bool:
    try:
        status = entry.path.stat(follow_symlinks=False)
        if (status.st_ino, status.st_mtime_ns) != (entry.inode, entry.used):
            return False  # rewritten or used since the scan
        os.unlink(entry.path)
    except OSError:
        return False  # gone already, or not removable (a read-only cache): left for `cache clear`
    return True


def touch(path: Path) -> None:
    """Mark an entry file used now; a cache that cannot be written keeps its old time."""
    with contextlib.suppress(OSError):
        os.utime(path)
