"""A stand-in for the CUDA driver, so that bind and execute run on a machine without a GPU.

``install(monkeypatch, arch)`` replaces ``driver.api`` with :class:`FakeDriver` (device
memory is a counter of fake addresses; launches and copies are recorded, never run) and
makes ``Plan.loaded_kernels`` return named stand-ins. Tests see what would reach the GPU
(launch order, copies, parameter slots); benchmarks time the Python side of a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import graphdnn as gd
from graphdnn.runtime import driver


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


class FakeArray:
    """Device memory seen through ``__cuda_array_interface__`` (as CuPy or Numba arrays are)."""

    def __init__(self, pointer: int, shape: tuple[int, ...], strides: tuple[int, ...], typestr: str) -> None:
        itemsize = int(typestr[-1])
        self.args = (pointer, shape, strides, typestr)  # FakeArray(*a.args): a new object over the same memory
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": tuple(s * itemsize for s in strides),
            "typestr": typestr,
            "data": (pointer, False),
            "version": 3,
        }


def install(monkeypatch: pytest.MonkeyPatch, arch: int = 90) -> FakeDriver:
    fake = FakeDriver()
    device = driver.Device(0, 0, FakeDriver.CONTEXT, arch, "fake GPU")
    monkeypatch.setattr(driver, "api", lambda: fake)
    monkeypatch.setattr(driver, "device", lambda ordinal: device)
    monkeypatch.setattr(driver, "pointer_device", lambda pointer: 0)
    monkeypatch.setattr(
        gd.Plan, "loaded_kernels", lambda plan, device: [FakeKernel(launch.name) for launch in plan.program.launches]
    )
    return fake
