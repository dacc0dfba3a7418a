"""block_scale_quantize / block_scale_dequantize: the reference against a per-block loop with
ml_dtypes conversions (bit-exact), the MXFP8 scale rule, saturation, NaN / inf / zero blocks,
partial blocks, layouts, the fp8_e8m0 type, JSON, and every validation error."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference

E4M3, E5M2, E8M0 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu
LARGEST = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
NUMPY = {"fp8_e4m3": E4M3, "fp8_e5m2": E5M2}


def quantize_graph(dims, block_size, element="fp8_e4m3", scale="float", axis=None, transpose=False, io="float"):
    g = gd.OperationGraphSpec(io_data_type=io, intermediate_data_type="float")
    x = g.tensor(list(dims), name="x")
    y, s = g.block_scale_quantize(x, block_size, axis=axis, transpose=transpose, name="q")
    y.set_output(True).set_data_type(element)
    s.set_output(True).set_data_type(scale)
    return g, y, s


def loop_quantize(x: np.ndarray, block_size: int, element: str, scale: str):
    """Each block of the last axis on its own, in Python floats and ml_dtypes casts."""
    rows, extent = x.shape
    blocks = -(-extent // block_size)
    y = np.empty(x.shape, dtype=NUMPY[element])
    s = np.empty((rows, blocks))
    for r in range(rows):
        for b in range(blocks):
            block = [float(v) for v in x[r, b * block_size : (b + 1) * block_size]]
            amax = math.nan if any(math.isnan(v) for v in block) else max(abs(v) for v in block)
            if scale == "fp8_e8m0":
                if not math.isfinite(amax):
                    sb = math.nan
                else:
                    k = -127
                    while k < 127 and amax / 2.0**k > LARGEST[element]:  # exact: powers of two
                        k += 1
                    sb = 2.0**k
            else:
                sb = float(np.float32(amax) / np.float32(LARGEST[element])) if math.isfinite(amax) else amax
                sb = 1.0 if sb == 0 else sb
            s[r, b] = sb
            for j, v in enumerate(block):
                with np.errstate(invalid="ignore"):
                    q = float(np.float32(v) / np.float32(sb))
                if not math.isnan(q):
                    q = min(max(q, -LARGEST[element]), LARGEST[element])
                y[r, b * block_size + j] = NUMPY[element](q)
    return y, s


def bits(values: np.ndarray, dtype) -> np.ndarray:
    """The stored bytes (NaN payloads compared as they are stored)."""
    return np.asarray(values).astype(dtype).view(np.uint8)


@pytest.mark.parametrize("element", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("scale", ["float", "fp8_e8m0"])
@pytest.mark.parametrize(("dims", "block_size"), [((3, 64), 32), ((2, 70), 32), ((4, 300), 128), ((1, 5), 16)])
def test_quantize_matches_the_block_loop_bit_for_bit(element, scale, dims, block_size, rng):
    x = (rng.standard_normal(dims) * rng.choice([1e-3, 1.0, 1e3], size=(dims[0], 1))).astype(np.float32)
    g, y, s = quantize_graph(dims, block_size, element, scale)
    out = reference.execute(g, {"x": x})
    want_y, want_s = loop_quantize(x, block_size, element, scale)
    np.testing.assert_array_equal(bits(out[y.name], NUMPY[element]), bits(want_y, NUMPY[element]))
    scale_type = E8M0 if scale == "fp8_e8m0" else np.float32
    np.testing.assert_array_equal(bits(out[s.name], scale_type), bits(want_s, scale_type))
    assert s.dim == (dims[0], -(-dims[1] // block_size))


def test_mxfp8_scales_are_the_smallest_power_of_two_that_fits():
    """amax 448 fits e4m3 with scale 1; just above it needs 2; 896 fits 2 exactly; 1e-30 needs 2^-108."""
    x = np.zeros((4, 32), dtype=np.float32)
    x[:, 0] = [448.0, np.nextafter(np.float32(448), np.float32(1e9)), 896.0, 1e-30]
    g, y, s = quantize_graph(x.shape, 32, scale="fp8_e8m0")
    out = reference.execute(g, {"x": x})
    np.testing.assert_array_equal(out[s.name].astype(np.float64)[:, 0], [1.0, 2.0, 2.0, 2.0**-108])
    np.testing.assert_array_equal(
        out[y.name].astype(np.float64)[:, 0], [448.0, 224.0, 448.0, 320.0]
    )  # 1e-30 * 2^108 = 324.5


def test_fp32_scales_saturate_instead_of_overflowing():
    """amax / 448 rounded to fp32 may come out below it: the largest element then exceeds 448
    by a rounding and saturates to 448 rather than becoming NaN."""
    values = np.float32([448.0 * 3.0, -448.0 * 3.0, 1.0])
    x = np.zeros((1, 3), dtype=np.float32)
    x[0] = values
    g, y, s = quantize_graph(x.shape, 3)
    out = reference.execute(g, {"x": x})
    assert out[s.name][0, 0] == np.float32(3.0)
    np.testing.assert_array_equal(out[y.name].astype(np.float64)[0], [448.0, -448.0, float(E4M3(1 / 3))])


@pytest.mark.parametrize("scale", ["float", "fp8_e8m0"])
def test_nan_inf_and_zero_blocks(scale):
    """NaN in a block: scale NaN and every element NaN. inf: the fp32 scale is inf (finite
    elements become 0, the inf NaN); the e8m0 scale NaN. All zeros: scale 1 (fp32) or 2^-127."""
    x = np.zeros((3, 4), dtype=np.float32)
    x[0] = [1.0, np.nan, 2.0, -3.0]
    x[1] = [1.0, np.inf, -2.0, 0.0]
    g, y, s = quantize_graph(x.shape, 4, scale=scale)
    out = reference.execute(g, {"x": x})
    got_y, got_s = out[y.name].astype(np.float64), out[s.name].astype(np.float64)
    assert np.isnan(got_s[0, 0]) and np.isnan(got_y[0]).all()
    if scale == "float":
        assert got_s[1, 0] == np.inf
        np.testing.assert_array_equal(np.isnan(got_y[1]), [False, True, False, False])
        np.testing.assert_array_equal(got_y[1, [0, 2, 3]], [0.0, 0.0, 0.0])
        assert got_s[2, 0] == 1.0
    else:
        assert np.isnan(got_s[1, 0]) and np.isnan(got_y[1]).all()
        assert got_s[2, 0] == 2.0**-127
    np.testing.assert_array_equal(got_y[2], 0.0)


def test_blocks_along_another_axis_and_transposed_layout(rng):
    x = rng.standard_normal((64, 3)).astype(np.float32)
    g, y, s = quantize_graph(x.shape, 32, axis=0, transpose=True)
    out = reference.execute(g, {"x": x})
    want_y, want_s = loop_quantize(x.T.copy(), 32, "fp8_e4m3", "float")
    np.testing.assert_array_equal(bits(out[y.name], E4M3), bits(want_y.T, E4M3))
    np.testing.assert_array_equal(out[s.name], want_s.T)
    assert s.dim == (2, 3) and y.stride == (1, 64) and s.stride == (1, 2)  # block axis innermost


@pytest.mark.parametrize("scale", ["float", "fp8_e8m0"])
def test_dequantize_inverts_quantize_within_fp8_rounding(scale, rng):
    x = rng.standard_normal((5, 100)).astype(np.float32)
    g, y, s = quantize_graph(x.shape, 32, scale=scale)
    back = g.block_scale_dequantize(y, s, 32, name="dq").set_output(True)
    out = reference.execute(g, {"x": x})
    scales = np.repeat(out[s.name].astype(np.float64), 32, axis=1)[:, :100]
    np.testing.assert_array_equal(out[back.name], (out[y.name].astype(np.float64) * scales).astype(np.float32))
    # e4m3 keeps 3 mantissa bits: within half an ulp of 448 (16) times the scale, 448 * scale >= amax
    assert np.all(np.abs(out[back.name] - x) <= 16 * scales)


def test_fp8_e8m0_is_a_data_type_rounded_as_ml_dtypes_rounds():
    values = np.array(
        [0.0, -1.0, 1.0, 1.5, 1.4999, 3.0, 2.0**-128, 1.2 * 2.0**-127, 1.5 * 2.0**-127, 2.0**128, np.inf, np.nan]
    )
    np.testing.assert_array_equal(
        bits(gd.dtypes.round_to(gd.DataType.FP8_E8M0, values), E8M0),
        [255, 255, 127, 128, 127, 129, 0, 0, 1, 255, 255, 255],
    )
    assert gd.DataType("fp8_e8m0").itemsize == 1 and gd.dtypes.as_data_type("e8m0") is gd.DataType.FP8_E8M0


def test_json_round_trip_keeps_attributes_and_types():
    g, _, _ = quantize_graph((4, 64), 32, element="fp8_e5m2", scale="fp8_e8m0", axis=-1, transpose=True)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature() and again.to_json() == text
    assert '"block_size": 32' in text and '"fp8_e8m0"' in text


# -- validation -------------------------------------------------------------------------------
def test_y_and_scale_default_to_e4m3_and_float():
    g = gd.OperationGraphSpec(io_data_type="half")
    y, s = g.block_scale_quantize(g.tensor([2, 64], name="x"), 32)
    y.set_output(True)
    s.set_output(True)
    ir = g.validate()
    assert [t.data_type.value for t in ir.outputs] == ["fp8_e4m3", "float"]


@pytest.mark.parametrize(
    ("element", "scale", "message"),
    [
        ("half", "float", r"output Y 'q::Y' is half; block_scale_quantize writes it as fp8_e4m3 or fp8_e5m2"),
        ("fp8_e4m3", "half", r"output scale 'q::scale' is half; .* writes it as float or fp8_e8m0"),
    ],
)
def test_output_types_outside_the_recipes_are_refused(element, scale, message):
    g, _, _ = quantize_graph((2, 64), 32, element, scale)
    with pytest.raises(gd.DataTypeError, match=rf"node 'q'.*{message}"):
        g.validate()


def test_input_types_are_checked():
    g = gd.OperationGraphSpec(io_data_type="double")
    with pytest.raises(gd.DataTypeError, match=r"node 'q'.*X 'x' is double; block_scale_quantize takes a float, half"):
        g.block_scale_quantize(g.tensor([2, 64], name="x"), 32, name="q")
    g = gd.OperationGraphSpec(io_data_type="float")
    x, s = g.tensor([2, 64], name="x"), g.tensor([2, 2], name="s")
    with pytest.raises(
        gd.DataTypeError, match=r"node 'dq'.*X 'x' is float; block_scale_dequantize takes fp8, 4-bit or int8 values"
    ):
        g.block_scale_dequantize(x, s, 32, name="dq")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"block_size": 0}, gd.AttributeValueError, "block_size must be >= 1, got 0"),
        ({"block_size": 32, "axis": 2}, gd.AttributeValueError, "axis 2 is out of range for rank 2"),
    ],
)
def test_bad_attributes(kwargs, error, message):
    g = gd.OperationGraphSpec(io_data_type="float")
    with pytest.raises(error, match=f"node 'q'.*{message}"):
        g.block_scale_quantize(g.tensor([2, 64], name="x"), name="q", **kwargs)


def test_dequantize_scale_dims_must_match_the_blocks():
    g = gd.OperationGraphSpec(io_data_type="float")
    x = g.tensor([2, 70], name="x", data_type="fp8_e4m3")
    s = g.tensor([2, 2], name="s")
    with pytest.raises(
        gd.ShapeError, match=r"node 'dq'.*scale has dims \[2, 2\], expected \[2, 3\]: one per block of 32"
    ):
        g.block_scale_dequantize(x, s, 32, name="dq")


def test_random_fp8_e8m0_inputs_are_powers_of_two_not_nan():
    from graphdnn.random_inputs import random_inputs

    g = gd.OperationGraphSpec(io_data_type="float")
    g.mul(g.tensor([64], name="s", data_type="fp8_e8m0"), g.tensor([64], name="x")).set_output(True)
    drawn = random_inputs(g.validate(), seed=0)["s"].astype(np.float64)
    assert not np.isnan(drawn).any() and np.all(np.log2(drawn) == np.round(np.log2(drawn)))
