"""The cuDNN frontend's enums, as graphdnn's own where graphdnn has the concept.

``data_type``, ``norm_forward_phase``, ``reduction_mode`` and ``convolution_mode`` are
graphdnn's enums under the frontend's names (their members are spelled alike, so
``cudnn.data_type.HALF`` is ``graphdnn.DataType.HALF``). The engine-selection enums
(``heur_mode``, ``build_plan_policy``) exist so that frontend code runs: graphdnn has one
plan per graph, built by its own fusion and code generation, whatever mode is asked for.
"""

from __future__ import annotations

import enum

from ..dtypes import DataType
from ..errors import UnsupportedError
from ..ops.conv import ConvMode
from ..ops.norms import NormForwardPhase
from ..ops.reduction import ReductionMode

data_type = DataType
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


class reshape_mode(enum.Enum):
    """VIEW_ONLY reinterprets the input's memory; LOGICAL keeps the row-major order of the elements."""

    VIEW_ONLY = "view_only"
    LOGICAL = "logical"
