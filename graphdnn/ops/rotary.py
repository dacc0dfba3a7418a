"""Rotary position embedding (RoPE), rotate-half form (GPT-NeoX, Llama), as sdpa applies it to Q
and K when the ``rotary_attention`` fusion rule has folded RoPE written in primitives into it.

For ``x`` ``[B, H, S, D]`` (D even, ``half = D / 2``), position ``s`` (x's index along dim 2) and
column ``d`` with frequency index ``i = d mod half``::

    angle = s * theta^(-2 i / D)
    y[..., d]        = x[..., d] cos(angle) - x[..., d + half] sin(angle)     (d < half)
    y[..., d + half] = x[..., d + half] cos(angle) + x[..., d] sin(angle)

i.e. ``y = x cos + rotate_half(x) sin`` with ``rotate_half(x) = [-x2, x1]``. The position is the
tensor's own row index: what ``gen_index(x, 2)`` gives, whatever masks or lengths sdpa applies.
With cos and sin given as tables (:func:`rotate_by_tables`) the positions are whatever the tables
hold, as in decode, where the query sits at the end of the cache.
"""

from __future__ import annotations

import numpy as np

from ..symbolic import Extent


def table_broadcasts(table: tuple[Extent, ...], operand: tuple[Extent, ...]) -> bool:
    """Whether a RoPE table of dims ``table`` broadcasts against an operand ``[B, H, S, D]``'s
    [S, D]: at most 4 dims, its leading (batch, head) ones 1."""
    dims = (1,) * (4 - len(table)) + tuple(table)
    return len(table) <= 4 and dims[:2] == (1, 1) and all(t in (1, e) for t, e in zip(dims[2:], operand[2:]))


def rotary_angles(positions: int, d: int, theta: float) -> np.ndarray:
    """The angles ``[positions, D / 2]``: row s, frequency i holds ``s * theta^(-2 i / D)``."""
    inverse = theta ** (-2.0 * np.arange(d // 2, dtype=np.float64) / d)
    return np.arange(positions, dtype=np.float64)[:, None] * inverse[None, :]


def rotate_half(x: np.ndarray, theta: float) -> np.ndarray:
    """``x`` (rank >= 2: [..., S, D], D even) rotated pairwise (d, d + D/2) by the RoPE angles
    of its positions along the second-last axis, in float64."""
    positions, d = x.shape[-2], x.shape[-1]
    angles = rotary_angles(positions, d, theta)
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotate_by_tables(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, negated: bool) -> np.ndarray:
    """``x cos + swap(x) sin`` with tables ``cos``, ``sin`` broadcastable to x's [..., S, D] and
    ``swap(x) = [x2, x1]``, or ``[-x2, x1]`` (torch's rotate_half) when ``negated``: RoPE as a
    graph writes it with cos and sin given as tensors (any positions), in float64."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    swapped = np.concatenate([-x2 if negated else x2, x1], axis=-1)
    return x * cos + swapped * sin
