"""CUDA spellings of graphdnn data types, and the headers each one needs."""

from __future__ import annotations

import re
from collections.abc import Iterable

from graphdnn.dtypes import DataType

CUDA_TYPE = {
    DataType.FLOAT: "float",
    DataType.HALF: "__half",
    DataType.BFLOAT16: "__nv_bfloat16",
    DataType.DOUBLE: "double",
    DataType.INT8: "signed char",
    DataType.UINT8: "unsigned char",
    DataType.INT32: "int",
    DataType.INT64: "long long",
    DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "__nv_fp8_e4m3",
    DataType.FP8_E5M2: "__nv_fp8_e5m2",
    DataType.FP8_E8M0: "__nv_fp8_e8m0",
    DataType.INT4: "unsigned char",  # pointers to the packed bytes (graphdnn/packing.py)
    DataType.FP4_E2M1: "unsigned char",
}
# Twice the magnitude of each fp4_e2m1 code 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6), a nibble each.
FP4_DOUBLED = 0xC8643210

_HEADERS = {
    DataType.HALF: "cuda_fp16.h",
    DataType.BFLOAT16: "cuda_bf16.h",
    DataType.FP8_E4M3: "cuda_fp8.h",
    DataType.FP8_E5M2: "cuda_fp8.h",
    DataType.FP8_E8M0: "cuda_fp8.h",
}

# Types narrower than float: a value of such a tensor is rounded when stored, and a
# virtual value of such a type is rounded inside fused kernels too.
NARROW_FLOATS = frozenset({DataType.HALF, DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2, DataType.FP8_E8M0})


def cuda_type(data_type: DataType) -> str:
    return CUDA_TYPE[data_type]


def compute_type(types: Iterable[DataType]) -> str:
    """float, unless a tensor is double: then the kernel computes in double."""
    return "double" if DataType.DOUBLE in set(types) else "float"


def headers_for(source: str) -> list[str]:
    """The CUDA headers a kernel's source needs: those declaring the fp16/bf16/fp8 types it
    names, wherever they appear (tensors, rounded virtual values, casts), and no others."""
    needed = {_HEADERS[t] for t in _HEADERS if re.search(rf"\b{CUDA_TYPE[t]}\b", source)}
    # cuda_fp8.h declares conversions through half and bfloat16.
    if "cuda_fp8.h" in needed:
        needed |= {"cuda_fp16.h", "cuda_bf16.h"}
    return sorted(needed)


def load(data_type: DataType, expression: str, compute: str = "float") -> str:
    """An expression converting an element (``expression``) of ``data_type`` to ``compute``."""
    return f"gd::to<{compute}>({expression})"


def load_packed(data_type: DataType, pointer: str, offset: str, compute: str = "float") -> str:
    """An expression reading element ``offset`` of a 4-bit tensor as ``compute``: byte
    offset / 2, the low nibble for even offsets (graphdnn/packing.py)."""
    code = f"(({pointer}[({offset}) >> 1] >> ((({offset}) & 1) << 2)) & 15)"
    if data_type is DataType.INT4:
        return f"({compute})(({code} ^ 8) - 8)"
    magnitude = f"({compute})((0x{FP4_DOUBLED:X}u >> (({code} & 7) << 2)) & 15) * ({compute})0.5"
    return f"(({code} & 8) ? -{magnitude} : {magnitude})"


def store(data_type: DataType, expression: str) -> str:
    """An expression converting a compute value to ``data_type`` as the reference rounds it."""
    return f"gd::from<{cuda_type(data_type)}>({expression})"


def rounded(data_type: DataType, expression: str, compute: str = "float") -> str:
    """``expression`` rounded to ``data_type`` and back, for narrow virtual values."""
    if data_type in NARROW_FLOATS or not data_type.is_floating:
        return f"gd::rounded<{cuda_type(data_type)}, {compute}>({expression})"
    if data_type is DataType.FLOAT and compute == "double":
        return f"(double)(float)({expression})"
    return expression
