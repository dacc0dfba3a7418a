"""GEMM family with 8-bit operands (issue 12): fp8 (e4m3, e5m2, mixed) and int8 on tensor cores.

CPU: the reference multiplies widened operands exactly (int8 sums exact, as an int32
accumulator); which path each arch takes (int8: mma.sync from sm_80; fp8: SIMT on sm_80, tensor
cores on sm_90, the warp-specialised engine for large problems); the refusals (B not K-major,
K not in 16-byte chunks, split-K for int8); per-tensor, per-row and per-column scales fold into
the GEMM's epilogue; every candidate kernel compiles with NVRTC for sm_80 and sm_90a (and,
where cuobjdump is installed, runs on the 8-bit tensor-core instructions). GPU: every
candidate against the reference on ragged shapes, each operand type and output type, int8
sums past 2^24 (exact), requantized int8 outputs (saturating), batched cases and fp8
convolutions (the implicit GEMM takes 8-bit operands too; conv_fprop refuses int8).
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen import ParamKind
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.nvrtc import compile_cubin
from graphdnn import reference
from graphdnn.errors import UnsupportedError
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from tests.gpu_check import check_on_gpu
from tests.test_codegen_gemm_sm90 import sass

EIGHT_BIT = {"fp8_e4m3", "fp8_e5m2", "int8"}


@dataclass(frozen=True)
class ScaledMatmul:
    """matmul(A, B) with compute type float (int8: exact int32 sums), then the frontend's scales:
    a per-tensor [1, 1], a per-row (per-token) [M, 1] and a per-column (per-channel) [1, N]
    float multiplication, each optional; the output stored as ``out_type``."""

    m: int = 300
    k: int = 128
    n: int = 200
    a_type: str = "fp8_e4m3"
    b_type: str = "fp8_e4m3"
    out_type: str = "bfloat16"
    scales: tuple[str, ...] = ("tensor", "row", "column")
    batch: tuple[int, ...] = ()
    b_k_major: bool = True  # B stored as B^T row-major (the layout 8-bit tensor cores read)
    matmul_type: str | None = None  # the matmul's own output type (int32: exact sums before the scales)

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(
            name="scaled_matmul", io_data_type=self.a_type, intermediate_data_type="float", compute_data_type="float"
        )
        batch = list(self.batch)
        a = g.tensor(name="A", dim=[*batch, self.m, self.k])
        b_dim = [*batch, self.k, self.n]
        order = [*range(len(batch)), len(batch) + 1, len(batch)] if self.b_k_major else None
        b = g.tensor(name="B", dim=b_dim, stride=list(gd.packed_strides(b_dim, order)), data_type=self.b_type)
        y = g.matmul(a, b, compute_data_type="float")
        if self.matmul_type is not None:
            y.set_data_type(self.matmul_type)
        ones = [1] * len(batch)
        shapes = {"tensor": [*ones, 1, 1], "row": [*ones, self.m, 1], "column": [*ones, 1, self.n]}
        for scale in self.scales:
            y = g.mul(y, g.tensor(name=f"{scale}_scale", dim=shapes[scale], data_type="float"))
        y.set_name("C").set_output(True).set_data_type(self.out_type)
        return g


@dataclass(frozen=True)
class Fp8Conv:
    """An NHWC convolution of fp8 image and filter (channels a multiple of 16), then a
    per-channel scale (conv_fprop takes floating operands: no int8)."""

    data_type: str = "fp8_e4m3"
    out_type: str = "float"

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name="fp8_conv", io_data_type=self.data_type, intermediate_data_type="float")
        x_dim, w_dim = [2, 32, 9, 11], [48, 32, 3, 3]
        x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
        w = g.tensor(name="w", dim=w_dim, stride=gd.nhwc_strides(w_dim))
        y = g.conv_fprop(image=x, weight=w, padding=[1, 1])
        y = g.mul(y, g.tensor(name="channel_scale", dim=[1, 48, 1, 1], data_type="float"))
        y.set_name("y").set_output(True).set_data_type(self.out_type)
        return g


def gemm_partition(graph: gd.OperationGraphSpec, arch: int) -> tuple[fr.Partition, fr.FusedNode]:
    partition = fr.fuse(graph, arch=arch)
    (fused,) = [f for f in partition.nodes if f.family is fr.Family.GEMM]
    return fr.Partition(partition.graph, (fused,), (), ()), fused


def kernel_names(graph: gd.OperationGraphSpec, arch: int, choice: dict[str, object] | None = None) -> list[str]:
    partition, fused = gemm_partition(graph, arch)
    programs = emit_partition(partition, arch, {fused.name: choice} if choice else {})
    return [kernel.name for program in programs for kernel in program.kernels]


# ---- reference semantics ----


def test_the_reference_multiplies_8bit_operands_exactly() -> None:
    """fp8 operands are widened exactly and their products summed in float64 (fp32
    accumulation at least); int8 sums are exact integers (an int32 accumulator never rounds),
    past 2^24 where an fp32 accumulator would."""
    rng = np.random.default_rng(3)
    g = ScaledMatmul(m=5, k=2048, n=3, a_type="int8", b_type="int8", out_type="int32", scales=()).build()
    a = rng.integers(-128, 128, (5, 2048)).astype(np.int8)
    a[0] = -128
    b = rng.integers(-128, 128, (2048, 3)).astype(np.int8)
    b[:, 0] = -128
    out = reference.execute(g.validate(), {"A": a, "B": b})["C"]
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert exact[0, 0] == 2048 * 128 * 128 > 2**24 and out.dtype == np.int32
    np.testing.assert_array_equal(out, exact)

    g = ScaledMatmul(m=4, k=64, n=5, b_type="fp8_e5m2", out_type="float", scales=()).build()
    a8 = rng.standard_normal((4, 64)).astype(ml_dtypes.float8_e4m3fn)
    b8 = (rng.standard_normal((64, 5)) * 100).astype(ml_dtypes.float8_e5m2)
    out = reference.execute(g.validate(), {"A": a8, "B": b8})["C"]
    widened = a8.astype(np.float64) @ b8.astype(np.float64)
    np.testing.assert_array_equal(out, widened.astype(np.float32))


# ---- lowering ----


def test_int8_takes_mma_sync_from_sm80_and_fp8_from_sm90() -> None:
    small = ScaledMatmul(a_type="int8", b_type="int8")
    assert [n for n in kernel_names(small.build(), 80) if "_mma_" in n]
    fp8 = ScaledMatmul()
    assert [n for n in kernel_names(fp8.build(), 80) if "_simt_" in n]  # no fp8 tensor cores on sm_80
    assert [n for n in kernel_names(fp8.build(), 90) if "_mma_" in n]  # few tiles: mma.sync, split-K where it pays
    for a_type, b_type in (("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e4m3"), ("int8", "int8")):
        large = ScaledMatmul(m=4096, k=512, n=4096, a_type=a_type, b_type=b_type)
        (name,) = kernel_names(large.build(), 90)
        assert "_ws_" in name  # the warp-specialised TMA engine takes what fills the GPU
    _, fused = gemm_partition(fp8.build(), 80)
    assert candidates(fused, 80) == []  # SIMT: nothing to tune


def test_8bit_candidates_and_int8_takes_no_split_k() -> None:
    _, fused = gemm_partition(ScaledMatmul(m=64, k=4096, n=64).build(), 90)
    fp8 = candidates(fused, 90)
    assert {c.get("path") for c in fp8} == {None, "wgmma", "ws"} and any("split_k" in c for c in fp8)
    graph = ScaledMatmul(m=64, k=4096, n=64, a_type="int8", b_type="int8").build()
    _, fused = gemm_partition(graph, 90)
    int8 = candidates(fused, 90)
    assert {c.get("path") for c in int8} == {None, "wgmma", "ws"} and not any("split_k" in c for c in int8)
    assert len(kernel_names(graph, 90)) == 1  # 1 K slice although the output has 1 tile
    with pytest.raises(UnsupportedError, match="int8 GEMMs take no split-K"):
        kernel_names(graph, 90, {"split_k": 2})


SLOW = {  # graph, the warning's message, the targets whose tensor cores cannot read it
    "int8_b_n_major": (
        ScaledMatmul(a_type="int8", b_type="int8", b_k_major=False),
        r"matmul 'matmul_0' multiplies int8 by int8 on the SIMT kernel.*B 'B' .*needs stride 1 along K.*transpose it",
        (80, 90),
    ),
    "int8_k_40": (ScaledMatmul(k=40, a_type="int8", b_type="int8"), "K = 40 is not a multiple of 16", (80, 90)),
    # sm_80 has no fp8 tensor cores to miss: the SIMT kernel widens the elements, silently
    "fp8_b_n_major": (ScaledMatmul(b_k_major=False), r"fp8_e4m3 by fp8_e4m3 on the SIMT kernel.*B 'B'", (90,)),
}


@pytest.mark.parametrize("case", SLOW)
def test_8bit_layouts_the_tensor_cores_cannot_read_run_on_simt_and_say_why(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec, match, warned = SLOW[case]
    graph = spec.build()
    for arch in (80, 90):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="graphdnn.compile"):
            assert [n for n in kernel_names(graph, arch) if "_simt_" in n]
        said = [r.getMessage() for r in caplog.records if r.name == "graphdnn.compile"]
        assert any(re.search(match, m) for m in said) == (arch in warned), (arch, said)


@pytest.mark.gpu
@pytest.mark.parametrize("case", SLOW)
def test_8bit_layouts_on_the_simt_kernel_match_reference_on_gpu(case: str) -> None:
    graph = SLOW[case][0].build()
    seed = zlib.crc32(case.encode())
    tolerance = fp8_tolerance(SLOW[case][0])
    plan = check_on_gpu(graph, seed=seed, feeds=_feeds(graph, seed), tolerance=tolerance)
    assert any("_simt_" in kernel.name for kernel in plan.kernels)


@pytest.mark.parametrize("arch", [80, 90])
def test_scales_fold_into_the_gemm_epilogue(arch: int) -> None:
    """The frontend's scaled GEMM: one fused node, matmul and its three scales (int8 on both
    arches; fp8 fuses from sm_89, the fp8 guard's rule)."""
    for a_type in ("int8", "fp8_e4m3"):
        partition = fr.fuse(ScaledMatmul(a_type=a_type, b_type=a_type).build(), arch=arch)
        if a_type == "fp8_e4m3" and arch == 80:
            # the matmul alone (SIMT), its scales in one elementwise kernel
            assert [f.family for f in partition.nodes] == [fr.Family.GEMM, fr.Family.ELEMENTWISE]
            continue
        (fused,) = partition.nodes
        assert fused.family is fr.Family.GEMM and [n.op for n in fused.nodes] == ["matmul", "mul", "mul", "mul"]
        (program,) = emit_partition(partition, arch)
        (kernel,) = program.kernels
        # one kernel reads A, B and the three scales and writes C; the per-tensor and per-column
        # scales are loaded once per thread, before the chunk loop (gemm_epilogue.tile_epilogue),
        # the per-row one per element
        tensors = [p.tensor for p in kernel.params if p.kind is ParamKind.TENSOR]
        assert len(tensors) == 6 and kernel.name.startswith("gd_matmul_mul_")
        assert len(re.findall(r"(?:float|double) col\d+\[8\];", kernel.source)) == 2


