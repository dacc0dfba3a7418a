"""An attention problem's work as its kernels launch it: its work items and grid (computed at
launch from the batch or Sq in a dynamic graph, whose kernels read the count from their EXTENT
arguments), and the problem at one size of a dynamic range (what the static plan of that size
chooses: a decode problem's size buckets)."""

from __future__ import annotations

import dataclasses

from graphdnn.symbolic import Sym

from ..indexing import c_extent
from ..kernel import DynamicGrid
from .attention_problem import Attention


def work_items(a: Attention, block_m: int) -> int:
    """The (row block, head, batch) items of a kernel that gives each ``block_m`` query rows (at
    the maxima of the batch and Sq in a dynamic graph)."""
    return _items_per_sequence(a, block_m) * a.batch


def work_count(a: Attention, block_m: int) -> str:
    """C: this call's work items (:func:`work_items`), from the batch's or Sq's EXTENT argument
    in a dynamic graph."""
    if isinstance(a.sq_extent, Sym):
        return f"(int)({a.row_blocks(block_m)} * {c_extent(a.batch_extent * a.heads)})"
    if not a.is_dynamic:
        return str(work_items(a, block_m))
    return f"(int){c_extent(a.batch_extent * _items_per_sequence(a, block_m))}"


def work_grid(a: Attention, block_m: int, cap: int = 2**31 - 1) -> DynamicGrid | None:
    """A dynamic graph's grid of one block per work item (at most ``cap``: a persistent kernel's
    SMs), computed at launch from the batch or Sq; None in a static graph."""
    if isinstance(a.sq_extent, Sym):
        batch = a.batch_extent  # a symbolic batch multiplies the rounded row blocks
        if isinstance(batch, Sym):
            return DynamicGrid(a.sq_extent, block_m, cap, multiplier=a.heads * batch.coefficient, times=batch.factors)
        return DynamicGrid(a.sq_extent, block_m, cap, multiplier=a.heads * batch)
    return batch_grid(a, _items_per_sequence(a, block_m), cap)


def batch_grid(a: Attention, per_sequence: int, cap: int = 2**31 - 1) -> DynamicGrid | None:
    """A dynamic graph's grid of ``per_sequence`` blocks per sequence (the batch outermost in
    the block index), at most ``cap``, computed at launch from the batch; None in a static graph."""
    if not isinstance(a.batch_extent, Sym):
        return None
    return DynamicGrid(a.batch_extent, 1, cap, multiplier=per_sequence)


def _items_per_sequence(a: Attention, block_m: int) -> int:
    return -(-a.rows_per_sequence // block_m) * a.heads


def at_batch(a: Attention, batch: int) -> Attention:
    """``a`` with a static batch of ``batch``: what the static plan of that batch chooses (a dynamic
    problem's size buckets)."""
    return dataclasses.replace(a, q=dataclasses.replace(a.q, dim=(batch, *a.q.dim[1:])))


def at_skv(a: Attention, skv: int) -> Attention:
    """``a`` with ``skv`` keys (K's and V's dim 2): what the static plan of that length chooses (a
    dynamic decode problem's size buckets)."""
    k, v = (dataclasses.replace(t, dim=(*t.dim[:2], skv, t.dim[3])) for t in (a.k, a.v))
    return dataclasses.replace(a, k=k, v=v)
