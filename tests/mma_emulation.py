"""The fp16 mma.sync GEMM kernels (codegen/families/gemm_mma.py) on the CPU, through
tests/cpu_emulation.py: their index math (implicit-GEMM gathers, swizzled tiles, fragment
addressing, staged epilogue, split-K partials) checked on a machine without a GPU.

The kernel's PTX building blocks are replaced by host stand-ins with the same contract:
``cp.async`` copies synchronously (so waits and commits are no-ops; a stage is refilled only
after the barrier that ends its reads, as on the GPU), ``ldmatrix`` (plain and ``.trans``) and
``mma.sync.m16n8k16`` exchange their operands through per-thread buffers between two block
barriers, every thread computing the fragment elements PTX gives it. Dynamic shared memory is
a global buffer, one block running at a time. fp16 only (the emulation's half is _Float16).
"""

from __future__ import annotations

import dataclasses

from codegen import Kernel

_STAND_INS = r"""
// ---- host stand-ins for the tensor-core GEMM building blocks (tests/mma_emulation.py) ----
alignas(128) unsigned char smem[SMEM_BYTES];
unsigned exchange_addr[1024];
unsigned exchange_regs[1024][6];
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - smem); }
inline void copy16(unsigned dst, const void* src, bool valid) {
  if (valid) std::memcpy(smem + dst, src, 16); else std::memset(smem + dst, 0, 16);
}
inline unsigned short smem_b16(unsigned addr, int element) {
  unsigned short v; std::memcpy(&v, smem + addr + 2 * element, 2); return v;
}
// Matrix j's 8 rows start at the addresses of lanes 8j..8j+7. Plain: lane l holds row l/4,
// columns 2(l%4), 2(l%4)+1; .trans: the transpose's, i.e. rows 2(l%4), 2(l%4)+1 of column l/4.
inline void ldmatrix(unsigned addr, unsigned* r, bool trans) {
  const int t = threadIdx.x, lane = t & 31, warp0 = t - lane;
  exchange_addr[t] = addr;
  __syncthreads();
  for (int j = 0; j < 4; ++j) {
    const int g = lane >> 2, c = (lane & 3) * 2;
    const unsigned* rows = exchange_addr + warp0 + 8 * j;
    const unsigned lo = trans ? smem_b16(rows[c], g) : smem_b16(rows[g], c);
    const unsigned hi = trans ? smem_b16(rows[c + 1], g) : smem_b16(rows[g], c + 1);
    r[j] = lo | (hi << 16);
  }
  __syncthreads();
}
inline void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  unsigned r[4]; ldmatrix(addr, r, false); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
inline void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  unsigned r[4]; ldmatrix(addr, r, true); r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
inline float half_bits(unsigned bits) { _Float16 h; unsigned short s = (unsigned short)bits; std::memcpy(&h, &s, 2); return (float)h; }
// m16n8k16, row-major A, column-major B; g = lane/4, q = lane%4. A: a0 (g, 2q..), a1 (g+8, 2q..),
// a2 (g, 2q+8..), a3 (g+8, 2q+8..); B: b0 (k 2q.., n g), b1 (k 2q+8.., n g); D: d0, d1 (g, 2q..),
// d2, d3 (g+8, 2q..).
inline void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  const int t = threadIdx.x, lane = t & 31, warp0 = t - lane;
  for (int i = 0; i < 4; ++i) exchange_regs[t][i] = a[i];
  exchange_regs[t][4] = b0; exchange_regs[t][5] = b1;
  __syncthreads();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const unsigned* r = exchange_regs[warp0 + l];
    const int g = l >> 2, q = (l & 3) * 2;
    for (int h = 0; h < 2; ++h) {
      const int shift = 16 * h;
      A[g][q + h] = half_bits(r[0] >> shift); A[g + 8][q + h] = half_bits(r[1] >> shift);
      A[g][q + 8 + h] = half_bits(r[2] >> shift); A[g + 8][q + 8 + h] = half_bits(r[3] >> shift);
      B[q + h][g] = half_bits(r[4] >> shift); B[q + 8 + h][g] = half_bits(r[5] >> shift);
    }
  }
  __syncthreads();
  const int g = lane >> 2, q = (lane & 3) * 2;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = q + (e & 1);
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    d[e] += sum;
  }
}
"""

# CUDA's vector types the staged epilogue and the split-K partials move floats with (float4
# is the shim's, tests/cpu_emulation.py)
_VECTOR_TYPES = """struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
"""
_FIRST = "// ---- tensor-core GEMM building blocks (sm_80+) ----"
_LAST = "// Byte offset of 16-byte chunk"
_DYNAMIC_SMEM = "extern __shared__ __align__(128) unsigned char smem[];"
_ASYNC_WAITS = (
    'asm volatile("cp.async.commit_group;\\n" ::);',
    'asm volatile("cp.async.wait_group %0;\\n" ::"n"(STAGES - 2));',
    'asm volatile("cp.async.wait_group 0;\\n" ::);',
)


def on_cpu(kernel: Kernel) -> Kernel:
    """``kernel`` (an fp16 mma.sync GEMM kernel, or a kernel without those building blocks, as
    the split-K reduction) with the host stand-ins in place of its PTX."""
    source = _VECTOR_TYPES + kernel.source
    if _FIRST not in source:
        return dataclasses.replace(kernel, source=source)
    assert "m16n8k16.row.col.f32.f16.f16.f32" in source, f"{kernel.name}: the emulation takes fp16 kernels only"
    start, end = source.index(_FIRST), source.index(_LAST)
    source = source[:start] + _STAND_INS.replace("SMEM_BYTES", str(max(kernel.shared_bytes, 16))) + source[end:]
    source = source.replace(_DYNAMIC_SMEM, "")
    for wait in _ASYNC_WAITS:
        source = source.replace(wait, "")
    assert 'asm volatile("cp.async' not in source and "ldmatrix.sync" not in source, kernel.name
    return dataclasses.replace(kernel, source=source)
