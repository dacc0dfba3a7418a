"""Compiling a plan's kernels: each distinct kernel once, the missing ones in parallel.

Kernels are named by key (content hash + target + compiler); one already compiled for
any plan in the cache is reused. NVRTC releases the GIL, so a thread pool compiles
several kernels at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from .cache.entries import KernelBinary
from .cache.plan_cache import PlanCache
from .lower import KernelSource


def build_kernels(
    sources: Mapping[str, KernelSource], arch: int, cache: PlanCache | None, jobs: int | None = None
) -> tuple[dict[str, KernelBinary], int]:
    """Every kernel of ``sources`` (by kernel key) as a binary, and how many were compiled."""
    binaries: dict[str, KernelBinary] = {}
    missing: dict[str, KernelSource] = {}
    for kernel_key, source in sources.items():
        found = cache.kernel(kernel_key) if cache is not None else None
        if found is not None and matches(found, source, arch):
            binaries[kernel_key] = found
        else:
            missing[kernel_key] = source
    for binary in compile_sources(missing, arch, jobs):
        binaries[binary.kernel_key] = binary
        if cache is not None:
            cache.add_kernel(binary, compiled=True)
    return binaries, len(missing)


def matches(binary: KernelBinary, source: KernelSource, arch: int) -> bool:
    """True when a stored kernel is the compiled ``source``: same entry point, content and
    target (a stored entry that passed its own checks may still belong to another build)."""
    return (binary.name, binary.content_hash, binary.arch) == (
        source.name,
        source.content_hash,
        f"sm_{arch}{source.arch_suffix}",
    )


def compile_sources(sources: Mapping[str, KernelSource], arch: int, jobs: int | None = None) -> list[KernelBinary]:
    """NVRTC-compile each source for sm_``arch`` (sm_``arch``a where the kernel asks for the
    arch-specific target; ``jobs`` threads; default: one per CPU)."""
    from codegen.nvrtc import compile_cubin

    def one(item: tuple[str, KernelSource]) -> KernelBinary:
        kernel_key, source = item
        cubin = compile_cubin(source.source, source.name, arch, source.arch_suffix)
        target = f"sm_{arch}{source.arch_suffix}"
        return KernelBinary(kernel_key, source.name, source.content_hash, target, cubin, source.source)

    items = list(sources.items())
    workers = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    if workers == 1:
        return [one(item) for item in items]
    # cuda.core's first import is not safe from several threads at once: finish it here.
    import cuda.core  # noqa: F401

    with ThreadPoolExecutor(workers, thread_name_prefix="graphdnn-nvrtc") as pool:
        return list(pool.map(one, items))
