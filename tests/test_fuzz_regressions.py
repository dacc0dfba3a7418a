"""Regression tests for what the structural fuzzer found, and for the bounds on work that
small inputs may ask for (file reads, storage extents, padding, host storage)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import graphdnn as gd
from codegen.nvrtc import compile_cubin
from codegen.pointwise import literal
from fusion_rules import fuse
from graphdnn.bounded_read import read_bounded
from graphdnn.layout import MAX_ELEMENTS, check_extent
from graphdnn.lower import lower
from graphdnn.reference_plan import MAX_HOST_GAP_BYTES, host_array
from graphdnn.signature import signature


def sources(graph: gd.OperationGraphSpec) -> list[tuple[str, str]]:
    """(name, CUDA source) of every kernel of ``graph`` for sm_90."""
    ir = graph.validate()
    return [(s.name, s.source) for s in lower(fuse(ir, arch=90), 90, signature(ir), lambda h: h).sources.values()]


# -- reference host arrays -----------------------------------------------------------------------
@pytest.mark.parametrize("data_type", ["fp8_e5m2", "fp8_e4m3", "bfloat16"])
def test_fp8_and_bf16_inputs_get_host_arrays_and_run_on_the_reference(data_type: str) -> None:
    """as_strided cannot rebuild fp8_e5m2 from its typestr ("<f1" not understood): a TypeError, not a result."""
    g = gd.OperationGraphSpec(name="narrow", io_data_type=data_type)
    x = g.tensor(name="x", dim=[2, 3], stride=[1, 2])
    g.relu(x).set_name("y").set_data_type("float").set_output(True)
    ir = g.validate()
    array = host_array(ir.tensor("x"), np.array([[-1.0, 2, 3], [4, -5, 6]]))
    assert array.dtype == ir.tensor("x").data_type.numpy
    assert tuple(s // array.itemsize for s in array.strides) == (1, 2)
    got = gd.compile(ir, backend="reference").execute({"x": array})["y"]
    np.testing.assert_array_equal(got, [[0, 2, 3], [4, 0, 6]])


def test_a_host_array_with_terabytes_of_gaps_is_refused_naming_the_tensor() -> None:
    """Strides of 2**40 used to make the reference allocate TiB (a MemoryError)."""
    g = gd.OperationGraphSpec(name="gaps", io_data_type="float")
    x = g.tensor(name="x", dim=[2, 3], stride=[2**40, 1])
    g.neg(x).set_name("y").set_output(True)
    ir = g.validate()
    with pytest.raises(gd.UnsupportedError, match=r"tensor 'x'.*bytes of gaps"):
        host_array(ir.tensor("x"))
    g2 = gd.OperationGraphSpec(name="gaps_out", io_data_type="float")
    x2 = g2.tensor(name="x", dim=[2, 3])
    g2.neg(x2).set_name("y").set_stride([2**31, 1]).set_output(True)
    plan = gd.compile(g2, backend="reference")
    with pytest.raises(gd.UnsupportedError, match=r"tensor 'y'"):
        plan.execute({"x": np.zeros((2, 3), np.float32)})


def test_host_arrays_may_have_gaps_up_to_the_limit() -> None:
    g = gd.OperationGraphSpec(name="slice", io_data_type="half")
    x = g.tensor(name="x", dim=[2, 3], stride=[MAX_HOST_GAP_BYTES // 2, 1])  # 2-byte elements
    g.neg(x).set_name("y").set_output(True)
    array = host_array(g.validate().tensor("x"), np.ones((2, 3)))
    assert array.strides == (MAX_HOST_GAP_BYTES, 2) and float(array.sum()) == 6


def test_the_reference_refuses_a_tensor_it_cannot_hold_before_allocating_it() -> None:
    """[1, 2**16] + [2**16, 1] is a valid graph of two small inputs and a 2**32-element output
    (32 GiB in float64): refused naming the output, not a MemoryError."""
    g = gd.OperationGraphSpec(name="outer", io_data_type="float")
    a, b = g.tensor(name="a", dim=[1, 2**16]), g.tensor(name="b", dim=[2**16, 1])
    g.add(a, b).set_name("y").set_output(True)
    ir = g.validate()
    feeds = {"a": np.zeros((1, 2**16), np.float32), "b": np.zeros((2**16, 1), np.float32)}
    with pytest.raises(gd.UnsupportedError, match=r"tensor 'y'.*4294967296 elements"):
        gd.reference.execute(ir, feeds)
    with pytest.raises(gd.UnsupportedError, match=r"tensor 'y'"):
        gd.compile(ir, backend="reference").execute(feeds)


# -- limits checked in validation ------------------------------------------------------------------
def test_a_storage_extent_over_the_limit_is_a_stride_error_naming_the_tensor() -> None:
    """2**31 elements stepped by 2**48 span ~2**79 elements: the kernels' 64-bit offsets overflow."""
    g = gd.OperationGraphSpec(name="extent", io_data_type="float")
    with pytest.raises(gd.StrideError, match=r"tensor 'x'.*span .* elements of memory, over"):
        x = g.tensor(name="x", dim=[2**31 - 1, 2], stride=[1, 2**48])
        g.neg(x).set_output(True)
        g.validate()
    check_extent([2, 2], [1, MAX_ELEMENTS - 2])  # spans MAX_ELEMENTS: exactly at the limit
    with pytest.raises(gd.StrideError):
        check_extent([2, 2], [1, MAX_ELEMENTS - 1])


