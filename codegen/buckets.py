"""Size buckets: a dynamic graph's fused node compiled as a few variants, each with the launch
choices a static plan would make for the sizes it serves, one chosen at each call.

A family's launch heuristic is a step function of a size (a row norm's rows, a matmul's M):
it widens a row norm's thread groups when there are too few rows to fill the GPU, it takes
smaller GEMM tiles when there are too few of them. One kernel for the whole range takes the
choice for its maximum, which small calls pay for (1.07-1.27x at 64 rows measured on a row
norm). :func:`size_buckets` cuts the range where the choice changes, from the top: each
bucket's variant takes the choice at its largest size, which is the static plan's at every
size in it, but the last bucket, which takes the rest of the range down to the minimum.
A choice that grows with the size and levels off (a decode's KV split over its key length: more
slices for more keys, up to what fills the GPU) is cut from the bottom instead: each bucket takes
the sizes that share its smallest size's choice, and the last one the rest of the range up to
the maximum, with the maximum's choice, where the choice has levelled off.
The variants are kernels of the plan like any other, so compiling or warming up the plan
compiles every bucket; binding launches the one whose bucket holds the call's size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from graphdnn.symbolic import Sym, lower, upper

from .kernel import FusedProgram, Kernel, Scratch, SizeBucket

C = TypeVar("C")
MAX_BUCKETS = 3


def variants(count: Sym, choose: Callable[[int], C], emit: Callable[[C], Kernel]) -> tuple[Kernel, ...]:
    """The kernels ``emit`` writes for each bucket's choice, each tagged with its bucket; one
    kernel, untagged, where one choice serves the whole range."""
    found = size_buckets(count, choose)
    if len(found) == 1:
        return (emit(found[0][1]),)
    return tuple(dataclasses.replace(emit(choice), bucket=bucket) for bucket, choice in found)


def size_buckets(
    count: Sym, choose: Callable[[int], C], most: int = MAX_BUCKETS, from_top: bool = True
) -> list[tuple[SizeBucket, C]]:
    """``(bucket, choice)`` pairs covering ``lower(count)..upper(count)`` without overlap, largest
    sizes first; ``choose(size)`` is the static choice at a size. It must be monotone: once the
    choice at a size differs from the choice at a larger one, it does at every smaller size
    too (as the heuristics' thresholds are), so each bucket's edge is found by bisection.
    ``from_top`` false: cut from the bottom (a choice that levels off at the top of the range)."""
    if not from_top:
        return _buckets_from_bottom(count, choose, most)
    low, high = lower(count), upper(count)
    found: list[tuple[SizeBucket, C]] = []
    while True:
        choice = choose(high)
        if len(found) == most - 1 or choose(low) == choice:
            found.append((SizeBucket(count, low, high), choice))
            return found
        same, below = _edge(choose, choice, high, low)
        found.append((SizeBucket(count, same, high), choice))
        high = below


def _buckets_from_bottom(count: Sym, choose: Callable[[int], C], most: int) -> list[tuple[SizeBucket, C]]:
    """:func:`size_buckets` cut from the bottom: each bucket the sizes sharing its smallest size's
    choice, the last the rest of the range with the maximum's choice; largest sizes first."""
    low, high = lower(count), upper(count)
    found: list[tuple[SizeBucket, C]] = []
    while True:
        choice = choose(low)
        if len(found) == most - 1 or choose(high) == choice:
            found.append((SizeBucket(count, low, high), choose(high)))
            return found[::-1]
        same, above = _edge(choose, choice, low, high)
        found.append((SizeBucket(count, low, same), choice))
        low = above


def _edge(choose: Callable[[int], C], choice: C, inside: int, outside: int) -> tuple[int, int]:
    """Bisection from ``inside`` (whose choice is ``choice``) toward ``outside`` (whose is not):
    the last size with ``choice`` and the first past it."""
    while abs(outside - inside) > 1:
        middle = (inside + outside) // 2
        inside, outside = (middle, outside) if choose(middle) == choice else (inside, middle)
    return inside, outside


def bucketed_program(
    name: str, found: list[tuple[SizeBucket, C]], emit: Callable[[C, int], FusedProgram]
) -> FusedProgram:
    """Fused node ``name``'s program over the buckets ``found``: each bucket's kernels (``emit(choice,
    the bucket's largest size)``) tagged with it, and one workspace buffer per scratch name, for
    the largest bucket that needs it; the one variant, untagged, where one bucket covers the range."""
    if len(found) == 1:
        (bucket, choice), *_ = found
        return emit(choice, bucket.high)
    kernels: list[Kernel] = []
    scratch: dict[str, Scratch] = {}
    for bucket, choice in found:
        program = emit(choice, bucket.high)
        kernels += [dataclasses.replace(k, bucket=bucket) for k in program.kernels]
        for s in program.scratch:
            scratch[s.name] = max(s, scratch.get(s.name, s), key=lambda x: x.bytes)
    return FusedProgram(name, tuple(kernels), tuple(scratch.values()))
