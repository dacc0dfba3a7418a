"""Warm plan-cache directories for the cache tests: built once per session, copied per test."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import graphdnn as gd
from graphdnn.cache.plan_cache import PlanCache


def warm(directory: Path, graphs: Iterable[Callable[[], gd.OperationGraphSpec]], arch: str) -> PlanCache:
    """A cache at ``directory`` holding each graph compiled for ``arch``."""
    cache = PlanCache(directory)
    for make in graphs:
        gd.compile(make(), arch=arch, cache=cache)
    return cache


def private_copy(warm_dir: Path, tmp_path: Path) -> Path:
    """A copy of a session's warm cache that one test may damage."""
    copy = tmp_path / "cache"
    shutil.copytree(warm_dir, copy)
    return copy
