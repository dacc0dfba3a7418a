"""Device code the sm_90 kernels share: mbarriers, named barriers, the tensor-map kernel
parameter and TMA tile loads (the GEMM engine, gemm_ws.py, and Hopper attention)."""

from __future__ import annotations


def mbarrier_prelude(rank: int) -> str:
    """mbarrier and named-barrier helpers, the tensor-map parameter type, and TMA loads of
    2 .. ``rank`` dims (none for 0)."""
    loads = "".join(_tma_load(r) for r in range(2, rank + 1))
    return (
        r"""
// ---- TMA and mbarriers (sm_90) ----
namespace gd {
// A kernel parameter: the CUtensorMap the runtime encoded (runtime/tensor_map.py).
struct alignas(64) TensorMapArg {
  unsigned long long map[16];
};
}  // namespace gd

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives once and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The 128 threads of consumer warpgroup `consumer` meet (named barrier 1 + consumer).
__device__ __forceinline__ void warpgroup_sync(int consumer) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + consumer) : "memory");
}
// A consumer's staged fp32 subtile: rows of 64 floats; 16-byte chunk c of row r sits at chunk
// c ^ (r % 8), so that neither the fragment writes nor the 8-column reads conflict.
__device__ __forceinline__ int staged_at(int row, int col) { return row * 64 + ((((col >> 2) ^ (row & 7))) << 2) + (col & 3); }
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
"""
        + loads
    )


def _tma_load(rank: int) -> str:
    coords = ", ".join(f"int x{i}" for i in range(rank))
    operands = ", ".join(f"%{i + 3}" for i in range(rank))
    inputs = ", ".join(f'"r"(x{i})' for i in range(rank))
    return f"""
// The box of `map` at coordinates x0.. (innermost first) into shared memory at `dst`, completing
// bytes on mbarrier `bar`.
__device__ __forceinline__ void tma_load(unsigned dst, const gd::TensorMapArg* map, unsigned bar, {coords}) {{
  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{{operands}}}], [%2];\\n"
               ::"r"(dst), "l"(map), "r"(bar), {inputs}
               : "memory");
}}
"""
