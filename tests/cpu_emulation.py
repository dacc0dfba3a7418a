"""Generated kernels run on the CPU, to check their index math on a machine without a GPU.

A kernel's source (float, double and half kernels: half is GCC's _Float16 behind a stand-in
cuda_fp16.h, both rounding to nearest even; int32 and int64 tensors; no bf16 or fp8) is
compiled with g++ after a few stand-ins for the CUDA built-ins: each block runs after the
previous one, its threads as std::threads; ``__shared__`` variables are function statics (one
block at a time); ``__syncthreads`` is a barrier of the block; ``__shfl_xor_sync`` goes through
a buffer and two barriers, so every thread of the block must call it together, as
``gd::group_sum`` does. Scratch buffers and outputs start as NaN (integers as -77), so an
element no kernel writes fails the comparison. Slow (a thread per CUDA thread): for small
shapes of the kernels that keep to those rules.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from codegen import FusedProgram, Kernel, ParamKind
from fusion_rules import FusedNode
from graphdnn.ir import Tensor
from graphdnn.layout import storage_extent

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
struct Dim { unsigned x = 0, y = 0, z = 0; };
thread_local Dim threadIdx;
Dim blockIdx, blockDim, gridDim;
std::barrier<>* block_barrier;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
alignas(16) unsigned char shuffled[1024 * 8];
template <class T> T __shfl_xor_sync(unsigned, T v, int offset) {
  T* values = reinterpret_cast<T*>(shuffled);
  values[threadIdx.x] = v;
  __syncthreads();
  const T r = values[threadIdx.x ^ offset];
  __syncthreads();
  return r;
}
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
// the vector types and the integer intrinsic graphdnn.cuh's Philox uses
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
"""

FP16 = """#pragma once
#define __CUDA_FP16_H__
struct __half { _Float16 value; };
inline float __half2float(__half h) { return (float)h.value; }
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
inline __half __double2half(double d) { return __half{(_Float16)d}; }
"""

LAUNCH = """
extern "C" void launch(void** args, int gx, int gy, int gz, int threads) {{
  gridDim = {{(unsigned)gx, (unsigned)gy, (unsigned)gz}};
  blockDim = {{(unsigned)threads, 1, 1}};
  std::barrier<> barrier(threads);
  block_barrier = &barrier;
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {{
    blockIdx = {{(unsigned)x, (unsigned)y, (unsigned)z}};
    std::vector<std::thread> block;
    for (int t = 0; t < threads; ++t)
      block.emplace_back([&, t] {{ threadIdx = {{(unsigned)t, 0, 0}}; {call}; }});
    for (auto& thread : block) thread.join();
  }}
}}
"""


def available() -> bool:
    return shutil.which("g++") is not None


def _library(kernel: Kernel, build: Path) -> ctypes.CDLL:
    """The kernel compiled with its launcher (cached in ``build`` by content)."""
    match = re.search(rf"{kernel.name}\((.*?)\) {{", kernel.source)
    assert match, kernel.name
    args = []
    for i, declaration in enumerate(match.group(1).split(", ")):
        c_type = declaration.rsplit(" ", 1)[0]
        args.append(f"({c_type})args[{i}]" if "*" in c_type else f"*({c_type.removeprefix('const ')}*)args[{i}]")
    text = SHIM + kernel.source + LAUNCH.format(call=f"{kernel.name}({', '.join(args)})")
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    library = build / f"{key}.so"
    if not library.exists():
        source = build / f"{key}.cpp"
        source.write_text(text)
        (build / "cuda_fp16.h").write_text(FP16)
        command = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", f"-I{build}", str(source)]
        command += ["-o", str(library)]
        subprocess.run(command, check=True, capture_output=True)
    return ctypes.CDLL(str(library))


def _strided(flat: np.ndarray, t: Tensor) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(flat, t.dim, [s * flat.itemsize for s in t.stride])


def run(
    fused: FusedNode, program: FusedProgram, memory: Mapping[str, Any], aligned: int, build: Path
) -> dict[str, np.ndarray]:
    """The fused node's outputs (by name, logical dims) from its kernels run on the CPU, its
    inputs taken from ``memory`` (by name) and laid out with their strides."""
    buffers: dict[int, np.ndarray] = {}
    for t in (*fused.inputs, *fused.outputs):
        if t.is_pass_by_value:
            continue
        dtype = {"double": np.float64, "half": np.float16, "int32": np.int32, "int64": np.int64}.get(
            t.data_type.value, np.float32
        )
        poison = np.nan if t.data_type.is_floating else -77
        buffers[t.id] = np.full(storage_extent(t.dim, t.stride), poison, dtype=dtype)
        if t in fused.inputs:
            _strided(buffers[t.id], t)[...] = memory[t.name]
    scratch = {s.name: np.full(-(-s.bytes // 4), np.nan, dtype=np.float32) for s in program.scratch}
    for kernel in program.kernels:
        values: list[Any] = []
        args = (ctypes.c_void_p * len(kernel.params))()
        for i, param in enumerate(kernel.params):
            if param.kind is ParamKind.TENSOR:
                assert param.tensor is not None
                args[i] = buffers[param.tensor].ctypes.data
            elif param.kind is ParamKind.SCRATCH:
                assert param.scratch is not None
                args[i] = scratch[param.scratch].ctypes.data
            else:
                if param.kind is ParamKind.ALIGNED:
                    value: Any = ctypes.c_longlong(aligned)
                else:
                    (t,) = [t for t in fused.inputs if t.id == param.tensor]
                    value = ctypes.c_double(float(np.asarray(memory[t.name]).reshape(-1)[0]))
                values.append(value)
                args[i] = ctypes.addressof(value)
        _library(kernel, build).launch(args, *kernel.grid, kernel.block[0])
    return {t.name: np.array(_strided(buffers[t.id], t)) for t in fused.outputs}
