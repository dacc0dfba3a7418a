"""The small-group weight gradient on the tensor cores (codegen/families/wgrad_mma.py; tuning
``mma``: 1, the default for 8 channels a group in fp16/bf16, 2-d). CPU: the CPU emulation (its
mma.sync and movmatrix stand-ins) against the reference for 8, 4, 2 and 1 channels a group, odd
images, stride 2, dilation, asymmetric padding, true convolution, 1-3 tiles a step, several
chunks of runs and slots, at both alignments; NVRTC for sm_80 and sm_90; the choices refused by
name. GPU: the benchmark's layers (batch 4) and awkward shapes against the reference."""

from __future__ import annotations

import pytest

import graphdnn as gd
from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from tests import cpu_emulation
from tests.test_cpu_emulation import check
from tests.test_wgrad_runs import case_id, fused_of, programs, wgrad

EMULATED = [
    (wgrad("half", 16, 8, [23, 21], [3, 3], n=3), {}),  # 2 runs: 4 slots a run, several blocks
    (wgrad("half", 80, 8, [9, 11], [3, 3], stride=2), {"mma": 1, "tiles": 1, "stages": 2}),  # 10 runs: 2 chunks
    (wgrad("half", 24, 4, [7, 8], [3, 3], dilation=[2, 2], convolution_mode="CONVOLUTION"), {"mma": 1}),
    (wgrad("half", 16, 2, [10, 7], [3, 2], pre_padding=[2, 0], post_padding=[0, 1]), {"mma": 1, "tiles": 1}),
    (wgrad("half", 16, 1, [12, 13], [3, 5], stride=2, dilation=[1, 2]), {"mma": 1, "blocks_per_sm": 1}),
    (wgrad("half", 8, 4, [5, 6], [1, 3], n=1), {"mma": 1, "stages": 2}),
    # 73 blocks of 2 steps: the next step staged during this one's products
    (
        wgrad("half", 16, 8, [68, 68], [3, 3]),
        {"mma": 1, "tiles": 1, "blocks_per_sm": 1, "stages": 2},
    ),  # one run; 3 taps: the second mma's upper rows zero
]


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_matches_reference_on_the_cpu(case, tmp_path_factory: pytest.TempPathFactory) -> None:
    graph, tuning = case
    kernels = programs(graph, tuning).kernels
    assert [k.name.rsplit("_", 1)[0] for k in kernels] == ["gd_conv_wgrad_mma", "gd_conv_wgrad_mma_total_sums"]
    check(graph, tuning, tmp_path_factory)


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", EMULATED[:3], ids=case_id)
def test_kernels_compile(case, arch: int) -> None:
    graph, tuning = case
    for kernel in programs(graph, tuning, arch).kernels:
        assert compile_cubin(kernel.source, kernel.name, arch)


@pytest.mark.parametrize(
    ("graph", "tuning", "message"),
    [
        (wgrad("half", 16, 8, [9, 7], [3, 3]), {"mma": 2}, "'mma' is 0 or 1"),
        (wgrad("float", 16, 4, [9, 7], [3, 3]), {"mma": 1}, "1 only for 2-d fp16 and bf16"),
        (wgrad("half", 16, 8, [6, 5, 7], [3, 1, 3]), {"mma": 1}, "1 only for 2-d fp16 and bf16"),
        (wgrad("half", 16, 8, [9, 7], [3, 3]), {"mma": 1, "tiles": 5}, r"'tiles' \(1\.\.4\)"),
        (wgrad("half", 16, 8, [9, 7], [3, 3]), {"mma": 1, "window": 1}, "with 'mma' the choices are"),
    ],
)
def test_a_bad_choice_is_refused_by_name(graph: gd.OperationGraphSpec, tuning: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedError, match=r"^node '\w+': conv_wgrad tuning .*" + message):
        programs(graph, tuning)


def test_defaults() -> None:
    """8-channel groups (bf16, 2-d) take the tensor cores; 4-channel groups and depthwise layers
    keep wgrad_runs' kernel, and so does a tuning of its choices with 'mma': 0."""
    cases = [
        (256, 8, {}, "gd_conv_wgrad_mma"),
        (128, 4, {}, "gd_conv_wgrad_runs"),
        (144, 1, {}, "gd_conv_wgrad_runs"),
        (256, 8, {"mma": 0, "owned_dims": 1}, "gd_conv_wgrad_runs"),
    ]
    for channels, group, tuning, name in cases:
        program = programs(wgrad("bfloat16", channels, group, [28, 28], [3, 3], n=32), tuning)
        assert program.kernels[0].name.rsplit("_", 1)[0] == name


GPU = [
    wgrad("bfloat16", 256, 8, [28, 28], [3, 3], n=4),
    wgrad("bfloat16", 128, 4, [56, 56], [3, 3], n=4),
    wgrad("bfloat16", 144, 1, [56, 56], [3, 3], n=4, stride=2),
    wgrad("half", 40, 8, [17, 13], [3, 3], n=3, stride=2, dilation=[2, 1]),
    wgrad("bfloat16", 64, 8, [15, 31], [3, 5], n=1, pre_padding=[2, 1], post_padding=[1, 2]),
]
GPU_TUNINGS = [{"mma": 1}, {"mma": 1, "tiles": 1, "blocks_per_sm": 4}]


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", GPU_TUNINGS, ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
@pytest.mark.parametrize("graph", GPU, ids=lambda g: g.name)
def test_matches_reference_on_gpu(graph: gd.OperationGraphSpec, tuning: dict[str, object]) -> None:
    from tests.gpu_check import check_on_gpu

    _, fused = fused_of(graph)
    check_on_gpu(graph, tuning={fused.name: tuning}, cache=None)


def test_autotuning_times_both_kernels() -> None:
    """The candidates: the kernel over runs and the tensor-core one (2 and 1 tiles a warp), each
    of which emits; a 3-d filter has no choice to time."""
    from codegen.emit import candidates

    for graph, want in (
        (wgrad("half", 16, 4, [9, 7], [3, 3]), [{"mma": 0}, {"mma": 1}, {"mma": 1, "tiles": 1}]),
        (wgrad("half", 16, 8, [6, 5, 7], [3, 1, 3]), []),
    ):
        _, fused = fused_of(graph)
        assert candidates(fused, 90) == want
        for choice in want:
            assert programs(graph, choice).kernels
