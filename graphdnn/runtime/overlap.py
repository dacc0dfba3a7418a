"""Which buffers of a variant pack share memory: exact byte extents and overlap of strided views.

A view is a pointer, dims, strides (in elements, never negative) and an element size;
its bytes are ``pointer + sum(i * stride) * itemsize + [0, itemsize)``. Two views whose
byte ranges are disjoint never overlap; when the ranges meet, NumPy's bounded solver
(``np.shares_memory``) decides whether some byte is really shared, so interleaved views
(the even and the odd elements of a row) are told apart. When that problem is too hard
for the bound, the views count as overlapping: a real overlap is never missed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Work bound for the exact test (NumPy's unit); past it, ranges that meet count as overlapping.
MAX_WORK = 100_000


@dataclass(frozen=True)
class View:
    """Where a tensor's elements are in memory."""

    pointer: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int

    @property
    def end(self) -> int:
        """One past the last byte of the last element (strides are never negative)."""
        return self.pointer + (sum((d - 1) * s for d, s in zip(self.dims, self.strides)) + 1) * self.itemsize


def same_view(a: View, b: View) -> bool:
    """The same elements at the same addresses: element (i...) of ``a`` is element (i...) of ``b``."""
    return (
        a.pointer == b.pointer
        and a.itemsize == b.itemsize
        and a.dims == b.dims
        and all(d == 1 or s == t for d, s, t in zip(a.dims, a.strides, b.strides))
    )


def overlap(a: View, b: View) -> bool:
    """Whether some byte belongs to both views (True, conservatively, when too hard to decide)."""
    if a.end <= b.pointer or b.end <= a.pointer:
        return False
    if same_view(a, b):
        return True
    base = min(a.pointer, b.pointer) - 4096  # relative addresses: the solver never sees a null pointer
    try:
        return bool(np.shares_memory(_bytes(a, base), _bytes(b, base), max_work=MAX_WORK))  # type: ignore[arg-type]  # the stubs list only -1 and 0
    except np.exceptions.TooHardError:
        return True


def overlapping_pairs(views: Mapping[int, View], written: set[int]) -> list[tuple[int, int]]:
    """Pairs (w, t) of keys of ``views`` that share memory, where ``w`` is in ``written`` (and
    ``t`` may be too, then each pair once). Views are swept in address order, so buffers far
    apart cost one comparison of their ranges."""
    ordered = sorted(views.items(), key=lambda item: item[1].pointer)
    pairs = []
    active: list[tuple[int, View]] = []
    for key, view in ordered:
        active = [(k, v) for k, v in active if v.end > view.pointer]
        for other, other_view in active:
            if (key in written or other in written) and overlap(view, other_view):
                first, second = (key, other) if key in written else (other, key)
                pairs.append((first, second))
        active.append((key, view))
    return pairs


class _Addresses:
    """A byte view for NumPy's overlap solver; its memory is never read."""

    def __init__(self, view: View, base: int) -> None:
        self.__array_interface__ = {
            "version": 3,
            "shape": (*view.dims, view.itemsize),
            "typestr": "|u1",
            "data": (view.pointer - base, True),
            "strides": (*(s * view.itemsize for s in view.strides), 1),
        }


def _bytes(view: View, base: int) -> np.ndarray:
    return np.asarray(_Addresses(view, base))
