"""TMA tensor maps, encoded by the driver when a plan is bound (they hold the tensor's address)."""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..program import TENSOR_MAP_ALIGNMENT, TensorMap
from . import driver


def encode(tensor_map: TensorMap, address: int) -> np.ndarray:
    """The TENSOR_MAP_WORDS words of the map of the tensor at ``address`` (aligned: binding
    copies an input that is not; the workspace's intermediates are 256-byte aligned)."""
    assert address % TENSOR_MAP_ALIGNMENT == 0
    api = driver.api()
    element_types, swizzles = _encodings()
    rank = len(tensor_map.dims)
    encoded = driver.call(
        api.cuTensorMapEncodeTiled,
        element_types[tensor_map.element_bytes],
        api.cuuint32_t(rank),
        address,
        [api.cuuint64_t(d) for d in tensor_map.dims],
        [api.cuuint64_t(s) for s in tensor_map.strides],
        [api.cuuint32_t(b) for b in tensor_map.box],
        [api.cuuint32_t(1)] * rank,
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[tensor_map.swizzle],
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # out-of-bounds elements read as zero
    )
    return np.array([int(w) for w in encoded.opaque], dtype=np.uint64)


@cache
def _encodings() -> tuple[dict[int, Any], dict[int, Any]]:
    """The driver's element type by element size and swizzle mode by bytes."""
    api = driver.api()
    kinds = api.CUtensorMapDataType
    element_types = {
        1: kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2: kinds.CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4: kinds.CU_TENSOR_MAP_DATA_TYPE_UINT32,
        8: kinds.CU_TENSOR_MAP_DATA_TYPE_INT64,
    }
    modes = api.CUtensorMapSwizzle
    swizzles = {
        0: modes.CU_TENSOR_MAP_SWIZZLE_NONE,
        32: modes.CU_TENSOR_MAP_SWIZZLE_32B,
        64: modes.CU_TENSOR_MAP_SWIZZLE_64B,
        128: modes.CU_TENSOR_MAP_SWIZZLE_128B,
    }
    return element_types, swizzles
