"""``PlanCache``: compiled plans by key, in memory (bounded LRU), on disk and optionally in
a remote cache shared by a fleet (:mod:`.remote`), with counters.

Lookups go memory -> disk -> remote; a remote hit is copied to disk (the exact bytes) and
memory. The default cache lives under ``$GRAPHDNN_CACHE_DIR``, else
``$XDG_CACHE_HOME/graphdnn``, else ``~/.cache/graphdnn``, with the remote cache
``$GRAPHDNN_REMOTE_CACHE`` names. Counters tell what happened, for tests and warmup
reports: plan hits and misses, plans loaded from disk or fetched from the remote cache,
kernels compiled and kernels reused.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..env import env_flag
from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .evict import max_bytes_from_env
from .lru import LRU
from .remote import RemoteCache, remote_from_env
from .store import CacheWarning, DiskStore
from .trust import check_binding, check_kernels

if TYPE_CHECKING:
    from ..ir import Tensor
    from .archive import ArchiveReport

_LOG = logging.getLogger("graphdnn.cache")
PLANS_IN_MEMORY = 64
KERNELS_IN_MEMORY = 512


@dataclass
class CacheCounters:
    hits: int = 0  # plans found, in memory, on disk or in the remote cache
    misses: int = 0  # plans not found (then built)
    loads: int = 0  # plans read from disk (a subset of hits)
    fetches: int = 0  # plans fetched from the remote cache (a subset of hits)
    compiles: int = 0  # kernels compiled with NVRTC
    kernel_hits: int = 0  # kernels a build found already compiled (shared with another plan)
    rejected: int = 0  # entries that failed their checks (corrupt, truncated, other version) and were rebuilt

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class CachedPlan:
    entry: PlanEntry
    kernels: dict[str, KernelBinary]  # by kernel key
    origin: str = "memory cache"  # where this lookup found it: "memory cache", "disk cache" or "remote cache"


class PlanCache:
    """Plans and compiled kernels; ``directory=None`` keeps them in memory only. ``remote``:
    a shared tier behind the disk (``remote.open_remote(url)``). ``max_bytes``: a size cap
    on the directory, least recently used entries evicted past it (None: no cap)."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        plans_in_memory: int = PLANS_IN_MEMORY,
        kernels_in_memory: int = KERNELS_IN_MEMORY,
        remote: RemoteCache | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.store = DiskStore(directory, max_bytes) if directory is not None else None
        self.remote = remote
        self.counters = CacheCounters()
        self._plans: LRU[str, CachedPlan] = LRU(plans_in_memory)
        self._kernels: LRU[str, KernelBinary] = LRU(kernels_in_memory)
        # kernel key -> (mtime, size) of its file (None: absent) when it was found unusable: not reread until it changes
        self._unreadable: dict[str, tuple[int, int] | None] = {}
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path | None:
        return self.store.directory if self.store else None

    def lookup(self, key: str, tensors: Sequence[Tensor] | None = None) -> CachedPlan | None:
        """The plan stored under ``key`` with all its kernels, or None (a miss). ``tensors``:
        the looking-up graph's tensors in canonical order; a plan whose arguments do not fit
        them (trust.check_binding) is rejected with a CacheWarning and is a miss."""
        found = self._plans.get(key)
        if found is None and self.store is not None:
            found = self._load(key)
        if found is None and self.remote is not None:
            found = self._fetch(key)
        if found is not None and tensors is not None:
            try:
                check_binding(found.entry.program, tensors)
            except EntryError as error:
                self._reject(key, f"plan {key[:16]}… does not fit the graph that looks it up: {error}")
                found = None
        with self._lock:
            if found is None:
                self.counters.misses += 1
            else:
                self.counters.hits += 1
        if found is None:
            _LOG.info("plan %s… not cached in %s", key[:16], self.directory or "memory")
        else:  # memory hits are the steady state of a serving process: debug only
            _LOG.log(
                logging.DEBUG if found.origin == "memory cache" else logging.INFO,
                "plan %s… found in the %s",
                key[:16],
                found.origin,
            )
        return found

    def kernel(self, kernel_key: str) -> KernelBinary | None:
        """A compiled kernel, if any plan compiled it before (counted as a kernel hit)."""
        binary = self._kernels.get(kernel_key)
        if binary is None and self.store is not None and not self._still_unreadable(kernel_key):
            binary = self._read_kernel(kernel_key)
        if binary is None and self.remote is not None:
            fetched = self.remote.kernel(kernel_key)
            binary = self._keep_kernel(*fetched) if fetched is not None else None
        if binary is not None:
            with self._lock:
                self.counters.kernel_hits += 1
        return binary

    def add_kernel(self, binary: KernelBinary, *, compiled: bool) -> None:
        self._kernels.put(binary.kernel_key, binary)
        self._unreadable.pop(binary.kernel_key, None)
        if self.store is not None:
            self.store.write_kernel(binary)
        if compiled:
            with self._lock:
                self.counters.compiles += 1

    def forget_kernel(self, kernel_key: str) -> None:
        """Drop a kernel from the memory tier: the next lookup reads the disk again."""
        self._kernels.pop(kernel_key)
        self._unreadable.pop(kernel_key, None)

    def add_plan(self, entry: PlanEntry, kernels: dict[str, KernelBinary]) -> OSError | None:
        """Keep a plan (in memory, on disk, and in the remote cache with its kernels, first):
        the error if the disk write failed."""
        self._plans.put(entry.key, CachedPlan(entry, kernels))
        data = entry.encode()
        failure = self.store.write(self.store.plan_path(entry.key), data) if self.store is not None else None
        if self.remote is not None:
            self.remote.publish(data, entry.key, {k: kernels[k].encode() for k in entry.program.kernel_keys})
        return failure

    def export_archive(self, archive: str | os.PathLike[str]) -> ArchiveReport:
        """Write every valid entry to one archive file (.tar or .tar.gz), to ship a warmed cache."""
        from .archive import export_cache

        return export_cache(self._disk("export"), Path(archive))

    def import_archive(self, archive: str | os.PathLike[str]) -> ArchiveReport:
        """Add the valid entries of an archive written by :meth:`export_archive`."""
        from .archive import import_cache

        return import_cache(self._disk("import"), Path(archive))

    def _disk(self, action: str) -> DiskStore:
        if self.store is None:
            from ..errors import GraphError

            raise GraphError(f"cannot {action} an archive: this plan cache has no directory")
        return self.store

    def _load(self, key: str) -> CachedPlan | None:
        assert self.store is not None
        entry = self.store.read_plan(key)
        kernels: dict[str, KernelBinary] = {}
        if entry is not None:
            for kernel_key in entry.program.kernel_keys:
                binary = self._kernels.get(kernel_key) or self._read_kernel(kernel_key)
                if binary is None:  # missing or rejected: the plan cannot run, rebuild it
                    entry = None
                    break
                kernels[kernel_key] = binary
        if entry is not None:
            try:
                check_kernels(entry, kernels)
            except EntryError as error:
                self._reject(key, f"ignoring {self.store.plan_path(key)}: {error}; it will be rebuilt")
                entry = None
        self._sync_rejected()
        if entry is None:
            return None
        self._plans.put(key, CachedPlan(entry, kernels))
        with self._lock:
            self.counters.loads += 1
        return CachedPlan(entry, kernels, origin="disk cache")

    def _fetch(self, key: str) -> CachedPlan | None:
        """The plan from the remote cache, with its kernels (from here if present, else from
        there), all checked; copied to disk, kernels first, so the next process reads it there."""
        assert self.remote is not None
        fetched = self.remote.plan(key)
        if fetched is None:
            return None
        entry, data = fetched
        kernels: dict[str, KernelBinary] = {}
        copies: dict[str, bytes] = {}
        for kernel_key in entry.program.kernel_keys:
            binary = self._kernels.get(kernel_key)
            if binary is None and self.store is not None and not self._still_unreadable(kernel_key):
                binary = self._read_kernel(kernel_key)
            if binary is None:
                remote_kernel = self.remote.kernel(kernel_key)
                if remote_kernel is None:
                    return None  # missing or rejected: the plan cannot run here, build it
                binary, copies[kernel_key] = remote_kernel
            kernels[kernel_key] = binary
        try:
            check_kernels(entry, kernels)
        except EntryError as error:
            self.remote.reject("plan", key, data, str(error))
            return None
        for binary in kernels.values():
            if binary.kernel_key in copies:
                self._keep_kernel(binary, copies[binary.kernel_key])
        if self.store is not None:
            self.store.write(self.store.plan_path(key), data)
        self._plans.put(key, CachedPlan(entry, kernels))
        with self._lock:
            self.counters.fetches += 1
        return CachedPlan(entry, kernels, origin="remote cache")

    def _keep_kernel(self, binary: KernelBinary, data: bytes) -> KernelBinary:
        """A kernel fetched from the remote cache, kept in memory and on disk (its exact bytes)."""
        self._kernels.put(binary.kernel_key, binary)
        self._unreadable.pop(binary.kernel_key, None)
        if self.store is not None:
            self.store.write(self.store.kernel_path(binary.kernel_key), data)
        return binary

    def _read_kernel(self, kernel_key: str) -> KernelBinary | None:
        assert self.store is not None
        binary = self.store.read_kernel(kernel_key)
        self._sync_rejected()
        if binary is None:
            with self._lock:
                self._unreadable[kernel_key] = self.store.stamp(self.store.kernel_path(kernel_key))
        else:
            self._unreadable.pop(kernel_key, None)
            self._kernels.put(kernel_key, binary)
        return binary

    def _still_unreadable(self, kernel_key: str) -> bool:
        """True when the kernel's file was found unusable and has not changed since."""
        assert self.store is not None
        return kernel_key in self._unreadable and self._unreadable[kernel_key] == self.store.stamp(
            self.store.kernel_path(kernel_key)
        )

    def _reject(self, key: str, reason: str) -> None:
        """Count and report a plan that passed its own checks but cannot be used; forget it."""
        self._plans.pop(key)
        if self.store is not None:
            self.store.rejected += 1
        else:
            with self._lock:
                self.counters.rejected += 1
        warnings.warn(f"graphdnn plan cache: {reason}", CacheWarning, stacklevel=4)
        self._sync_rejected()

    def _sync_rejected(self) -> None:
        if self.store is not None:
            with self._lock:
                self.counters.rejected = self.store.rejected

    def __repr__(self) -> str:
        where = self.directory if self.directory else "memory only"
        remote = f", remote {self.remote.url}" if self.remote is not None else ""
        return f"PlanCache({where}{remote}, {self.counters.as_dict()})"


