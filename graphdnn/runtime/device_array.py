"""``DeviceArray``: a small strided device array, for callers that bring no array library.

Allocated with cuMemAlloc in the device's primary context and freed when the last
reference goes. It exposes ``__cuda_array_interface__`` (so CuPy, Numba or torch can
view it, for the types they know) and copies to and from NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DataType, as_data_type
from ..layout import packed_strides, storage_extent
from . import driver


class DeviceMemory:
    """Raw device bytes owned by this object."""

    def __init__(self, device: driver.Device, nbytes: int) -> None:
        self.device = device
        self.nbytes = nbytes
        self.pointer = 0
        with device.current():
            self.pointer = int(driver.call(driver.api().cuMemAlloc, max(nbytes, 1)))

    def __del__(self) -> None:
        if not self.pointer:
            return
        try:
            with self.device.current():
                driver.call(driver.api().cuMemFree, self.pointer)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


class BorrowedMemory:
    """Device bytes allocated elsewhere (a raw pointer from another library): never freed here."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.pointer = pointer
        self.nbytes = nbytes


class DeviceArray:
    """``dims`` elements of ``data_type`` laid out with element ``strides`` (default: packed
    row-major) on ``device`` (default: the current one)."""

    def __init__(
        self,
        dims: Sequence[int],
        strides: Sequence[int] | None = None,
        data_type: DataType = DataType.FLOAT,
        device: driver.Device | None = None,
    ) -> None:
        self.shape = tuple(int(d) for d in dims)
        self.strides = tuple(int(s) for s in strides) if strides is not None else packed_strides(self.shape)
        self.data_type = data_type
        self.device = device if device is not None else driver.current_device()
        self.nbytes = storage_extent(self.shape, self.strides) * data_type.itemsize
        self._memory: DeviceMemory | BorrowedMemory = DeviceMemory(self.device, self.nbytes)

    @classmethod
    def wrap(
        cls,
        pointer: int,
        dims: Sequence[int],
        strides: Sequence[int],
        data_type: DataType,
        device: driver.Device,
    ) -> DeviceArray:
        """A view of device memory at ``pointer`` that the caller owns and keeps alive:
        a raw ``data_ptr()`` is memory whose dims, strides and type only the graph knows."""
        array = cls.__new__(cls)
        array.shape = tuple(int(d) for d in dims)
        array.strides = tuple(int(s) for s in strides)
        array.data_type = data_type
        array.device = device
        array.nbytes = storage_extent(array.shape, array.strides) * data_type.itemsize
        array._memory = BorrowedMemory(pointer, array.nbytes)
        return array

    @property
    def pointer(self) -> int:
        return self._memory.pointer

    @property
    def dtype(self) -> np.dtype:
        return self.data_type.numpy

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        itemsize = self.data_type.itemsize
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "strides": tuple(s * itemsize for s in self.strides),
            "version": 3,
        }

    @classmethod
    def from_numpy(
        cls,
        values: np.ndarray,
        strides: Sequence[int] | None = None,
        data_type: DataType | None = None,
        device: driver.Device | None = None,
    ) -> DeviceArray:
        """A device copy of ``values`` (logical dims), laid out with ``strides``, in
        ``data_type`` (default: the array's)."""
        values = np.asarray(values)
        kind = data_type if data_type is not None else as_data_type(values.dtype)
        array = cls(values.shape, strides, kind, device)
        storage = np.zeros(array.nbytes // kind.itemsize, dtype=kind.numpy)
        array._host_view(storage)[...] = values.astype(kind.numpy)
        with array.device.current():
            driver.call(driver.api().cuMemcpyHtoD, array.pointer, storage.ctypes.data, array.nbytes)
        return array

    def to_numpy(self) -> np.ndarray:
        """A host copy in logical dims (waits for the copy; order it after your kernels)."""
        storage = np.empty(self.nbytes // self.data_type.itemsize, dtype=self.data_type.numpy)
        with self.device.current():
            driver.call(driver.api().cuMemcpyDtoH, storage.ctypes.data, self.pointer, self.nbytes)
        return np.array(self._host_view(storage))

    def fill_bytes(self, byte: int) -> None:
        """Set every byte (0xFF makes floats NaN and integers -1: a poison for unwritten outputs)."""
        with self.device.current():
            driver.call(driver.api().cuMemsetD8, self.pointer, byte, self.nbytes)

    def _host_view(self, storage: np.ndarray) -> np.ndarray:
        itemsize = self.data_type.itemsize
        return np.lib.stride_tricks.as_strided(
            storage, shape=self.shape, strides=tuple(s * itemsize for s in self.strides)
        )

    def __repr__(self) -> str:
        return f"DeviceArray({list(self.shape)} {self.data_type.value} stride {list(self.strides)} on cuda:{self.device.ordinal})"
