"""The weight-only GEMM's problem as its kernels read it (gemm_weight_only.py picks the kernel,
gemm_weight_only_mma.py is the tensor-core one), and what keeps it off the tensor cores."""

from __future__ import annotations

from dataclasses import dataclass

from graphdnn.dtypes import DataType
from graphdnn.ir import Node, Tensor
from graphdnn.ops.weight_only import group_scales, rows_of

from ..cuda_types import cuda_type

MAX_ROWS = 16  # two m16n8k16 column halves of 8 tokens


@dataclass(frozen=True)
class WeightOnly:
    """The anchor seen as the kernels read it: strides in elements, rows folded (rows_of)."""

    node: Node
    a: Tensor
    w: Tensor
    scale: Tensor
    zero_point: Tensor | None  # B_zero_point: an asymmetric int4 weight's zero per group
    out: Tensor
    rows: int
    k: int
    n: int
    group: int
    a_row: int  # A's row stride
    c_row: int  # C's row stride

    @property
    def k_major(self) -> bool:
        """W packed along K (strides [1, column stride]): each column's k contiguous."""
        return self.w.static_stride[0] == 1

    @property
    def k_per_load(self) -> int:
        """k in one 16-byte load of a column: 32 int4 codes, 16 of one byte."""
        return 32 if self.w.data_type.is_packed else 16

    @property
    def activation(self) -> str:
        return cuda_type(self.a.data_type)


def problem_of(node: Node) -> WeightOnly:
    a, w, out = node.input("A"), node.input("B"), node.output("C")
    assert a is not None and w is not None and out is not None
    scale, group = group_scales(node)
    a_rows, c_rows = rows_of(a), rows_of(out)
    assert a_rows is not None and c_rows is not None, f"{node.name}: rows the rule should have refused"
    k, n = w.static_dim
    zero_point = node.input("B_zero_point")
    return WeightOnly(node, a, w, scale, zero_point, out, a_rows[0], k, n, group, a_rows[1], c_rows[1])


def tensor_core_reason(p: WeightOnly) -> str | None:
    """Why the tensor-core kernel cannot read this problem, or None."""
    if p.w.data_type not in (DataType.INT4, DataType.INT8, DataType.FP8_E4M3):
        return (
            f"W '{p.w.name}' is {p.w.data_type.value}: the tensor-core kernel dequantizes int4, int8 and fp8_e4m3 "
            "(FP4 is storage here)"
        )
    if p.rows > MAX_ROWS:
        return f"{p.rows} rows (tokens): the tensor-core kernel serves up to {MAX_ROWS}"
    if not p.k_major or p.w.static_stride[1] % p.k_per_load:
        return f"W '{p.w.name}' has strides {list(p.w.stride)}: the tensor-core kernel reads it k-contiguous in 16-byte columns"
    if p.k % p.k_per_load:
        return f"K = {p.k} is not a multiple of {p.k_per_load} (one 16-byte load of {p.w.data_type.value} per thread)"
    if p.a.static_stride[-1] != 1 or (p.rows > 1 and p.a_row % 8):
        return f"A '{p.a.name}' has strides {list(p.a.stride)}: the tensor-core kernel reads it k-contiguous in 16-byte rows"
    return None