def default_directory() -> Path:
    """``$GRAPHDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/graphdnn``, else ``~/.cache/graphdnn``."""
    explicit = os.environ.get("GRAPHDNN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "graphdnn"


_SHARED_CACHES = 8
_shared: OrderedDict[Path, PlanCache] = OrderedDict()
_shared_lock = threading.Lock()


def cache_at(directory: str | os.PathLike[str]) -> PlanCache:
    """The process's PlanCache for ``directory`` (the same object each time, so its memory
    tier and counters carry across calls; the last few directories are kept), with the
    remote cache of GRAPHDNN_REMOTE_CACHE and the size cap of GRAPHDNN_CACHE_MAX_BYTES, if
    set when the directory is first used."""
    path = Path(directory).expanduser().resolve()
    with _shared_lock:
        if path not in _shared:
            _shared[path] = PlanCache(path, remote=remote_from_env(), max_bytes=max_bytes_from_env())
            while len(_shared) > _SHARED_CACHES:
                _shared.popitem(last=False)
        _shared.move_to_end(path)
        return _shared[path]


def default_cache() -> PlanCache | None:
    """The cache ``gd.compile`` uses unless told otherwise; None when GRAPHDNN_DISABLE_CACHE=1."""
    if env_flag("GRAPHDNN_DISABLE_CACHE"):
        return None
    return cache_at(default_directory())


class _Default:
    def __repr__(self) -> str:
        return "<default plan cache>"


DEFAULT: Any = _Default()


def resolve_cache(cache: Any) -> PlanCache | None:
    """What ``gd.compile``'s ``cache`` argument means: the default cache, none, a directory, a PlanCache."""
    if cache is DEFAULT:
        return default_cache()
    if cache is None or isinstance(cache, PlanCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return cache_at(cache)
    from ..errors import GraphError

    raise GraphError(f"cache must be a PlanCache, a directory or None, not {type(cache).__name__}")
