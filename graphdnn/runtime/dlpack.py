"""Reading a DLPack capsule (``__dlpack__``) with ctypes: pointer, device, shape, strides, type.

graphdnn only borrows the tensor: it keeps the capsule (and so the producer's tensor)
alive while it uses the pointer and never renames it, so the capsule's own destructor
calls the producer's deleter when the last reference goes.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from ..dtypes import DataType
from ..layout import packed_strides

CUDA, CUDA_HOST, CUDA_MANAGED = 2, 3, 13  # DLDeviceType values graphdnn cares about
DEVICE_NAMES = {1: "CPU", CUDA: "CUDA", CUDA_HOST: "CUDA pinned host", 10: "ROCm", CUDA_MANAGED: "CUDA managed"}

# (DLDataTypeCode, bits) -> DataType
_TYPES = {
    (0, 8): DataType.INT8,
    (0, 32): DataType.INT32,
    (0, 64): DataType.INT64,
    (1, 8): DataType.UINT8,
    (2, 16): DataType.HALF,
    (2, 32): DataType.FLOAT,
    (2, 64): DataType.DOUBLE,
    (4, 16): DataType.BFLOAT16,
    (6, 8): DataType.BOOLEAN,
    (10, 8): DataType.FP8_E4M3,
    (12, 8): DataType.FP8_E5M2,
    (14, 8): DataType.FP8_E8M0,
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _ManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class DLTensorView:
    pointer: int
    device_type: int
    device_id: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    data_type: DataType | None  # None: a type graphdnn has no name for (see type_name)
    type_name: str
    capsule: Any  # keeps the producer's tensor alive

    @property
    def on_cuda(self) -> bool:
        return self.device_type in (CUDA, CUDA_MANAGED)

    @property
    def device_name(self) -> str:
        return DEVICE_NAMES.get(self.device_type, f"DLPack device type {self.device_type}")


def read_capsule(capsule: Any) -> DLTensorView:
    """The tensor a legacy ``dltensor`` capsule describes (strides default to row-major)."""
    address = _get_pointer(capsule, b"dltensor")
    managed = _ManagedTensor.from_address(address)
    tensor = managed.dl_tensor
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    strides = tuple(int(tensor.strides[i]) for i in range(tensor.ndim)) if tensor.strides else packed_strides(shape)
    code, bits, lanes = int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes)
    data_type = _TYPES.get((code, bits)) if lanes == 1 else None
    return DLTensorView(
        pointer=int(tensor.data or 0) + int(tensor.byte_offset),
        device_type=int(tensor.device.device_type),
        device_id=int(tensor.device.device_id),
        shape=shape,
        strides=strides,
        data_type=data_type,
        type_name=data_type.value if data_type else f"DLPack type code {code}, {bits} bits x {lanes}",
        capsule=capsule,
    )


def export(value: Any, stream: int) -> DLTensorView:
    """Ask ``value`` for a capsule to be used on ``stream`` and read it.

    The DLPack stream argument for CUDA: 1 is the legacy default stream (our 0), other
    values are stream handles; the producer makes that stream wait for its pending work.
    """
    device_type, _ = value.__dlpack_device__() if hasattr(value, "__dlpack_device__") else (CUDA, 0)
    if device_type in (CUDA, CUDA_MANAGED):
        try:
            capsule = value.__dlpack__(stream=stream or 1)
        except TypeError:  # a producer without the stream argument
            capsule = value.__dlpack__()
    else:
        capsule = value.__dlpack__()
    return read_capsule(capsule)
