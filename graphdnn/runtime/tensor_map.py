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
    """The driver's words for ``tensor_map`` at ``address``, kept (``encode``): a tiled map, or an
    im2col one where ``tensor_map.im2col`` says so."""
    api = driver.api()
    element_types = _encodings()[0]
    rank = len(tensor_map.dims)
    window = tensor_map.im2col
    shape = (
        element_types[tensor_map.element_bytes],
        api.cuuint32_t(rank),
        address,
        [api.cuuint64_t(d) for d in tensor_map.dims],
        [api.cuuint64_t(s) for s in tensor_map.strides],
    )
    if window is None:
        box = ([api.cuuint32_t(b) for b in tensor_map.box], [api.cuuint32_t(1)] * rank)
        result = driver.call(api.cuTensorMapEncodeTiled, *shape, *box, *_modes(tensor_map.swizzle))
    else:
        channels, pixels = tensor_map.box
        # the channel and image dims are walked one by one, the spatial ones by the convolution's strides
        steps = [api.cuuint32_t(s) for s in (1, *window.strides, 1)]
        corners = (list(window.lower), list(window.upper))
        im2col = (*corners, api.cuuint32_t(channels), api.cuuint32_t(pixels), steps)
        result = driver.call(api.cuTensorMapEncodeIm2col, *shape, *im2col, *_modes(tensor_map.swizzle))
    words = np.array([int(w) for w in result.opaque], dtype=np.uint64)
    words.flags.writeable = False  # shared by every binding that finds it
    return words


def _modes(swizzle: int) -> tuple[Any, ...]:
    """The encodings' last four arguments: no interleave, the swizzle, L2 promotion, zero fill."""
    api = driver.api()
    return (
        api.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        _encodings()[1][swizzle],
        api.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        api.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # out-of-bounds elements read as zero
    )


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