def test_8bit_tensor_maps_copy_128_byte_rows() -> None:
    partition, _ = gemm_partition(ScaledMatmul(m=4096, k=512, n=4096).build(), 90)
    (program,) = emit_partition(partition, 90)
    (kernel,) = program.kernels
    maps = [p.tensor_map for p in kernel.params if p.kind is ParamKind.TENSOR_MAP]
    assert [(m.element_bytes, m.box[0], m.swizzle) for m in maps if m is not None] == [(1, 128, 128), (1, 128, 128)]
    assert all(m is not None and not m.problems() for m in maps)
    assert "BK = 128," in kernel.source and "m64n256k32.f32.e4m3.e4m3" in kernel.source


# ---- every kernel compiles ----

COMPILE_CASES = {
    "fp8_e4m3_bf16": ScaledMatmul(),
    "fp8_e5m2_half": ScaledMatmul(m=77, k=96, n=136, a_type="fp8_e5m2", b_type="fp8_e5m2", out_type="half"),
    "fp8_mixed_float_batched": ScaledMatmul(m=45, k=64, n=40, b_type="fp8_e5m2", out_type="float", batch=(2,)),
    "int8_int32": ScaledMatmul(m=300, k=256, n=200, a_type="int8", b_type="int8", out_type="int32", scales=()),
    "int8_requantized": ScaledMatmul(m=33, k=48, n=72, a_type="int8", b_type="int8", out_type="int8"),
    "fp8_requantized": ScaledMatmul(m=33, k=48, n=72, out_type="fp8_e4m3", scales=("tensor",)),
    "fp8_conv": Fp8Conv(out_type="bfloat16"),
    "fp8_e5m2_conv": Fp8Conv(data_type="fp8_e5m2"),
}


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", COMPILE_CASES)
def test_every_8bit_candidate_compiles(case: str, arch: int) -> None:
    graph = COMPILE_CASES[case].build()
    partition, fused = gemm_partition(graph, arch)
    choices: list[dict[str, object] | None] = [None, *candidates(fused, arch)]
    fp8 = case.startswith("fp8")
    assert (len(choices) == 1) == (fp8 and arch == 80)  # fp8 on sm_80: the SIMT kernel alone
    for choice in choices:
        for program in emit_partition(partition, arch, {fused.name: choice} if choice else {}):
            for kernel in program.kernels:
                code = sass(compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix))
                tensor_core = "_simt_" not in kernel.name and "_reduce_" not in kernel.name
                if code is not None and tensor_core:  # HGMMA / IGMMA / QGMMA; IMMA, HMMA...
                    wgmma = "_ws_" in kernel.name or "_wgmma_" in kernel.name
                    assert ("GMMA" if wgmma else "MMA") in code and "LDL" not in code, kernel.name


