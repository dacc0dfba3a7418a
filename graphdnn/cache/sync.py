"""``graphdnn cache push|pull``: copy whole caches between a directory and the remote cache.

Push adds every valid local entry to the remote cache (kernels first, then the plans whose
kernels all went; entries already there are kept). Pull adds every remote entry to the
directory, each checked as an import checks it (``archive.admit``): a damaged or foreign
entry is reported and left out, never written.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..errors import GraphError
from .archive import admit, valid_entries
from .container import EntryError
from .remote import KINDS, RemoteCache
from .store import CacheWarning, DiskStore


@dataclass(frozen=True)
class SyncReport:
    plans: int  # added
    kernels: int  # added
    present: int  # already at the destination, kept
    skipped: int  # invalid, left out
    failed: int = 0  # (pull) valid, but could not be written to the directory

    def __str__(self) -> str:
        failed = f", {self.failed} could not be written" if self.failed else ""
        return (
            f"{self.plans} plans, {self.kernels} kernels ({self.present} already there, {self.skipped} skipped{failed})"
        )


def push(store: DiskStore, remote: RemoteCache) -> SyncReport:
    """Add every valid entry of ``store`` to ``remote``."""
    if remote.read_only:
        raise GraphError(f"the remote cache {remote.url} is read-only (GRAPHDNN_REMOTE_CACHE_READONLY): cannot push")
    added = {"plan": 0, "kernel": 0}
    present = 0
    found, skipped = valid_entries(store, "pushing")
    for stored, data, _ in found:  # kernels first
        if remote.put(stored.kind, stored.key, data):
            added[stored.kind] += 1
        else:
            _check(remote, "push to")
            present += 1
    return SyncReport(added["plan"], added["kernel"], present, skipped)


def pull(store: DiskStore, remote: RemoteCache) -> SyncReport:
    """Add every valid entry of ``remote`` to ``store``, kernels first."""
    added = {"plan": 0, "kernel": 0}
    present = skipped = failed = 0
    for kind in KINDS:
        keys = list(remote.keys(kind))
        _check(remote, "pull from")
        for key in keys:
            data = remote.get(kind, key)
            _check(remote, "pull from")
            if data is None:  # expired or removed since it was listed
                continue
            try:
                outcome = admit(store, kind, key, data, "the remote cache")
            except EntryError as error:
                skipped += 1
                warnings.warn(
                    f"graphdnn plan cache: not pulling {kind} {key[:16]}…: {error}", CacheWarning, stacklevel=2
                )
                continue
            if outcome == "added":
                added[kind] += 1
            elif outcome == "present":
                present += 1
            else:
                failed += 1
    return SyncReport(added["plan"], added["kernel"], present, skipped, failed)


def _check(remote: RemoteCache, action: str) -> None:
    if remote.off is not None:
        raise GraphError(f"cannot {action} the remote cache {remote.url}: {remote.off}")
