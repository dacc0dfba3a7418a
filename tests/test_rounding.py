"""One rounding rule (graphdnn.dtypes.round_to) for the reference, runtime scalars, the
constants compiled into kernels and the kernels' own conversions (the last on the GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen import emit_partition
from graphdnn import reference
from graphdnn.variant_pack import resolve


def constants_graph() -> gd.OperationGraphSpec:
    """y = x + int8(300) + int8(-7.5) + uint8(2.5) + s, s an int8 runtime scalar."""
    g = gd.OperationGraphSpec(name="constants", io_data_type="float")
    x = g.tensor([4], name="x")
    s = g.tensor([1], name="s", data_type="int8", is_pass_by_value=True)
    y = g.add(x, g.scalar(300, data_type="int8"))
    y = g.add(g.add(y, g.scalar(-7.5, data_type="int8")), g.scalar(2.5, data_type="uint8"))
    g.add(y, s).set_name("y").set_output(True)
    return g


def test_integer_constants_in_kernels_saturate_and_round_as_the_reference() -> None:
    """300 as int8 is 127 in the kernel, as in the reference (NumPy's cast wrapped it to 44);
    -7.5 and 2.5 round half to even."""
    graph = constants_graph()
    (kernel,) = [k for program in emit_partition(fr.fuse(graph), 90) for k in program.kernels]
    for literal in ("127.0f", "-8.0f", "2.0f"):
        assert literal in kernel.body
    assert "44.0f" not in kernel.body and "300" not in kernel.body
    out = reference.execute(graph, {"x": np.zeros(4, np.float32), "s": 0})
    np.testing.assert_array_equal(out["y"], [121.0] * 4)


@pytest.mark.parametrize(("given", "held"), [(300, 127.0), (-1e9, -128.0), (2.5, 2.0), (-3.5, -4.0), (math.nan, 0.0)])
def test_runtime_scalars_round_as_the_reference(given: float, held: float) -> None:
    graph = constants_graph()
    ir = graph.validate()
    x = np.zeros(4, np.float32)
    pack = resolve(ir, {"x": x, "s": given})
    assert pack.scalars[ir.tensor("s").id] == held
    np.testing.assert_array_equal(reference.execute(ir, {"x": x, "s": given})["y"], [121.0 + held] * 4)


def integer_conversions_graph() -> gd.OperationGraphSpec:
    """x / 2 stored as int8, uint8 and int32, and through an int8 virtual value (x / 2 + 0.25)."""
    g = gd.OperationGraphSpec(name="integer_conversions", io_data_type="float")
    x = g.tensor([16], name="x")
    for data_type in ("int8", "uint8", "int32"):
        g.mul(x, 0.5).set_name(data_type).set_data_type(data_type).set_output(True)
    inner = g.mul(x, 0.5).set_data_type("int8")
    g.add(inner, 0.25).set_name("through_int8").set_output(True)
    return g


# Halves of: ties (2.5, 1.5, -2.5, 0.5), near ties, saturation at each type's limits, inf, NaN.
HALVES = [
    5.0,
    3.0,
    -5.0,
    1.0,
    5.02,
    -4.98,
    254.0,
    255.0,
    510.0,
    -257.0,
    1e10,
    -1e10,
    math.inf,
    -math.inf,
    math.nan,
    0.0,
]


@pytest.mark.gpu
def test_kernels_convert_to_integers_as_the_reference() -> None:
    """Every element equal: nearest-even, saturation, NaN as 0 (gd::from<int type> in graphdnn.cuh)."""
    import torch

    from tests.gpu_check import poisoned, to_device, to_numpy

    graph = integer_conversions_graph()
    ir = graph.validate()
    x = np.array(HALVES, np.float32)
    expected = reference.execute(ir, {"x": x})
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    gd.compile(graph).execute({"x": to_device(x, ir.tensor("x")), **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        np.testing.assert_array_equal(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64), err_msg=t.name)


@pytest.mark.gpu
def test_kernels_use_constants_and_scalars_as_the_reference() -> None:
    import torch

    from tests.gpu_check import poisoned, to_device, to_numpy

    graph = constants_graph()
    ir = graph.validate()
    x = np.arange(4, dtype=np.float32)
    y = poisoned(ir.tensor("y"))
    gd.compile(graph).execute({"x": to_device(x, ir.tensor("x")), "s": 300, "y": y})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(y), reference.execute(ir, {"x": x, "s": 300})["y"])


def fp8_probe_values() -> np.ndarray:
    """Every fp8 value of both formats, the midpoints between neighbours (ties) and the floats
    either side of each, the overflow thresholds (e4m3 NaN past 464, e5m2 inf from 61440) and
    their neighbours, values under the smallest subnormal, signed zeros, infinities and NaNs."""
    import ml_dtypes

    values = []
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
        finite = np.unique(codes[np.isfinite(codes)])
        values += [finite, (finite[1:] + finite[:-1]) / 2]
    values.append(np.array([464, 480, 61440, 65536, 1e-9, 2**-17, 2**-10, 0.0], np.float32))
    probes = np.concatenate(values)
    probes = np.concatenate([probes, np.nextafter(probes, np.inf), np.nextafter(probes, -np.inf)])
    probes = np.concatenate([probes, -probes])
    return np.concatenate([probes, np.array([np.inf, -np.inf, np.nan, -np.nan], np.float32)]).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("data_type", ["fp8_e4m3", "fp8_e5m2"])
def test_kernels_convert_to_fp8_bit_for_bit_as_the_reference(data_type: str) -> None:
    """gd::from<fp8> (one cvt from sm_89, a branch for NaN and overflow) writes the reference's
    bytes for every probe: nearest even at each tie, NaN or inf past the range (inf signed)."""
    import torch

    from tests.gpu_check import poisoned, to_device

    x = fp8_probe_values()
    g = gd.OperationGraphSpec(name=f"to_{data_type}", io_data_type="float")
    g.identity(g.tensor([x.size], name="x")).set_name("y").set_data_type(data_type).set_output(True)
    ir = g.validate()
    expected = reference.execute(ir, {"x": x})["y"].view(np.uint8)
    y = poisoned(ir.tensor("y"))
    gd.compile(g).execute({"x": to_device(x, ir.tensor("x")), "y": y})
    torch.cuda.synchronize()
    got = y.view(torch.uint8).cpu().numpy()
    # Where the reference gives NaN, a NaN of either sign: the GPU's conversions and arithmetic
    # make canonical (positive) NaNs, and the kernel reads its fp8 value back through them.
    fp8 = ir.tensor("y").data_type.numpy
    both_nan = np.isnan(got.view(fp8).astype(np.float32)) & np.isnan(expected.view(fp8).astype(np.float32))
    wrong = np.flatnonzero((got != expected) & ~both_nan)
    assert wrong.size == 0, [(float(x[i]), hex(got[i]), hex(expected[i])) for i in wrong[:10]]
