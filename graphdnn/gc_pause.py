"""Whole-graph passes run with Python's cyclic garbage collector paused.

A pass over a large graph allocates objects by the hundred thousand and frees almost
none of them before it ends; every few hundred allocations the collector would traverse
the young ones, and ever more often all the live ones, which made loading, validating,
signing and fusing a 65,536-node graph up to twice as slow. Reference counting still
frees whatever dies meanwhile; the collector resumes when the outermost pass returns.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (or, as a decorator, the call); nests."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
