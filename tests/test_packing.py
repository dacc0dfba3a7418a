"""The 4-bit types (int4, fp4_e2m1) and their one packing (graphdnn/packing.py): two elements
per byte along the stride-1 dim, low nibble first; bad layouts, feeds and buffers refused
naming the tensor."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from graphdnn import reference
from graphdnn.dtypes import DataType, as_data_type, round_to
from graphdnn.errors import DataTypeError, FeedError, ShapeError
from graphdnn.layout import packed_strides
from graphdnn.packing import VALUES, byte_layout, pack, storage_bytes, unpack
from graphdnn.runtime.buffers import Buffer, check

FOUR_BIT = (DataType.INT4, DataType.FP4_E2M1)


def test_the_types_are_named_as_the_frontend_and_decode_as_ml_dtypes() -> None:
    assert as_data_type("int4") is DataType.INT4 and as_data_type("FP4_E2M1") is DataType.FP4_E2M1
    assert as_data_type(np.dtype(ml_dtypes.int4)) is DataType.INT4 and as_data_type("e2m1") is DataType.FP4_E2M1
    assert DataType.INT4.bits == 4 and DataType.HALF.bits == 16 and DataType.INT4.is_packed
    np.testing.assert_array_equal(VALUES[DataType.INT4], [*range(8), *range(-8, 0)])
    np.testing.assert_array_equal(VALUES[DataType.FP4_E2M1][:8], [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(VALUES[DataType.FP4_E2M1][8:], -VALUES[DataType.FP4_E2M1][:8])
    with pytest.raises(DataTypeError, match="int4 elements are packed two per byte"):
        DataType.INT4.itemsize  # noqa: B018


def test_rounding_saturates_as_the_types_hold() -> None:
    np.testing.assert_array_equal(round_to(DataType.INT4, [9.0, -9.5, 2.5, np.nan]), [7, -8, 2, 0])
    np.testing.assert_array_equal(round_to(DataType.FP4_E2M1, [0.7, 5.0, 7.0, -100.0]), [0.5, 4, 6, -6])


def test_a_row_major_int4_matrix_packs_along_its_rows_low_nibble_first() -> None:
    values = np.arange(-8, 8, dtype=np.float64).reshape(2, 8)
    packed = pack(values, DataType.INT4, (8, 1))
    assert packed.dtype == np.uint8 and packed.shape == (2, 4)
    assert packed[0, 0] == (0x8 | 0x9 << 4) and packed[1, 3] == (0x6 | 0x7 << 4)  # -8 then -7; 6 then 7
    # the same matrix stored column-major packs along its columns: byte (j, i) holds rows 2j, 2j + 1
    column_major = pack(values, DataType.INT4, (1, 2))
    assert column_major.shape == (1, 8) and column_major[0, 0] == (0x8 | 0x0 << 4)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Packed layouts of rank 1-3 in any dim order, the stride-1 dim of even extent."""
    rank = draw(st.integers(1, 3))
    dims = [draw(st.integers(1, 6)) for _ in range(rank)]
    order = draw(st.permutations(range(rank)))
    dims[order[-1]] = 2 * draw(st.integers(1, 5))
    return tuple(dims), packed_strides(dims, order)


@settings(max_examples=60, deadline=None)
@given(layout=layouts(), data_type=st.sampled_from(FOUR_BIT), seed=st.integers(0, 2**16))
def test_packing_round_trips_every_code(
    layout: tuple[tuple[int, ...], tuple[int, ...]], data_type: DataType, seed: int
) -> None:
    dims, strides = layout
    codes = np.random.default_rng(seed).integers(0, 16, dims)
    values = VALUES[data_type][codes]
    packed = pack(values, data_type, strides)
    assert packed.shape == byte_layout("w", data_type, dims, strides)[0]
    assert packed.size == storage_bytes("w", data_type, dims, strides)
    np.testing.assert_array_equal(unpack(packed, data_type, dims, strides, "w"), values)
    np.testing.assert_array_equal(unpack(packed.view(np.int8), data_type, dims, strides, "w"), values)


