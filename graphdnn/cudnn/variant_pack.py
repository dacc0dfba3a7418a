"""A frontend variant pack made into a graphdnn one, and the backend it runs on.

The frontend takes tensors, uids (and, here, names) as keys, and as values framework
tensors or raw ``data_ptr()`` integers: memory whose dims and strides come from the graph.
This module resolves each key to its graph tensor, drops what the frontend ignores (``None``
keys, inputs that no node reads), and turns each value into what graphdnn's plans take:

- buffers in host memory (NumPy arrays, CPU torch tensors, host pointers) run the NumPy
  reference plan, as NumPy arrays with the tensor's dims and strides;
- buffers in GPU memory run the compiled plan: raw device pointers become DeviceArray
  views, torch tensors whose dims differ from the tensor's are viewed with its dims.

A buffer whose dims differ from its tensor's is accepted when it lays out the same memory
(a ``[K]`` buffer for a ``[1, K, 1, 1]`` tensor), as the frontend, which sees only the
pointer, accepts it. Pass-by-value values may be one-element host tensors.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import as_data_type
from ..errors import DataTypeError, FeedError
from ..ir import Graph, Tensor, resolve_tensor
from ..layout import storage_extent
from ..runtime import driver
from ..runtime.buffers import is_torch
from ..runtime.device_array import DeviceArray
from ..tensor import TensorSpec


@dataclass(frozen=True)
class Adapted:
    """A pack for a graphdnn plan, keyed by tensor name, and the backend its buffers ask for."""

    pack: dict[str, Any]
    on_host: bool


def adapt(ir: Graph, owner: Any, pack: Mapping[Any, Any], ignored: set[TensorSpec], gpu: bool) -> Adapted:
    """Resolve ``pack`` against ``ir``, built by ``owner``; ``ignored`` are the builder's
    unread inputs, ``gpu`` whether a GPU plan exists (raw pointers are then device
    pointers where CUDA knows them)."""
    if not isinstance(pack, Mapping):
        raise FeedError(f"the variant pack must be a dict {{tensor: buffer}}, got a {type(pack).__name__}")
    resolved: list[tuple[Tensor, Any]] = []
    for key, value in pack.items():
        if key is None or _names_ignored(key, ignored):
            continue
        if isinstance(key, TensorSpec) and key.graph is not owner:
            raise FeedError(f"is a tensor of graph '{key.graph.name}', not of graph '{ir.name}'", tensor=key.name)
        t = resolve_tensor(ir, key)
        if any(t is seen for seen, _ in resolved):
            raise FeedError("is given twice in the variant pack", tensor=t.name)
        resolved.append((t, value))
    buffers = [(t, value) for t, value in resolved if not t.is_pass_by_value]
    where = {t.name: _on_host(value, gpu) for t, value in buffers}
    on_host = all(where.values())
    if not on_host and any(where.values()):
        host = next(name for name, here in where.items() if here)
        device = next(name for name, here in where.items() if not here)
        raise FeedError(
            f"is in host memory while '{device}' is on the GPU: give every buffer in GPU memory (the compiled "
            "plan) or every one in host memory (the NumPy reference plan)",
            tensor=host,
        )
    out = {t.name: _scalar(value) if t.is_pass_by_value else _buffer(t, value, on_host) for t, value in resolved}
    return Adapted(out, on_host)


def _names_ignored(key: Any, ignored: set[TensorSpec]) -> bool:
    if isinstance(key, TensorSpec):
        return key in ignored
    return any(key == t.name or (key == t.uid and isinstance(key, int)) for t in ignored)


def _on_host(value: Any, gpu: bool) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if is_torch(value):
        return not bool(value.is_cuda)
    if isinstance(value, int) and not isinstance(value, bool):
        return not gpu or _device_of(value) is None
    return False


def _device_of(pointer: int) -> int | None:
    """The GPU that owns ``pointer``; None for host memory, or where there is no driver
    (a plan compiled for ``sm_version`` on a machine without a GPU)."""
    try:
        return driver.pointer_device(pointer)
    except driver.CudaError:
        return None


def _scalar(value: Any) -> Any:
    """A one-element host tensor (the frontend's pass-by-value) as a Python number."""
    if is_torch(value) and not value.is_cuda and value.numel() == 1:
        return value.item()
    return value


def _buffer(t: Tensor, value: Any, on_host: bool) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise FeedError(f"is the pointer {value}: give the address of its memory (data_ptr())", tensor=t.name)
        return _host_view(t, value) if on_host else _device_view(t, value)
    shape, strides = _layout(value)
    if shape is None or strides is None:
        return value  # CuPy, DLPack...: graphdnn's runtime reads and checks them
    if shape != t.static_dim and not same_memory(shape, strides, t.static_dim, t.static_stride):
        raise FeedError(
            f"has dims {list(shape)} and strides {list(strides)}, which do not lay out the memory of the graph's "
            f"dims {list(t.static_dim)} and strides {list(t.static_stride)}",
            tensor=t.name,
        )
    if on_host:
        if isinstance(value, np.ndarray) and shape == t.static_dim:
            return value  # the reference plan checks its type and strides
        _check_type(t, value)
        return _host_view(t, value.ctypes.data if isinstance(value, np.ndarray) else int(value.data_ptr()))
    if shape != t.static_dim:
        return value.as_strided(t.static_dim, t.static_stride)  # a torch CUDA tensor: the same memory, the graph's dims
    return value


def _layout(value: Any) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """Dims and element strides of a NumPy array or torch tensor; (None, None) for others."""
    if isinstance(value, np.ndarray):
        return tuple(value.shape), tuple(s // value.itemsize for s in value.strides)
    if is_torch(value):
        return tuple(int(d) for d in value.shape), tuple(int(s) for s in value.stride())
    return None, None


def same_memory(shape: Sequence[int], strides: Sequence[int], dim: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether two (dims, strides) address the same elements in the same order: their dims
    of extent > 1, outermost first and contiguous runs merged, agree."""
    return _runs(shape, strides) == _runs(dim, stride)


def _runs(dims: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for extent, step in sorted(((d, s) for d, s in zip(dims, strides) if d != 1), key=lambda ds: -ds[1]):
        if runs and runs[-1][1] == step * extent:
            runs[-1] = (runs[-1][0] * extent, step)
        else:
            runs.append((extent, step))
    return runs


def _check_type(t: Tensor, value: Any) -> None:
    try:
        given = as_data_type(str(value.dtype) if is_torch(value) else value.dtype)
    except DataTypeError:
        given = None
    if given is not t.data_type:
        raise FeedError(f"has data type {value.dtype}, the graph declares {t.data_type.value}", tensor=t.name)


def _host_view(t: Tensor, pointer: int) -> np.ndarray:
    """A NumPy array of ``t``'s dims, strides and type over host memory at ``pointer``; the
    caller keeps that memory alive (the frontend's contract for raw pointers)."""
    itemsize = t.data_type.itemsize
    raw = (ctypes.c_byte * (storage_extent(t.static_dim, t.static_stride) * itemsize)).from_address(pointer)
    storage = np.frombuffer(memoryview(raw), dtype=t.data_type.numpy)
    return np.ndarray(t.static_dim, t.data_type.numpy, storage, strides=tuple(s * itemsize for s in t.static_stride))


def _device_view(t: Tensor, pointer: int) -> DeviceArray:
    ordinal = _device_of(pointer)
    if ordinal is None:
        raise FeedError(f"pointer {pointer:#x} is not device memory CUDA knows", tensor=t.name)
    return DeviceArray.wrap(pointer, t.static_dim, t.static_stride, t.data_type, driver.device(ordinal))
