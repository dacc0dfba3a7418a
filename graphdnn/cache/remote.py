"""The remote tier of the plan cache, shared by a fleet: behind memory and disk, before a build.

A remote cache holds the exact bytes of the local entry files, under
``graphdnn:v<format>:plan:<key>`` and ``graphdnn:v<format>:kernel:<kernel key>``. Every
entry read is checked as a disk read is (``trust.trusted_plan`` / ``trusted_kernel``:
size, checksum, format, key, every field), so a damaged or foreign entry is a miss, never
executed. Writes only add (put-if-absent): the kernels of a plan first, then the plan, so
a reader that finds a plan finds its kernels. The first connection error turns the remote
tier off for the process (counted, reported by ``graphdnn cache stats``): a fleet keeps
compiling locally while the server is down, and never waits on it twice.

A backend is anything with the :class:`~.backend.RemoteBackend` methods; ``register_scheme`` maps a
URL scheme to a factory (``redis://``, ``rediss://`` and ``unix://`` are built in).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar
from urllib.parse import urlsplit

from ..env import env_flag
from ..errors import GraphError
from .backend import RemoteBackend, RemoteError
from .container import EntryError
from .entries import KernelBinary, PlanEntry
from .key import FORMAT_VERSION
from .store import MAX_ENTRY_BYTES, CacheWarning
from .trust import KEY, trusted_kernel, trusted_plan

_LOG = logging.getLogger("graphdnn.cache")
PREFIX = f"graphdnn:v{FORMAT_VERSION}:"
KINDS = ("kernel", "plan")  # in the order a plan's entries are written
T = TypeVar("T")
N = TypeVar("N", int, float)
DEFAULT_TIMEOUT = 1.0  # seconds for a connect or a reply: a cache must never stall a compile for long


BackendFactory = Callable[[str, float], RemoteBackend]
_SCHEMES: dict[str, BackendFactory] = {}


def register_scheme(scheme: str, factory: BackendFactory) -> None:
    """Make ``scheme://`` URLs open ``factory(url, timeout)`` (an S3 or HTTP backend, say)."""
    _SCHEMES[scheme] = factory


def _redis(url: str, timeout: float) -> RemoteBackend:
    from .redis_backend import RedisBackend

    return RedisBackend(url, timeout)


for _scheme in ("redis", "rediss", "unix"):
    register_scheme(_scheme, _redis)


def entry_name(kind: str, key: str) -> str:
    return f"{PREFIX}{kind}:{key}"


