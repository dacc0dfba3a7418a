"""GPU time of each kernel of a bound plan (CUDA events), and host time per bound call."""

from __future__ import annotations

import statistics
import time

from . import driver
from .device_array import DeviceMemory
from .launch import BoundPlan

# Written over before each timed round so that no round finds its data in L2 (as
# triton's do_bench does): larger than the L2 of any GPU graphdnn targets (H200: 60 MB).
FLUSH_BYTES = 256 * 2**20


def kernel_times_us(bound: BoundPlan, repeats: int = 20, *, flush_l2: bool = True) -> list[float]:
    """Median GPU time of each kernel in µs: an event before and after every launch, ``repeats``
    rounds, each (by default) starting with a cold L2, as graph inputs arrive from memory."""
    api = driver.api()
    count = len(bound.launches)
    samples: list[list[float]] = [[] for _ in range(count)]
    flush = DeviceMemory(bound.device, FLUSH_BYTES) if flush_l2 else None
    with bound.device.current():
        stream = api.CUstream(bound.stream)
        events = [driver.call(api.cuEventCreate, 0) for _ in range(count + 1)]
        try:
            bound()  # warm-up: first launches pay for lazy loading
            for _ in range(repeats):
                if flush is not None:
                    driver.call(api.cuMemsetD8Async, flush.pointer, 0, FLUSH_BYTES, stream)
                driver.call(api.cuEventRecord, events[0], stream)
                for i in range(count):
                    bound.launch_kernel(i)
                    driver.call(api.cuEventRecord, events[i + 1], stream)
                driver.call(api.cuEventSynchronize, events[count])
                for i in range(count):
                    samples[i].append(driver.call(api.cuEventElapsedTime, events[i], events[i + 1]) * 1e3)
        finally:
            for event in events:
                driver.call(api.cuEventDestroy, event)
    return [statistics.median(s) for s in samples]


def host_us_per_call(bound: BoundPlan, calls: int = 1000) -> float:
    """Wall time per call of ``bound`` in a loop, in µs (the enqueue cost; the GPU is waited for at the end)."""
    for _ in range(10):
        bound()
    bound.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        bound()
    elapsed = time.perf_counter() - start
    bound.synchronize()
    return elapsed / calls * 1e6