def test_convolution_padding_is_bounded_by_the_input_and_filter_extents() -> None:
    """A 1x1 conv padded by 2**28 was a 1.2 KB file asking for a 2 GB output (and 8 s)."""
    document = {
        "format": "graphdnn.graph",
        "version": 1,
        "tensors": [
            {"id": 0, "name": "x", "dim": [1, 1, 4], "data_type": "float"},
            {"id": 1, "name": "w", "dim": [1, 1, 1], "data_type": "float"},
            {"id": 2, "name": "y", "dim": [1, 1, 4 + 2**29], "data_type": "float"},
        ],
        "nodes": [
            {
                "name": "conv",
                "op": "conv_fprop",
                "inputs": {"image": 0, "weight": 1},
                "outputs": {"y": 2},
                "attributes": {"pre_padding": [2**28], "post_padding": [2**28], "stride": [1], "dilation": [1]},
            }
        ],
    }
    with pytest.raises(gd.AttributeValueError, match=r"nodes\[0\], node 'conv': .*padding 268435456\+268435456"):
        gd.OperationGraphSpec.from_json(json.dumps(document))
    g = gd.OperationGraphSpec(name="edge", io_data_type="float")
    x, w = g.tensor(name="x", dim=[1, 1, 2]), g.tensor(name="w", dim=[1, 1, 3])
    # Up to the dilated filter extent (3), here larger than the input's (2).
    assert g.conv_fprop(x, w, pre_padding=[3], post_padding=[0]).dim == (1, 1, 3)
    with pytest.raises(gd.AttributeValueError, match=r"padding 4\+0 is over the limit of 3"):
        g.conv_fprop(x, w, pre_padding=[4], post_padding=[0])


def test_pooling_padding_is_bounded_by_the_input_extent() -> None:
    """A window of 2**27 padded by 2**27 - 1 on each side of a 2-element input took 15 s and
    2 GB on the reference, for a 2-element output."""
    g = gd.OperationGraphSpec(name="pool", io_data_type="float")
    x = g.tensor(name="x", dim=[1, 1, 2])
    with pytest.raises(gd.AttributeValueError, match=r"node 'pool': padding 134217727\+134217727 .* over the input"):
        g.pooling(x, mode="max", window=[2**27], stride=[2**27], padding=[2**27 - 1], name="pool")
    assert g.pooling(x, mode="max", window=[3], stride=[1], padding=[2]).dim == (1, 1, 4)


# -- bounded reads ---------------------------------------------------------------------------------
def test_reading_dev_zero_as_a_graph_stops_at_the_limit(tmp_path: Path) -> None:
    """stat() says /dev/zero is empty; the reader used to trust it and read forever (MemoryError)."""
    with pytest.raises(gd.FormatError, match=r"/dev/zero: file is over the \d+-byte limit"):
        gd.load("/dev/zero")
    link = tmp_path / "graph.json"
    os.symlink("/dev/zero", link)
    with pytest.raises(gd.FormatError, match=r"graph.json: file is over"):
        gd.load(link)


def test_read_bounded_reads_a_file_of_exactly_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, 10) == b"x" * 10
    with pytest.raises(gd.FormatError, match="over the 9-byte limit"):
        read_bounded(path, 9)
    with pytest.raises(gd.FormatError, match="cannot read"):
        read_bounded(tmp_path / "missing", 9)


