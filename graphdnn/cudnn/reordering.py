"""The frontend's ``F8_128x4`` reordering: block scales stored in 128 x 4 tiles.

Blackwell's block-scaled MMA reads the scales of an MXFP8 (or NVFP4) operand in the layout
cuBLAS documents as its block scaling factors layout: the scale matrix, one row per row of
the operand along its unblocked dim (A's M, B's N) and one column per block along K, is
padded to multiples of 128 rows and 4 columns and cut into 128 x 4 tiles of 512 bytes,
stored tile row by tile row, each tile's K tiles consecutive. Inside a tile, the scale of
row r and column c sits at byte ``(r % 32) * 16 + (r // 32) * 4 + c``. A batch of such
matrices is stored one after the other.

graphdnn's ops read a block-scale tensor in its own dims and strides, so a tensor declared
with this reordering becomes the graph input holding the tiles (``[*batch, rows, cols]``
padded, row-major: the bytes the caller's buffer holds) and, where an op reads it, movement
nodes that undo the tiling: a reshape into ``[*batch, row tiles, K tiles, 32, 4, 4]``, the
transpose that puts the row index back together, a reshape to the padded matrix, a slice to
the dims the op needs and, for a scale along the second-to-last dim (B's ``[K / 32, N]``),
the transpose to it. The caller's buffer is the tiled bytes, as for the frontend.

Which of the declared tensor's last two dims runs along the blocks is read off its strides,
as the frontend's samples declare it: the one of stride 1 (A's scales ``[b, m, k / 32]``
with strides ``[.., k / 32, 1]``; B's ``[b, k / 32, n]`` with strides ``[.., 1, k / 32]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dtypes import DataType, as_data_type
from ..errors import UnsupportedError

if TYPE_CHECKING:
    from ..graph import OperationGraphSpec
    from ..tensor import TensorSpec

TILE_ROWS, TILE_COLS = 128, 4  # a tile: 128 rows of 4 scales, as 32 rows of 16 bytes
SCALE_TYPES = frozenset({DataType.FP8_E8M0, DataType.FP8_E4M3})  # MXFP8's and NVFP4's 1-byte scales


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Tiled:
    """A block-scale tensor stored in 128 x 4 tiles: the frontend's dims, and which of its
    last two dims runs along the blocks (-1 or -2)."""

    dims: tuple[int, ...]
    block_axis: int

    @property
    def rows(self) -> int:
        """The tiles' rows: the declared dim that is not along the blocks."""
        return self.dims[-1] if self.block_axis == -2 else self.dims[-2]

    @property
    def cols(self) -> int:
        return self.dims[self.block_axis]

    @property
    def storage(self) -> list[int]:
        """The dims of the graph input holding the tiles: each matrix padded, row-major."""
        return [*self.dims[:-2], round_up(self.rows, TILE_ROWS), round_up(self.cols, TILE_COLS)]


def tiled(dims: Sequence[Any], stride: Sequence[Any] | None, data_type: Any, name: str | None) -> Tiled:
    """The layout of a tensor declared with ``F8_128x4``; UnsupportedError naming the tensor
    when it cannot be one (rank below 2, symbolic dims, a type other than a 1-byte scale's,
    neither of the last two dims of stride 1)."""
    if len(dims) < 2 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise UnsupportedError(
            f"tensor reordering F8_128x4 takes static dims [..., rows, blocks] of rank 2 or more, got {list(dims)}",
            tensor=name,
        )
    kind = as_data_type(data_type) if data_type is not None else DataType.NOT_SET
    if kind not in SCALE_TYPES:
        raise UnsupportedError(
            f"tensor reordering F8_128x4 holds 1-byte block scales (FP8_E8M0 or FP8_E4M3), not {kind.value}",
            tensor=name,
        )
    if stride is None or stride[-1] == 1:
        return Tiled(tuple(dims), -1)
    if stride[-2] == 1:
        return Tiled(tuple(dims), -2)
    raise UnsupportedError(
        f"tensor reordering F8_128x4 with strides {list(stride)}: one of the last two dims must have stride 1, "
        "the dim along the blocks",
        tensor=name,
    )


def untiled(spec: OperationGraphSpec, tiles: TensorSpec, layout: Tiled, dims: Sequence[int]) -> TensorSpec:
    """The scales in ``tiles`` (the graph input of ``layout``) as a plain tensor of ``dims``:
    ``layout.dims`` or smaller in the last two (the blocks an op reads of a padded
    declaration); never the padding beyond the declared dims."""
    lead, rows, cols = list(layout.storage[:-2]), *layout.storage[-2:]
    want_rows, want_cols = (dims[-1], dims[-2]) if layout.block_axis == -2 else (dims[-2], dims[-1])
    if list(dims[:-2]) != lead or want_rows > layout.rows or want_cols > layout.cols:
        raise UnsupportedError(
            f"an op reads the F8_128x4 scales as {list(dims)}; their tiles hold {list(layout.dims)} "
            f"(padded to {[*lead, rows, cols]})",
            tensor=tiles.name,
        )
    kind = tiles.data_type
    n = len(lead)

    def typed(t: TensorSpec) -> TensorSpec:
        return t.set_data_type(kind)

    name = f"{tiles.name}.untiled"
    tile_major = typed(
        spec.reshape(tiles, [*lead, rows // TILE_ROWS, cols // TILE_COLS, 32, 4, 4], name=f"{name}.tiles")
    )
    # [.., row tile, K tile, r % 32, r // 32 % 4, c % 4] -> [.., row tile, r // 32 % 4, r % 32, K tile, c % 4]
    order = [*range(n), n, n + 3, n + 2, n + 1, n + 4]
    matrix = typed(spec.reshape(typed(spec.transpose(tile_major, order, name=f"{name}.rows")), [*lead, rows, cols]))
    if (want_rows, want_cols) != (rows, cols):
        matrix = typed(spec.slice(matrix, [*(slice(None),) * n, slice(0, want_rows), slice(0, want_cols)]))
    if layout.block_axis == -2:
        matrix = typed(spec.transpose(matrix, [*range(n), n + 1, n], name=f"{name}.blocks"))
    return matrix
