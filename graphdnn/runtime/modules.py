"""Cubins loaded into a device's primary context, shared by every plan that uses them.

A loaded kernel is kept while some plan holds it (weak references), keyed by (device,
kernel key): two plans with the same fused kernel load its module once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from . import driver

STATIC_SHARED_LIMIT = 48 * 1024  # bytes of static plus dynamic shared memory a block gets without opting in


class LoadedKernel:
    """A module (one cubin) and its entry point, in one device's primary context."""

    def __init__(self, device: driver.Device, kernel_key: str, name: str, cubin: bytes) -> None:
        api = driver.api()
        self.device = device
        self.kernel_key = kernel_key
        self.name = name
        self.module: Any = None
        self._shared_opt_in = 0
        with device.current():
            self.module = driver.call(api.cuModuleLoadData, cubin)
            self.function = driver.call(api.cuModuleGetFunction, self.module, name.encode())
            attribute = api.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
            self.static_shared = int(driver.call(api.cuFuncGetAttribute, attribute, self.function))

    def allow_shared(self, nbytes: int) -> None:
        """Opt in to ``nbytes`` of dynamic shared memory when, with the kernel's static shared
        memory, that is more than 48 KB (a launch over the limit fails with an invalid value)."""
        if nbytes + self.static_shared <= STATIC_SHARED_LIMIT or nbytes <= self._shared_opt_in:
            return
        api = driver.api()
        attribute = api.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        with self.device.current():
            driver.call(api.cuFuncSetAttribute, self.function, attribute, nbytes)
        self._shared_opt_in = nbytes

    def __del__(self) -> None:
        if self.module is None:
            return
        try:
            with self.device.current():
                driver.call(driver.api().cuModuleUnload, self.module)
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


_loaded: weakref.WeakValueDictionary[tuple[int, str], LoadedKernel] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def load(device: driver.Device, kernel_key: str, name: str, cubin: bytes, shared_bytes: int) -> LoadedKernel:
    """The kernel loaded on ``device`` (loading it on first use), ready for ``shared_bytes``."""
    with _lock:
        kernel = _loaded.get((device.ordinal, kernel_key))
        if kernel is None:
            kernel = LoadedKernel(device, kernel_key, name, cubin)
            _loaded[(device.ordinal, kernel_key)] = kernel
        kernel.allow_shared(shared_bytes)
        return kernel
