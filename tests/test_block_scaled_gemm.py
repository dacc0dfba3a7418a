"""Block-scaled fp8 GEMM (issue 12): DeepSeek-V3's 1 x 128 activation and 128 x 128 (or
128 x 1) weight scales, and MXFP8's fp8_e8m0 scales per 32 k of both operands, written as
block_scale_dequantize -> matmul or as a matmul with A_scale / B_scale.

CPU: the reference (bit-for-bit the dequantized product, hypothesis over shapes and scales),
validation errors naming the node, the block_scaled_matmul rule firing on sm_90 and each near
miss refused with its reason, the fused partition computing what the graph does, and NVRTC
compiling every kernel for sm_90a (the engine) and sm_80 (SIMT). GPU: default plan and every
engine candidate against the reference on ragged M, N and K = 128, 384, 4096 (MXFP8: 32, 96,
4096), and NaN scales.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.families.gemm_problem import problem_of
from codegen.families.gemm_ws import default_choice
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from fusion_rules.partition_reference import execute_partition
from graphdnn import reference
from graphdnn.errors import DataTypeError, ShapeError, UnsupportedError
from graphdnn.ops.block_scaled import e8m0_value
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from graphdnn.signature import signature
from tests.gpu_check import check_on_gpu, poisoned, relative_error, to_device, to_numpy


@dataclass(frozen=True)
class BlockScaled:
    """C [m, n] = A [m, k] (fp8, 1 x 128 scales) @ B [k, n] (fp8, stored K-major) with B's
    scales per 128 x 128 block ("tile"), or per 128 x 1 ("column"); ``form`` "dequantize" writes
    block_scale_dequantize of each operand then a matmul (B's scales per column), "matmul" binds
    the scales to the matmul."""

    m: int
    n: int
    k: int
    form: str = "dequantize"
    b_blocks: str = "column"
    out_type: str = "bfloat16"
    element: str = "fp8_e4m3"
    block: int = 128  # the dequantizes' block size
    b_k_major: bool = True
    b_escapes: bool = False  # the dequantized B is a graph output too
    scale: str = "float"  # or "fp8_e8m0" (MXFP8, with block 32)
    b_scale: str | None = None  # B's scale type where it differs from A's

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(
            name="block_scaled", io_data_type=self.element, intermediate_data_type="float", compute_data_type="float"
        )
        m, n, k = self.m, self.n, self.k
        a = g.tensor(name="a", dim=[m, k])
        b = g.tensor(name="b", dim=[k, n], stride=[1, k] if self.b_k_major else [n, 1])
        blocks = -(-k // self.block)
        sa = g.tensor(name="a_scale", dim=[m, blocks], data_type=self.scale)
        if self.form == "dequantize":
            sb = g.tensor(name="b_scale", dim=[blocks, n], data_type=self.b_scale or self.scale)
            da = g.block_scale_dequantize(a, sa, self.block, axis=-1, name="deq_a")
            db = g.block_scale_dequantize(b, sb, self.block, axis=0, name="deq_b")
            if self.b_escapes:
                db.set_output(True)
            c = g.matmul(da, db, name="mm")
        else:
            columns = -(-n // 128) if self.b_blocks == "tile" else n
            sb = g.tensor(name="b_scale", dim=[blocks, columns], data_type=self.scale)
            c = g.matmul(a, b, A_scale=sa, B_scale=sb, name="mm")
        c.set_name("c").set_output(True).set_data_type(self.out_type)
        return g


def mx(m: int, n: int, k: int, **fields: Any) -> BlockScaled:
    """An MXFP8 case: fp8_e8m0 scales per 32 k of A's rows and of B's columns."""
    return BlockScaled(m, n, k, **{"scale": "fp8_e8m0", "block": 32, **fields})


def feeds_of(graph: gd.OperationGraphSpec, seed: int) -> dict[str, np.ndarray]:
    """Random fp8 operands and scales spread over two orders of magnitude (so that a scale
    applied to the wrong block shows)."""
    ir = graph.validate()
    feeds = random_inputs(ir, seed)
    rng = np.random.default_rng(seed)
    for t in ir.inputs:
        if t.name.endswith("scale") and t.data_type is gd.DataType.FP8_E8M0:  # biased exponents 2^-4 .. 2^2
            feeds[t.name] = rng.integers(127 - 4, 127 + 3, t.static_dim, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
        elif t.name.endswith("scale"):
            feeds[t.name] = (2.0 ** rng.integers(-4, 3, t.static_dim) * rng.uniform(0.5, 1, t.static_dim)).astype(
                np.float32
            )
    return feeds


def scale_values(scale: np.ndarray) -> np.ndarray:
    """Float scales as they are; e8m0 bytes e read by the OCP MX definition, 2^(e - 127), and
    NaN for 255."""
    if scale.dtype != ml_dtypes.float8_e8m0fnu:
        return scale.astype(np.float64)
    e = scale.view(np.uint8).astype(np.float64)
    return np.where(e == 255, np.nan, np.float64(2.0) ** (e - 127))


def dequantized_product(feeds: dict[str, np.ndarray], b_columns: int, block: int = 128) -> np.ndarray:
    """An independent statement of the semantics: each element times its block's scale, then
    the float64 product."""
    a, b = feeds["a"].astype(np.float64), feeds["b"].astype(np.float64)
    sa, sb = scale_values(feeds["a_scale"]), scale_values(feeds["b_scale"])
    k, n = b.shape
    a_scaled = a * np.array([[sa[i, j // block] for j in range(k)] for i in range(a.shape[0])])
    b_scaled = b * np.array([[sb[i // block, j // b_columns] for j in range(n)] for i in range(k)])
    return np.asarray(a_scaled @ b_scaled)


# ---- reference and validation ----


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(1, 9),
    n=st.integers(1, 300),
    blocks=st.integers(1, 3),
    b_blocks=st.sampled_from(["tile", "column"]),
    seed=st.integers(0, 2**16),
)
def test_the_reference_scales_each_block_before_the_product(
    m: int, n: int, blocks: int, b_blocks: str, seed: int
) -> None:
    case = BlockScaled(m, n, 128 * blocks, form="matmul", b_blocks=b_blocks, out_type="float")
    graph = case.build()
    feeds = feeds_of(graph, seed)
    got = reference.execute(graph.validate(), feeds)["c"]
    want = dequantized_product(feeds, 128 if b_blocks == "tile" else 1).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_the_dequantize_form_means_the_same_product() -> None:
    matmul, dequantize = BlockScaled(5, 200, 256, form="matmul"), BlockScaled(5, 200, 256)
    feeds = feeds_of(dequantize.build(), 3)
    want = reference.execute(matmul.build().validate(), feeds)["c"].astype(np.float64)
    got = reference.execute(dequantize.build().validate(), feeds)["c"].astype(np.float64)
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)  # bfloat16 C, two roundings
    exact = dequantized_product(feeds, 1)
    assert np.linalg.norm(got - exact) <= 1e-2 * np.linalg.norm(exact)
    assert feeds["a"].dtype == ml_dtypes.float8_e4m3fn


def test_e8m0_scales_are_the_ocp_mx_powers_of_two() -> None:
    """Every byte: 2^(e - 127), 0 is 2^-127 (a float64 normal, an fp32 subnormal), 255 NaN;
    ml_dtypes' widening (what the reference receives) agrees bit for bit."""
    bits = np.arange(256, dtype=np.uint8)
    values = e8m0_value(bits)
    assert np.isnan(values[255]) and np.isnan(values).sum() == 1
    assert values[0] == 2.0**-127 and values[127] == 1.0 and values[254] == 2.0**127
    np.testing.assert_array_equal(values, bits.view(ml_dtypes.float8_e8m0fnu).astype(np.float64))
    np.testing.assert_array_equal(values, scale_values(bits.view(ml_dtypes.float8_e8m0fnu)))
    np.testing.assert_array_equal(values, e8m0_value(bits.view(ml_dtypes.float8_e8m0fnu)))


@st.composite
def mx_cases(draw: st.DrawFn) -> BlockScaled:
    """An MXFP8 product of 1-9 rows, 1-70 columns and 1-5 k blocks, either form, fp32 out."""
    m, n, blocks = draw(st.integers(1, 9)), draw(st.integers(1, 70)), draw(st.integers(1, 5))
    return mx(m, n, 32 * blocks, form=draw(st.sampled_from(["matmul", "dequantize"])), out_type="float")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mx_cases(), spread=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_the_mxfp8_reference_scales_each_32_block_before_the_product(case: BlockScaled, spread: int, seed: int) -> None:
    graph = case.build()
    feeds = feeds_of(graph, seed)
    rng = np.random.default_rng(seed)
    for name in ("a_scale", "b_scale"):  # exponents up to 2^+-spread: exact in float64 either way
        shape = feeds[name].shape
        feeds[name] = rng.integers(127 - spread, 128 + spread, shape, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    got = reference.execute(graph.validate(), feeds)["c"]
    with np.errstate(over="ignore"):  # a product past fp32's range is inf in both
        want = dequantized_product(feeds, 1, block=32).astype(np.float32)
    if case.form == "matmul":
        np.testing.assert_array_equal(got, want)
    else:  # the dequantized operands are float, exact: only the product's summation order may differ
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_a_nan_e8m0_scale_makes_its_row_or_column_nan() -> None:
    case = mx(6, 40, 96, form="matmul", out_type="float")
    graph = case.build()
    feeds = feeds_of(graph, 1)
    feeds["a_scale"].view(np.uint8)[2, 1] = 255  # row 2's second block
    feeds["b_scale"].view(np.uint8)[0, 17] = 255  # column 17's first block
    got = reference.execute(graph.validate(), feeds)["c"]
    nan = np.zeros(got.shape, dtype=bool)
    nan[2, :], nan[:, 17] = True, True
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan], dequantized_product(feeds, 1, block=32).astype(np.float32)[~nan])


