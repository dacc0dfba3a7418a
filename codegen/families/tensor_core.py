"""mma.sync building blocks shared by the tensor-core kernels (GEMM, attention): ``ldmatrix``
fragment loads and the m16n8k16 tile product, for fp16 or bf16 operands."""

from __future__ import annotations

from graphdnn.dtypes import DataType

# The operand types the mma.sync m16n8k16 tile takes (fp32 accumulation).
TENSOR_CORE_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})

_FRAGMENTS = r"""
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// D = A * B + D, one m16n8k16 tile, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA_TYPE.MMA_TYPE.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""


def mma_fragments(data_type: DataType) -> str:
    """The device functions for operands of ``data_type`` (HALF or BFLOAT16)."""
    return _FRAGMENTS.replace("MMA_TYPE", "bf16" if data_type is DataType.BFLOAT16 else "f16")
