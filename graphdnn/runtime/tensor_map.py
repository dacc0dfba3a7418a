"""TMA tensor maps, encoded by the driver when a plan is bound (they hold the tensor's address)."""

from __future__ import annotations

import numpy as np

from ..program import TENSOR_MAP_ALIGNMENT, TensorMap
from . import driver


def encode(tensor_map: TensorMap, address: int) -> np.ndarray:
    """The TENSOR_MAP_WORDS words of the map of the tensor at ``address`` (aligned: binding
    copies an input that is not; the workspace's intermediates are 256-byte aligned)."""
    assert address % TENSOR_MAP_ALIGNMENT == 0
    api = driver.api()
    element_type = {
        1: api.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        2: api.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4: api.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT32,
        8: api.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_INT64,
    }[tensor_map.element_bytes]
    swizzle = {
        0: api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        32: api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
        64: api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
        128: api.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
    }[tensor_map.swizzle]
    rank = len(tensor_map.dims)
    encoded = driver.call(
        api.cuTensorMapEncodeTiled,
        element_type,
        api.cuuint32_t(rank),
        address,
        [api.cuuint64_t(d) for d in tensor_map.dims],
        [api.cuuint64_t(s) for s in tensor_map.strides],
        [api.cuuint32_t(b) for b in tensor_map.box],
        [api.cuuint32_t(1)] * rank,
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle,
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # out-of-bounds elements read as zero
    )
    return np.array([int(w) for w in encoded.opaque], dtype=np.uint64)