# ---- GPU ----


def _feeds(graph: gd.OperationGraphSpec, seed: int) -> dict[str, np.ndarray]:
    """Random inputs, int8 operands over their whole range (sums past 2^24 for long K) and
    scales small enough that fp8 outputs stay finite."""
    ir = graph.validate()
    feeds = random_inputs(ir, seed)
    rng = np.random.default_rng(seed)
    for t in ir.inputs:
        if t.data_type is gd.DataType.INT8:
            feeds[t.name] = rng.integers(-128, 128, t.static_dim).astype(np.int8)
        elif t.name.endswith("scale"):
            feeds[t.name] = rng.uniform(0.02, 0.2, t.static_dim).astype(np.float32)
    return feeds


# fp8 tensor cores (mma.sync k32 and wgmma k32 alike) add their products keeping about 14
# mantissa bits, not fp32's 24 (measured by DeepSeek-V3's report, section 3.3.2, on H800;
# graphdnn does not yet promote partial sums to fp32 registers): a float output differs from
# the float64 reference by ~2^-14 relative for a short K, 3.4e-4 measured at K = 2064 on an
# H100. Narrower outputs keep their own, larger, tolerances.
FP8_ACCUMULATION = 1e-3


def fp8_tolerance(case: ScaledMatmul | Fp8Conv) -> float | None:
    """FP8_ACCUMULATION for an fp8 GEMM with a float output; None (the output type's own) else."""
    element = case.a_type if isinstance(case, ScaledMatmul) else case.data_type
    return FP8_ACCUMULATION if element.startswith("fp8") and case.out_type == "float" else None