@pytest.mark.parametrize(
    ("dim", "stride", "message"),
    [
        ([4, 7], None, "packs two elements per byte along dim 1 (stride 1), whose extent 7 is odd"),
        ([4, 6], [7, 1], "has stride 7 along dim 0: strides of a 4-bit tensor other than the packed"),
        ([1, 1], None, "no dimension of extent > 1 has stride 1"),
    ],
)
def test_layouts_that_cannot_pack_are_refused_naming_the_tensor(
    dim: list[int], stride: list[int] | None, message: str
) -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    w = g.tensor(name="w", dim=dim, stride=stride, data_type="int4")
    y = g.block_scale_dequantize(w, g.tensor(name="s", dim=[1, dim[1]]), 32, axis=0)
    y.set_output(True)
    with pytest.raises(ShapeError, match="'w'") as caught:
        g.validate()
    assert message in str(caught.value)


def test_4bit_tensors_are_inputs_read_only_by_dequantize_and_matmul() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    w = g.tensor(name="w", dim=[4, 8], data_type="int4")
    g.add(w, w, name="plus").set_output(True)
    with pytest.raises(DataTypeError, match=r"node 'plus'.*'w' is int4; add does not read 4-bit tensors"):
        g.validate()
    g = gd.OperationGraphSpec(io_data_type="half")
    g.relu(g.tensor(name="x", dim=[4, 8]), name="act").set_output(True).set_data_type("int4")
    with pytest.raises(DataTypeError, match="4-bit tensors are graph inputs"):
        g.validate()


def _weight_graph() -> gd.Graph:
    g = gd.OperationGraphSpec(io_data_type="half")
    w = g.tensor(name="w", dim=[64, 6], stride=[1, 64], data_type="int4")
    g.block_scale_dequantize(w, g.tensor(name="s", dim=[2, 6]), 32, axis=0, name="deq").set_output(True)
    return g.validate()


def test_feeds_are_the_packed_bytes() -> None:
    ir = _weight_graph()
    s = np.ones((2, 6), np.float16)
    with pytest.raises(
        FeedError, match=r"'w' has dtype float16; a 4-bit \(int4\) tensor takes its packed bytes as uint8"
    ):
        reference.execute(ir, {"w": np.zeros((64, 6), np.float16), "s": s})
    with pytest.raises(FeedError, match=r"'w' has shape \[64, 6\]; int4 \[64, 6\] packed two per byte along dim 0"):
        reference.execute(ir, {"w": np.zeros((64, 6), np.uint8), "s": s})


def _buffer(shape: tuple[int, ...], strides: tuple[int, ...], data_type: DataType, pointer: int = 4096) -> Buffer:
    return Buffer(pointer, shape, strides, data_type, data_type.value, 0, "cuda:0", None)


def test_buffers_of_4bit_tensors_are_checked_as_their_packed_bytes() -> None:
    w = _weight_graph().tensors[0]
    check(w, _buffer((32, 6), (1, 32), DataType.UINT8), 0)
    check(w, _buffer((32, 6), (1, 32), DataType.INT8, pointer=4097), 0)  # bytes: any address
    with pytest.raises(FeedError, match=r"'w'.*has data type half; the graph declares int4, whose buffer holds"):
        check(w, _buffer((32, 6), (1, 32), DataType.HALF), 0)
    with pytest.raises(FeedError, match=r"has dims \[64, 6\]; int4 \[64, 6\] packed two per byte is \[32, 6\] bytes"):
        check(w, _buffer((64, 6), (1, 64), DataType.UINT8), 0)
    with pytest.raises(FeedError, match=r"has strides \[6, 1\], the graph declares \[1, 32\]"):
        check(w, _buffer((32, 6), (6, 1), DataType.UINT8), 0)


def test_a_4bit_graph_survives_json() -> None:
    g = gd.OperationGraphSpec(io_data_type="bfloat16")
    w = g.tensor(name="w", dim=[64, 6], stride=[1, 64], data_type="fp4_e2m1")
    g.block_scale_dequantize(w, g.tensor(name="s", dim=[1, 6]), 64, axis=0, name="deq").set_output(True)
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert again.validate().tensors[0].data_type is DataType.FP4_E2M1
    assert '"fp4_e2m1"' in g.to_json()