def test_an_mxfp8_graph_survives_json() -> None:
    """The e8m0 scale tensors and the matmul's scale roles round-trip: same signature, same C."""
    graph = mx(7, 40, 96, form="matmul").build()
    again = gd.OperationGraphSpec.from_json(graph.to_json())
    assert signature(again.validate()) == signature(graph.validate())
    feeds = feeds_of(graph, 2)
    np.testing.assert_array_equal(
        reference.execute(again.validate(), feeds)["c"], reference.execute(graph.validate(), feeds)["c"]
    )


def _scaled(a: list[int], b: list[int], sa: list[int] | None, sb: list[int] | None, **types: str) -> None:
    g = gd.OperationGraphSpec(io_data_type="fp8_e4m3", intermediate_data_type="float", compute_data_type="float")
    scales = {
        role: g.tensor(name=role.lower(), dim=dims, data_type=types.get(role, "float"))
        for role, dims in (("A_scale", sa), ("B_scale", sb))
        if dims is not None
    }
    x = g.tensor(name="x", dim=a, data_type=types.get("A", "fp8_e4m3"))
    c = g.matmul(x, g.tensor(name="w", dim=b), name="scaled_mm", **scales)  # type: ignore[arg-type]
    c.set_output(True).set_data_type("bfloat16")
    g.validate()