GPU_CASES = {
    **COMPILE_CASES,
    "fp8_e4m3_one_row": ScaledMatmul(m=1, k=32, n=24, out_type="float", scales=("column",)),
    "fp8_e5m2_long_k": ScaledMatmul(m=130, k=2064, n=136, a_type="fp8_e5m2", b_type="fp8_e5m2", out_type="float"),
    "int8_past_2_24": ScaledMatmul(m=129, k=2048, n=72, a_type="int8", b_type="int8", out_type="int32", scales=()),
    "int8_int32_then_scaled": ScaledMatmul(
        m=100, k=2048, n=40, a_type="int8", b_type="int8", out_type="float", matmul_type="int32"
    ),
    "int8_dequantized_half": ScaledMatmul(m=257, k=160, n=120, a_type="int8", b_type="int8", out_type="half"),
    "int8_batched": ScaledMatmul(m=70, k=96, n=56, a_type="int8", b_type="int8", batch=(3,)),
    "fp8_more_tiles_than_sms": ScaledMatmul(m=2000, k=528, n=1100),
    "int8_more_tiles_than_sms": ScaledMatmul(m=2000, k=528, n=1100, a_type="int8", b_type="int8", out_type="float"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_every_8bit_candidate_matches_reference_on_gpu(case: str) -> None:
    arch = current_gpu_arch()
    if case.startswith("fp8") and arch < 89:
        pytest.skip("fp8 tensor cores start with sm_89")
    graph = GPU_CASES[case].build()
    seed = zlib.crc32(case.encode())
    _, fused = gemm_partition(graph, arch)
    feeds = _feeds(graph, seed)
    tolerance = fp8_tolerance(GPU_CASES[case])
    check_on_gpu(graph, seed=seed, feeds=feeds, tolerance=tolerance)  # the default path
    for choice in candidates(fused, arch):
        check_on_gpu(graph, seed=seed, feeds=feeds, tolerance=tolerance, tuning={fused.name: choice})
