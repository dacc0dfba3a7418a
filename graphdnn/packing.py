"""How 4-bit tensors (int4, fp4_e2m1) sit in memory: two elements per byte.

The one packing: along the tensor's stride-1 dimension, element 2j in the low nibble of byte j
and element 2j + 1 in the high nibble. That dimension's extent is even and every other stride
is even, so each row along it starts on a byte and no byte holds elements of two rows. A
weight W [K, N] stored row-major (strides [N, 1]) packs along N; stored as Wᵀ (strides [1, K],
the [N, K] layout of a linear layer's weight) it packs along K.

Strides stay in elements, as for every other type; a buffer or feed of a 4-bit tensor is a
uint8 (or int8) array of the packed bytes, shaped like the tensor with the packed dimension
halved (:func:`byte_layout`). int4 is two's complement (-8..7); fp4_e2m1 is the OCP MX FP4
element (sign, two exponent bits with bias 1, one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6),
decoded bit-exactly as ml_dtypes decodes ``int4`` and ``float4_e2m1fn``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .dtypes import DataType, round_to
from .errors import FeedError, ShapeError
from .layout import storage_extent

_CODES = np.arange(16, dtype=np.uint8)
# The value of each 4-bit code, as ml_dtypes reads a byte holding it in its low nibble.
VALUES = {t: _CODES.view(t.numpy).astype(np.float64) for t in (DataType.INT4, DataType.FP4_E2M1)}
BYTE_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))


def packed_axis(name: str, data_type: DataType, dim: Sequence[object], stride: Sequence[object]) -> int:
    """The axis two elements share a byte along; a ShapeError naming the tensor unless the
    layout can be packed (static dims, one stride-1 dimension of even extent, other strides even)."""
    if any(not isinstance(e, int) for e in (*dim, *stride)):
        raise ShapeError(
            f"{data_type.value} tensor '{name}' has symbolic dims or strides {list(dim)} / {list(stride)}; "
            "4-bit tensors take static ones",
            tensor=name,
        )
    dims = [e for e in dim if isinstance(e, int)]
    strides = [s for s in stride if isinstance(s, int)]
    unit = [a for a, (d, s) in enumerate(zip(dims, strides)) if s == 1 and d > 1]
    if not unit:
        raise ShapeError(
            f"{data_type.value} tensor '{name}' has dims {dims} and strides {strides}: no dimension of extent > 1 "
            "has stride 1, and 4-bit elements are packed two per byte along one",
            tensor=name,
        )
    axis = unit[0]
    if dims[axis] % 2:
        raise ShapeError(
            f"{data_type.value} tensor '{name}' packs two elements per byte along dim {axis} (stride 1), whose "
            f"extent {dims[axis]} is odd; pad it to an even extent",
            tensor=name,
        )
    odd = [a for a, (d, s) in enumerate(zip(dims, strides)) if a != axis and d > 1 and s % 2]
    if odd:
        raise ShapeError(
            f"{data_type.value} tensor '{name}' has stride {strides[odd[0]]} along dim {odd[0]}: strides of a "
            "4-bit tensor other than the packed dimension's must be even (each row starts on a byte)",
            tensor=name,
        )
    return axis


def byte_layout(
    name: str, data_type: DataType, dim: Sequence[int], stride: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dims and strides (in bytes) of the uint8 array holding the packed tensor."""
    axis = packed_axis(name, data_type, dim, stride)
    dims = tuple(d // 2 if a == axis else d for a, d in enumerate(dim))
    strides = tuple(1 if a == axis else s // 2 for a, s in enumerate(stride))
    return dims, strides


def storage_bytes(name: str, data_type: DataType, dim: Sequence[int], stride: Sequence[int]) -> int:
    """Bytes spanned from the tensor's first byte to its last."""
    return storage_extent(*byte_layout(name, data_type, dim, stride))


def encode(values: np.ndarray, data_type: DataType) -> np.ndarray:
    """The 4-bit codes (uint8, 0..15) of ``values`` after rounding them to ``data_type``
    (int4 saturates to -8..7, fp4_e2m1 to +-6: :func:`graphdnn.dtypes.round_to`)."""
    rounded = round_to(data_type, values)
    return rounded.astype(data_type.numpy).view(np.uint8) & 0xF


def pack(values: np.ndarray, data_type: DataType, stride: Sequence[int], name: str = "value") -> np.ndarray:
    """``values`` (logical dims, any real type) rounded to ``data_type`` and packed into the
    contiguous uint8 array a buffer of a tensor with ``stride`` holds (:func:`byte_layout`)."""
    axis = packed_axis(name, data_type, values.shape, stride)
    codes = np.moveaxis(encode(values, data_type), axis, -1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(np.moveaxis(packed, -1, axis))


def unpack(raw: np.ndarray, data_type: DataType, dim: Sequence[int], stride: Sequence[int], name: str) -> np.ndarray:
    """The float64 values of the tensor whose packed bytes are ``raw``; a FeedError naming it
    unless ``raw`` is a uint8 or int8 array of the byte layout's dims."""
    axis = packed_axis(name, data_type, dim, stride)
    dims, _ = byte_layout(name, data_type, dim, stride)
    if raw.dtype not in BYTE_TYPES:
        raise FeedError(
            f"feed for '{name}' has dtype {raw.dtype}; a 4-bit ({data_type.value}) tensor takes its packed bytes as uint8 or "
            "int8 (two elements per byte, low nibble first)",
            tensor=name,
        )
    if tuple(raw.shape) != dims:
        raise FeedError(
            f"feed for '{name}' has shape {list(raw.shape)}; {data_type.value} {list(dim)} packed two per byte along "
            f"dim {axis} is {list(dims)} bytes",
            tensor=name,
        )
    codes = np.moveaxis(raw.view(np.uint8), axis, -1)
    both = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape((*codes.shape[:-1], 2 * codes.shape[-1]))
    return np.moveaxis(VALUES[data_type][both], -1, axis)
