"""Array libraries: allocating outputs the caller left out, and torch tensors for graph tensors.

Missing outputs are torch tensors when the variant pack holds torch tensors, CuPy arrays
when it holds CuPy arrays (for the types CuPy has), otherwise a graphdnn DeviceArray.
Every allocation has exactly the graph tensor's dims and strides. ``to_torch`` and
``empty_torch`` serve the GPU tests and the benchmarks; ``numpy_view`` and ``torch_host``
carry CPU tensors to and from the reference backend (graphdnn.torch's CPU kernel).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..dtypes import DataType
from ..ir import Tensor
from ..layout import overlap_reason, storage_extent
from ..packing import byte_layout
from . import driver
from .device_array import DeviceArray

TORCH_DTYPE_NAMES = {
    DataType.FLOAT: "float32",
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.DOUBLE: "float64",
    DataType.INT8: "int8",
    DataType.UINT8: "uint8",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "float8_e4m3fn",
    DataType.FP8_E5M2: "float8_e5m2",
    DataType.FP8_E8M0: "float8_e8m0fnu",
}

_CUPY_TYPES = frozenset(
    {
        DataType.FLOAT,
        DataType.HALF,
        DataType.DOUBLE,
        DataType.INT8,
        DataType.UINT8,
        DataType.INT32,
        DataType.INT64,
        DataType.BOOLEAN,
    }
)


def torch_dtype(data_type: DataType) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[data_type])


def to_torch(array: np.ndarray, tensor: Tensor) -> Any:
    """A CUDA torch tensor with ``tensor``'s dims and strides holding ``array`` (logical dims,
    the tensor's NumPy type: ml_dtypes bf16 / fp8 arrays cross by their bits). Strides that map
    several elements to one address (a broadcast input) hold, there, one of their values. A
    4-bit tensor's ``array`` is its packed bytes: the result is a uint8 tensor of the byte
    layout (graphdnn/packing.py)."""
    if tensor.data_type.is_packed:
        import torch

        dims, strides = byte_layout(tensor.name, tensor.data_type, tensor.static_dim, tensor.static_stride)
        packed = torch.empty_strided(dims, strides, dtype=torch.uint8, device="cuda")
        packed.copy_(torch.from_numpy(np.ascontiguousarray(array.view(np.uint8))))
        return packed
    if overlap_reason(tensor.dim, tensor.stride) is not None:  # torch copies into no such view
        storage = np.zeros(storage_extent(tensor.static_dim, tensor.static_stride), dtype=array.dtype)
        strides = tuple(s * storage.itemsize for s in tensor.static_stride)
        np.lib.stride_tricks.as_strided(storage, tensor.static_dim, strides)[...] = array
        return torch_host(storage, tensor).to("cuda").as_strided(tensor.dim, tensor.stride)
    device = empty_torch(tensor)
    device.copy_(torch_host(array, tensor).reshape(tensor.dim))
    return device


def torch_host(array: np.ndarray, tensor: Tensor) -> Any:
    """``array`` as a CPU torch tensor of ``tensor``'s type (fp8 and bf16 by their bits)."""
    import torch

    if tensor.data_type.is_floating and array.dtype.itemsize == 1:
        return torch.from_numpy(array.view(np.uint8)).view(torch_dtype(tensor.data_type))
    if tensor.data_type is DataType.BFLOAT16:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def numpy_view(value: Any, data_type: DataType) -> np.ndarray:
    """A CPU torch tensor of ``data_type`` as a NumPy array over the same memory (its dims
    and strides), bf16 and fp8 by their bits (NumPy reads them through ml_dtypes)."""
    import torch

    if data_type is DataType.BFLOAT16:
        value = value.view(torch.int16)
    elif data_type.is_floating and data_type.itemsize == 1:
        value = value.view(torch.uint8)
    array: np.ndarray = value.numpy()
    return array.view(data_type.numpy)


def empty_torch(tensor: Tensor, device: str = "cuda") -> Any:
    """An uninitialised torch tensor with ``tensor``'s dims, strides and type."""
    import torch

    return torch.empty_strided(
        tensor.static_dim, tensor.static_stride, dtype=torch_dtype(tensor.data_type), device=device
    )


def library_of(values: Iterable[Any]) -> str:
    """'torch', 'cupy' or 'graphdnn': the array library of the caller's buffers."""
    modules = {type(v).__module__.split(".")[0] for v in values}
    if "torch" in modules:
        return "torch"
    if "cupy" in modules:
        return "cupy"
    return "graphdnn"


def allocate(tensor: Tensor, device: driver.Device, library: str) -> Any:
    """An uninitialised array for ``tensor`` on ``device``, from ``library`` where it can hold the type."""
    if library == "torch":
        return empty_torch(tensor, f"cuda:{device.ordinal}")
    if library == "cupy" and tensor.data_type in _CUPY_TYPES:
        import cupy

        itemsize = tensor.data_type.itemsize
        with cupy.cuda.Device(device.ordinal):
            memory = cupy.cuda.alloc(storage_extent(tensor.static_dim, tensor.static_stride) * itemsize)
            return cupy.ndarray(
                tensor.dim,
                dtype=tensor.data_type.numpy,
                memptr=memory,
                strides=tuple(s * itemsize for s in tensor.stride),
            )
    return DeviceArray(tensor.static_dim, tensor.static_stride, tensor.data_type, device)
