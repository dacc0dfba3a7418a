"""Arrays of other libraries, read through cuda.core's ``StridedMemoryView``.

Anything exporting DLPack (``__dlpack__`` and ``__dlpack_device__``, versioned capsules up
to 1.0) or the CUDA Array Interface v3 is read by cuda.core: its pointer, dims, strides in
elements, NumPy dtype (bf16 through ml_dtypes), device and read-only flag. DLPack is asked
first, as cuda.core does. graphdnn's stream is the consumer stream, so the producer orders
its pending work before the plan's: DLPack passes it to ``__dlpack__``; for the CUDA Array
Interface cuda.core makes it wait for the interface's ``stream`` (an event). Whatever the
producer or cuda.core refuses becomes a FeedError saying what the object is and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import FeedError

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13  # DLDeviceType values
DEVICE_NAMES = {
    CPU: "CPU",
    CUDA: "CUDA",
    CUDA_HOST: "CUDA pinned host",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    10: "ROCm",
    CUDA_MANAGED: "CUDA managed",
    14: "oneAPI",
}
_ON_GPU = (CUDA, CUDA_MANAGED)  # the memory kernels are given; pinned host memory is refused (PCIe speed)
_READABLE = (CPU, CUDA, CUDA_HOST, CUDA_MANAGED)  # what cuda.core reads (host memory: for the message)


@dataclass(frozen=True)
class Opened:
    """A foreign array as cuda.core read it, and where its memory is."""

    view: Any  # a cuda.core StridedMemoryView (or, on the CPU tests' fake driver, a stand-in)
    device: int | None  # CUDA device ordinal; None when the memory is not GPU memory
    where: str  # "cuda:0", "CPU memory (a numpy.ndarray)"...


def consumer_stream(handle: int) -> int:
    """The stream producers are told: graphdnn's 0 (the legacy default stream) is 1 in DLPack
    and in the CUDA Array Interface."""
    return handle or 1


def open_array(value: Any, stream: int) -> Opened:
    """``value`` read through DLPack or the CUDA Array Interface, ordered before ``stream``."""
    kind = _kind(value)
    has_dlpack = hasattr(value, "__dlpack__")
    if has_dlpack and hasattr(value, "__dlpack_device__"):
        device_type, ordinal = (int(n) for n in value.__dlpack_device__())
        memory = f"{DEVICE_NAMES.get(device_type, f'DLPack device type {device_type}')} memory ({kind})"
        if device_type not in _READABLE:
            raise FeedError(f"is in {memory}; it must be in GPU memory")
        on_gpu = device_type in _ON_GPU
        try:
            view = dlpack_view(value, consumer_stream(stream) if on_gpu else -1)
        except Exception as error:  # the producer's or cuda.core's refusal, whatever its type
            if not on_gpu:  # unreadable host memory is refused for where it is
                raise FeedError(f"is in {memory}; it must be in GPU memory") from None
            raise FeedError(f"is {kind} that cannot be read through DLPack: {_reason(error)}") from error
        return Opened(view, ordinal if on_gpu else None, f"cuda:{ordinal}" if on_gpu else memory)
    if hasattr(value, "__cuda_array_interface__"):
        try:
            view = cuda_array_interface_view(value, consumer_stream(stream))
        except Exception as error:
            raise FeedError(
                f"is {kind} that cannot be read through __cuda_array_interface__: {_reason(error)}"
            ) from error
        return Opened(view, int(view.device_id), f"cuda:{view.device_id}")
    if has_dlpack:
        raise FeedError(f"is {kind} with __dlpack__ but no __dlpack_device__; DLPack producers have both")
    raise FeedError(
        f"is {kind}; give a torch tensor, a CuPy array, or an object with __cuda_array_interface__ or __dlpack__"
    )


def dlpack_view(value: Any, stream_ptr: int) -> Any:
    from cuda.core.utils import StridedMemoryView

    return StridedMemoryView.from_dlpack(value, stream_ptr)


def cuda_array_interface_view(value: Any, stream_ptr: int) -> Any:
    """cuda.core asks the driver which device owns the pointer (the CPU tests replace this)."""
    from cuda.core.utils import StridedMemoryView

    return StridedMemoryView.from_cuda_array_interface(value, stream_ptr)


def _kind(value: Any) -> str:
    """'a numpy.ndarray': what the caller passed, for messages."""
    cls = type(value)
    package = cls.__module__.split(".")[0]
    return f"a {cls.__name__}" if package in ("builtins", "__main__") else f"a {package}.{cls.__name__}"


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