E8M0 = {"A_scale": "fp8_e8m0", "B_scale": "fp8_e8m0"}


@pytest.mark.parametrize(
    ("shapes", "types", "error", "message"),
    [
        (([8, 200], [200, 16], [8, 2], [2, 16]), {}, ShapeError, "K = 200 is not a multiple of 128"),
        (([8, 256], [256, 16], [8, 2], None), {}, ShapeError, "B_scale is unbound"),
        (([8, 256], [256, 16], [8, 1], [2, 16]), {}, ShapeError, "A_scale has dims [8, 1], expected [8, 2]"),
        (([8, 256], [256, 300], [8, 2], [2, 2]), {}, ShapeError, "expected [2, 3] or [2, 300]"),
        (([2, 8, 256], [256, 16], [8, 2], [2, 16]), {}, ShapeError, "A has dims [2, 8, 256]"),
        (([8, 256], [256, 16], [8, 2], [2, 16]), {"A": "bfloat16"}, DataTypeError, "fp8_e4m3 or fp8_e5m2"),
        (([8, 256], [256, 16], [8, 2], [2, 16]), {"B_scale": "half"}, DataTypeError, "float or fp8_e8m0 scales"),
        (([8, 48], [48, 16], [8, 2], [2, 16]), E8M0, ShapeError, "K = 48 is not a multiple of 32"),
        (([8, 128], [128, 16], [8, 1], [4, 16]), E8M0, ShapeError, "A_scale has dims [8, 1], expected [8, 4] (1 x 32"),
        (([8, 128], [128, 300], [8, 4], [4, 3]), E8M0, ShapeError, "expected [4, 300] (32 x 1 blocks, MXFP8"),
        (([8, 256], [256, 16], [8, 2], [8, 16]), {"B_scale": "fp8_e8m0"}, DataTypeError, "both float (1 x 128"),
    ],
)
def test_bad_block_scales_are_refused_naming_the_node(
    shapes: tuple[list[int], ...], types: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        _scaled(*shapes, **types)
    assert message in str(caught.value) and "scaled_mm" in str(caught.value)


# ---- the fusion rule ----


def test_the_rule_makes_one_block_scaled_gemm_on_sm90() -> None:
    case = BlockScaled(129, 1000, 384)
    graph = case.build().validate()
    partition = fuse(graph, arch=90)
    (fused,) = partition.nodes
    assert fused.rule == "block_scaled_matmul" and fused.synthesized
    assert fused.anchor is not None and fused.anchor.input("A_scale") is not None
    assert {t.name for t in fused.inputs} == {"a", "b", "a_scale", "b_scale"}
    feeds = feeds_of(case.build(), 5)
    got, want = execute_partition(partition, feeds)["c"], reference.execute(graph, feeds)["c"]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
    (program,) = emit_partition(partition, 90, {})
    assert [k.name.split("_")[-2] for k in program.kernels] == ["ws"]


def test_the_rule_makes_one_mxfp8_gemm_on_sm90() -> None:
    case = mx(129, 1000, 96)
    graph = case.build().validate()
    partition = fuse(graph, arch=90)
    (fused,) = partition.nodes
    assert fused.rule == "block_scaled_matmul" and fused.anchor is not None
    a_scale = fused.anchor.input("A_scale")
    assert a_scale is not None and a_scale.data_type is gd.DataType.FP8_E8M0 and a_scale.dim == (129, 3)
    feeds = feeds_of(case.build(), 6)
    got, want = execute_partition(partition, feeds)["c"], reference.execute(graph, feeds)["c"]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2, atol=1e-2)
    (program,) = emit_partition(partition, 90, {})
    (kernel,) = program.kernels
    assert "_ws_" in kernel.name and "the step is done, the next one may run" in kernel.source


