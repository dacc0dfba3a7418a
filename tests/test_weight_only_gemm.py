"""Weight-only 4-bit and 8-bit GEMM (issue 12): matmul(A fp16 / bf16, block_scale_dequantize(W
int4 / fp4_e2m1 / int8 / fp8_e4m3, group scales along K or one scale per column)). The reference against a hand-written NumPy product, the
matmul form the rule builds, the rule and its near misses, the kernels compiled for sm_80 and
sm_90 and run on the CPU (tests/cpu_emulation.py), and on the GPU against the reference."""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from codegen.context import EmitContext
from codegen.emit import emit_partition, emitter
from codegen.families.gemm import candidates
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.dtypes import DataType
from graphdnn.errors import DataTypeError, ShapeError, UnsupportedError
from graphdnn.packing import unpack
from graphdnn.random_inputs import random_inputs
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.gpu_check import check_on_gpu


@dataclass(frozen=True)
class WeightOnly:
    """C = A [*batch, m, k] @ dequantize(W [k, n], scales per ``group`` k, or per column where
    ``group`` is None), W stored as [n, k] (``k_major``, packed along K) or [k, n] (along N)."""

    m: int
    k: int
    n: int
    group: int | None = 128
    k_major: bool = True
    act: str = "half"
    scale: str = "half"
    weight: str = "int4"
    out: str | None = None
    batch: tuple[int, ...] = ()
    zero: str | None = None  # the zero points' type, if any (asymmetric int4)

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name="weight_only", io_data_type=self.act, intermediate_data_type=self.act)
        a = g.tensor(name="a", dim=[*self.batch, self.m, self.k])
        stride = [1, self.k] if self.k_major else [self.n, 1]
        w = g.tensor(name="w", dim=[self.k, self.n], stride=stride, data_type=self.weight)
        groups = [-(-self.k // self.block), self.n]
        s = g.tensor(name="s", dim=groups, data_type=self.scale)
        z = g.tensor(name="z", dim=groups, stride=[1, groups[0]], data_type=self.zero) if self.zero else None
        c = g.matmul(a, g.block_scale_dequantize(w, s, self.block, axis=0, zero_point=z, name="deq"), name="mm")
        c.set_name("c").set_output(True)
        if self.out:
            c.set_data_type(self.out)
        return g

    @property
    def block(self) -> int:
        """k per scale: the group, or all of K (per-channel)."""
        return self.group or self.k


def by_hand(case: WeightOnly, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The semantics, written out: each weight's code decoded, less its group's zero point,
    times its group's scale, rounded to A's type; then the float64 product."""
    stride = (1, case.k) if case.k_major else (case.n, 1)
    if case.weight in ("int8", "fp8_e4m3"):
        w = feeds["w"].astype(np.float64)
    else:
        w = unpack(feeds["w"], DataType(case.weight), (case.k, case.n), stride, "w")
    s = feeds["s"].astype(np.float64)
    z = feeds["z"].astype(np.float64) if case.zero else np.zeros_like(s)
    g = case.block
    scaled = np.array([[(w[i, j] - z[i // g, j]) * s[i // g, j] for j in range(case.n)] for i in range(case.k)])
    return np.asarray(feeds["a"].astype(np.float64) @ scaled.astype(gd.DataType(case.act).numpy).astype(np.float64))


# ---- reference and validation ----


@settings(max_examples=20, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 6).map(lambda x: 32 * x + 2 * (x % 3)),
    n=st.integers(1, 12),
    group=st.sampled_from([32, 64, 128, None]),
    k_major=st.booleans(),
    act=st.sampled_from(["half", "bfloat16"]),
    scale=st.sampled_from(["half", "bfloat16", "float"]),
    weight=st.sampled_from(["int4", "fp4_e2m1", "int8", "fp8_e4m3"]),
    zero=st.sampled_from([None, "half", "bfloat16", "float"]),
    seed=st.integers(0, 2**16),
)
def test_the_reference_is_the_hand_written_product(
    m: int,
    k: int,
    n: int,
    group: int | None,
    k_major: bool,
    act: str,
    scale: str,
    weight: str,
    zero: str | None,
    seed: int,
) -> None:
    zero = zero if weight == "int4" else None  # zero points are for int4 weights
    n += n % 2 if weight in ("int4", "fp4_e2m1") and not k_major else 0  # 4-bit packed along N: whole bytes
    case = WeightOnly(m, k, n, group, k_major, act, scale, weight, out="float", zero=zero)
    ir = case.build().validate()
    feeds = random_inputs(ir, seed)
    got = reference.execute(ir, feeds)["c"].astype(np.float64)
    want = by_hand(case, feeds)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("form", ["dequantize", "matmul"])
def test_random_int8_weights_span_the_whole_type(form: str) -> None:
    """-128..127, so that the tests reach the codes the dequantize tricks treat specially
    (the int8 GEMM's operands keep the small default range)."""
    if form == "dequantize":
        ir = WeightOnly(2, 64, 64, group=None, weight="int8").build().validate()
    else:
        g = gd.OperationGraphSpec(io_data_type="half")
        w = g.tensor(name="w", dim=[64, 64], stride=[1, 64], data_type="int8")
        g.matmul(g.tensor(name="a", dim=[2, 64]), w, B_scale=g.tensor(name="s", dim=[1, 64])).set_output(True)
        ir = g.validate()
    w = random_inputs(ir, 3)["w"]
    assert w.min() == -128 and w.max() == 127


@pytest.mark.parametrize("zero", [None, "bfloat16"])
def test_the_matmul_form_means_the_dequantize_form(zero: str | None) -> None:
    """The anchor the rule builds (a 4-bit B with B_scale, and B_zero_point) computes what the
    two nodes do, and survives JSON."""
    case = WeightOnly(3, 96, 40, group=32, zero=zero)
    feeds = random_inputs(case.build().validate(), 4)
    g = gd.OperationGraphSpec(io_data_type="half")
    a = g.tensor(name="a", dim=[3, 96])
    w = g.tensor(name="w", dim=[96, 40], stride=[1, 96], data_type="int4")
    s = g.tensor(name="s", dim=[3, 40])
    z = g.tensor(name="z", dim=[3, 40], stride=[1, 3], data_type=zero) if zero else None
    g.matmul(a, w, B_scale=s, B_zero_point=z, name="mm").set_name("c").set_output(True)
    want = reference.execute(case.build().validate(), feeds)["c"]
    np.testing.assert_array_equal(reference.execute(g.validate(), feeds)["c"], want)
    again = gd.OperationGraphSpec.from_json(g.to_json()).validate()
    np.testing.assert_array_equal(reference.execute(again, feeds)["c"], want)


def _weight_only(k: int, scale_dims: list[int], **types: str) -> None:
    g = gd.OperationGraphSpec(io_data_type=types.get("A", "half"))
    w = g.tensor(name="w", dim=[k, 16], stride=[1, k], data_type=types.get("B", "int4"))
    scale = g.tensor(name="s", dim=scale_dims, data_type=types.get("B_scale", "half"))
    zero_dims = [int(d) for d in types.get("zero_dims", ",".join(map(str, scale_dims))).split(",")]
    zero = g.tensor(name="z", dim=zero_dims, data_type=types["B_zero_point"]) if "B_zero_point" in types else None
    g.matmul(g.tensor(name="a", dim=[2, k]), w, B_scale=scale, B_zero_point=zero, name="wmm").set_output(True)
    g.validate()


@pytest.mark.parametrize(
    ("k", "scale_dims", "types", "error", "message"),
    [
        (256, [3, 16], {}, ShapeError, "B_scale has dims [3, 16], expected [2, 16] or [4, 16] or [8, 16]"),
        (256, [2, 8], {}, ShapeError, "one scale per group of 32, 64 or 128 k per column"),
        (256, [2, 16], {"A": "float"}, DataTypeError, "takes half or bfloat16 activations"),
        (256, [2, 16], {"B_scale": "fp8_e8m0"}, DataTypeError, "float, half or bfloat16 group scales"),
        (256, [2, 16], {"B_zero_point": "int8"}, DataTypeError, "float, half or bfloat16 zero points"),
        (
            256,
            [2, 16],
            {"B_zero_point": "half", "zero_dims": "4,16"},
            ShapeError,
            "B_zero_point has dims [4, 16], expected B_scale's [2, 16]",
        ),
        (
            256,
            [2, 16],
            {"B_zero_point": "half", "B": "fp4_e2m1"},
            ShapeError,
            "B 'w' is fp4_e2m1: zero points are for int4 weights",
        ),
        (
            256,
            [2, 16],
            {"B_zero_point": "half", "B": "int8"},
            ShapeError,
            "B 'w' is int8: zero points are for int4 weights (int8 and fp8 weights are symmetric)",
        ),
        (256, [3, 16], {"B": "int8"}, ShapeError, "B_scale has dims [3, 16], expected [2, 16] or [4, 16] or [8, 16]"),
        (256, [1, 8], {"B": "int8"}, ShapeError, "(or [1, 16]: one per column)"),
        (
            256,
            [2, 16],
            {"B": "int8", "A": "float"},
            DataTypeError,
            "of int8 weights takes half or bfloat16 activations",
        ),
        (256, [1, 16], {"B": "int8", "B_scale": "int32"}, DataTypeError, "float, half or bfloat16 group scales"),
    ],
)
def test_bad_weight_only_matmuls_are_refused_naming_the_node(
    k: int, scale_dims: list[int], types: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        _weight_only(k, scale_dims, **types)
    assert message in str(caught.value) and "wmm" in str(caught.value)


@pytest.mark.parametrize(
    ("weight", "zero_dims", "zero_type", "message"),
    [
        (
            "fp8_e4m3",
            [64, 1],
            "float",
            "zero_point 'z' is bound but X 'w' is fp8_e4m3: zero points are for int4 weights",
        ),
        ("int4", [64, 2], "float", "zero_point has dims [64, 2], expected [64, 1]: one per block of 32"),
        ("int4", [64, 1], "int32", "zero_point 'z' is int32; block_scale_dequantize takes zero points"),
    ],
)
def test_bad_zero_points_are_refused_naming_the_node(
    weight: str, zero_dims: list[int], zero_type: str, message: str
) -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    w = g.tensor(name="w", dim=[64, 32], data_type=weight)
    z = g.tensor(name="z", dim=zero_dims, data_type=zero_type)
    with pytest.raises((ShapeError, DataTypeError)) as caught:
        g.block_scale_dequantize(w, g.tensor(name="s", dim=[64, 1]), 32, zero_point=z, name="deq")
    assert message in str(caught.value) and "deq" in str(caught.value)


@pytest.mark.parametrize("a_type", ["int8", "half"])
def test_an_int8_b_without_b_scale_or_with_an_int8_a_is_no_weight_only_matmul(a_type: str) -> None:
    """int8 x int8 stays the int8 GEMM (its scales are A_scale and B_scale together), and an
    int8 B without B_scale an ordinary matmul of its values."""
    from graphdnn.ops.weight_only import is_weight_only

    g = gd.OperationGraphSpec(io_data_type="half")
    b = g.tensor(name="b", dim=[64, 8], data_type="int8")
    g.matmul(g.tensor(name="a", dim=[2, 64], data_type=a_type), b, name="mm").set_output(True)
    (node,) = g.validate().nodes
    assert not is_weight_only(node)
    g = gd.OperationGraphSpec(io_data_type="half")
    b = g.tensor(name="b", dim=[64, 8], data_type="int8")
    a = g.tensor(name="a", dim=[2, 64], data_type="int8")
    with pytest.raises(ShapeError, match=r"mm.*a block-scaled matmul binds both A_scale and B_scale"):
        g.matmul(a, b, B_scale=g.tensor(name="s", dim=[1, 8]), name="mm")


def test_a_zero_point_on_a_16_bit_matmul_is_refused() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    b = g.tensor(name="b", dim=[64, 8])
    z = g.tensor(name="z", dim=[2, 8])
    with pytest.raises(ShapeError, match=r"mm.*B_zero_point 'z' is bound but B 'b' is half"):
        g.matmul(g.tensor(name="a", dim=[2, 64]), b, B_zero_point=z, name="mm")


# ---- the fusion rule ----


def test_the_rule_makes_one_weight_only_gemm() -> None:
    partition = fuse(WeightOnly(16, 256, 40).build(), arch=80)
    assert [f.rule for f in partition.nodes] == ["weight_only_matmul"]
    anchor = partition.nodes[0].anchor
    assert anchor is not None and anchor.input("B") is not None and anchor.input("B").data_type is DataType.INT4
    assert anchor.input("B_zero_point") is None
    (asymmetric,) = fuse(WeightOnly(16, 256, 40, zero="half").build(), arch=80).nodes
    assert asymmetric.rule == "weight_only_matmul" and asymmetric.anchor is not None
    zero_point = asymmetric.anchor.input("B_zero_point")
    assert zero_point is not None and zero_point.name == "z"


@pytest.mark.parametrize("weight", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("group", [32, None], ids=["groups", "per_channel"])
def test_the_rule_makes_one_8_bit_weight_only_gemm(group: int | None, weight: str) -> None:
    (gemm,) = fuse(WeightOnly(5, 256, 40, group=group, weight=weight).build(), arch=80).nodes
    assert gemm.rule == "weight_only_matmul" and gemm.anchor is not None
    b, scale = gemm.anchor.input("B"), gemm.anchor.input("B_scale")
    assert b is not None and b.data_type is DataType(weight)
    assert scale is not None and list(scale.dim) == [8 if group else 1, 40]


def test_fp8_e5m2_weights_run_as_written_with_the_reason() -> None:
    partition = fuse(WeightOnly(5, 256, 40, weight="fp8_e5m2").build(), arch=90)
    reasons = [str(r.reason) for r in partition.rejections if r.rule == "weight_only_matmul"]
    assert any("deq dequantizes fp8_e5m2 weights; the weight-only GEMM takes int4" in r for r in reasons), reasons


def test_blocks_that_are_neither_a_group_nor_k_run_as_written() -> None:
    g = gd.OperationGraphSpec(io_data_type="half", intermediate_data_type="half")
    w = g.tensor(name="w", dim=[256, 8], stride=[1, 256], data_type="int8")
    deq = g.block_scale_dequantize(w, g.tensor(name="s", dim=[3, 8]), 96, axis=0, name="deq")
    g.matmul(g.tensor(name="a", dim=[2, 256]), deq, name="mm").set_output(True)
    reasons = [str(r.reason) for r in fuse(g, arch=90).rejections if r.rule == "weight_only_matmul"]
    assert any("deq has blocks of 96 along axis 0" in r and "or one per column" in r for r in reasons), reasons


def test_batch_dims_fold_into_the_rows() -> None:
    partition = fuse(WeightOnly(3, 64, 8, batch=(2,)).build(), arch=90)
    assert [f.rule for f in partition.nodes] == ["weight_only_matmul"]


def test_more_than_16_rows_run_as_written() -> None:
    partition = fuse(WeightOnly(17, 256, 40).build(), arch=90)
    assert "weight_only_matmul" not in [f.rule for f in partition.nodes]
    reasons = [r.reason for r in partition.rejections if r.rule == "weight_only_matmul"]
    assert any("mm has 17 rows (tokens); the weight-only GEMM serves up to 16" in str(r) for r in reasons), reasons


def test_weights_dequantized_to_another_type_than_a_run_as_written() -> None:
    g = gd.OperationGraphSpec(io_data_type="half", intermediate_data_type="float")
    w = g.tensor(name="w", dim=[64, 8], stride=[1, 64], data_type="int4")
    deq = g.block_scale_dequantize(w, g.tensor(name="s", dim=[2, 8]), 32, axis=0, name="deq")
    g.matmul(g.tensor(name="a", dim=[2, 64]), deq, name="mm").set_output(True)
    partition = fuse(g, arch=90)
    reasons = [str(r.reason) for r in partition.rejections if r.rule == "weight_only_matmul"]
    assert any("multiplies half A by float dequantized weights" in r for r in reasons), reasons


def test_batch_dims_that_do_not_fold_into_rows_run_as_written() -> None:
    g = gd.OperationGraphSpec(io_data_type="half", intermediate_data_type="half")
    a = g.tensor(name="a", dim=[2, 3, 64], stride=[64, 128, 1])  # the batch between the rows
    w = g.tensor(name="w", dim=[64, 8], stride=[1, 64], data_type="int4")
    deq = g.block_scale_dequantize(w, g.tensor(name="s", dim=[2, 8]), 32, axis=0, name="deq")
    g.matmul(a, deq, name="mm").set_output(True)
    reasons = [str(r.reason) for r in fuse(g, arch=90).rejections if r.rule == "weight_only_matmul"]
    assert any("has batch dims that do not fold into its rows" in r for r in reasons), reasons


def test_launch_choices_are_checked_naming_the_node() -> None:
    for spec, tuning, message in (
        (WeightOnly(3, 96, 40), {"column_tiles": 3}, "column_tiles = 3 is not one of column_tiles in [1, 2, 4]"),
        (WeightOnly(3, 96, 40), {"column_tiles": 2, "unroll": 4}, "unroll = 4 takes column_tiles = 1 (registers)"),
        (WeightOnly(3, 96, 40), {"column_tiles": 4, "warps": 16}, "warps = 16 takes column_tiles <= 2"),
        (WeightOnly(3, 96, 40), {"early_a": 1}, "early_a = 1 takes 8-bit weights and at most 8 rows"),
        (WeightOnly(9, 96, 40, weight="int8"), {"early_a": 1}, "early_a = 1 takes 8-bit weights and at most 8 rows"),
        (WeightOnly(3, 100, 30, k_major=False), {"warps": 4}, "this problem runs on the SIMT kernel, which takes none"),
        (
            WeightOnly(3, 96, 40),
            {"stages": 6, "column_tiles": 4, "unroll": 2},
            "the ring needs 393216 bytes of shared memory, over 232448",
        ),
        (WeightOnly(3, 96, 40, weight="int8"), {"stages": 4, "early_a": 1}, "stages > 0 takes early_a = 0"),
        (WeightOnly(3, 96, 40), {"split": 3}, "split = 3 is not one of"),
    ):
        partition = fuse(spec.build(), arch=90)
        (gemm,) = partition.nodes
        with pytest.raises(UnsupportedError, match="weight_only") as caught:
            emit_partition(partition, 90, {gemm.name: tuning})
        assert message in str(caught.value)
    simt = fuse(WeightOnly(3, 100, 30, k_major=False).build(), arch=90).nodes[0]
    assert candidates(simt, 90) == []


@pytest.mark.parametrize(
    ("spec", "ring"),
    [
        (WeightOnly(1, 4096, 14336, group=None, act="bfloat16", weight="int8"), True),
        (WeightOnly(8, 4096, 14336, group=None, act="bfloat16", weight="int8"), True),
        (WeightOnly(16, 4096, 14336, group=None, act="bfloat16", weight="int8"), False),  # measured slower
        (WeightOnly(1, 4096, 14336, group=128, act="bfloat16", weight="int8"), False),  # not measured
        (WeightOnly(1, 4096, 14336, act="bfloat16"), False),  # int4: no gain
        (WeightOnly(1, 4096, 4096, group=None, act="bfloat16", weight="int8"), False),  # one tile: 16 warps
    ],
    ids=["int8_m1", "int8_m8", "int8_m16", "int8_groups", "int4", "int8_4096_columns"],
)
def test_the_ring_is_the_default_only_where_it_was_measured_faster(spec: WeightOnly, ring: bool) -> None:
    (program,) = emit_partition(fuse(spec.build(), arch=90), 90, {})
    (kernel,) = program.kernels
    assert ("cp.async.wait_group" in kernel.source) == ring
    assert kernel.shared_bytes == (4 * 2 * 256 * 16 if ring else 0)  # 4 stages of 2 loads per thread


def test_k_slices_take_sm_90() -> None:
    """Off sm_90 no cluster sums the K slices: refused naming the node, and not offered."""
    partition = fuse(WeightOnly(3, 96, 40).build(), arch=80)
    (gemm,) = partition.nodes
    with pytest.raises(UnsupportedError, match="weight_only") as caught:
        emit_partition(partition, 80, {gemm.name: {"split": 4}})
    assert "split = 4 takes sm_90 or later" in str(caught.value)
    assert all(c["split"] == 1 for c in candidates(gemm, 80))
    assert {c["split"] for c in candidates(gemm, 90)} == {1, 2, 4}


# ---- kernels: NVRTC, the CPU, the GPU ----

COMPILE_CASES = {
    "mma_fp16": WeightOnly(3, 96, 40, group=32),
    "mma_bf16_16_rows": WeightOnly(16, 4000, 24, act="bfloat16", scale="float"),
    "simt_n_major": WeightOnly(5, 100, 30, group=32, k_major=False),
    "simt_fp4": WeightOnly(2, 64, 16, act="bfloat16", weight="fp4_e2m1"),
    "fallback_32_rows": WeightOnly(32, 128, 64),
    "mma_bf16_zero_points": WeightOnly(5, 256, 40, act="bfloat16", scale="float", zero="bfloat16"),
    "simt_zero_points": WeightOnly(5, 100, 30, group=32, k_major=False, zero="float"),
    "fallback_zero_points": WeightOnly(32, 128, 64, zero="half"),
    "mma_int4_per_channel": WeightOnly(4, 4096, 40, group=None, act="bfloat16", scale="bfloat16"),
    "mma_int8_fp16": WeightOnly(3, 96, 40, group=32, weight="int8"),
    "mma_int8_bf16_per_channel_16_rows": WeightOnly(
        16, 4000, 24, group=None, act="bfloat16", scale="float", weight="int8"
    ),
    "simt_int8_n_major": WeightOnly(5, 100, 31, group=32, k_major=False, weight="int8"),
    "simt_int8_k_not_16": WeightOnly(2, 72, 17, group=None, act="bfloat16", weight="int8"),
    "fallback_int8_32_rows": WeightOnly(32, 128, 64, weight="int8"),
    "mma_fp8_fp16": WeightOnly(3, 96, 40, group=32, weight="fp8_e4m3"),
    "mma_fp8_bf16_per_channel": WeightOnly(9, 4000, 24, group=None, act="bfloat16", weight="fp8_e4m3"),
    "simt_fp8_n_major": WeightOnly(5, 100, 31, group=64, k_major=False, act="bfloat16", weight="fp8_e4m3"),
}


# The cases whose every tuning candidate is compiled too: one per weight type, with zero points
# and per-channel scales among them (the candidates differ in launch constants, the same
# template for every case; the other cases compile their default kernel).
EVERY_CANDIDATE = {"mma_bf16_zero_points", "mma_int4_per_channel", "mma_int8_bf16_per_channel_16_rows", "mma_fp8_fp16"}


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", COMPILE_CASES)
def test_every_weight_only_kernel_compiles(case: str, arch: int) -> None:
    partition = fuse(COMPILE_CASES[case].build(), arch=arch)
    gemm = next(f for f in partition.nodes if f.anchor is not None and f.anchor.op == "matmul")
    for choice in [None, *(candidates(gemm, arch) if case in EVERY_CANDIDATE else [])]:
        for program in emit_partition(partition, arch, {gemm.name: choice} if choice else {}):
            for kernel in program.kernels:
                assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


# K cut over the blocks of a cluster (sm_90), and the weights through the cp.async ring:
# awkward shapes, K slices with no chunk at all, rings that wrap around and run past K
CHOICE_CASES = {
    "m3_k96_g32_split2": (WeightOnly(3, 96, 40, group=32), {"split": 2}),
    "m9_k1184_g32_split4_warps4": (WeightOnly(9, 1184, 24, group=32), {"split": 4, "warps": 4, "unroll": 1}),
    "m16_k4096_tiles2_split8": (WeightOnly(16, 4096, 40, scale="float"), {"split": 8, "warps": 4, "column_tiles": 2}),
    "m1_k2080_n31_split8": (WeightOnly(1, 2080, 31, group=32), {"split": 8, "warps": 8}),
    "m5_zero_points_split4": (WeightOnly(5, 1184, 24, group=32, zero="half"), {"split": 4, "warps": 4}),
    "int8_m1_k336_n27_split2": (WeightOnly(1, 336, 27, weight="int8"), {"split": 2, "warps": 4}),
    "int8_m12_per_channel_split2_tiles2": (
        WeightOnly(12, 1184, 40, group=None, weight="int8"),
        {"split": 2, "column_tiles": 2, "unroll": 1},
    ),
    "m3_k96_g32_stages3": (WeightOnly(3, 96, 40, group=32), {"stages": 3}),
    "m9_k2080_stages4_warps4": (WeightOnly(9, 2080, 24, group=32), {"stages": 4, "unroll": 1, "warps": 4}),
    "m16_k4096_tiles2_stages6_split2": (
        WeightOnly(16, 4096, 40, scale="float"),
        {"stages": 6, "unroll": 1, "column_tiles": 2, "split": 2, "warps": 4},
    ),
    "m5_zero_points_stages4": (WeightOnly(5, 1184, 24, group=32, zero="half"), {"stages": 4, "unroll": 1, "warps": 4}),
    "int8_m12_per_channel_stages3_tiles2": (
        WeightOnly(12, 1184, 40, group=None, weight="int8"),
        {"stages": 3, "column_tiles": 2, "unroll": 1, "warps": 4},
    ),
    "int8_m1_k336_n27_stages6": (WeightOnly(1, 336, 27, weight="int8"), {"stages": 6, "unroll": 1, "warps": 4}),
}

EMULATED = {
    "m1_k96_g64": (WeightOnly(1, 96, 24, group=64), {}),
    "m9_k160": (WeightOnly(9, 160, 8), {}),
    "m16_k4096_float_scales": (WeightOnly(16, 4096, 16, scale="float"), {}),
    "m3_tiles4_warps4_unroll1": (WeightOnly(3, 512, 72), {"column_tiles": 4, "warps": 4, "unroll": 1}),
    "m12_tiles2": (WeightOnly(12, 320, 40, group=32), {"column_tiles": 2}),  # fp16 only: no bf16 on the CPU
    "m5_k1184_prefetch_tail": (WeightOnly(5, 1184, 24, group=32), {"warps": 4, "unroll": 1}),
    "simt_n_major": (WeightOnly(3, 100, 30, group=32, k_major=False), {}),
    "simt_k_not_32": (WeightOnly(4, 72, 20, group=32), {}),
    "simt_fp4": (WeightOnly(2, 64, 16, weight="fp4_e2m1"), {}),
    "batched_rows": (WeightOnly(3, 64, 8, batch=(2,)), {}),
    "m5_zero_points": (WeightOnly(5, 1184, 24, group=32, zero="half"), {"warps": 4, "unroll": 1}),
    "m12_zero_points_tiles2": (WeightOnly(12, 320, 40, group=64, scale="float", zero="float"), {"column_tiles": 2}),
    "simt_zero_points": (WeightOnly(3, 100, 30, group=32, k_major=False, zero="float"), {}),
    "int4_per_channel": (WeightOnly(2, 512, 24, group=None), {}),
    "int8_m1_k96_g64": (WeightOnly(1, 96, 24, group=64, weight="int8"), {}),
    "int8_m9_k160_n_odd": (WeightOnly(9, 160, 27, weight="int8"), {}),
    "int8_m16_k4096_per_channel": (WeightOnly(16, 4096, 16, group=None, scale="float", weight="int8"), {}),
    "int8_m3_tiles4_warps4_unroll1": (
        WeightOnly(3, 512, 72, weight="int8"),
        {"column_tiles": 4, "warps": 4, "unroll": 1},
    ),
    "int8_m12_tiles2_k_tail": (WeightOnly(12, 336, 40, group=32, weight="int8"), {"column_tiles": 2}),
    "int8_m5_k1184_prefetch_tail": (WeightOnly(5, 1184, 24, group=32, weight="int8"), {"warps": 4, "unroll": 1}),
    "int8_m5_k1184_unroll4": (WeightOnly(5, 1184, 24, group=32, weight="int8"), {"warps": 4, "unroll": 4}),
    "int8_m16_k1184_warps16": (WeightOnly(16, 1184, 40, group=32, weight="int8"), {"warps": 16, "column_tiles": 2}),
    "int8_m5_k1184_early_a": (WeightOnly(5, 1184, 24, group=32, weight="int8"), {"warps": 4, "early_a": 1}),
    "int8_m8_k336_early_a_tiles2": (
        WeightOnly(8, 336, 40, weight="int8"),
        {"column_tiles": 2, "unroll": 1, "early_a": 1},
    ),
    "m7_k2080_unroll4": (WeightOnly(7, 2080, 40, group=32), {"warps": 8, "unroll": 4}),
    "simt_int8_n_major": (WeightOnly(3, 100, 31, group=32, k_major=False, weight="int8"), {}),
    "simt_int8_k_not_16": (WeightOnly(4, 72, 20, group=None, weight="int8"), {}),
    **{f"choice_{name}": case for name, case in CHOICE_CASES.items()},
}


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("aligned", [1, 0], ids=["vectors", "bytes"])
@pytest.mark.parametrize("case", EMULATED)
def test_the_kernels_match_the_reference_on_the_cpu(
    case: str, aligned: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    spec, tuning = EMULATED[case]
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    ir = spec.build().validate()
    feeds = random_inputs(ir, zlib.crc32(case.encode()))
    memory = dict(feeds)
    (fused,) = fuse(ir, arch=90).nodes
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, tuning))
    assert ("mma" in program.kernels[0].name) == (not case.startswith("simt"))
    memory.update(cpu_emulation.run(fused, program, memory, aligned, build))
    want = reference.execute(ir, feeds)["c"].astype(np.float64)
    error = relative_error(memory["c"].astype(np.float64), want)
    assert error <= 1e-3, error  # fp32 sums of the weights rounded as the reference rounds them


GPU_CASES = {
    "m1_4096x4096_bf16": WeightOnly(1, 4096, 4096, act="bfloat16", scale="bfloat16"),
    "m3_k96_n40_g32": WeightOnly(3, 96, 40, group=32),
    "m16_k4000_n24_float_scales_bf16": WeightOnly(16, 4000, 24, act="bfloat16", scale="float"),
    "m9_k256_n296_g64_bf16_scales": WeightOnly(9, 256, 296, group=64, scale="bfloat16"),
    "m8_k4096_n14336_bf16": WeightOnly(8, 4096, 14336, act="bfloat16", scale="bfloat16"),
    "simt_n_major_fp16": WeightOnly(5, 100, 30, group=32, k_major=False),
    "simt_n_major_bf16": WeightOnly(16, 256, 72, group=64, k_major=False, act="bfloat16"),
    "simt_fp4_bf16": WeightOnly(2, 64, 16, act="bfloat16", weight="fp4_e2m1"),
    "simt_k_not_32": WeightOnly(4, 72, 20, group=32),
    "batched_rows_fp32_out": WeightOnly(3, 128, 24, batch=(2,), out="float"),
    "fallback_32_rows": WeightOnly(32, 256, 64),
    "m1_4096x4096_bf16_zero_points": WeightOnly(1, 4096, 4096, act="bfloat16", scale="bfloat16", zero="bfloat16"),
    "m9_k256_n296_g64_zero_points": WeightOnly(9, 256, 296, group=64, scale="float", zero="float"),
    "m16_k4000_n24_zero_points_bf16": WeightOnly(16, 4000, 24, act="bfloat16", scale="float", zero="half"),
    "simt_n_major_zero_points": WeightOnly(5, 100, 30, group=32, k_major=False, zero="half"),
    "fallback_32_rows_zero_points": WeightOnly(32, 256, 64, zero="half"),
    "m4_4096x4096_int4_per_channel_bf16": WeightOnly(4, 4096, 4096, group=None, act="bfloat16", scale="bfloat16"),
    "m1_4096x4096_int8_per_channel_bf16": WeightOnly(
        1, 4096, 4096, group=None, act="bfloat16", scale="bfloat16", weight="int8"
    ),
    "m16_4096x4096_int8_g128_bf16": WeightOnly(16, 4096, 4096, act="bfloat16", scale="bfloat16", weight="int8"),
    "m8_k4096_n14336_int8_per_channel_fp16": WeightOnly(8, 4096, 14336, group=None, weight="int8"),
    "m3_k96_n40_int8_g32": WeightOnly(3, 96, 40, group=32, weight="int8"),
    "m9_k336_n297_int8_g64_bf16_float_scales": WeightOnly(
        9, 336, 297, group=64, act="bfloat16", scale="float", weight="int8"
    ),
    "m16_k4000_n24_int8_per_channel_bf16": WeightOnly(16, 4000, 24, group=None, act="bfloat16", weight="int8"),
    "simt_int8_n_major_bf16": WeightOnly(5, 100, 31, group=32, k_major=False, act="bfloat16", weight="int8"),
    "simt_int8_k_not_16": WeightOnly(4, 72, 20, group=None, weight="int8"),
    "batched_rows_int8_fp32_out": WeightOnly(3, 128, 24, batch=(2,), out="float", weight="int8"),
    "fallback_int8_32_rows": WeightOnly(32, 256, 64, weight="int8"),
    "m1_4096x4096_fp8_per_channel_bf16": WeightOnly(1, 4096, 4096, group=None, act="bfloat16", weight="fp8_e4m3"),
    "m9_k336_n297_fp8_g64_fp16": WeightOnly(9, 336, 297, group=64, weight="fp8_e4m3"),
    "m16_k4000_n24_fp8_g32_bf16": WeightOnly(16, 4000, 24, group=32, act="bfloat16", scale="float", weight="fp8_e4m3"),
    "simt_fp8_n_major": WeightOnly(5, 100, 31, group=64, k_major=False, act="bfloat16", weight="fp8_e4m3"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_weight_only_gemm_matches_reference_on_gpu(case: str) -> None:
    from graphdnn.runtime.driver import current_gpu_arch

    spec = GPU_CASES[case]
    graph = spec.build()
    limit = 1e-5 if spec.out == "float" else tolerance(DataType(spec.act))
    check_on_gpu(graph, seed=zlib.crc32(case.encode()), tolerance=limit)  # the default plan
    gemm = next(f for f in fuse(graph, arch=current_gpu_arch()).nodes if f.anchor is not None)
    if spec.m * math.prod(spec.batch) <= 16 and "simt" not in case and spec.k * spec.n <= 2**20:  # every launch choice
        for choice in candidates(gemm, current_gpu_arch()):
            check_on_gpu(graph, seed=1, tolerance=limit, tuning={gemm.name: choice})


GPU_CHOICE_CASES = {
    **{name: (dataclasses.replace(spec, act="bfloat16"), tuning) for name, (spec, tuning) in CHOICE_CASES.items()},
    "m1_4096x4096_split4_warps4": (
        WeightOnly(1, 4096, 4096, act="bfloat16", scale="bfloat16"),
        {"split": 4, "warps": 4},
    ),
    "m9_4096x4096_zero_points_split8": (
        WeightOnly(9, 4096, 4096, act="bfloat16", scale="bfloat16", zero="bfloat16"),
        {"split": 8, "warps": 4, "unroll": 1},
    ),
    "m16_4096x14336_int8_per_channel_split2_tiles2": (
        WeightOnly(16, 4096, 14336, group=None, act="bfloat16", scale="bfloat16", weight="int8"),
        {"split": 2, "column_tiles": 2, "unroll": 1},
    ),
    "m16_4096x14336_stages4": (
        WeightOnly(16, 4096, 14336, act="bfloat16", scale="bfloat16"),
        {"stages": 4, "unroll": 1, "column_tiles": 1},
    ),
    "m1_4096x4096_int8_stages6_split2": (
        WeightOnly(1, 4096, 4096, group=None, act="bfloat16", scale="bfloat16", weight="int8"),
        {"stages": 6, "unroll": 1, "split": 2},
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CHOICE_CASES)
def test_k_slices_and_the_ring_match_the_reference_on_gpu(case: str) -> None:
    spec, tuning = GPU_CHOICE_CASES[case]
    graph = spec.build()
    gemm = next(f for f in fuse(graph, arch=90).nodes if f.anchor is not None)
    check_on_gpu(
        graph, seed=zlib.crc32(case.encode()), tolerance=tolerance(DataType(spec.act)), tuning={gemm.name: tuning}
    )


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("weight", ["int4", "int8"])
def test_a_direct_weight_only_matmul_of_more_than_16_rows_runs_on_the_simt_kernel(
    weight: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The matmul form written by hand is not bound by the rule's 16 rows; the tensor-core
    kernel serves 16, so 20 rows take the SIMT kernel, every row written."""
    g = gd.OperationGraphSpec(io_data_type="half")
    w = g.tensor(name="w", dim=[64, 24], stride=[1, 64], data_type=weight)
    scale = g.tensor(name="s", dim=[1, 24])
    g.matmul(g.tensor(name="a", dim=[20, 64]), w, B_scale=scale, name="mm").set_name("c").set_output(True)
    ir = g.validate()
    feeds = random_inputs(ir, 20)
    (fused,) = fuse(ir, arch=90).nodes
    program = emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, {}))
    assert "simt" in program.kernels[0].name
    build: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build.mkdir(exist_ok=True)
    got = cpu_emulation.run(fused, program, dict(feeds), 1, build)["c"].astype(np.float64)
    assert relative_error(got, reference.execute(ir, feeds)["c"].astype(np.float64)) <= 1e-3
