"""A stand-in for the CUDA driver, so that bind and execute run on a machine without a GPU.

``install(monkeypatch, arch)`` replaces ``driver.api`` with :class:`FakeDriver` (device
memory is a counter of fake addresses; launches and copies are recorded, never run),
reads ``__cuda_array_interface__`` arrays as cuda.core does without asking the driver
(:func:`cuda_array_interface_view`) and makes ``Plan.loaded_kernels`` return named stand-ins. Tests see what would reach the GPU
(launch order, copies, parameter slots); benchmarks time the Python side of a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.runtime import driver, strided, tensor_map


@dataclass(frozen=True)
class FakeKernel:
    function: str  # the launch's name: what a recorded launch shows


class FakeDriver:
    CONTEXT = 0xC0

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._next = 0x7F0000000000

    def CUstream(self, handle: int) -> int:
        return handle

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return (0, self.CONTEXT)

    def cuCtxGetDevice(self) -> tuple[int, int]:
        return (0, 0)

    def cuMemAlloc(self, nbytes: int) -> tuple[int, int]:
        pointer = self._next
        self._next += -(-nbytes // 4096) * 4096
        return (0, pointer)

    def cuMemFree(self, pointer: int) -> tuple[int]:
        return (0,)

    def cuLaunchKernel(self, function: str, *arguments: Any) -> tuple[int]:
        self.calls.append(("launch", function))
        return (0,)

    def cuMemcpyDtoDAsync(self, destination: int, source: int, nbytes: int, stream: int) -> tuple[int]:
        self.calls.append(("copy", destination, source, nbytes))
        return (0,)

    def cuGraphLaunch(self, graph: Any, stream: int) -> tuple[int]:
        raise AssertionError("no CUDA graphs on the fake driver")

    def allocate(self, nbytes: int) -> int:
        return self.cuMemAlloc(nbytes)[1]

    # TMA tensor maps: an encoding records its arguments and returns them as the map's words
    CUtensorMapDataType = SimpleNamespace(
        CU_TENSOR_MAP_DATA_TYPE_UINT8=1,
        CU_TENSOR_MAP_DATA_TYPE_UINT16=2,
        CU_TENSOR_MAP_DATA_TYPE_UINT32=4,
        CU_TENSOR_MAP_DATA_TYPE_INT64=8,
    )
    CUtensorMapSwizzle = SimpleNamespace(
        CU_TENSOR_MAP_SWIZZLE_NONE=0,
        CU_TENSOR_MAP_SWIZZLE_32B=32,
        CU_TENSOR_MAP_SWIZZLE_64B=64,
        CU_TENSOR_MAP_SWIZZLE_128B=128,
    )
    CUtensorMapInterleave = SimpleNamespace(CU_TENSOR_MAP_INTERLEAVE_NONE=0)
    CUtensorMapL2promotion = SimpleNamespace(CU_TENSOR_MAP_L2_PROMOTION_L2_256B=0)
    CUtensorMapFloatOOBfill = SimpleNamespace(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE=0)
    cuuint32_t = cuuint64_t = staticmethod(int)

    def cuTensorMapEncodeTiled(
        self, element: int, rank: int, address: int, dims: list[int], strides: list[int], box: list[int], *rest: Any
    ) -> tuple[int, SimpleNamespace]:
        """Words: address, rank, element size, then the dims and strides (16 in all, zero-padded)."""
        self.calls.append(("tensor_map", address, tuple(dims), tuple(strides), tuple(box)))
        words = [address, rank, element, *dims, *strides]
        return (0, SimpleNamespace(opaque=words + [0] * (16 - len(words))))

    def cuTensorMapEncodeIm2col(
        self, element: int, rank: int, address: int, dims: list[int], strides: list[int], *rest: Any
    ) -> tuple[int, SimpleNamespace]:
        """As ``cuTensorMapEncodeTiled``; recorded with the window's corners for a box."""
        lower, upper = rest[0], rest[1]
        self.calls.append(("tensor_map", address, tuple(dims), tuple(strides), (tuple(lower), tuple(upper))))
        words = [address, rank, element, *dims, *strides]
        return (0, SimpleNamespace(opaque=words + [0] * (16 - len(words))))


class FakeArray:
    """Device memory seen through ``__cuda_array_interface__`` (as CuPy or Numba arrays are);
    ``device`` is the ordinal the fake reports for its pointer."""

    def __init__(
        self,
        pointer: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        typestr: str,
        *,
        readonly: bool = False,
        stream: int | None = None,
        device: int = 0,
    ) -> None:
        itemsize = int(typestr[-1])
        self.args = (pointer, shape, strides, typestr)  # FakeArray(*a.args): a new object over the same memory
        self.device = device
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": tuple(s * itemsize for s in strides),
            "typestr": typestr,
            "data": (pointer, readonly),
            "version": 3,
            "stream": stream,
        }


@dataclass(frozen=True)
class FakeView:
    """What cuda.core's StridedMemoryView reads from a CUDA Array Interface."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # in elements; None: C-contiguous
    dtype: np.dtype
    device_id: int
    readonly: bool
    stream_ptr: int  # the consumer stream it was asked to order the producer's stream before


VIEWS: list[FakeView] = []  # every view read since install, in order


def cuda_array_interface_view(value: Any, stream_ptr: int) -> FakeView:
    """cuda.core's reading of the interface (its refusals included), with the device the
    array says instead of the driver's answer for the pointer."""
    interface = value.__cuda_array_interface__
    if interface["version"] < 3:
        raise BufferError("only CUDA Array Interface v3 or above is supported")
    if interface.get("mask") is not None:
        raise BufferError("mask is not supported")
    dtype = np.dtype(interface["typestr"])
    byte_strides = interface.get("strides")
    if byte_strides is not None and any(s % dtype.itemsize for s in byte_strides):
        raise ValueError("strides must be divisible by itemsize")
    pointer, readonly = interface["data"]
    view = FakeView(
        pointer,
        tuple(interface["shape"]),
        None if byte_strides is None else tuple(s // dtype.itemsize for s in byte_strides),
        dtype,
        getattr(value, "device", 0),
        readonly,
        stream_ptr,
    )
    VIEWS.append(view)
    return view


def install(monkeypatch: pytest.MonkeyPatch, arch: int = 90) -> FakeDriver:
    fake = FakeDriver()
    device = driver.Device(0, 0, FakeDriver.CONTEXT, arch, "fake GPU")
    monkeypatch.setattr(driver, "api", lambda: fake)
    monkeypatch.setattr(driver, "device", lambda ordinal: device)
    monkeypatch.setattr(driver, "pointer_device", lambda pointer: 0)
    monkeypatch.setattr(strided, "cuda_array_interface_view", cuda_array_interface_view)
    VIEWS.clear()
    # the fake's encodings in caches of their own, never seen by the real driver's bindings
    monkeypatch.setattr(tensor_map, "encoded", lru_cache(tensor_map.ENCODED_MAPS)(tensor_map.encoded.__wrapped__))
    monkeypatch.setattr(tensor_map, "_encodings", lru_cache(None)(tensor_map._encodings.__wrapped__))
    monkeypatch.setattr(
        gd.Plan, "loaded_kernels", lambda plan, device: [FakeKernel(launch.name) for launch in plan.program.launches]
    )
    return fake
