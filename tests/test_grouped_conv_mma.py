"""The depthwise and small-group forward on the tensor cores (grouped_conv_mma.py; tuning
``mma``: 1, the default for 8 channels a group in fp16/bf16). CPU: the CPU emulation (its
mma.sync stand-in) against the reference for 8, 4, 2 and 1 channels a group, odd images, stride
2, dilation, true convolution, a fused epilogue and 1-3 tiles a warp step, at both alignments;
NVRTC for sm_80 and sm_90; the choices refused by name. GPU: the benchmark's layers (batch 2) and
awkward shapes against the reference."""

from __future__ import annotations

import pytest

from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from tests import cpu_emulation
from tests.test_codegen_gemm import Conv
from tests.test_cpu_emulation import check, grouped_conv
from tests.test_grouped_conv_pixels import case_id, check_choice_on_gpu, kernels

EMULATED = [
    (grouped_conv("fprop", 16, 2, io="half", size=9), {"mma": 1, "tiles": 1}),  # 8 channels a group
    (grouped_conv("fprop", 24, 3, 2, io="half", dilation=2, mode=True), {"mma": 1, "blocks_per_sm": 1}),
    (
        grouped_conv("fprop", 16, 4, io="half", bias_relu=True),
        {"mma": 1, "tiles": 1, "stages": 2},
    ),  # 4 channels a group
    (grouped_conv("fprop", 8, 4, io="half", size=5), {"mma": 1, "blocks_per_sm": 1}),  # 2 channels a group
    (grouped_conv("fprop", 16, 16, 2, io="half", size=11), {"mma": 1}),  # depthwise
    # 73 blocks of 2 steps: the next step staged during this one's products
    (grouped_conv("fprop", 16, 2, io="half", size=68), {"mma": 1, "tiles": 1, "blocks_per_sm": 1, "stages": 2}),
]


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_matches_reference_on_the_cpu(case, tmp_path_factory: pytest.TempPathFactory) -> None:
    graph, tuning = case
    check(graph, tuning, tmp_path_factory, marker="mma_16816(acc[i]")


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", EMULATED[:3], ids=case_id)
def test_kernels_compile(case, arch: int) -> None:
    graph, tuning = case
    for kernel in kernels(graph, tuning, arch):
        assert compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"mma": 2}, "'mma' is 0 or 1"),
        (
            {"mma": 1, "tiles": 5},
            r"with 'mma' the choices are 'tiles' \(1\.\.4\), 'blocks_per_sm' \(1\.\.8\) and 'stages'",
        ),
        ({"mma": 1, "pixels": 2}, r"with 'mma' the choices are"),
        ({"mma": 1, "tiles": 4}, "1 x 4 tiles a warp do not fit in shared memory"),  # 4 slots of 4 tiles, 10 taps
        ({"mma": 1, "stages": 3}, r"'stages' \(1\.\.2\)"),
    ],
)
def test_a_bad_choice_is_refused_by_name(tuning: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedError, match=rf"^node '\w+': grouped convolution tuning .*{message}"):
        kernels(grouped_conv("fprop", 16, 2, io="half"), tuning)


def test_float_takes_no_mma() -> None:
    with pytest.raises(UnsupportedError, match="1 only for 2-d fp16 and bf16"):
        kernels(grouped_conv("fprop", 16, 4), {"mma": 1})  # 4 channels a group: runs of 4 floats


def test_eight_channel_groups_default_to_the_tensor_cores() -> None:
    """Measured on an H200 (benchmarks/RESULTS.md); fp32 and 4-channel groups keep the SIMT kernel."""
    (kernel,) = kernels(Conv(n=32, c=256, hw=(28, 28), k=256, groups=32, epilogue="").build(), {})
    assert "mma_16816(acc[i]" in kernel.source
    for conv in (
        Conv(n=32, c=128, hw=(56, 56), k=128, groups=32, epilogue=""),
        Conv(n=2, c=64, hw=(8, 8), k=64, groups=8, dtype="float"),
    ):
        (kernel,) = kernels(conv.build(), {})
        assert "mma_16816" not in kernel.source


GPU = {
    "g32_256_28_bf16": Conv(n=2, c=256, hw=(28, 28), k=256, groups=32, epilogue=""),
    "g32_128_56_bf16_relu": Conv(n=2, c=128, hw=(56, 56), k=128, groups=32, epilogue="bias_add_relu"),
    "dw_144_56_s2_bf16": Conv(n=1, c=144, hw=(57, 55), k=144, groups=144, epilogue="", stride=(2, 2)),
    "dw_576_14_bf16": Conv(n=2, c=576, hw=(14, 14), k=576, groups=576, epilogue=""),
    "g8_half_stride2_odd": Conv(n=3, c=64, hw=(13, 11), k=64, groups=8, dtype="half", stride=(2, 2)),
    "g4_half_dilation_mode": Conv(
        c=16, hw=(11, 6), k=16, groups=4, dtype="half", dilation=(2, 2), pre=(2, 0), post=(1, 3), mode="convolution"
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("choice", [{"mma": 1}, {"mma": 1, "tiles": 1, "blocks_per_sm": 2}], ids=["t2", "t1-bps2"])
@pytest.mark.parametrize("case", GPU)
def test_matches_reference_on_gpu(case: str, choice: dict[str, object]) -> None:
    check_choice_on_gpu(GPU[case], choice)


def test_autotuning_times_both_kernels() -> None:
    """The candidates: the kernel over runs and the tensor-core one (2 and 1 tiles a warp), each
    of which emits; fp32 has no choice to time."""
    from codegen.emit import candidates
    from fusion_rules import fuse

    for conv, want in (
        (Conv(n=2, c=64, hw=(9, 9), k=64, groups=8), [{"mma": 0}, {"mma": 1}, {"mma": 1, "tiles": 1}]),
        (Conv(n=2, c=64, hw=(9, 9), k=64, groups=16, dtype="float"), []),
    ):
        graph = conv.build()
        (fused,) = fuse(graph.validate()).nodes
        assert candidates(fused, 90) == want
        for choice in want:
            assert kernels(graph, choice)
