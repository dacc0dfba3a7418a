"""Generated kernels run on the CPU, to check their index math on a machine without a GPU.

A kernel's source (float, double and half kernels: half is GCC's _Float16 behind a stand-in
cuda_fp16.h, both rounding to nearest even; int8, int32 and int64 tensors; no bf16 or fp8) is
compiled with g++ after a few stand-ins for the CUDA built-ins: each block runs after the
previous one, its threads as fibers (ucontext) of one OS thread, each run in turn up to its
next ``__syncthreads``, which is what the barrier means (no OS thread per CUDA thread, no
futex wake-ups: a block of 256 threads costs what its arithmetic costs); ``__shared__``
variables are function statics (one block at a time); ``__syncwarp`` is the block's barrier
(every warp calls it together); ``__shfl_xor_sync`` goes through
a buffer and two barriers, so every thread of the block must call it together, as
``gd::group_sum`` does. Scratch buffers and outputs start as NaN (integers as -77), so an
element no kernel writes fails the comparison. For small shapes of the kernels that keep to
those rules (no thread may wait in a loop for another thread of its block: fibers are not
preempted).

fp16 tensor-core kernels run too (:data:`TENSOR_CORE_STAND_INS`): ``cp.async`` becomes a copy,
``ldmatrix``, ``mma.sync`` m16n8k16 and ``movmatrix`` exchange fragments between the lanes of each warp
through a buffer and two barriers (every thread of the block calls them together, as the
attention kernels do), with the PTX fragment layouts; the dynamic shared memory is a static
array and ``ex2.approx`` is exp2f.

A dynamic graph's kernels run at the symbol values given: EXTENT parameters take them, the
grid is computed from them as the runtime computes it, and of a fused node's size-bucket
variants only the one whose bucket holds the call runs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from codegen import FusedProgram, Kernel, ParamKind
from codegen.families.attention_decode_mma import TRANSPOSE
from codegen.families.gemm_loaders import ASYNC_COPY_PRELUDE
from codegen.families.norm_backward_sets import PREFETCH_L2
from codegen.families.tensor_core import mma_fragments
from fusion_rules import FusedNode
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.layout import storage_extent
from graphdnn.packing import byte_layout, storage_bytes
from graphdnn.symbolic import evaluate

SHIM = r"""
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <ucontext.h>
#include <vector>
using std::max;
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __restrict__ __restrict
#define __shared__ static
struct Dim { unsigned x = 0, y = 0, z = 0; };
Dim threadIdx, blockIdx, blockDim, gridDim;
namespace fibers {
ucontext_t scheduler;
std::vector<ucontext_t> threads;
std::vector<bool> done;
int current;
}  // namespace fibers
inline void __syncthreads() { swapcontext(&fibers::threads[fibers::current], &fibers::scheduler); }
// a warp's lanes meet: the block's barrier stands in (every warp of the emulated kernels that call
// it calls it together), so that what one lane wrote to shared memory is there for the others
inline void __syncwarp(unsigned = 0xffffffffu) { __syncthreads(); }
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
// the RNN kernels' 16-byte loads and their step ticket
#define __align__(n) __attribute__((aligned(n)))
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(16) double2 { double x, y; };
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
// the weight-only GEMM's read-only loads and byte permutes
template <class T> T __ldg(const T* p) { return *p; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long both = x | ((unsigned long long)y << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
"""

FP16 = """#pragma once
#define __CUDA_FP16_H__
struct __half { _Float16 value; };
inline float __half2float(__half h) { return (float)h.value; }
inline __half __float2half_rn(float f) { return __half{(_Float16)f}; }
inline __half __double2half(double d) { return __half{(_Float16)d}; }
struct __half2 { __half x, y; };
inline __half2 __floats2half2_rn(float x, float y) { return __half2{__float2half_rn(x), __float2half_rn(y)}; }
inline __half2 __float2half2_rn(float f) { return __floats2half2_rn(f, f); }
inline __half2 __hsub2(__half2 a, __half2 b) { return {{(_Float16)(a.x.value - b.x.value)}, {(_Float16)(a.y.value - b.y.value)}}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {{(_Float16)(a.x.value * b.x.value)}, {(_Float16)(a.y.value * b.y.value)}}; }
// one rounding: a half product plus a half is exact in double
inline _Float16 fma_rn(_Float16 a, _Float16 b, _Float16 c) { return (_Float16)((double)a * (double)b + (double)c); }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {{fma_rn(a.x.value, b.x.value, c.x.value)}, {fma_rn(a.y.value, b.y.value, c.y.value)}}; }
"""

# The PTX of the tensor-core kernels' building blocks, on the CPU: (original, stand-in) text.
TENSOR_CORE_STAND_INS = (
    (
        ASYNC_COPY_PRELUDE,
        r"""
inline unsigned long long smem_addr(const void* p) { return (unsigned long long)p; }
inline void copy16(unsigned long long dst, const void* src, bool valid) {
  if (valid) std::memcpy((void*)dst, src, 16); else std::memset((void*)dst, 0, 16);
}
""",
    ),
    (
        mma_fragments(DataType.HALF),
        r"""
alignas(16) unsigned long long fragment_rows[1024];
alignas(16) unsigned fragments[1024][6];
inline unsigned pair_at(const _Float16* a, const _Float16* b) {  // two halves, a in the low bits
  unsigned short lo, hi;
  std::memcpy(&lo, a, 2); std::memcpy(&hi, b, 2);
  return lo | ((unsigned)hi << 16);
}
// ldmatrix .x4: lanes 8m..8m+7 give the rows of matrix m; lane l gets (row l/4, columns 2(l%4), +1)
// of each, or with .trans (rows 2(l%4), +1 of column l/4).
inline void ldmatrix_any(unsigned long long addr, unsigned* r, bool trans) {
  const int lane = threadIdx.x & 31, warp0 = threadIdx.x - lane;
  fragment_rows[threadIdx.x] = addr;
  __syncthreads();
  for (int m = 0; m < 4; ++m) {
    if (!trans) {
      const _Float16* row = (const _Float16*)fragment_rows[warp0 + 8 * m + lane / 4] + 2 * (lane % 4);
      r[m] = pair_at(row, row + 1);
    } else {
      const _Float16* r0 = (const _Float16*)fragment_rows[warp0 + 8 * m + 2 * (lane % 4)] + lane / 4;
      const _Float16* r1 = (const _Float16*)fragment_rows[warp0 + 8 * m + 2 * (lane % 4) + 1] + lane / 4;
      r[m] = pair_at(r0, r1);
    }
  }
  __syncthreads();
}
inline void ldmatrix_x4(unsigned long long addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  unsigned r[4]; ldmatrix_any(addr, r, false); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
inline void ldmatrix_x4_trans(unsigned long long addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  unsigned r[4]; ldmatrix_any(addr, r, true); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
inline float half_of(unsigned pair, int k) {
  unsigned short bits = k ? pair >> 16 : pair & 0xffff; _Float16 h; std::memcpy(&h, &bits, 2); return (float)h;
}
// m16n8k16: A (row, k) is in lane (row%8)*4 + (k%8)/2, register (row>=8) + 2(k>=8); B (k, n) in
// lane n*4 + (k%8)/2, register k>=8; D (row, col) in lane (row%8)*4 + col/2, register 2(row>=8) + col%2.
inline void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  const int lane = threadIdx.x & 31, warp0 = threadIdx.x - lane;
  unsigned* mine = fragments[threadIdx.x];
  mine[0] = a[0]; mine[1] = a[1]; mine[2] = a[2]; mine[3] = a[3]; mine[4] = b0; mine[5] = b1;
  __syncthreads();
  for (int e = 0; e < 4; ++e) {
    const int row = lane / 4 + 8 * (e >> 1), col = 2 * (lane % 4) + (e & 1);
    float sum = d[e];
    for (int k = 0; k < 16; ++k) {
      const float x = half_of(fragments[warp0 + (row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
      const float y = half_of(fragments[warp0 + col * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2);
      sum += x * y;
    }
    d[e] = sum;
  }
  __syncthreads();
}
""",
    ),
    (
        TRANSPOSE,
        r"""
alignas(16) unsigned transposed[1024];
// movmatrix .trans: lane l gets (row l/4, columns 2(l%4), +1) of the transpose, i.e. (rows
// 2(l%4), +1 of column l/4); element (row, col) is in lane row*4 + col/2, half col%2.
inline unsigned transpose8x8(unsigned x) {
  const int lane = threadIdx.x & 31, warp0 = threadIdx.x - lane, col = lane / 4, row = 2 * (lane % 4);
  transposed[threadIdx.x] = x;
  __syncthreads();
  const unsigned lo = transposed[warp0 + row * 4 + col / 2] >> (16 * (col % 2)) & 0xffff;
  const unsigned hi = transposed[warp0 + (row + 1) * 4 + col / 2] >> (16 * (col % 2)) & 0xffff;
  __syncthreads();
  return lo | hi << 16;
}
""",
    ),
    ('asm volatile("cp.async.commit_group;\\n" ::);', ";"),
    *((f'asm volatile("cp.async.wait_group {n};\\n" ::);', ";") for n in range(7)),
    *((f'asm volatile("cp.async.wait_group {n};\\n" ::: "memory");', ";") for n in range(7)),
    ("gd::exp2_approx(", "exp2f("),
    (PREFETCH_L2, "inline void prefetch_l2(const void*) {}"),
)


def _on_the_cpu(kernel: Kernel) -> str:
    """The kernel's source with the tensor-core stand-ins and its dynamic shared memory static."""
    source = kernel.source
    for original, stand_in in TENSOR_CORE_STAND_INS:
        source = source.replace(original, stand_in)
    dynamic = "extern __shared__ __align__(128) unsigned char smem[];"
    return source.replace(dynamic, f"alignas(128) static unsigned char smem[{max(kernel.shared_bytes, 16)}];")


# Each block's threads are fibers: a round resumes every unfinished one in turn until it
# reaches its next __syncthreads (or returns), so after a round all are at the same barrier.
LAUNCH = """
static std::function<void()> thread_body;
static void fiber_entry() {{ thread_body(); fibers::done[fibers::current] = true; }}
extern "C" void launch(void** args, int gx, int gy, int gz, int threads) {{
  constexpr size_t stack_bytes = 1 << 19;
  gridDim = {{(unsigned)gx, (unsigned)gy, (unsigned)gz}};
  blockDim = {{(unsigned)threads, 1, 1}};
  thread_body = [&] {{ {call}; }};
  fibers::threads.assign(threads, ucontext_t{{}});
  fibers::done.assign(threads, false);
  std::vector<std::unique_ptr<char[]>> stacks(threads);  // left uninitialised: untouched pages cost nothing
  for (auto& stack : stacks) stack.reset(new char[stack_bytes]);
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {{
    blockIdx = {{(unsigned)x, (unsigned)y, (unsigned)z}};
    for (int t = 0; t < threads; ++t) {{
      ucontext_t& fiber = fibers::threads[t];
      getcontext(&fiber);
      fiber.uc_stack = {{stacks[t].get(), 0, stack_bytes}};
      fiber.uc_link = &fibers::scheduler;
      makecontext(&fiber, fiber_entry, 0);
      fibers::done[t] = false;
    }}
    for (int running = threads; running > 0;)
      for (int t = 0; t < threads; ++t) {{
        if (fibers::done[t]) continue;
        fibers::current = t;
        threadIdx = {{(unsigned)t, 0, 0}};
        swapcontext(&fibers::scheduler, &fibers::threads[t]);
        running -= fibers::done[t];
      }}
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
    text = SHIM + _on_the_cpu(kernel) + LAUNCH.format(call=f"{kernel.name}({', '.join(args)})")
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


def _concrete(t: Tensor, symbols: Mapping[str, int]) -> Tensor:
    dim = tuple(evaluate(d, symbols) for d in t.dim)
    return dataclasses.replace(t, dim=dim, stride=tuple(evaluate(s, symbols) for s in t.stride))


def _grid(kernel: Kernel, symbols: Mapping[str, int]) -> tuple[int, int, int]:
    """The launch grid at these symbol values (GridExtent.blocks' formula)."""
    if kernel.blocks is None:
        return kernel.grid
    blocks = -(-evaluate(kernel.blocks.count, symbols) // kernel.blocks.per_block)
    scale = kernel.blocks.multiplier * math.prod(symbols[s.name] for s in kernel.blocks.times)
    grid = list(kernel.grid)
    grid[kernel.blocks.grid_axis] = min(max(1, blocks) * scale, kernel.blocks.cap)
    return (grid[0], grid[1], grid[2])


def run(
    fused: FusedNode,
    program: FusedProgram,
    memory: Mapping[str, Any],
    aligned: int,
    build: Path,
    symbols: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """The fused node's outputs (by name, logical dims) from its kernels run on the CPU, its
    inputs taken from ``memory`` (by name) and laid out with their strides; ``symbols``: the
    values of a dynamic graph's symbols."""
    symbols = symbols or {}
    buffers: dict[int, np.ndarray] = {}
    inputs = {t.id for t in fused.inputs}
    for t in (_concrete(t, symbols) for t in (*fused.inputs, *fused.outputs)):
        if t.is_pass_by_value:
            continue
        if t.data_type.is_packed:  # the packed bytes (graphdnn/packing.py), laid out as a buffer holds them
            dims, strides = byte_layout(t.name, t.data_type, t.static_dim, t.static_stride)
            buffers[t.id] = np.zeros(storage_bytes(t.name, t.data_type, t.static_dim, t.static_stride), np.uint8)
            np.lib.stride_tricks.as_strided(buffers[t.id], dims, strides)[...] = memory[t.name]
            continue
        integer = t.data_type.value in ("int8", "int32", "int64")  # weights, sequence lengths, indices
        dtype = (
            t.data_type.numpy
            if integer
            else {"double": np.float64, "half": np.float16}.get(t.data_type.value, np.float32)
        )
        buffers[t.id] = np.full(storage_extent(t.dim, t.stride), -77 if integer else np.nan, dtype=dtype)
        if t.id in inputs:
            _strided(buffers[t.id], t)[...] = memory[t.name]
    scratch = {s.name: np.full(-(-s.bytes // 4), np.nan, dtype=np.float32) for s in program.scratch}
    for kernel in program.kernels:
        if (
            kernel.bucket is not None
            and not kernel.bucket.low <= evaluate(kernel.bucket.count, symbols) <= kernel.bucket.high
        ):
            continue  # another size bucket's variant (codegen.buckets): binding launches only the call's
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
                elif param.kind is ParamKind.EXTENT:
                    assert param.symbol is not None
                    value = ctypes.c_longlong(symbols[param.symbol.name])
                else:
                    (t,) = [t for t in fused.inputs if t.id == param.tensor]
                    value = ctypes.c_double(float(np.asarray(memory[t.name]).reshape(-1)[0]))
                values.append(value)
                args[i] = ctypes.addressof(value)
        _library(kernel, build).launch(args, *_grid(kernel, symbols), kernel.block[0])
    return {t.name: np.array(_strided(buffers[t.id], _concrete(t, symbols))) for t in fused.outputs}


def check_across_the_range(graph: Any, values_list: list[dict[str, int]], temporary: Any, arch: int = 80) -> None:
    """The kernels of the dynamic ``graph`` (one fused node), emitted once for sm_``arch``, run at
    each symbol ``values`` on fresh random inputs against the reference (per-dtype tolerance);
    built in the session's cpu_emulation folder of pytest's ``temporary`` (tmp_path_factory)."""
    from codegen import emit_partition
    from fusion_rules import fuse
    from graphdnn import reference
    from graphdnn.compare import relative_error, tolerance
    from graphdnn.random_inputs import random_inputs
    from graphdnn.specialize import specialize

    build: Path = temporary.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    ir = graph.validate()
    partition = fuse(ir, arch=arch)
    (fused,), (program,) = partition.nodes, emit_partition(partition, arch)
    for i, values in enumerate(values_list):
        feeds = random_inputs(specialize(ir, values), i + 1)
        expected = reference.execute(ir, feeds)
        got = run(fused, program, feeds, i % 2, build, values)
        for t in ir.outputs:
            error = relative_error(got[t.name].astype(np.float64), expected[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name} at {values}: {error:.3g}"