NEAR_MISSES = {
    "sm_80": (BlockScaled(64, 64, 256), 80, "needs sm_90's fp8 tensor cores (wgmma), the target is sm_80"),
    "block_64": (BlockScaled(64, 64, 256, block=64), 90, "deq_a has blocks of 64 along axis 1"),
    "k_not_whole_blocks": (BlockScaled(64, 64, 200), 90, "mm has K = 200, not a multiple of 128"),
    "b_n_major": (BlockScaled(64, 64, 256, b_k_major=False), 90, "reads it K-major"),
    "mx_sm_80": (mx(64, 64, 64), 80, "needs sm_90's fp8 tensor cores (wgmma), the target is sm_80"),
    "mx_block_128": (
        mx(64, 64, 256, block=128),
        90,
        "has blocks of 128 along axis 1; the block-scaled GEMM takes blocks of 32",
    ),
    "mx_k_not_whole_blocks": (mx(64, 64, 48), 90, "mm has K = 48, not a multiple of 32"),
    "mx_b_n_major": (mx(64, 64, 64, b_k_major=False), 90, "reads it K-major"),
    "float_block_32": (
        BlockScaled(64, 64, 256, block=32),
        90,
        "takes blocks of 128 of A along its last axis (1 x 128) with float",
    ),
    "mixed_scales": (
        BlockScaled(64, 64, 256, block=32, b_scale="fp8_e8m0"),
        90,
        "deq_a has float scales and deq_b fp8_e8m0 ones",
    ),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_are_refused_with_their_reason(case: str) -> None:
    spec, arch, reason = NEAR_MISSES[case]
    partition = fuse(spec.build(), arch=arch)
    assert all(f.rule != "block_scaled_matmul" for f in partition.nodes)
    reasons = [r.reason for r in partition.rejections if r.rule == "block_scaled_matmul"]
    assert any(reason in r for r in reasons), reasons


def test_a_dequantized_operand_read_elsewhere_stays_unfused() -> None:
    partition = fuse(BlockScaled(64, 64, 256, b_escapes=True).build(), arch=90)
    reasons = [r.reason for r in partition.rejections if r.rule == "block_scaled_matmul"]
    assert reasons == ["deq_b's output 'deq_b::Y' is a graph output"]


def test_b_not_dequantized_is_reported_and_plain_fp8_matmuls_keep_their_plan() -> None:
    g = gd.OperationGraphSpec(io_data_type="fp8_e4m3", intermediate_data_type="float", compute_data_type="float")
    a = g.block_scale_dequantize(
        g.tensor(name="a", dim=[8, 128]), g.tensor(name="s", dim=[8, 1], data_type="float"), 128
    )
    g.matmul(a, g.tensor(name="b", dim=[128, 16], data_type="float"), name="mm").set_output(True)
    partition = fuse(g, arch=90)
    assert [r.reason for r in partition.rejections if r.rule == "block_scaled_matmul"] == [
        "mm's B 'b' is not written by a block_scale_dequantize"
    ]


# ---- kernels ----

COMPILE_CASES = {
    "dequantize": BlockScaled(129, 1000, 384),
    "tile_scales": BlockScaled(7, 129, 128, form="matmul", b_blocks="tile", out_type="float"),
    "column_scales_e5m2": BlockScaled(1000, 7, 256, form="matmul", element="fp8_e5m2"),
    "mx_dequantize": mx(129, 1000, 96),
    "mx_float_out": mx(7, 129, 32, form="matmul", out_type="float"),
    "mx_e5m2": mx(1000, 7, 4096, form="matmul", element="fp8_e5m2"),
}


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", COMPILE_CASES)
def test_every_block_scaled_kernel_compiles(case: str, arch: int) -> None:
    partition = fuse(COMPILE_CASES[case].build(), arch=arch)
    gemm = next(f for f in partition.nodes if f.anchor is not None and f.anchor.op == "matmul")
    choices = candidates(gemm, arch)
    # the engine's 128 x 128 tile, two ring depths; an MXFP8 matmul of few tiles and long K, K slices too
    splits = [c["split_k"] for c in choices[2:]]
    assert len(choices) == (2 + len(splits) if arch == 90 else 0)
    assert splits == ([4, 8] if case == "mx_e5m2" and arch == 90 else [])
    for choice in [None, *choices]:
        for program in emit_partition(partition, arch, {gemm.name: choice} if choice else {}):
            for kernel in program.kernels:
                engine = (
                    arch == 90 and kernel.name.startswith(("gd_matmul", "gd_block")) and "_splitk_" not in kernel.name
                )
                assert ("_ws_" in kernel.name) == engine
                assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


def test_a_tuning_the_block_scaled_gemm_cannot_take_is_refused() -> None:
    partition = fuse(BlockScaled(256, 512, 256, form="matmul", b_blocks="tile").build(), arch=90)
    (gemm,) = partition.nodes
    for tuning, message in (
        ({"path": "ws", "block_n": 256, "stages": 3}, "takes block_n 128"),
        ({"path": "ws", "block_n": 128, "stages": 5, "split_k": 2}, "split_k only with MXFP8 scales"),
        ({"block_m": 128, "block_n": 128, "stages": 3}, "runs on the warp-specialised engine only"),
    ):
        with pytest.raises(UnsupportedError, match=message):
            emit_partition(partition, 90, {gemm.name: tuning})


# ---- GPU ----

GPU_SHAPES = [(1, 1000, 128), (7, 129, 384), (129, 7, 4096), (1000, 1000, 384), (129, 1, 128), (1000, 129, 4096)]
GPU_CASES = {
    **{f"dequantize_{m}x{n}x{k}": BlockScaled(m, n, k) for m, n, k in GPU_SHAPES},
    **{f"tile_{m}x{n}x{k}": BlockScaled(m, n, k, form="matmul", b_blocks="tile") for m, n, k in GPU_SHAPES},
    "column_float_out": BlockScaled(129, 1000, 4096, form="matmul", out_type="float"),
    "e5m2_tile": BlockScaled(1000, 129, 384, form="matmul", b_blocks="tile", element="fp8_e5m2"),
    "more_tiles_than_sms": BlockScaled(2048, 2304, 1024, form="matmul", b_blocks="tile"),
    "simt_b_n_major": BlockScaled(129, 200, 256, form="matmul", b_k_major=False),  # no tensor-core layout
}
MX_SHAPES = [(1, 1000, 32), (7, 129, 96), (129, 7, 4096), (1000, 1000, 96), (129, 1, 32), (1000, 129, 4096)]
GPU_CASES |= {
    **{f"mx_dequantize_{m}x{n}x{k}": mx(m, n, k) for m, n, k in MX_SHAPES},
    **{f"mx_matmul_{m}x{n}x{k}": mx(m, n, k, form="matmul") for m, n, k in MX_SHAPES},
    "mx_float_out": mx(129, 1000, 4096, form="matmul", out_type="float"),
    "mx_e5m2": mx(1000, 129, 96, form="matmul", element="fp8_e5m2"),
    "mx_more_tiles_than_sms": mx(2048, 2304, 1024, form="matmul"),
    "mx_simt_b_n_major": mx(129, 200, 96, form="matmul", b_k_major=False),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_block_scaled_gemm_matches_reference_on_gpu(case: str) -> None:
    arch = current_gpu_arch()
    spec = GPU_CASES[case]
    graph = spec.build()
    seed = zlib.crc32(case.encode())
    feeds = feeds_of(graph, seed)
    tolerance = 1e-3 if spec.out_type == "float" else None
    check_on_gpu(graph, seed=seed, feeds=feeds, tolerance=tolerance)  # the default plan
    gemm = next(f for f in fuse(graph, arch=arch).nodes if f.anchor is not None and f.anchor.op == "matmul")
    default = default_choice(problem_of(gemm.anchor), arch)
    for choice in (c for c in candidates(gemm, arch) if c != default):
        check_on_gpu(graph, seed=seed, feeds=feeds, tolerance=tolerance, tuning={gemm.name: choice})


def _run_on_gpu(graph: gd.OperationGraphSpec, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """C of the default plan on ``feeds`` (poisoned first), as float64."""
    import torch

    ir = graph.validate()
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    (out,) = ir.outputs
    c = poisoned(out)
    gd.compile(graph).execute({**pack, out.name: c})
    torch.cuda.synchronize()
    return to_numpy(c)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["matmul", "dequantize"])
def test_mxfp8_nan_scales_and_wide_exponents_on_gpu(form: str) -> None:
    """Scales from 2^-40 to 2^40 (powers of two: exact in fp32 as long as no product leaves its
    range) match the reference within the fp32-out tolerance; a NaN scale (byte 255) makes exactly its
    row's or column's outputs NaN."""
    case = mx(200, 300, 4096, form=form, out_type="float")
    graph = case.build()
    feeds = feeds_of(graph, 11)
    rng = np.random.default_rng(11)
    for name in ("a_scale", "b_scale"):
        shape = feeds[name].shape
        feeds[name] = rng.integers(127 - 40, 128 + 40, shape, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    want = reference.execute(graph.validate(), feeds)["c"].astype(np.float64)
    got = _run_on_gpu(graph, feeds)
    assert relative_error(got, want) <= 1e-3
    feeds["a_scale"].view(np.uint8)[199, 127] = 255  # the last row's last block
    feeds["b_scale"].view(np.uint8)[0, 131] = 255  # a column of the second tile, first block
    want = reference.execute(graph.validate(), feeds)["c"].astype(np.float64)
    got = _run_on_gpu(graph, feeds)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).sum() == 300 + 200 - 1
    finite = ~np.isnan(want)
    assert relative_error(got[finite], want[finite]) <= 1e-3
