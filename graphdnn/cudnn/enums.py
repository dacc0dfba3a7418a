"""The cuDNN frontend's enums, as graphdnn's own where graphdnn has the concept.

``data_type``, ``norm_forward_phase``, ``reduction_mode`` and ``convolution_mode`` are
graphdnn's enums under the frontend's names (their members are spelled alike, so
``cudnn.data_type.HALF`` is ``graphdnn.DataType.HALF``). The engine-selection enums
(``heur_mode``, ``build_plan_policy``) exist so that frontend code runs: graphdnn has one
plan per graph, built by its own fusion and code generation, whatever mode is asked for.
"""

from __future__ import annotations

import enum
from typing import Any

from ..dtypes import DataType
from ..errors import UnsupportedError
from ..ops.conv import ConvMode
from ..ops.norms import NormForwardPhase
from ..ops.reduction import ReductionMode

# The frontend's data types graphdnn has no counterpart for, and why.
FRONTEND_ONLY_TYPES = {
    "FAST_FLOAT_FOR_FP8": "graphdnn has no fast-accumulation fp8 compute type (it accumulates fp8 products in float)",
    "INT8x4": "graphdnn has no vectorized types",
    "UINT8x4": "graphdnn has no vectorized types",
    "INT8x32": "graphdnn has no vectorized types",
}


class _DataTypes(type):
    """Makes ``data_type`` graphdnn's DataType in all but name: its members, iteration,
    calls and isinstance; a frontend-only member raises UnsupportedError saying so."""

    def __getattr__(cls, name: str) -> Any:
        if name in FRONTEND_ONLY_TYPES:
            raise UnsupportedError(f"cudnn.data_type.{name} is not supported: {FRONTEND_ONLY_TYPES[name]}")
        return getattr(DataType, name)

    def __iter__(cls) -> Any:
        return iter(DataType)

    def __getitem__(cls, name: str) -> DataType:
        return DataType[name]

    def __call__(cls, value: Any) -> DataType:
        return DataType(value)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, DataType)


class data_type(metaclass=_DataTypes):
    """The frontend's ``cudnn.data_type``: ``data_type.HALF is graphdnn.DataType.HALF``."""


norm_forward_phase = NormForwardPhase
reduction_mode = ReductionMode
convolution_mode = ConvMode

# The frontend raises this when no engine supports a graph; graphdnn's UnsupportedError is
# the same situation (and says why), so frontend code catching it keeps working.
cudnnGraphNotSupportedError = UnsupportedError


class heur_mode(enum.Enum):
    """Which heuristics rank the frontend's engines; graphdnn accepts each and builds its one plan."""

    A = "a"
    B = "b"
    FALLBACK = "fallback"
    OPENSOURCE = "opensource"


class build_plan_policy(enum.Enum):
    """How many of the ranked plans the frontend builds; graphdnn always has exactly one."""

    HEURISTICS_CHOICE = "heuristics_choice"
    ALL = "all"


class diagonal_alignment(enum.Enum):
    """Where sdpa's diagonal band starts: the first query with the first key, or the last with the last."""

    TOP_LEFT = "top_left"
    BOTTOM_RIGHT = "bottom_right"


class tensor_reordering(enum.Enum):
    """How a tensor's elements are reordered in memory. graphdnn lays every tensor out by its
    dims and strides, so NONE, and F8_128x4 for block-scale inputs (cudnn/reordering.py)."""

    NONE = "none"
    INT8x32 = "int8x32"
    F16x16 = "f16x16"
    F8_128x4 = "f8_128x4"


def tiled_reordering(reordering: Any, tensor: str | None) -> bool:
    """Whether ``reordering`` is F8_128x4 (block scales in 128 x 4 tiles: cudnn/reordering.py);
    False for NONE; the other reorderings are refused, naming the tensor."""
    name = getattr(reordering, "name", reordering)
    if reordering is None or name == "NONE":
        return False
    if name == "F8_128x4":
        return True
    raise UnsupportedError(
        f"tensor reordering {reordering!r} is not supported: graphdnn reads tensors in their own dims and strides "
        "(F8_128x4 block scales excepted)",
        tensor=tensor,
    )


class reshape_mode(enum.Enum):
    """VIEW_ONLY reinterprets the input's memory; LOGICAL keeps the row-major order of the elements."""

    VIEW_ONLY = "view_only"
    LOGICAL = "logical"


class moe_grouped_matmul_mode(enum.Enum):
    """Where a grouped matmul's rows come from (GATHER: ``token_index``) or go (SCATTER: not supported)."""

    NONE = "none"
    GATHER = "gather"
    SCATTER = "scatter"
