"""TMA tensor maps, encoded by the driver when a plan is bound (they hold the tensor's address).

A kernel parameter ``gd::TensorMapArg`` is the 128-byte ``CUtensorMap``, then the shift: TMA
needs a 16-byte aligned base, so the map starts at the address rounded down, one row grown by
the elements that skipped, and the kernel adds ``shift`` to its innermost coordinate.
"""

from __future__ import annotations

import numpy as np

from ..program import TENSOR_MAP_WORDS, TensorMap
from . import driver

BASE_ALIGNMENT = 16
_MAP_WORDS = 16  # sizeof(CUtensorMap) / 8


def encode(tensor_map: TensorMap, address: int) -> np.ndarray:
    """The TENSOR_MAP_WORDS words of the parameter for the tensor at ``address`` (element-aligned:
    binding checked every buffer; the workspace's intermediates are 256-byte aligned)."""
    assert address % tensor_map.element_bytes == 0
    shift = address % BASE_ALIGNMENT // tensor_map.element_bytes
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
    dims = (tensor_map.dims[0] + shift, *tensor_map.dims[1:])
    rank = len(dims)
    encoded = driver.call(
        api.cuTensorMapEncodeTiled,
        element_type,
        api.cuuint32_t(rank),
        address - shift * tensor_map.element_bytes,
        [api.cuuint64_t(d) for d in dims],
        [api.cuuint64_t(s) for s in tensor_map.strides],
        [api.cuuint32_t(b) for b in tensor_map.box],
        [api.cuuint32_t(1)] * rank,
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle,
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # out-of-bounds elements read as zero
    )
    words = np.zeros(TENSOR_MAP_WORDS, dtype=np.uint64)
    words[:_MAP_WORDS] = [int(w) for w in encoded.opaque]
    words[_MAP_WORDS] = shift
    return words
