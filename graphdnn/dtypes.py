"""Data types: the enum, what users may write for one, their NumPy counterparts, and the one
rule for rounding a value to a type."""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np

from .errors import DataTypeError


class DataType(enum.Enum):
    """Element types, named as in the cuDNN frontend's ``data_type`` enum.

    The value is the name used in graph JSON files.
    """

    NOT_SET = "not_set"
    FLOAT = "float"
    HALF = "half"
    BFLOAT16 = "bfloat16"
    DOUBLE = "double"
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    INT64 = "int64"
    BOOLEAN = "boolean"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP8_E8M0 = "fp8_e8m0"  # a power of two 2^-127..2^127 or NaN (OCP MX scales): no sign, no zero
    # 4-bit types, stored two per byte (graphdnn/packing.py): weights of weight-only GEMMs
    INT4 = "int4"  # two's complement, -8..7
    FP4_E2M1 = "fp4_e2m1"  # OCP MX FP4: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; no inf, no NaN

    @property
    def bits(self) -> int:
        """Bits per element: 4 for the packed types, else 8 times the NumPy item size."""
        return 4 if self in _PACKED else 8 * int(self.numpy.itemsize)

    @property
    def itemsize(self) -> int:
        """Bytes per element; the 4-bit types have none (two share a byte: packing.py sizes them)."""
        if self is DataType.NOT_SET:
            raise DataTypeError("NOT_SET has no size")
        if self in _PACKED:
            raise DataTypeError(f"{self.value} elements are packed two per byte; they have no byte size of their own")
        return int(self.numpy.itemsize)

    @property
    def is_packed(self) -> bool:
        """Two elements per byte (int4, fp4_e2m1): buffers hold the packed bytes (packing.py)."""
        return self in _PACKED

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds values of this type (bf16, fp8 and the 4-bit types via
        ml_dtypes, one 4-bit value per byte: feeds of a 4-bit tensor are packed bytes instead)."""
        try:
            return _NUMPY[self]
        except KeyError:
            raise DataTypeError("NOT_SET has no NumPy dtype") from None

    @property
    def is_floating(self) -> bool:
        return self in _FLOATING

    @property
    def is_set(self) -> bool:
        return self is not _NOT_SET

    def __repr__(self) -> str:
        return f"DataType.{self.name}"


_NOT_SET = DataType.NOT_SET  # a member read through the class costs a descriptor call; is_set runs per tensor

_FLOATING = frozenset(
    {
        DataType.FLOAT,
        DataType.HALF,
        DataType.BFLOAT16,
        DataType.DOUBLE,
        DataType.FP8_E4M3,
        DataType.FP8_E5M2,
        DataType.FP8_E8M0,
        DataType.FP4_E2M1,
    }
)
_PACKED = frozenset({DataType.INT4, DataType.FP4_E2M1})

_NUMPY: dict[DataType, np.dtype] = {
    DataType.FLOAT: np.dtype(np.float32),
    DataType.HALF: np.dtype(np.float16),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.DOUBLE: np.dtype(np.float64),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.BOOLEAN: np.dtype(np.bool_),
    DataType.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FP8_E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    DataType.INT4: np.dtype(ml_dtypes.int4),
    DataType.FP4_E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
}

_BY_NUMPY = {dtype: data_type for data_type, dtype in _NUMPY.items()}

# Short and framework spellings users write; every enum value and name is accepted too.
_ALIASES = {
    "fp32": DataType.FLOAT,
    "float32": DataType.FLOAT,
    "f32": DataType.FLOAT,
    "fp16": DataType.HALF,
    "float16": DataType.HALF,
    "f16": DataType.HALF,
    "bf16": DataType.BFLOAT16,
    "fp64": DataType.DOUBLE,
    "float64": DataType.DOUBLE,
    "f64": DataType.DOUBLE,
    "bool": DataType.BOOLEAN,
    "fp8": DataType.FP8_E4M3,
    "e4m3": DataType.FP8_E4M3,
    "float8_e4m3fn": DataType.FP8_E4M3,
    "e5m2": DataType.FP8_E5M2,
    "float8_e5m2": DataType.FP8_E5M2,
    "e8m0": DataType.FP8_E8M0,
    "float8_e8m0fnu": DataType.FP8_E8M0,
    "s4": DataType.INT4,
    "fp4": DataType.FP4_E2M1,
    "e2m1": DataType.FP4_E2M1,
    "float4_e2m1fn": DataType.FP4_E2M1,
}


def _spellings() -> dict[str, DataType]:
    """Every spelling as_data_type reads, for one lookup per tensor of a large file: values
    and names first (the first type in declaration order wins), then the aliases."""
    spellings: dict[str, DataType] = {}
    for data_type in DataType:
        spellings.setdefault(data_type.value, data_type)
        spellings.setdefault(data_type.name.lower(), data_type)
    for alias, data_type in _ALIASES.items():
        spellings.setdefault(alias, data_type)
    return spellings


_BY_SPELLING = _spellings()


def as_data_type(value: Any, *, what: str = "data type") -> DataType:
    """Turn what a user wrote for a type into a :class:`DataType`.

    Accepts the enum itself, its names and JSON values (``"bfloat16"``, ``"BFLOAT16"``),
    short spellings (``"bf16"``, ``"fp32"``), NumPy dtypes and scalar types, and torch
    dtypes (recognised by name, so torch need not be installed). ``None`` means NOT_SET.
    """
    if value is None:
        return DataType.NOT_SET
    if isinstance(value, DataType):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        if key in _BY_SPELLING:
            return _BY_SPELLING[key]
        raise DataTypeError(
            f"unknown {what} {value!r}; expected one of " + ", ".join(d.value for d in DataType if d.is_set)
        )
    if type(value).__module__ == "torch":  # a torch.dtype, e.g. torch.bfloat16
        return as_data_type(str(value), what=what)
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise DataTypeError(f"cannot interpret {value!r} as a {what}") from None
    if dtype in _BY_NUMPY:
        return _BY_NUMPY[dtype]
    raise DataTypeError(f"NumPy dtype {dtype} has no graphdnn {what}")


def round_to(data_type: DataType, values: Any) -> np.ndarray:
    """``values`` (float64) rounded to ``data_type`` and back, as storing them would.

    The one rounding rule: the reference backend, variant-pack scalars and the constants
    compiled into kernels all use it, and the kernels' own conversions (``gd::from`` in
    codegen/include/graphdnn.cuh) compute the same. Floating types: nearest, ties to even
    (ml_dtypes for bf16, fp8 and fp4); overflow gives inf, or NaN for fp8_e4m3; fp4_e2m1 saturates
    to +-6 and, having no NaN, makes NaN -0 (ml_dtypes). fp8_e8m0 holds
    powers of two only: ml_dtypes rounds to the nearest (ties up), and zero, negative values,
    inf, NaN and overflow become NaN. Integer types:
    nearest, ties to even, then saturated to the type's range, NaN becoming 0 (as the GPU's
    ``cvt.rni.sat`` does). Boolean: 1 for non-zero, NaN becoming 0.
    """
    values = np.asarray(values, dtype=np.float64)
    if data_type.is_floating:
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(data_type.numpy).astype(np.float64)
    if data_type is DataType.BOOLEAN:
        return (np.nan_to_num(values) != 0).astype(np.float64)
    low, high = _INTEGER_RANGE[data_type]
    return np.clip(np.rint(np.nan_to_num(values)), low, high)


def _float_range(dtype: np.dtype) -> tuple[float, float]:
    """The integer type's range as float64 values that convert back exactly: int64's maximum
    (2**63 - 1) is no float64, so its saturation limit is the largest float64 below 2**63
    (kernels saturate to 2**63 - 1 itself, 1023 away: a relative 1e-16)."""
    info = ml_dtypes.iinfo(dtype)  # NumPy's iinfo does not know int4
    high = float(info.max)
    return float(info.min), high if high <= info.max else float(np.nextafter(high, 0.0))


_INTEGER_RANGE = {
    t: _float_range(t.numpy) for t in DataType if t.is_set and not t.is_floating and t is not DataType.BOOLEAN
}