# -- codegen -----------------------------------------------------------------------------------------
def test_a_float_attribute_beyond_float_range_compiles() -> None:
    """negative_slope=1e308 became the literal 1e+308f, which NVRTC rejects as out of range."""
    assert literal(1e308, "float") == "__int_as_float(0x7f800000)"
    assert literal(-1e-300, "float") == "-0.0f" and literal(0.1, "float") == "0.1f"
    assert literal(1e308, "double") == "1e+308"
    g = gd.OperationGraphSpec(name="slope", io_data_type="float")
    x = g.tensor(name="x", dim=[4, 5])
    g.leaky_relu(x, negative_slope=1e308).set_name("y").set_output(True)
    for name, source in sources(g):
        assert compile_cubin(source, name, 90)


def test_an_epilogue_reading_the_training_batchnorms_own_statistic_stays_unfused() -> None:
    """relu(bn.y) + bn.next_running_mean validated and ran on the reference, then codegen died
    with a KeyError: the fused kernel computes the statistics in another pass."""
    g = gd.OperationGraphSpec(name="bn_stat", io_data_type="float")
    x = g.tensor(name="x", dim=[2, 3, 4, 4])
    per_channel = [g.tensor(name=n, dim=[1, 3, 1, 1]) for n in ("scale", "bias", "running_mean", "running_var")]
    y, mean, inv, next_mean, next_var = g.batchnorm(
        x,
        *per_channel[:2],
        in_running_mean=per_channel[2],
        in_running_var=per_channel[3],
        epsilon=1e-5,
        momentum=0.1,
        name="bn",
    )
    for t in (mean, inv, next_var):
        t.set_output(True)
    g.add(g.relu(y, name="relu"), next_mean, name="add").set_name("out").set_output(True)
    ir = g.validate()
    partition = gd.fuse(ir)
    assert [[n.name for n in f.nodes] for f in partition.nodes] == [["bn", "relu"], ["add"]]
    assert any("add reads bn's next_running_mean" in r.reason for r in partition.rejections)
    for name, source in sources(g):
        assert compile_cubin(source, name, 90)
    feeds = {t.name: np.full(t.dim, 0.5, np.float32) for t in ir.inputs}
    assert np.isfinite(gd.reference.execute(ir, feeds)["out"]).all()


@pytest.mark.parametrize("role", ["image", "weight"])
def test_a_pass_by_value_tensor_is_refused_outside_scalar_roles_and_elementwise_ops(role: str) -> None:
    """A one-element pass-by-value image or weight validated, then the conv kernel indexed the
    scalar's parameter (a double) as a pointer and NVRTC refused it (fuzz seed 100)."""
    g = gd.OperationGraphSpec(name="conv_scalar", io_data_type="float")
    x = g.tensor(name="x", dim=[1, 1, 1, 1], is_pass_by_value=role == "image")
    w = g.tensor(name="w", dim=[1, 1, 1, 1], is_pass_by_value=role == "weight")
    name = "x" if role == "image" else "w"
    with pytest.raises(gd.StructureError, match=rf"node 'conv': {role} '{name}' is a pass-by-value scalar"):
        g.conv_fprop(x, w, name="conv")


def test_elementwise_ops_of_pass_by_value_scalars_alone_compile_and_run() -> None:
    g = gd.OperationGraphSpec(name="scalars", io_data_type="float")
    a = g.tensor(name="a", dim=[1], is_pass_by_value=True)
    b = g.tensor(name="b", dim=[1, 1], is_pass_by_value=True)
    g.add(g.relu(a), b).set_name("y").set_output(True)
    for name, source in sources(g):
        assert compile_cubin(source, name, 90)
    assert gd.reference.execute(g.validate(), {"a": -2.0, "b": 3.0})["y"].tolist() == [[3.0]]


@pytest.mark.parametrize("value", [-1.25, float("-inf")])
def test_neg_of_a_negative_constant_compiles(value: float) -> None:
    """neg(-1.25) rendered as (--1.25f), a decrement NVRTC refuses (fuzz seed 500)."""
    g = gd.OperationGraphSpec(name="neg_constant", io_data_type="float")
    x = g.tensor(name="x", dim=[2, 3])
    g.add(x, g.neg(g.scalar(value))).set_name("y").set_output(True)
    kernels = sources(g)
    assert any("(-(-" in source for _, source in kernels)
    for name, source in kernels:
        assert compile_cubin(source, name, 90)
    got = gd.reference.execute(g.validate(), {"x": np.zeros((2, 3), np.float32)})["y"]
    assert (got == -value).all()
