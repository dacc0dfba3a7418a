"""``gd.fuse``: partition a graph into the fused nodes that codegen turns into kernels.

The fusion stage lives in :mod:`fusion_rules`, which builds on graphdnn's IR; it is
imported when fusion is asked for, so that importing graphdnn never imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusion_rules import Partition


def fuse(graph: Any, *, arch: str | int | None = None, disable: Iterable[str] = ()) -> Partition:
    """Partition ``graph`` (an OperationGraphSpec or a validated Graph) for target ``arch``
    ('sm_90' when None), with the fusion rules named in ``disable`` turned off.

    ``Partition.describe()`` explains the result: each fused node's members, and why
    each candidate that was not fused was rejected.
    """
    from fusion_rules import fuse as fuse_graph

    return fuse_graph(graph, arch=arch, disable=disable)
