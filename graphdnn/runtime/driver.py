"""The CUDA driver API through ``cuda.bindings.driver``: every call checked, primary contexts.

graphdnn works in each device's *primary* context, the one the CUDA runtime (and so
torch and CuPy) uses, so pointers and streams from those libraries are valid here and
ours are valid there. Every ``CUresult`` is checked; a failure raises :class:`CudaError`
naming the call and the error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any


class CudaError(RuntimeError):
    """A CUDA driver call failed (or there is no usable driver or GPU)."""


@cache
def api() -> Any:
    """``cuda.bindings.driver``, initialised (cuInit) once per process."""
    try:
        from cuda.bindings import driver
    except ImportError as error:  # pragma: no cover - a dependency of graphdnn
        raise CudaError(f"cuda-bindings is not installed: {error}") from None
    try:
        (status,) = driver.cuInit(0)
    except Exception as error:  # the driver library itself is missing: no NVIDIA driver on this machine
        raise CudaError(f"no NVIDIA driver found ({error})") from None
    if status:
        raise CudaError(f"cuInit failed: {describe(driver, status)} (no usable NVIDIA GPU?)")
    return driver


def describe(driver: Any, status: Any) -> str:
    """'CUDA_ERROR_X: explanation' for a CUresult."""
    _, name = driver.cuGetErrorName(status)
    _, text = driver.cuGetErrorString(status)
    decode = lambda b: b.decode() if isinstance(b, bytes) else str(b)  # noqa: E731
    return f"{decode(name)}: {decode(text)}" if name else f"CUresult {int(status)}"


def call(function: Callable[..., Any], *args: Any) -> Any:
    """Call a driver function; raise CudaError unless it succeeds. Returns what follows
    the status: None, the single value, or a tuple of values."""
    result = function(*args)
    status = result[0]
    if status:
        raise CudaError(f"{getattr(function, '__name__', function)} failed: {describe(api(), status)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@dataclass(frozen=True, eq=False)
class Device:
    """A GPU and its primary context (retained for the life of the process)."""

    ordinal: int
    handle: Any  # CUdevice
    context: Any  # CUcontext
    arch: int  # compute capability as 80, 86, 90...
    name: str

    @property
    def context_handle(self) -> int:
        return int(self.context)

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make this device's primary context current in this thread for the block, then
        restore whatever was current (so a torch or CuPy caller keeps its device)."""
        driver = api()
        previous = call(driver.cuCtxGetCurrent)
        if int(previous) == self.context_handle:
            yield
            return
        call(driver.cuCtxPushCurrent, self.context)
        try:
            yield
        finally:
            call(driver.cuCtxPopCurrent)

    def __repr__(self) -> str:
        return f"Device(cuda:{self.ordinal} {self.name}, sm_{self.arch})"


_lock = threading.Lock()


@cache
def device(ordinal: int) -> Device:
    """The device with this ordinal, its primary context retained."""
    driver = api()
    with _lock:
        count = call(driver.cuDeviceGetCount)
        if not 0 <= ordinal < count:
            raise CudaError(f"no CUDA device {ordinal}: this machine has {count}")
        handle = call(driver.cuDeviceGet, ordinal)
        attribute = driver.CUdevice_attribute
        major = call(driver.cuDeviceGetAttribute, attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle)
        minor = call(driver.cuDeviceGetAttribute, attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle)
        raw = call(driver.cuDeviceGetName, 256, handle)
        name = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
        context = call(driver.cuDevicePrimaryCtxRetain, handle)
        return Device(ordinal, handle, context, major * 10 + minor, name)


def current_device() -> Device:
    """The device of the context current in this thread (torch's / CuPy's); where none is,
    device 0, whose primary context becomes current (as the CUDA runtime would make it)."""
    driver = api()
    context = call(driver.cuCtxGetCurrent)
    if int(context) == 0:
        first = device(0)
        call(driver.cuCtxSetCurrent, first.context)
        return first
    return device(int(call(driver.cuCtxGetDevice)))


@cache
def current_gpu_arch() -> int | None:
    """sm_XY of the current CUDA device as a number, or None where there is no usable GPU."""
    try:
        return current_device().arch
    except CudaError:
        return None


def pointer_device(pointer: int) -> int | None:
    """The ordinal of the device that owns ``pointer``; None for host or unknown memory."""
    driver = api()
    attribute = driver.CUpointer_attribute
    status, memory_type = driver.cuPointerGetAttribute(attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pointer)
    if status or int(memory_type) not in (
        int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE),
        int(driver.CUmemorytype.CU_MEMORYTYPE_UNIFIED),
    ):
        return None
    return int(call(driver.cuPointerGetAttribute, attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, pointer))


def stream_handle(stream: Any) -> int:
    """A CUstream handle from what users pass: None (the legacy default stream, 0), an int,
    an object with ``__cuda_stream__`` (cuda.core, newer torch), a torch.cuda.Stream
    (``cuda_stream``) or a CuPy stream (``ptr``)."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        _, handle = protocol() if callable(protocol) else protocol
        return int(handle)
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    from ..errors import FeedError

    raise FeedError(
        f"cannot use {type(stream).__name__} as a stream: give an int handle, an object with __cuda_stream__, "
        "or a torch.cuda.Stream"
    )
