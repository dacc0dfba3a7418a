"""Comparing results with the reference backend: relative error and per-type tolerances.

The error of an output is ‖out − ref‖ / ‖ref‖ over the finite reference values; a NaN
where the reference has none (an unwritten, poisoned element) makes it infinite, so NaN
never passes. Tolerances are by output data type: storage rounding dominates for the
narrow types. ``graphdnn run --check`` and the GPU tests use both.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DataType

TOLERANCE = {
    DataType.DOUBLE: 1e-12,
    DataType.FLOAT: 2e-5,
    DataType.HALF: 3e-3,
    DataType.BFLOAT16: 1.5e-2,
    DataType.FP8_E4M3: 0.1,
    DataType.FP8_E5M2: 0.2,
    DataType.FP8_E8M0: 0.5,  # powers of two: a value between two is up to a third from either
    # the reference saturates int64 at the largest float64 below 2**63, kernels at 2**63 - 1
    # (graphdnn.dtypes._float_range): 1023 apart, a relative 2**-53 (less an ulp of the norms)
    DataType.INT64: 2.0**-52,
}


def tolerance(data_type: DataType) -> float:
    """The relative error allowed for an output of ``data_type`` (0: integers and booleans are exact, int64 up to its saturation limit)."""
    return TOLERANCE.get(data_type, 0.0)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ over the finite reference values; inf when out has a NaN the reference lacks."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref)
    if np.isnan(out[finite]).any() or not np.array_equal(np.isnan(out[~finite]), np.isnan(ref[~finite])):
        return float("inf")
    diff = np.linalg.norm(out[finite] - ref[finite])
    scale = np.linalg.norm(ref[finite])
    return float(diff / scale) if scale > 0 else float(diff)
