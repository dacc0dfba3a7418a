"""TMA tensor maps, encoded by the driver when a plan is bound (they hold the tensor's address).

A dynamic graph's maps hold the call's extents too (TensorMap.at), so binding encodes one per
call shape. Encoding costs a driver call (7 µs through the Python bindings on an H200 host,
benchmarks/RESULTS.md), so the words are kept per (map, address): a map is a pure function of them, and binding the same
buffers at a shape seen before encodes nothing. The cache is bounded (least recently used out).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

import numpy as np

from ..program import TENSOR_MAP_ALIGNMENT, TensorMap
from . import driver

ENCODED_MAPS = 4096  # (map, address) pairs kept: 128 bytes of words each


def encode(tensor_map: TensorMap, address: int) -> np.ndarray:
    """The TENSOR_MAP_WORDS words (read-only) of the map of the tensor at ``address`` (aligned:
    binding copies an input that is not; the workspace's intermediates are 256-byte aligned),
    from the cache when this map was encoded at this address before. A map with symbolic sizes
    is resolved first (TensorMap.at)."""
    assert address % TENSOR_MAP_ALIGNMENT == 0 and not tensor_map.symbolic
    return encoded(tensor_map, address)


@lru_cache(maxsize=ENCODED_MAPS)
def encoded(tensor_map: TensorMap, address: int) -> np.ndarray:
    """cuTensorMapEncodeTiled's words for ``tensor_map`` at ``address``, kept (``encode``)."""
    api = driver.api()
    element_types, swizzles = _encodings()
    rank = len(tensor_map.dims)
    result = driver.call(
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
    words = np.array([int(w) for w in result.opaque], dtype=np.uint64)
    words.flags.writeable = False  # shared by every binding that finds it
    return words


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
