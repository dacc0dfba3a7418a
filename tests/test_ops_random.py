"""rng: Philox4x32-10 against the Random123 known-answer vectors, the mask's definition element by
element, reproducibility from seed and offset, errors, JSON, NVRTC; on the GPU, masks bit-identical
to the reference (poisoned outputs) and dropout built on them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.ops.random import philox4x32_10, uniform

from .compile_check import compile_graphs


@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [  # Random123's kat_vectors for philox4x32_10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
)
def test_philox_matches_the_known_answers(
    counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    words = philox4x32_10([np.array([c], dtype=np.uint32) for c in counter], key)
    assert tuple(int(w[0]) for w in words) == expected


def mask_graph(seed: int, offset: int, p: float, dims: list[int]) -> tuple[gd.OperationGraphSpec, str]:
    g = gd.OperationGraphSpec(name="mask", io_data_type="float", intermediate_data_type="float")
    y = g.rng(seed, offset, p, shape=dims).set_output(True)
    return g, y.name


def run_mask(seed: int, offset: int, p: float, dims: list[int]) -> np.ndarray:
    g, name = mask_graph(seed, offset, p, dims)
    return gd.reference.execute(g, {})[name]


def test_each_element_is_its_own_philox_draw() -> None:
    """Element i: key (seed_lo, seed_hi), counter (i_lo, i_hi, offset_lo, offset_hi), 1 where the
    top 24 bits of word 0, over 2^24, are below p; 64-bit seeds and offsets use both halves."""
    seed, offset, p, dims = 2**40 + 17, 2**33 + 5, 0.3, [3, 4, 5]
    mask = run_mask(seed, offset, p, dims)
    for i, index in enumerate(np.ndindex(*dims)):
        counter = [np.array([w], dtype=np.uint32) for w in (i, 0, offset % 2**32, offset >> 32)]
        word = int(philox4x32_10(counter, (seed % 2**32, seed >> 32))[0][0])
        assert mask[index] == (1.0 if (word >> 8) / 2**24 < p else 0.0), index


def test_masks_are_reproducible_and_offsets_give_fresh_ones() -> None:
    first = run_mask(7, 0, 0.5, [64, 64])
    np.testing.assert_array_equal(run_mask(7, 0, 0.5, [64, 64]), first)
    assert np.mean(run_mask(7, 1, 0.5, [64, 64]) != first) > 0.4
    assert np.mean(run_mask(8, 0, 0.5, [64, 64]) != first) > 0.4
    for p in (0.1, 0.5, 0.9):
        assert abs(run_mask(3, 11, p, [256, 512]).mean() - p) < 0.005
    assert run_mask(3, 11, 0.0, [9]).sum() == 0 and run_mask(3, 11, 1.0, [9]).sum() == 9


def test_uniform_values_are_multiples_of_two_to_the_minus_24() -> None:
    u = uniform((1000,), 5, 6)
    assert ((u * 2**24) % 1 == 0).all() and u.min() >= 0 and u.max() < 1


def test_errors_json_and_runtime_scalars() -> None:
    g = gd.OperationGraphSpec(name="r", io_data_type="float", intermediate_data_type="float")
    seed = g.tensor([1], data_type="int64", is_pass_by_value=True, name="seed")
    offset = g.tensor([1], data_type="int64", name="offset")  # a device scalar
    with pytest.raises(gd.AttributeValueError, match=r"node 'p'.*bernoulli_probability 1.5 is not a probability"):
        g.rng(seed, offset, 1.5, shape=[4], name="p")
    with pytest.raises(gd.AttributeValueError, match=r"node 'd'.*'distribution' must be one of 'bernoulli'"):
        g.rng(seed, offset, 0.5, shape=[4], distribution="normal", name="d")
    y = g.rng(seed, offset, 0.5, name="later")
    with pytest.raises(gd.UndeclaredDimsError, match=r"node 'later'.*pass shape= or call set_dim"):
        g.validate()
    y.set_dim([5, 6]).set_output(True)
    again = gd.OperationGraphSpec.from_json(g.to_json())
    assert again.signature() == g.signature()
    feeds = {"seed": np.array([9], dtype=np.int64), "offset": np.array([4], dtype=np.int64)}
    np.testing.assert_array_equal(gd.reference.execute(g, feeds)[y.name], run_mask(9, 4, 0.5, [5, 6]))


RATE = 0.25


def dropout_graph(io: str, where: str) -> gd.OperationGraphSpec:
    """y = dropout(value) with the mask from runtime seed and offset, the value made by ``where``:
    an elementwise op, a matmul + bias, a layer, group or (training) batch norm or a softmax,
    whose kernel draws the mask;
    plus the same mask written alone, column-major (the first axis innermost) and boolean."""
    g = gd.OperationGraphSpec(name=f"dropout_{where}_{io}", io_data_type=io, intermediate_data_type="float")
    seed = g.tensor([1], data_type="int64", is_pass_by_value=True, name="seed")
    offset = g.tensor([1], data_type="int64", is_pass_by_value=True, name="offset")
    if where == "matmul":
        a, b, bias = g.tensor([40, 24], name="a"), g.tensor([24, 56], name="b"), g.tensor([1, 56], name="bias")
        value = g.add(g.matmul(a, b), bias)
    elif where in ("groupnorm", "batchnorm"):
        x = g.tensor([4, 8, 5, 7], stride=gd.nhwc_strides([4, 8, 5, 7]), name="x")
        s, b = g.tensor([1, 8, 1, 1], name="s"), g.tensor([1, 8, 1, 1], name="b")
        if where == "groupnorm":
            value = g.groupnorm(x, s, b, epsilon=1e-5, groups=2)[0]
        else:
            value = g.batchnorm(x, s, b, epsilon=1e-5)[0]
    else:
        x = g.tensor([7, 40, 56], name="x")
        if where == "layernorm":
            value = g.layernorm("inference", x, g.tensor([56], name="s"), g.tensor([56], name="b"), epsilon=1e-5)[0]
        else:
            value = g.softmax(x) if where == "softmax" else g.neg(x)
    dims = list(value.dim)
    keep = g.rng(seed, offset, 1.0 - RATE, shape=dims, name="keep")
    g.scale(g.mul(value, keep), 1.0 / (1.0 - RATE)).set_name("y").set_output(True)
    mask = g.rng(seed, offset, 1.0 - RATE, shape=dims, name="keep_mask").set_name("mask")
    mask.set_stride([math.prod(dims[:axis]) for axis in range(len(dims))]).set_data_type("boolean")
    mask.set_output(True)
    return g


WHERE = ("elementwise", "matmul", "layernorm", "softmax", "groupnorm", "batchnorm")


@pytest.mark.parametrize("where", WHERE)
def test_the_mask_is_drawn_in_the_kernel_that_uses_it(where: str) -> None:
    """rng reads no tensor: the epilogue (or group) that multiplies by it draws it in registers."""
    partition = gd.fuse(dropout_graph("half", where).validate())
    [fused] = [f for f in partition.nodes if any(n.name == "keep" for n in f.nodes)]
    assert {"keep", "y"} <= {n.name for n in fused.nodes} | {t.name for t in fused.outputs}
    assert not partition.materialized  # no mask in the workspace
    [alone] = [f for f in partition.nodes if any(n.name == "keep_mask" for n in f.nodes)]
    assert [n.name for n in alone.nodes] == ["keep_mask"]  # a graph output: its own kernel


def test_an_rng_leaves_an_epilogue_with_its_reader() -> None:
    """The sum is also a graph output, so the multiply cannot join the GEMM's epilogue: the mask
    goes with it into the elementwise kernel, not into the GEMM to be stored."""
    g = gd.OperationGraphSpec(name="leave", io_data_type="half", intermediate_data_type="float")
    a, b, bias = g.tensor([40, 24], name="a"), g.tensor([24, 56], name="b"), g.tensor([1, 56], name="bias")
    total = g.add(g.matmul(a, b), bias, name="sum").set_name("total").set_output(True)
    g.mul(total, g.rng(3, 4, 0.5, shape=[40, 56], name="keep"), name="drop").set_name("y").set_output(True)
    partition = gd.fuse(g.validate())
    assert [sorted(n.name for n in f.nodes) for f in partition.nodes] == [["matmul_0", "sum"], ["drop", "keep"]]
    assert not partition.materialized


@pytest.mark.parametrize("io", ["float", "half", "bfloat16", "fp8_e4m3"])
def test_kernels_compile_for_every_target(io: str) -> None:
    g, _ = mask_graph(2**40 + 1, 3, 0.5, [3, 5, 7])
    graphs = [dropout_graph(io, where).validate() for where in WHERE] + [g.validate()]
    report = compile_graphs(graphs)
    assert report.failures == [], "\n\n".join(report.failures)


@pytest.mark.gpu
@pytest.mark.parametrize(("seed", "offset"), [(0, 0), (1234, 1), (2**40 + 3, 2**35 + 7)])
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("io", ["float", "half", "bfloat16"])
def test_gpu_masks_are_bit_identical_to_the_reference(io: str, where: str, seed: int, offset: int) -> None:
    """The standalone mask exactly; y's zeros exactly where the reference drops (the values it
    scales are never 0), its values within the type's tolerance."""
    import torch

    from graphdnn.compare import relative_error, tolerance
    from graphdnn.random_inputs import random_inputs
    from tests.gpu_check import poisoned, to_device, to_numpy

    ir = dropout_graph(io, where).validate()
    feeds = {
        **random_inputs(ir, seed=offset % 97),
        "seed": np.array([seed], dtype=np.int64),
        "offset": np.array([offset], dtype=np.int64),
    }
    expected = gd.reference.execute(ir, feeds)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    pack = {t.name: feeds[t.name] if t.is_pass_by_value else to_device(feeds[t.name], t) for t in ir.inputs}
    gd.compile(ir).execute({**pack, **outputs})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(outputs["mask"]), expected["mask"].astype(np.float64))
    y, want = to_numpy(outputs["y"]), expected["y"].astype(np.float64)
    np.testing.assert_array_equal(y == 0, want == 0)
    error = relative_error(y, want)
    assert error <= tolerance(gd.DataType(io)), f"y: relative error {error:.3g}"
