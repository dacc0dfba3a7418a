"""A kernel whose static plus dynamic shared memory passes 48 KB launches, with its dynamic
part alone under 48 KB (the opt-in must count both)."""

from __future__ import annotations

import ctypes

import pytest

from codegen.nvrtc import compile_cubin
from graphdnn.runtime import driver, modules

SOURCE = r"""
extern "C" __global__ void gd_test_static_and_dynamic_shared(float* out) {
    __shared__ float fixed[10240];  // 40 KiB static
    extern __shared__ float spill[];  // 16 KiB dynamic at launch
    for (int i = threadIdx.x; i < 10240; i += blockDim.x) fixed[i] = i;
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) spill[i] = 2 * i;
    __syncthreads();
    out[threadIdx.x] = fixed[10239 - threadIdx.x] + spill[4095 - threadIdx.x];
}
"""
NAME = "gd_test_static_and_dynamic_shared"
DYNAMIC = 16 * 1024


@pytest.mark.gpu
def test_static_and_dynamic_shared_memory_over_48k_launches() -> None:
    import torch

    device = driver.device(torch.cuda.current_device())
    kernel = modules.load(
        device, "test-static-and-dynamic-shared", NAME, compile_cubin(SOURCE, NAME, device.arch), DYNAMIC
    )
    assert kernel.static_shared == 40 * 1024
    out = torch.zeros(256, device="cuda")
    api = driver.api()
    with device.current():
        params = ((out.data_ptr(),), (ctypes.c_void_p,))
        driver.call(api.cuLaunchKernel, kernel.function, 1, 1, 1, 256, 1, 1, DYNAMIC, 0, params, 0)
        driver.call(api.cuCtxSynchronize)
    threads = torch.arange(256, device="cuda", dtype=torch.float32)
    assert torch.equal(out, (10239 - threads) + 2 * (4095 - threads))
