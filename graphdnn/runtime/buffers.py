"""What a value in a variant pack is, in memory: pointer, device, dims, strides, type.

graphdnn's own DeviceArray and torch tensors take fast paths (``data_ptr``/``stride``/
``dtype``: a few attribute reads, and torch's ``__cuda_array_interface__`` refuses bf16);
everything else (CuPy, Numba, JAX, NumPy...) is read through cuda.core's
StridedMemoryView (:mod:`.strided`). :func:`check` compares a buffer with the graph
tensor it is bound to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..dtypes import DataType, as_data_type
from ..errors import DataTypeError, FeedError
from ..ir import Tensor
from ..layout import packed_strides, storage_extent
from ..packing import byte_layout
from . import strided
from .device_array import DeviceArray


@dataclass(frozen=True)
class Buffer:
    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    data_type: DataType | None  # None: a type graphdnn has no name for (see type_name)
    type_name: str
    device: int | None  # CUDA device ordinal; None when the memory is not on a GPU
    where: str  # what the memory is, for messages: "cuda:0", "CPU memory (a numpy.ndarray)"...
    owner: Any  # keeps the memory alive while a bound plan uses it
    readonly: bool = False  # its exporter forbids writing it (DLPack's flag, the CUDA Array Interface's)

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
    return _strided(strided.open_array(value, stream))


def check(tensor: Tensor, buffer: Buffer, device: int, written: bool = False) -> None:
    """FeedError naming ``tensor`` unless ``buffer`` is on ``device`` with exactly its
    data type, dims and strides, aligned to its element size, and writable if ``written``."""

    def fail(message: str) -> None:
        raise FeedError(message, tensor=tensor.name)

    if buffer.device is None:
        fail(f"is in {buffer.where}; it must be in GPU memory (cuda:{device})")
    if buffer.device != device:
        fail(f"is on cuda:{buffer.device}, the plan runs on cuda:{device} (where the other buffers are)")
    if tensor.data_type.is_packed:
        _check_packed(tensor, buffer, fail)
        _check_writable(buffer, written, fail)
        return
    if buffer.data_type is not tensor.data_type:
        fail(f"has data type {buffer.type_name}, the graph declares {tensor.data_type.value}")
    if buffer.shape != tensor.dim:
        fail(f"has dims {list(buffer.shape)}, the graph declares {list(tensor.dim)}")
    _check_strides(tensor.static_dim, buffer.strides, tensor.static_stride, tensor.stride, fail)
    if buffer.pointer % tensor.data_type.itemsize:
        fail(
            f"starts at address {buffer.pointer:#x}, not aligned to its element size ({tensor.data_type.itemsize} bytes)"
        )
    _check_writable(buffer, written, fail)


def element_bytes(tensor: Tensor) -> int:
    """Bytes per element of the buffer bound to ``tensor``: a 4-bit tensor's holds bytes."""
    return 1 if tensor.data_type.is_packed else tensor.data_type.itemsize


def _check_packed(tensor: Tensor, buffer: Buffer, fail: Callable[[str], None]) -> None:
    """A 4-bit tensor's buffer is a uint8 or int8 array of its packed bytes (graphdnn/packing.py)."""
    dims, strides = byte_layout(tensor.name, tensor.data_type, tensor.static_dim, tensor.static_stride)
    if buffer.data_type not in (DataType.UINT8, DataType.INT8):
        fail(
            f"has data type {buffer.type_name}; the graph declares {tensor.data_type.value}, whose buffer holds the "
            "packed bytes as uint8 or int8 (two elements per byte, low nibble first)"
        )
    if buffer.shape != dims:
        fail(
            f"has dims {list(buffer.shape)}; {tensor.data_type.value} {list(tensor.dim)} packed two per byte is "
            f"{list(dims)} bytes"
        )
    _check_strides(dims, buffer.strides, strides, strides, fail)


def _check_strides(
    dims: tuple[int, ...],
    given: tuple[int, ...],
    declared: tuple[int, ...],
    shown: tuple[object, ...],
    fail: Callable[[str], None],
) -> None:
    if any(s < 0 for d, s in zip(dims, given) if d > 1):
        fail(
            f"has strides {list(given)}: a reversed view; graph strides are never negative, so no "
            f"kernel reads it: pass a copy with the graph's strides {list(shown)}"
        )
    if not same_strides(dims, given, declared):
        fail(
            f"has strides {list(given)}, the graph declares {list(shown)}: kernels are compiled "
            "for the graph's strides; pass a buffer with exactly these (e.g. torch.empty_strided) or build the "
            "graph with the buffer's strides"
        )


def _check_writable(buffer: Buffer, written: bool, fail: Callable[[str], None]) -> None:
    if written and buffer.readonly:
        fail("is read-only (its exporter set the read-only flag); the plan writes it")


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


def _strided(opened: strided.Opened) -> Buffer:
    view = opened.view
    shape = tuple(view.shape)
    strides = view.strides
    try:
        dtype = view.dtype
    except Exception as error:  # a type cuda.core has no NumPy dtype for (fp8...)
        data_type, type_name = None, f"a type cuda.core cannot read ({error})"
    else:
        data_type, type_name = _data_type(dtype), str(dtype)
    return Buffer(
        int(view.ptr),
        shape,
        packed_strides(shape) if strides is None else tuple(_signed(s) for s in strides),
        data_type,
        type_name,
        opened.device,
        opened.where,
        view,  # holds the exporting object, and the DLPack capsule until the view goes
        bool(view.readonly),
    )


def _signed(stride: int) -> int:
    """cuda.core 1.2.0 hands a negative stride of a CuPy view back as a 62-bit two's complement
    (-2 as 2**62 - 2, seen on the GPU machine); no real stride comes near 2**61 elements."""
    return stride - (1 << 62) if stride >= 1 << 61 else stride


def _data_type(dtype: Any) -> DataType | None:
    try:
        return as_data_type(dtype)
    except DataTypeError:
        return None
