"""The depthwise and small-group forward with P output pixels a thread (gemm_grouped_conv.py's
tuning choice ``pixels``, with ``blocks_per_sm``): P > 1 shares each weight vector among P
pixels (a grouped layer's default: 4 pixels, 2 blocks per SM; a depthwise one's: 1). CPU: the CPU emulation against the reference (float and half; rows whose width P does
not divide, stride 2, dilation, true convolution, a fused epilogue, 1, 2, 4 and 8 channels a
group) at both alignments, NVRTC for sm_80 and sm_90, a bad choice refused by name. GPU: the
benchmark's grouped layers (batch 2) and awkward shapes against the reference."""

from __future__ import annotations

import pytest

import graphdnn as gd
from codegen import emitter
from codegen.context import EmitContext
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.test_codegen_gemm import Conv
from tests.test_cpu_emulation import check, grouped_conv

EMULATED = [
    (grouped_conv("fprop", 16, 2, io="half", size=9), {"pixels": 4}),  # 8 channels a group, 9 = 4 + 4 + 1
    (grouped_conv("fprop", 16, 2, 2, io="half", dilation=2, mode=True), {"pixels": 3, "blocks_per_sm": 2}),
    (grouped_conv("fprop", 12, 12, bias_relu=True), {"pixels": 2}),  # depthwise, runs of 4 floats
    (grouped_conv("fprop", 24, 6, io="half", size=11), {"pixels": 8, "blocks_per_sm": 1}),  # 4 channels a group
    (grouped_conv("fprop", 8, 4, 2, mode=True), {"pixels": 5}),  # 2 channels a group, one tile a row
]


def kernels(graph: gd.OperationGraphSpec, tuning: dict[str, object], arch: int = 90):
    ir = graph.validate()
    return [
        k
        for fused in fuse(ir).nodes
        for k in emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, tuning)).kernels
    ]


def case_id(case: tuple[gd.OperationGraphSpec, dict[str, object]]) -> str:
    return case[0].name + "".join(f"-{k}{v}" for k, v in case[1].items())


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_matches_reference_on_the_cpu(case, tmp_path_factory: pytest.TempPathFactory) -> None:
    graph, tuning = case
    check(graph, tuning, tmp_path_factory, marker=f"acc[{tuning['pixels']}]")


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_kernels_compile(case, arch: int) -> None:
    graph, tuning = case
    for kernel in kernels(graph, tuning, arch):
        assert compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize("tuning", [{"pixels": 0}, {"pixels": 9}, {"blocks_per_sm": 9}, {"block_n": 64}])
def test_a_bad_choice_is_refused_by_name(tuning: dict[str, object]) -> None:
    graph = grouped_conv("fprop", 16, 2, io="half")
    ir = graph.validate()
    (fused,) = fuse(ir).nodes
    with pytest.raises(
        UnsupportedError,
        match=r"^node '\w+': grouped convolution tuning .* the choices are 'pixels' \(1\.\.8\) and 'blocks_per_sm' \(1\.\.8\)",
    ):
        emitter(fused.family)(fused, EmitContext(ir, signature(ir), 90, tuning))


GPU = {
    "g32_256_28_bf16": Conv(n=2, c=256, hw=(28, 28), k=256, groups=32, epilogue=""),
    "g32_128_56_bf16": Conv(n=2, c=128, hw=(56, 56), k=128, groups=32, epilogue="bias_add_relu"),
    "dw_576_14_bf16": Conv(n=2, c=576, hw=(14, 14), k=576, groups=576, epilogue=""),
    "g8_half_stride2_odd": Conv(n=3, c=64, hw=(13, 11), k=64, groups=8, dtype="half", stride=(2, 2)),
    "g2_fp32_dilation_mode": Conv(
        c=16, hw=(11, 6), k=16, groups=8, dtype="float", dilation=(2, 2), pre=(2, 0), post=(1, 3), mode="convolution"
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("choice", [{"pixels": 2}, {"pixels": 4, "blocks_per_sm": 2}], ids=["p2", "p4-bps2"])
@pytest.mark.parametrize("case", GPU)
def test_matches_reference_on_gpu(case: str, choice: dict[str, object]) -> None:
    check_choice_on_gpu(GPU[case], choice)


def check_choice_on_gpu(conv: Conv, choice: dict[str, object]) -> None:
    """The convolution's plan with ``choice`` as the tuning of its GEMM-family node, against the reference."""
    from tests.gpu_check import check_on_gpu

    graph = conv.build()
    ir = graph.validate()
    tuning = {fused.name: choice for fused in fuse(ir).nodes if fused.family.value == "gemm"}
    assert tuning
    check_on_gpu(graph, tuning=tuning, cache=None)


def test_defaults_take_four_pixels_for_groups_and_one_for_depthwise() -> None:
    """Measured on an H200 (benchmarks/RESULTS.md): a grouped layer's thread takes 4 pixels on a
    grid of 2 blocks per SM, whose registers the launch bounds cap; a depthwise one 1 pixel on
    the uncapped resident grid of 8 blocks per SM. (8-channel groups take the tensor cores:
    test_grouped_conv_mma.py.)"""
    grouped = Conv(n=32, c=128, hw=(56, 56), k=128, groups=32, epilogue="").build()
    depthwise = Conv(n=32, c=144, hw=(56, 56), k=144, groups=144, epilogue="").build()
    (kernel,) = kernels(grouped, {})
    assert "acc[4][8]" in kernel.source and "__launch_bounds__(256, 2)" in kernel.source
    assert kernel.grid == (2 * 132, 1, 1)
    (kernel,) = kernels(depthwise, {})
    assert "acc[1][8]" in kernel.source and "__launch_bounds__(256)" in kernel.source
    assert kernel.grid == (8 * 132, 1, 1)
