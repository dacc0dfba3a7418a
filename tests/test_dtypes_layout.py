"""Data types (what users may write for one) and layouts (strides and the checks on them)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import graphdnn as gd
from graphdnn.dtypes import DataType, as_data_type
from graphdnn.layout import (
    MAX_DIM,
    check_dims,
    check_strides,
    is_packed,
    nchw_strides,
    nhwc_strides,
    packed_strides,
    stride_order,
)


# -- data types ----------------------------------------------------------------------------
@pytest.mark.parametrize("data_type", [d for d in DataType if d.is_set])
def test_every_type_is_found_by_enum_name_and_json_value(data_type: DataType) -> None:
    assert as_data_type(data_type) is data_type
    assert as_data_type(data_type.value) is data_type
    assert as_data_type(data_type.name) is data_type
    assert as_data_type(data_type.name.lower()) is data_type


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("bf16", DataType.BFLOAT16),
        ("BF16", DataType.BFLOAT16),
        (" bf16 ", DataType.BFLOAT16),
        ("fp32", DataType.FLOAT),
        ("float32", DataType.FLOAT),
        ("float16", DataType.HALF),
        ("fp16", DataType.HALF),
        ("fp64", DataType.DOUBLE),
        ("bool", DataType.BOOLEAN),
        ("e4m3", DataType.FP8_E4M3),
        ("float8_e5m2", DataType.FP8_E5M2),
        ("torch.bfloat16", DataType.BFLOAT16),
        ("torch.float16", DataType.HALF),
        ("torch.float32", DataType.FLOAT),
        ("torch.int64", DataType.INT64),
    ],
)
def test_aliases_and_torch_names(spelling: str, expected: DataType) -> None:
    assert as_data_type(spelling) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32, DataType.FLOAT),
        (np.dtype("float16"), DataType.HALF),
        (np.float64, DataType.DOUBLE),
        (np.int8, DataType.INT8),
        (np.uint8, DataType.UINT8),
        (np.int32, DataType.INT32),
        (np.bool_, DataType.BOOLEAN),
        (ml_dtypes.bfloat16, DataType.BFLOAT16),
        (np.dtype(ml_dtypes.bfloat16), DataType.BFLOAT16),
        (ml_dtypes.float8_e4m3fn, DataType.FP8_E4M3),
        (ml_dtypes.float8_e5m2, DataType.FP8_E5M2),
    ],
)
def test_numpy_and_ml_dtypes(value: object, expected: DataType) -> None:
    assert as_data_type(value) is expected
    assert expected.numpy == np.dtype(value)


def test_torch_dtype_objects_are_read_by_name_without_torch() -> None:
    class FakeTorchDtype:
        def __str__(self) -> str:
            return "torch.bfloat16"

    FakeTorchDtype.__module__ = "torch"
    assert as_data_type(FakeTorchDtype()) is DataType.BFLOAT16


def test_none_is_not_set() -> None:
    assert as_data_type(None) is DataType.NOT_SET
    assert not DataType.NOT_SET.is_set


@pytest.mark.parametrize(
    ("junk", "message"),
    [
        ("bfloat17", r"unknown data type 'bfloat17'; expected one of float, half, bfloat16"),
        ("", r"unknown data type ''"),
        ("torch.", r"unknown data type 'torch.'"),
        (np.complex64, r"NumPy dtype complex64 has no graphdnn data type"),
        (np.dtype("<U3"), r"NumPy dtype <U3 has no graphdnn data type"),
        (object(), r"cannot interpret <object object at .*> as a data type"),
        (3.5, r"cannot interpret 3.5 as a data type"),
    ],
)
def test_junk_is_rejected(junk: object, message: str) -> None:
    with pytest.raises(gd.DataTypeError, match=message):
        as_data_type(junk)


def test_error_names_what_the_type_was_for() -> None:
    with pytest.raises(gd.DataTypeError, match="unknown io_data_type 'fp33'"):
        gd.OperationGraphSpec(io_data_type="fp33")


@pytest.mark.parametrize(
    ("data_type", "itemsize", "floating"),
    [
        (DataType.FLOAT, 4, True),
        (DataType.HALF, 2, True),
        (DataType.BFLOAT16, 2, True),
        (DataType.DOUBLE, 8, True),
        (DataType.FP8_E4M3, 1, True),
        (DataType.FP8_E5M2, 1, True),
        (DataType.INT8, 1, False),
        (DataType.UINT8, 1, False),
        (DataType.INT32, 4, False),
        (DataType.INT64, 8, False),
        (DataType.BOOLEAN, 1, False),
    ],
)
def test_itemsize_and_is_floating(data_type: DataType, itemsize: int, floating: bool) -> None:
    assert data_type.itemsize == itemsize
    assert data_type.is_floating is floating


def test_not_set_has_no_size_or_numpy_type() -> None:
    assert not DataType.NOT_SET.is_floating
    with pytest.raises(gd.DataTypeError, match="NOT_SET has no size"):
        DataType.NOT_SET.itemsize  # noqa: B018
    with pytest.raises(gd.DataTypeError, match="NOT_SET has no NumPy dtype"):
        DataType.NOT_SET.numpy  # noqa: B018


# -- packed layouts ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dim", "nchw", "nhwc"),
    [
        ((2, 3, 5), (15, 5, 1), (15, 1, 3)),
        ((2, 3, 4, 5), (60, 20, 5, 1), (60, 1, 15, 3)),
        ((2, 3, 4, 5, 6), (360, 120, 30, 6, 1), (360, 1, 90, 18, 3)),
        ((1, 7, 1, 1), (7, 1, 1, 1), (7, 1, 7, 7)),
    ],
)
def test_channels_first_and_last_strides(dim: tuple[int, ...], nchw: tuple[int, ...], nhwc: tuple[int, ...]) -> None:
    assert nchw_strides(dim) == nchw == packed_strides(dim)
    assert nhwc_strides(dim) == nhwc
    check_strides(dim, nchw)
    check_strides(dim, nhwc)
    assert is_packed(dim, nchw) and is_packed(dim, nhwc)


def test_packed_strides_with_an_order_and_a_bad_order() -> None:
    assert packed_strides((2, 3, 4), (2, 0, 1)) == (3, 1, 6)
    with pytest.raises(gd.ShapeError, match=r"layout order \[0, 0, 1\] is not a permutation of 3 dims"):
        packed_strides((2, 3, 4), (0, 0, 1))


def test_stride_order_lists_dims_outermost_first_and_keeps_ties_in_logical_order() -> None:
    assert stride_order((2, 3, 4, 5), nhwc_strides((2, 3, 4, 5))) == (0, 2, 3, 1)
    assert stride_order((2, 3, 4, 5), nchw_strides((2, 3, 4, 5))) == (0, 1, 2, 3)
    # the size-1 dims share strides with their neighbours; ties go to the logical order
    assert stride_order((1, 3, 1, 1), (3, 1, 3, 3)) == (0, 2, 3, 1)


# -- stride checks -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dim", "stride"),
    [
        ((2, 3, 4), (12, 1, 3)),  # a permuted packed layout
        ((4, 3), (1, 4)),  # column-major
        ((2, 3), (10, 1)),  # rows of a wider tensor
        ((2, 3, 4), (40, 12, 2)),  # every other element of a bigger tensor
        ((3, 1, 4), (4, 0, 1)),  # a size-1 dim may carry any stride, zero included
        ((3, 1, 4), (4, 999, 1)),
        ((1,), (0,)),
    ],
)
def test_check_strides_accepts_permutations_and_gaps(dim: tuple[int, ...], stride: tuple[int, ...]) -> None:
    check_strides(dim, stride)


@pytest.mark.parametrize(
    ("dim", "stride", "message"),
    [
        (
            (2, 3),
            (2, 1),
            r"strides \[2, 1\] overlap for dims \[2, 3\]: dim 0 \(extent 2\) steps 2 but the dims inside it span 3",
        ),
        ((2, 2), (1, 1), r"strides \[1, 1\] overlap"),
        ((3,), (0,), r"strides \[0\] overlap for dims \[3\]: dim 0 \(extent 3\) steps 0"),
        ((2, 3), (0, 1), r"strides \[0, 1\] overlap"),
        ((2, 3), (3, -1), r"stride\[1\] = -1 is negative"),
        ((2, 3), (3,), r"1 strides for 2 dims"),
        ((2, 3), (3, 1, 1), r"3 strides for 2 dims"),
        ((2, 3), (3.0, 1), r"stride\[0\] is 3.0, not an integer"),
        ((2, 3), (3, True), r"stride\[1\] is True, not an integer"),
    ],
)
def test_check_strides_rejects(dim: tuple[int, ...], stride: tuple, message: str) -> None:
    with pytest.raises(gd.StrideError, match=message):
        check_strides(dim, stride)


# -- dim checks ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dim", "message"),
    [
        ((2, 0, 3), r"dim\[1\] = 0 is outside 1\.\.2147483647"),
        ((-1,), r"dim\[0\] = -1 is outside 1\.\.2147483647"),
        ((MAX_DIM + 1,), r"dim\[0\] = 2147483648 is outside"),
        ((MAX_DIM, MAX_DIM, 2), r"dims \[2147483647, 2147483647, 2\] hold \d+ elements, over 281474976710656"),
        ((), r"rank 0 is outside 1\.\.8"),
        ((1,) * 9, r"rank 9 is outside 1\.\.8"),
        ((2, 2.0), r"dim\[1\] is 2\.0, not an integer"),
        ((True, 2), r"dim\[0\] is True, not an integer"),
    ],
)
def test_check_dims_rejects(dim: tuple, message: str) -> None:
    with pytest.raises(gd.ShapeError, match=message):
        check_dims(dim)


def test_check_dims_accepts_the_limits() -> None:
    check_dims((1,))
    check_dims((MAX_DIM,))
    check_dims((1,) * 8)


# -- property: every permuted (and gapped) packed layout is valid and its order is recoverable ----
@st.composite
def dims_and_order(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    rank = draw(st.integers(1, 6))
    dim = draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank))
    order = draw(st.permutations(range(rank)))
    gaps = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    return dim, list(order), gaps


@given(dims_and_order())
def test_packed_strides_in_any_order_pass_the_check_and_give_the_order_back(
    case: tuple[list[int], list[int], list[int]],
) -> None:
    dim, order, gaps = case
    stride = packed_strides(dim, order)
    check_strides(dim, stride)
    assert is_packed(dim, stride)
    spanning = [axis for axis in order if dim[axis] > 1]
    assert [axis for axis in stride_order(dim, stride) if dim[axis] > 1] == spanning

    # the same order with gaps between dims (a strided slice of a bigger tensor)
    gapped = [0] * len(dim)
    step = 1
    for axis, gap in zip(reversed(order), gaps):
        gapped[axis] = step * gap
        step = gapped[axis] * dim[axis]
    check_strides(dim, gapped)
    assert [axis for axis in stride_order(dim, gapped) if dim[axis] > 1] == spanning
