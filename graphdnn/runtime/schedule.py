"""An execution order for a plan whose outputs share memory with its inputs.

The cuDNN frontend's in-place samples write an output into the memory of an input (RoPE:
``Y1`` into ``X1``, ``Y2`` into ``X2``). A plan of several kernels must then read every
aliased input before anything writes over it. :func:`schedule` decides, from the launches
and the overlaps found at bind (:mod:`graphdnn.runtime.overlap`), pure and testable on a CPU:

- a kernel that writes an output over an input it reads itself is safe when it is an
  elementwise kernel and the two are the same view (each thread reads its element, then
  writes it); otherwise the input is copied first;
- every other kernel reading the input runs before the output's writer: fused nodes are
  reordered, keeping their data dependencies, as close to the plan's order as possible;
- when no order exists (RoPE fused as two kernels: each reads the other's aliased input),
  inputs are copied, greedily, until one does. A copy is taken before the first launch,
  and every kernel reading that input reads the copy.

Two outputs sharing memory cannot both be honoured: FeedError naming both.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import FeedError
from ..program import Launch
from .overlap import View, overlapping_pairs, same_view


@dataclass(frozen=True)
class Schedule:
    """Launch indices in execution order, and the inputs to copy before the first launch."""

    order: tuple[int, ...]
    copies: tuple[int, ...]  # tensor ids, in ascending order


def schedule(
    launches: Sequence[Launch], views: Mapping[int, View], outputs: set[int], names: Mapping[int, str]
) -> Schedule:
    """Order ``launches`` (and choose inputs to copy) so that no kernel reads memory an earlier
    one overwrote. ``views`` holds the caller's buffers by tensor id, ``outputs`` the ids of
    the outputs among them; ``names`` names tensors for messages."""
    hazards = aliased_inputs(views, outputs, names)
    if not hazards:
        return Schedule(tuple(range(len(launches))), ())
    inputs = set(views) - outputs
    groups = _groups(launches)
    bound = [
        {a.tensor for i in group for a in launches[i].args if a.tensor is not None and a.reads_memory}
        for group in groups
    ]
    writer: dict[int, int] = {}
    for g, tensors in enumerate(bound):
        for t in tensors:
            writer.setdefault(t, g)  # for a tensor no caller gave, the first fused node binding it writes it
    edges: set[tuple[int, int]] = {
        (writer[t], g) for g, tensors in enumerate(bound) for t in tensors if t not in inputs and writer[t] != g
    }
    copies = []
    for x in sorted(hazards):
        readers = [g for g, tensors in enumerate(bound) if x in tensors]
        wanted = set()
        needs_copy = False
        for y in hazards[x]:
            w = writer[y]
            for r in readers:
                if r != w:
                    wanted.add((r, w))
                elif not (len(groups[w]) == 1 and launches[groups[w][0]].elementwise and same_view(views[x], views[y])):
                    needs_copy = True
        if not needs_copy and _order(len(groups), edges | wanted) is not None:
            edges |= wanted
        else:
            copies.append(x)
    order = _order(len(groups), edges)
    assert order is not None  # only edges that keep the graph acyclic were added
    return Schedule(tuple(i for g in order for i in groups[g]), tuple(copies))


def aliased_inputs(views: Mapping[int, View], outputs: set[int], names: Mapping[int, str]) -> dict[int, list[int]]:
    """Each input sharing memory with outputs, with those outputs (by tensor id); FeedError
    when two outputs share memory."""
    hazards: dict[int, list[int]] = {}
    for written, other in overlapping_pairs(views, outputs):
        if other in outputs:
            first, second = sorted((written, other))
            raise FeedError(
                f"shares memory with output '{names[second]}': two outputs cannot be written to the same "
                "memory; give each its own buffer",
                tensor=names[first],
            )
        hazards.setdefault(other, []).append(written)
    return hazards


def _groups(launches: Sequence[Launch]) -> list[list[int]]:
    """Launch indices by fused node, in plan order (a fused node's kernels stay together, in order)."""
    groups: list[list[int]] = []
    for i, launch in enumerate(launches):
        if i and launch.fused_index == launches[i - 1].fused_index:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _order(count: int, edges: set[tuple[int, int]]) -> list[int] | None:
    """A topological order of ``count`` nodes, the lowest ready index first; None on a cycle."""
    successors: list[list[int]] = [[] for _ in range(count)]
    indegree = [0] * count
    for a, b in edges:
        successors[a].append(b)
        indegree[b] += 1
    ready = [g for g in range(count) if indegree[g] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        g = heapq.heappop(ready)
        order.append(g)
        for s in successors[g]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, s)
    return order if len(order) == count else None
