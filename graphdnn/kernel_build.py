"""Compiling a plan's kernels: each distinct kernel once, the missing ones in parallel.

Kernels are named by key (content hash + target + compiler); one already compiled for
any plan in the cache is reused. NVRTC releases the GIL, so a thread pool compiles
several kernels at once. With a disk cache each missing kernel is compiled under its
lock (DiskStore.claim), so processes sharing the cache compile it once between them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .cache.entries import KernelBinary
from .cache.plan_cache import PlanCache
from .cache.store import CacheWarning, DiskStore
from .dump import dump_directory, write_sources
from .lower import KernelSource

_LOG = logging.getLogger("graphdnn.compile")


def build_kernels(
    sources: Mapping[str, KernelSource], arch: int, cache: PlanCache | None, jobs: int | None = None
) -> tuple[dict[str, KernelBinary], int]:
    """Every kernel of ``sources`` (by kernel key) as a binary, and how many were compiled.

    With a disk cache, the missing kernels nobody else is compiling are claimed and compiled
    first; then the ones another process holds are waited for and read from the cache (or
    compiled, if that process failed or died)."""
    binaries: dict[str, KernelBinary] = {}
    missing: dict[str, KernelSource] = {}
    for kernel_key, source in sources.items():
        found = cache.kernel(kernel_key) if cache is not None else None
        if found is not None and matches(found, source, arch):
            binaries[kernel_key] = found
        else:
            missing[kernel_key] = source
    if cache is None or cache.store is None:
        return binaries | _compiled(missing, arch, cache, jobs), len(missing)
    compiled = 0
    for wait in (False, True):
        with claimed(cache.store, missing, arch, wait=wait) as claim:
            binaries |= claim.cached | _compiled(claim.todo, arch, cache, jobs)
            compiled += len(claim.todo)
        missing = {key: missing[key] for key in claim.busy}
    return binaries, compiled


def _compiled(
    sources: Mapping[str, KernelSource], arch: int, cache: PlanCache | None, jobs: int | None
) -> dict[str, KernelBinary]:
    binaries = compile_sources(sources, arch, jobs)
    for binary in binaries:
        if cache is not None:
            cache.add_kernel(binary, compiled=True)
    return {binary.kernel_key: binary for binary in binaries}


@dataclass
class Claim:
    """What :func:`claimed` found: kernels now in the cache, kernels this process holds and
    must compile, kernels another process holds (only when not waiting)."""

    cached: dict[str, KernelBinary] = field(default_factory=dict)
    todo: dict[str, KernelSource] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)


@contextlib.contextmanager
def claimed(store: DiskStore, sources: Mapping[str, KernelSource], arch: int, *, wait: bool) -> Iterator[Claim]:
    """Claim the compile lock of each kernel of ``sources`` and re-read the cache under it
    (another process may have stored it meanwhile); the locks are released on exit, so store
    the compiled kernels inside. Locks are taken in key order: waiters never deadlock."""
    claim = Claim()
    with contextlib.ExitStack() as locks:
        for key in sorted(sources):
            if not locks.enter_context(store.claim(key, wait=wait)):
                claim.busy.append(key)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheWarning)  # a damaged entry is simply compiled again
                binary = store.read_kernel(key)
            if binary is not None and matches(binary, sources[key], arch):
                claim.cached[key] = binary
            else:
                claim.todo[key] = sources[key]
        yield claim


def matches(binary: KernelBinary, source: KernelSource, arch: int) -> bool:
    """True when a stored kernel is the compiled ``source``: same entry point, content and
    target (a stored entry that passed its own checks may still belong to another build)."""
    return (binary.name, binary.content_hash, binary.arch) == (source.name, source.content_hash, source.target(arch))


def compile_sources(sources: Mapping[str, KernelSource], arch: int, jobs: int | None = None) -> list[KernelBinary]:
    """NVRTC-compile each source for sm_``arch`` (sm_``arch``a where the kernel asks for the
    arch-specific target; ``jobs`` threads; default: one per CPU). Under GRAPHDNN_DUMP_DIR
    each source is written there first."""
    from codegen.nvrtc import compile_cubin

    dump = dump_directory()
    if dump is not None:
        write_sources(dump, sources.values(), arch, why="GRAPHDNN_DUMP_DIR")

    def one(item: tuple[str, KernelSource]) -> KernelBinary:
        kernel_key, source = item
        start = time.perf_counter()
        cubin = compile_cubin(source.source, source.name, arch, source.arch_suffix)
        _LOG.info("NVRTC compiled %s for %s in %.3f s", source.name, source.target(arch), time.perf_counter() - start)
        return KernelBinary(kernel_key, source.name, source.content_hash, source.target(arch), cubin, source.source)

    items = list(sources.items())
    workers = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    if workers == 1:
        return [one(item) for item in items]
    # cuda.core's first import is not safe from several threads at once: finish it here.
    import cuda.core  # noqa: F401

    with ThreadPoolExecutor(workers, thread_name_prefix="graphdnn-nvrtc") as pool:
        return list(pool.map(one, items))
