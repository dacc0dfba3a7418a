"""rng: Philox4x32-10 against the Random123 known-answer vectors, the mask's definition element by
element, reproducibility from seed and offset, errors, JSON, NVRTC; on the GPU, masks bit-identical
to the reference (poisoned outputs) and dropout built on them."""

from __future__ import annotations

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


def dropout(io: str) -> gd.OperationGraphSpec:
    """y = x * mask / (1 - rate), the mask from runtime seed and offset; the mask, in a column-major
    layout, also written as a boolean output."""
    rate = 0.25
    g = gd.OperationGraphSpec(name=f"dropout_{io}", io_data_type=io, intermediate_data_type="float")
    x = g.tensor([7, 1000], name="x")
    seed = g.tensor([1], data_type="int64", is_pass_by_value=True, name="seed")
    offset = g.tensor([1], data_type="int64", is_pass_by_value=True, name="offset")
    mask = g.rng(seed, offset, 1.0 - rate, shape=[7, 1000], name="keep")
    g.scale(g.mul(x, mask), 1.0 / (1.0 - rate)).set_name("y").set_output(True)
    g.rng(seed, offset, 1.0 - rate, shape=[7, 1000], name="keep_mask").set_name("mask").set_stride(
        [1, 7]
    ).set_data_type("boolean").set_output(True)
    return g


@pytest.mark.parametrize("io", ["float", "half", "bfloat16", "int8"])
def test_kernels_compile_for_every_target(io: str) -> None:
    g, _ = mask_graph(2**40 + 1, 3, 0.5, [3, 5, 7])
    report = compile_graphs([dropout(io).validate(), g.validate()])
    assert report.failures == [], "\n\n".join(report.failures)


@pytest.mark.gpu
@pytest.mark.parametrize(("seed", "offset"), [(0, 0), (1234, 1), (2**40 + 3, 2**35 + 7)])
@pytest.mark.parametrize("io", ["float", "half", "bfloat16"])
def test_gpu_masks_are_bit_identical_to_the_reference(io: str, seed: int, offset: int) -> None:
    import torch

    from graphdnn.compare import relative_error, tolerance
    from tests.gpu_check import poisoned, to_device, to_numpy

    ir = dropout(io).validate()
    rng = np.random.default_rng(seed % 1000)
    feeds = {
        "x": rng.standard_normal((7, 1000)).astype(gd.DataType(io).numpy),
        "seed": np.array([seed], dtype=np.int64),
        "offset": np.array([offset], dtype=np.int64),
    }
    expected = gd.reference.execute(ir, feeds)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    pack = {"x": to_device(feeds["x"], ir.tensor("x")), "seed": feeds["seed"], "offset": feeds["offset"]}
    gd.compile(ir).execute({**pack, **outputs})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(to_numpy(outputs["mask"]), expected["mask"].astype(np.float64))
    # y is x times the mask and 1 / (1 - rate): the kernel rounds the product to float first
    error = relative_error(to_numpy(outputs["y"]), expected["y"])
    assert error <= tolerance(gd.DataType(io)), f"y: relative error {error:.3g}"
