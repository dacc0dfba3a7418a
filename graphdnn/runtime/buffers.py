"""What a value in a variant pack is, in memory: pointer, device, dims, strides, type.

Torch tensors take a fast path (``data_ptr``/``stride``/``dtype``: torch's
``__cuda_array_interface__`` refuses bf16); then graphdnn's own DeviceArray, anything
with ``__cuda_array_interface__`` (CuPy, Numba...) and anything with ``__dlpack__``.
:func:`check` compares a buffer with the graph tensor it is bound to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DataType, as_data_type
from ..errors import DataTypeError, FeedError
from ..ir import Tensor
from ..layout import packed_strides, storage_extent
from . import dlpack, driver
from .device_array import DeviceArray


@dataclass(frozen=True)
class Buffer:
    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    data_type: DataType | None  # None: a type graphdnn has no name for (see type_name)
    type_name: str
    device: int | None  # CUDA device ordinal; None when the memory is not on a GPU
    where: str  # what the memory is, for messages: "cuda:0", "host memory (NumPy array)"...
    owner: Any  # keeps the memory alive while a bound plan uses it

    @property
    def nbytes(self) -> int:
        itemsize = self.data_type.itemsize if self.data_type else 1
        return storage_extent(self.shape, self.strides) * itemsize if self.shape else itemsize


def describe(value: Any, stream: int) -> Buffer:
    """The memory behind ``value``; FeedError when it is no array graphdnn can read."""
    if isinstance(value, DeviceArray):
        return Buffer(
            value.pointer,
            value.shape,
            value.strides,
            value.data_type,
            value.data_type.value,
            value.device.ordinal,
            f"cuda:{value.device.ordinal}",
            value,
        )
    if is_torch(value):
        return _torch(value)
    if hasattr(value, "__cuda_array_interface__"):
        return _array_interface(value)
    if isinstance(value, np.ndarray):
        return Buffer(
            value.ctypes.data,
            tuple(value.shape),
            tuple(s // value.itemsize for s in value.strides),
            _data_type(value.dtype),
            str(value.dtype),
            None,
            "host memory (a NumPy array)",
            value,
        )
    if hasattr(value, "__dlpack__"):
        return _dlpack(value, stream)
    raise FeedError(
        f"is a {type(value).__name__}; give a torch tensor, a CuPy array, or an object with "
        "__cuda_array_interface__ or __dlpack__"
    )


def check(tensor: Tensor, buffer: Buffer, device: int) -> None:
    """FeedError naming ``tensor`` unless ``buffer`` is on ``device`` with exactly its
    data type, dims and strides, aligned to its element size."""

    def fail(message: str) -> None:
        raise FeedError(message, tensor=tensor.name)

    if buffer.device is None:
        fail(f"is in {buffer.where}; it must be in GPU memory (cuda:{device})")
    if buffer.device != device:
        fail(f"is on cuda:{buffer.device}, the plan runs on cuda:{device} (where the other buffers are)")
    if buffer.data_type is not tensor.data_type:
        fail(f"has data type {buffer.type_name}, the graph declares {tensor.data_type.value}")
    if buffer.shape != tensor.dim:
        fail(f"has dims {list(buffer.shape)}, the graph declares {list(tensor.dim)}")
    if not same_strides(tensor.static_dim, buffer.strides, tensor.static_stride):
        fail(
            f"has strides {list(buffer.strides)}, the graph declares {list(tensor.stride)}: kernels are compiled "
            "for the graph's strides; pass a buffer with exactly these (e.g. torch.empty_strided) or build the "
            "graph with the buffer's strides"
        )
    if buffer.pointer % tensor.data_type.itemsize:
        fail(
            f"starts at address {buffer.pointer:#x}, not aligned to its element size ({tensor.data_type.itemsize} bytes)"
        )


def same_strides(dims: tuple[int, ...], given: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Strides agree on every dim of extent > 1 (a size-1 dim's stride is never used)."""
    return len(given) == len(declared) and all(d == 1 or g == s for d, g, s in zip(dims, given, declared))


def is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "data_ptr")


def _torch(value: Any) -> Buffer:
    dtype = str(value.dtype)
    data_type = _data_type(dtype)
    on_gpu = bool(value.is_cuda)
    ordinal = int(value.get_device()) if on_gpu else None
    return Buffer(
        int(value.data_ptr()),
        tuple(int(d) for d in value.shape),
        tuple(int(s) for s in value.stride()),
        data_type,
        dtype.removeprefix("torch."),
        ordinal,
        f"cuda:{ordinal}" if on_gpu else f"{value.device} memory (a torch tensor)",
        value,
    )


def _array_interface(value: Any) -> Buffer:
    interface = value.__cuda_array_interface__
    shape = tuple(int(d) for d in interface["shape"])
    dtype = np.dtype(interface["typestr"])
    pointer = int(interface["data"][0])
    byte_strides = interface.get("strides")
    strides = packed_strides(shape) if byte_strides is None else tuple(int(s) // dtype.itemsize for s in byte_strides)
    ordinal = driver.pointer_device(pointer) if pointer else driver.current_device().ordinal
    return Buffer(
        pointer,
        shape,
        strides,
        _data_type(dtype),
        str(dtype),
        ordinal,
        f"cuda:{ordinal}" if ordinal is not None else "memory CUDA does not know as device memory",
        value,
    )


def _dlpack(value: Any, stream: int) -> Buffer:
    try:
        view = dlpack.export(value, stream)
    except (BufferError, TypeError, ValueError) as error:  # the producer refused, or an unreadable capsule
        raise FeedError(f"is a {type(value).__name__} that cannot be read through DLPack: {error}") from None
    ordinal = view.device_id if view.on_cuda else None
    return Buffer(
        view.pointer,
        view.shape,
        view.strides,
        view.data_type,
        view.type_name,
        ordinal,
        f"cuda:{ordinal}" if ordinal is not None else f"{view.device_name} memory (a DLPack tensor)",
        (value, view.capsule),
    )


def _data_type(dtype: Any) -> DataType | None:
    try:
        return as_data_type(dtype)
    except DataTypeError:
        return None
