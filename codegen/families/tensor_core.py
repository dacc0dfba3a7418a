"""Tensor-core building blocks shared by the tensor-core kernels (GEMM, attention): which operand
types the tensor cores take and what changes with them (:class:`OperandTypes`), ``ldmatrix``
fragment loads and the mma.sync tile products."""

from __future__ import annotations

from dataclasses import dataclass

from graphdnn.dtypes import DataType

# The operand types the mma.sync m16n8k16 tile takes (fp32 accumulation).
TENSOR_CORE_TYPES = frozenset({DataType.HALF, DataType.BFLOAT16})
FP8_TYPES = frozenset({DataType.FP8_E4M3, DataType.FP8_E5M2})
# 8-bit operands: k32 tiles (mma.sync m16n8k32, wgmma m64nNk32), both operands K-major.
EIGHT_BIT_TYPES = FP8_TYPES | {DataType.INT8}
FP8_MIN_ARCH = 89  # mma.sync / cvt with e4m3 and e5m2 start with sm_89; wgmma with sm_90a

_PTX = {
    DataType.HALF: "f16",
    DataType.BFLOAT16: "bf16",
    DataType.FP8_E4M3: "e4m3",
    DataType.FP8_E5M2: "e5m2",
    DataType.INT8: "s8",
}


@dataclass(frozen=True)
class OperandTypes:
    """The A and B element types of a tensor-core GEMM, and what they decide: the PTX type names,
    the accumulator (fp32, or s32 for int8, exact), the k extent of one tensor-core step (32
    bytes of k: k16 for 16-bit operands, k32 for 8-bit ones) and how many elements a 16-byte
    copy moves. Every size the kernels share across types is in bytes; this converts."""

    a: DataType
    b: DataType

    @property
    def element_bytes(self) -> int:
        return self.a.itemsize

    @property
    def eight_bit(self) -> bool:
        return self.a in EIGHT_BIT_TYPES

    @property
    def integer(self) -> bool:
        return self.a is DataType.INT8

    @property
    def accumulator(self) -> str:
        """The C type of the accumulators (and of the staged tile the epilogue reads)."""
        return "int" if self.integer else "float"

    @property
    def accumulator_ptx(self) -> str:
        return "s32" if self.integer else "f32"

    @property
    def register(self) -> str:
        """The inline-asm constraint of one accumulator register."""
        return "r" if self.integer else "f"

    @property
    def k_step(self) -> int:
        """k elements per tensor-core step: 32 bytes of k."""
        return 32 // self.element_bytes

    @property
    def chunk(self) -> int:
        """Elements per 16-byte copy."""
        return 16 // self.element_bytes

    @property
    def min_arch(self) -> int:
        return FP8_MIN_ARCH if self.a in FP8_TYPES else 80

    def ptx(self, data_type: DataType) -> str:
        return _PTX[data_type]

    @property
    def suffix(self) -> str:
        """``.<accumulator>.<a>.<b>`` of the instruction's name."""
        return f".{self.accumulator_ptx}.{self.ptx(self.a)}.{self.ptx(self.b)}"


def operand_types(a: DataType, b: DataType) -> OperandTypes | None:
    """The tensor cores' view of operands ``a`` and ``b``, or None when no tensor-core path
    takes them: both fp16 or both bf16, both fp8 (e4m3 and e5m2 mix), or both int8."""
    if a in TENSOR_CORE_TYPES and b is a:
        return OperandTypes(a, b)
    if a in FP8_TYPES and b in FP8_TYPES:
        return OperandTypes(a, b)
    if a is DataType.INT8 and b is DataType.INT8:
        return OperandTypes(a, b)
    return None


def zero(c_type: str) -> str:
    """The literal 0 of accumulator or compute type ``c_type`` (float, double or int)."""
    return {"float": "0.0f", "double": "0.0"}.get(c_type, "0")


_FRAGMENTS = r"""
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// D = A * B + D, one m16n8kK_STEP tile, ACC_NAME accumulators.
__device__ __forceinline__ void mma_16816(ACC* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8kK_STEP.row.colMMA_TYPES {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+REG"(d[0]), "+REG"(d[1]), "+REG"(d[2]), "+REG"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""


def mma_fragments(data_type: DataType, b_type: DataType | None = None) -> str:
    """The device functions for operands of ``data_type`` (and ``b_type``, the same by default):
    the ldmatrix loads, which move 8 x 16-byte rows whatever the element type, and the
    ``mma_16816`` tile product (m16n8k16 for 16-bit operands, m16n8k32 for 8-bit ones; the
    fragments hold the same bytes of k either way)."""
    types = operand_types(data_type, b_type or data_type)
    assert types is not None
    return (
        _FRAGMENTS.replace("K_STEP", str(types.k_step))
        .replace("MMA_TYPES", f"{types.suffix}.{types.accumulator_ptx}")
        .replace("ACC_NAME", "s32" if types.integer else "fp32")
        .replace("ACC", types.accumulator)
        .replace("REG", types.register)
    )