class RemoteCache:
    """A backend seen as a cache tier: checked reads, ordered put-if-absent writes, off after
    the first connection error. ``read_only``: never write (serving machines)."""

    def __init__(self, backend: RemoteBackend, *, read_only: bool = False, ttl: int | None = None) -> None:
        if ttl is not None and ttl < 1:
            raise GraphError(f"a remote cache TTL is a number of seconds of at least 1, not {ttl}")
        self.backend = backend
        self.read_only = read_only
        self.ttl = ttl
        self.errors = 0  # connection errors (the first turns the tier off)
        self.rejected = 0  # entries that failed their checks
        self.written = 0  # entries this process added
        self.off: str | None = None  # why the tier is off, once it is
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.backend.url

    def plan(self, key: str) -> tuple[PlanEntry, bytes] | None:
        """The plan stored under ``key``, checked on its own (its kernels are the caller's),
        with its bytes; None when absent, damaged (a CacheWarning) or the tier is off."""
        return self._read("plan", key, lambda data: trusted_plan(data, key))

    def kernel(self, kernel_key: str) -> tuple[KernelBinary, bytes] | None:
        """The kernel stored under ``kernel_key``, checked, with its bytes; None as for :meth:`plan`."""
        return self._read("kernel", kernel_key, lambda data: trusted_kernel(data, kernel_key))

    def get(self, kind: str, key: str) -> bytes | None:
        """An entry's bytes, unchecked (for ``cache pull``, which checks them as an import does)."""
        return self._call(lambda: self.backend.get(entry_name(kind, key), MAX_ENTRY_BYTES))

    def publish(self, plan: bytes, key: str, kernels: Mapping[str, bytes]) -> None:
        """Add a plan (its entry bytes) and its kernels (entry bytes by kernel key), kernels first;
        nothing when read-only or off. Entries already there are kept."""
        for kernel_key, data in kernels.items():
            self.put("kernel", kernel_key, data)
            if self.off is not None:
                return  # never a plan whose kernels may be missing
        self.put("plan", key, plan)

    def put(self, kind: str, key: str, data: bytes) -> bool:
        """Add one entry unless present; True when this call stored it."""
        if self.read_only:
            return False
        stored = bool(self._call(lambda: self.backend.put_if_absent(entry_name(kind, key), data, self.ttl)))
        if stored:
            with self._lock:
                self.written += 1
        return stored

    def keys(self, kind: str) -> Iterator[str]:
        """The keys of every stored entry of ``kind``; names that are not a key are skipped."""
        prefix = f"{PREFIX}{kind}:"
        names = self._call(lambda: list(self.backend.names(prefix))) or []
        return (name[len(prefix) :] for name in sorted(names) if KEY.fullmatch(name[len(prefix) :]))

    def reject(self, kind: str, key: str, data: bytes, reason: str) -> None:
        """Count and report an entry that cannot be used; a writer removes it (if unchanged),
        so that the rebuild can take its place."""
        with self._lock:
            self.rejected += 1
        warnings.warn(
            f"graphdnn plan cache: ignoring {entry_name(kind, key[:16])}… in the remote cache {self.url}: {reason}",
            CacheWarning,
            stacklevel=4,
        )
        if not self.read_only:
            self._call(lambda: self.backend.remove_if(entry_name(kind, key), data))

    def describe(self) -> str:
        """One line: where, how, and what happened in this process."""
        mode = "read-only" if self.read_only else f"read-write, TTL {self.ttl} s" if self.ttl else "read-write"
        state = f"OFF for this process: {self.off}" if self.off else "on"
        return (
            f"remote cache {self.url} ({mode}): {state}; {self.errors} connection error(s), "
            f"{self.rejected} rejected entr{'y' if self.rejected == 1 else 'ies'}, {self.written} written"
        )

    def _read(self, kind: str, key: str, decode: Callable[[bytes], T]) -> tuple[T, bytes] | None:
        data = self.get(kind, key)
        if data is None:
            return None
        try:
            return decode(data), data
        except EntryError as error:
            self.reject(kind, key, data, str(error))
            return None

    def _call(self, operation: Callable[[], T]) -> T | None:
        """Run a backend call unless the tier is off; the first RemoteError turns it off."""
        if self.off is not None:
            return None
        try:
            return operation()
        except RemoteError as error:
            with self._lock:
                self.errors += 1
                first = self.off is None
                self.off = str(error)
            if first:
                warnings.warn(
                    f"graphdnn plan cache: the remote cache {self.url} failed ({error}); "
                    "it is off for the rest of this process",
                    CacheWarning,
                    stacklevel=4,
                )
                _LOG.info("remote cache %s turned off: %s", self.url, error)
            return None


def open_remote(
    url: str, *, read_only: bool = False, ttl: int | None = None, timeout: float = DEFAULT_TIMEOUT
) -> RemoteCache:
    """A remote cache at ``url`` (redis://host:6379/0, rediss://..., unix:///path/redis.sock,
    or a registered scheme). Nothing is contacted until the first lookup."""
    scheme = urlsplit(url).scheme
    if scheme not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
        raise GraphError(
            f"remote cache URL {url!r}: unknown scheme {scheme + '://' if scheme else '(none)'}; use {known}"
        )
    if not timeout > 0:
        raise GraphError(f"a remote cache timeout is a positive number of seconds, not {timeout}")
    return RemoteCache(_SCHEMES[scheme](url, timeout), read_only=read_only, ttl=ttl)


_opened: dict[tuple[str, bool, int | None, float], RemoteCache] = {}
_opened_lock = threading.Lock()


def remote_from_env(url: str | None = None) -> RemoteCache | None:
    """The remote cache GRAPHDNN_REMOTE_CACHE names (or ``url``), with GRAPHDNN_REMOTE_CACHE_READONLY,
    _TTL and _TIMEOUT; None when there is none. One object per setting in a process, so that
    a connection error turns it off for every cache that uses it."""
    url = url or os.environ.get("GRAPHDNN_REMOTE_CACHE", "").strip()
    if not url:
        return None
    ttl = _number("GRAPHDNN_REMOTE_CACHE_TTL", int)
    timeout = _number("GRAPHDNN_REMOTE_CACHE_TIMEOUT", float)
    settings = (url, env_flag("GRAPHDNN_REMOTE_CACHE_READONLY"), ttl, DEFAULT_TIMEOUT if timeout is None else timeout)
    with _opened_lock:
        if settings not in _opened:
            _opened[settings] = open_remote(url, read_only=settings[1], ttl=ttl, timeout=settings[3])
        return _opened[settings]


def _number(name: str, kind: type[N]) -> N | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not number > 0:
        what = "a whole number of seconds" if kind is int else "a number of seconds"
        raise GraphError(f"environment variable {name}={value!r} must be {what}, greater than 0")
    return number
