"""Convolution gradients on the tensor-core GEMM (fusion_rules/conv_grad_gemm.py decides, the
GEMM family emits): which graphs take it and why the others stay direct, the launch choices,
NVRTC compilation for sm_80 and sm_90, and (GPU) results against the reference."""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen.emit import candidates, emit_partition
from graphdnn.compare import relative_error, tolerance
from graphdnn.errors import UnsupportedError
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from tests import cpu_emulation
from tests.compile_check import compile_graphs
from tests.gpu_check import check_on_gpu
from tests.mma_emulation import on_cpu
from tests.test_codegen_gemm import Conv


@dataclass(frozen=True)
class Grad:
    """A conv_dgrad (with an optional epilogue on dx) or conv_wgrad graph."""

    op: str = "dgrad"  # or "wgrad"
    n: int = 2
    c: int = 16
    hw: tuple[int, int] = (9, 7)
    k: int = 24
    filt: tuple[int, int] = (3, 3)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    pre: tuple[int, int] = (1, 1)
    post: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype: str = "bf16"
    layout: str = "nhwc"  # or "nchw" (image and loss)
    image_layout: str = ""  # a wgrad's image in another layout than the loss ("nchw")
    filter_layout: str = "krsc"  # "kcrs", or "rsck" (output channels contiguous)
    mode: str = "cross_correlation"
    epilogue: str = ""  # dgrad: "", "drelu" (relu_backward of a forward input), "add" (a residual), "drelu_add"

    @property
    def out_hw(self) -> tuple[int, ...]:
        return tuple(
            (x + lo + hi - d * (f - 1) - 1) // s + 1
            for x, lo, hi, d, f, s in zip(self.hw, self.pre, self.post, self.dilation, self.filt, self.stride)
        )

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"conv_{self.op}", io_data_type=self.dtype)
        layout = gd.nhwc_strides if self.layout == "nhwc" else gd.nchw_strides
        x_dim = [self.n, self.c, *self.hw]
        dy_dim = [self.n, self.k, *self.out_hw]
        w_dim = [self.k, self.c // self.groups, *self.filt]
        dy = g.tensor(name="dy", dim=dy_dim, stride=layout(dy_dim))
        conv = dict(
            pre_padding=self.pre,
            post_padding=self.post,
            stride=self.stride,
            dilation=self.dilation,
            convolution_mode=self.mode,
        )
        if self.op == "wgrad":
            image_layout = {"": layout, "nhwc": gd.nhwc_strides, "nchw": gd.nchw_strides}[self.image_layout]
            x = g.tensor(name="x", dim=x_dim, stride=image_layout(x_dim))
            dw = g.conv_wgrad(image=x, loss=dy, filter_dim=w_dim, **conv)
            dw.set_name("dw").set_output(True).set_data_type("float")
            return g
        w = g.tensor(name="w", dim=w_dim, stride=self._filter_strides(w_dim))
        dx = g.conv_dgrad(loss=dy, filter=w, image_dim=x_dim, **conv)
        if "drelu" in self.epilogue:
            dx = g.relu_backward(dx, g.tensor(name="x", dim=x_dim, stride=layout(x_dim)))
        if "add" in self.epilogue:
            dx = g.add(dx, g.tensor(name="residual", dim=x_dim, stride=layout(x_dim)))
        dx.set_name("dx").set_output(True)
        return g

    def _filter_strides(self, w_dim: list[int]) -> list[int]:
        if self.filter_layout == "krsc":
            return gd.nhwc_strides(w_dim)
        if self.filter_layout == "kcrs":
            return gd.nchw_strides(w_dim)
        k, c, _, s = w_dim
        return [1, k, s * c * k, c * k]  # RSCK: output channels innermost


def gemm_fused(graph: gd.OperationGraphSpec, arch: int = 90) -> fr.FusedNode:
    (fused,) = [f for f in fr.fuse(graph, arch=arch).nodes if f.anchor is not None and "conv" in f.anchor.op]
    return fused


def emitted(graph: gd.OperationGraphSpec, arch: int = 90, choice: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    partition = fr.fuse(graph, arch=arch)
    fused = gemm_fused(graph, arch)
    programs = emit_partition(partition, arch, {fused.name: choice} if choice is not None else None)
    (program,) = [p for p, f in zip(programs, partition.nodes) if f.name == fused.name]
    return program


# -- the choice -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
@pytest.mark.parametrize("arch", [80, 90])
def test_fitting_gradients_take_the_tensor_core_gemm(op: str, arch: int) -> None:
    fused = gemm_fused(Grad(op=op).build(), arch)
    assert fused.family is fr.Family.GEMM and fused.rule == f"conv_{op}_gemm"
    kernel = emitted(Grad(op=op).build(), arch).kernels[0]
    path = "wgmma" if (op, arch) == ("wgrad", 90) else "mma"  # a wgrad's default on sm_90: gemm_wgrad.py
    assert kernel.name.startswith(f"gd_conv_{op}_{path}_") and kernel.block[0] >= 64


def test_dgrad_epilogues_fuse_into_the_gemm() -> None:
    fused = gemm_fused(Grad(epilogue="drelu_add").build())
    assert [n.op for n in fused.nodes] == ["conv_dgrad", "relu_backward", "add"]
    (kernel,) = emitted(Grad(epilogue="drelu_add").build()).kernels
    assert kernel.name.startswith("gd_conv_dgrad_relu_backward_add_mma_")


REFUSED = {
    "fp32": (Grad(dtype="float"), "fp16 or bf16"),
    "nchw_loss": (Grad(layout="nchw"), "loss 'dy' needs axis 1 contiguous"),
    "k_not_multiple_of_8": (Grad(k=20), "loss 'dy' needs axis 1 contiguous with a multiple of 8"),
    "kcrs_filter": (Grad(filter_layout="kcrs"), "filter 'w' needs axis 1 contiguous"),
    "filter_c_not_multiple_of_8": (Grad(c=12), "filter 'w' needs axis 1 contiguous"),
    "grouped": (Grad(c=32, groups=2), "grouped convolution"),
    "wgrad_nchw": (Grad(op="wgrad", layout="nchw"), "loss 'dy' needs axis 1"),
    "wgrad_k_not_multiple_of_8": (Grad(op="wgrad", k=20), "loss 'dy' needs axis 1 contiguous with a multiple of 8"),
    "wgrad_grouped": (Grad(op="wgrad", c=32, groups=2), "grouped convolution"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_other_gradients_stay_direct_and_the_plan_says_why(case: str) -> None:
    spec, reason = REFUSED[case]
    partition = fr.fuse(spec.build(), arch=90)
    (grad,) = [f for f in partition.nodes if f.anchor is not None and f.anchor.op.startswith("conv_")]
    assert grad.family is fr.Family.DIRECT and grad.rule == "single"
    (rejection,) = [r for r in partition.rejections if r.rule == f"conv_{spec.op}_gemm"]
    assert reason in rejection.reason
    assert reason in partition.describe()


def test_sm75_keeps_the_direct_kernels() -> None:
    partition = fr.fuse(Grad().build(), arch=75)
    assert all(f.family is not fr.Family.GEMM for f in partition.nodes)
    assert any("needs sm_80 or newer" in r.reason for r in partition.rejections)


def test_k_contiguous_filter_takes_the_gemm() -> None:
    spec = Grad(filter_layout="rsck")
    assert gemm_fused(spec.build()).family is fr.Family.GEMM
    from codegen.families.gemm_problem import problem_of, tensor_core_layout

    fused = gemm_fused(spec.build())
    assert fused.anchor is not None and tensor_core_layout(problem_of(fused.anchor)) == "nk"
    assert tensor_core_layout(problem_of(gemm_fused(Grad().build()).anchor)) == "kn"  # type: ignore[arg-type]


def test_wgrad_of_a_long_reduction_splits_k() -> None:
    spec = Grad(op="wgrad", n=32, c=64, k=64, hw=(56, 56))  # 64 x 576 outputs, K = 32*56*56
    program = emitted(spec.build(), 80)
    main, reduce = program.kernels
    assert "_mma_splitk_" in main.name and "_splitk_reduce_" in reduce.name
    assert 16 < main.grid[2] <= 64 and program.scratch  # 5 tiles of 64 x 128: about one wave of slices
    # The reduction of the small 64 x 576 output over 22 slices: 8 slice groups of 3 (reduce_groups),
    # so blocks of 2 rows x 128 columns by 8 groups, 160 of them (one group: 20 blocks of 16 rows).
    assert main.grid[2] == 22 and reduce.block[0] == 256 and reduce.grid[:2] == (32, 5)
    assert "GROUPS = 8" in reduce.source


def test_wgrad_takes_wgmma_on_sm90() -> None:
    """gemm_wgrad.default_choice: 64 x 128 tiles, 3 stages, slices for three waves (three blocks
    per SM); 128 x 64 tiles for a 1x1 64 -> 256, 6 stages, slices for one wave; 128 x 192 tiles
    for a 3x3 over 128 channels (N = 1152, six tiles)."""
    main, reduce = emitted(Grad(op="wgrad", n=32, c=64, k=64, hw=(56, 56)).build(), 90).kernels
    assert "_wgmma_splitk_" in main.name and main.grid == (1, 5, 80) and main.block == (128, 1, 1)
    assert "STAGES = 3" in main.source and "_splitk_reduce_" in reduce.name
    assert "(int)kk * 64 + m" in main.source  # the packed loss addressed from k directly
    one_by_one = Grad(op="wgrad", n=32, c=64, k=256, hw=(56, 56), filt=(1, 1), pre=(0, 0), post=(0, 0))
    main = emitted(one_by_one.build(), 90).kernels[0]
    assert main.grid == (2, 1, 66) and main.block == (256, 1, 1) and "STAGES = 6" in main.source
    wide = Grad(op="wgrad", n=32, c=128, k=128, hw=(28, 28))
    main = emitted(wide.build(), 90).kernels[0]
    assert main.grid == (1, 6, 22) and main.block == (256, 1, 1) and "STAGES = 4" in main.source
    (small,) = emitted(Grad(op="wgrad").build(), 90).kernels  # K = 2*9*7: one k tile, no split
    assert "_wgmma_" in small.name and "splitk" not in small.name


@pytest.mark.parametrize("op", ["dgrad", "wgrad"])
def test_candidates_cover_tiles_split_k_and_the_direct_kernel(op: str) -> None:
    spec = Grad(op=op, n=32, c=64, k=64, hw=(56, 56))
    choices = candidates(gemm_fused(spec.build()), 90)
    assert {"path": "direct"} in choices
    assert not any(c.get("path") == "ws" for c in choices)
    assert any(c.get("path") == "wgmma" for c in choices)  # wgrad's m-contiguous loss: wgmma's transposed A
    assert any(c.get("block_n") == 192 for c in choices) == (op == "wgrad")  # N = 3 * 3 * 64 = 3 * 192
    wgrad_default = {"path": "wgmma", "block_m": 64, "block_n": 128, "stages": 3, "split_k": 80}
    assert (wgrad_default in choices) == (op == "wgrad")  # autotuning times the default too
    assert not any(c.get("path") == "wgmma" for c in candidates(gemm_fused(spec.build(), 80), 80))
    assert any("split_k" in c for c in choices) == (op == "wgrad")
    direct = emitted(spec.build(), 90, {"path": "direct"})
    assert all("_mma" not in kernel.name for kernel in direct.kernels)
    tuned = emitted(spec.build(), 90, {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 3})
    assert tuned.kernels[0].grid[2] == 3


def test_with_an_epilogue_the_direct_kernel_is_no_candidate_and_is_refused() -> None:
    graph = Grad(epilogue="drelu").build()
    assert {"path": "direct"} not in candidates(gemm_fused(graph), 90)
    with pytest.raises(UnsupportedError, match="has no epilogue"):
        emitted(graph, 90, {"path": "direct"})
    with pytest.raises(UnsupportedError, match=r"mma\.sync path"):
        emitted(Grad(op="wgrad").build(), 90, {"path": "ws", "block_n": 128, "stages": 3})


# -- NVRTC ------------------------------------------------------------------------------------
# Awkward shapes: stride 2 (taps between loss pixels), dilation 2, padding 0/1/2, 1x1, 3x3 and
# 7x7 filters, odd H and W, C and K not multiples of the tile, true convolution, split-K.
CASES: dict[str, Grad] = {
    "dgrad_3x3_s1": Grad(),
    "dgrad_3x3_s2_odd": Grad(hw=(9, 11), stride=(2, 2), c=24, k=40),
    "dgrad_3x3_dil2_pad2": Grad(dilation=(2, 2), pre=(2, 2), post=(2, 2), hw=(7, 9)),
    "dgrad_1x1_pad0": Grad(filt=(1, 1), pre=(0, 0), post=(0, 0), c=72, k=40, hw=(5, 5)),
    "dgrad_1x1_s2_pad0": Grad(filt=(1, 1), stride=(2, 2), pre=(0, 0), post=(0, 0), c=40, k=24, hw=(9, 9)),
    "dgrad_7x7_s2_pad3": Grad(filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3), c=8, k=16, hw=(15, 13), n=1),
    "dgrad_half_convolution_mode": Grad(dtype="half", mode="convolution", stride=(2, 1), hw=(8, 7)),
    "dgrad_rsck_filter": Grad(filter_layout="rsck", stride=(2, 2), hw=(9, 9)),
    "dgrad_drelu_add": Grad(epilogue="drelu_add", c=24, hw=(6, 5)),
    "dgrad_half_drelu": Grad(dtype="half", epilogue="drelu", stride=(2, 2), hw=(11, 9), c=136),
    "dgrad_asym_pad": Grad(pre=(0, 1), post=(2, 0), hw=(8, 9)),
    "wgrad_3x3_s1": Grad(op="wgrad"),
    "wgrad_3x3_s2_odd": Grad(op="wgrad", hw=(9, 11), stride=(2, 2), c=24, k=40),
    "wgrad_3x3_dil2_pad2": Grad(op="wgrad", dilation=(2, 2), pre=(2, 2), post=(2, 2), hw=(7, 9)),
    "wgrad_1x1_pad0": Grad(op="wgrad", filt=(1, 1), pre=(0, 0), post=(0, 0), c=72, k=136, hw=(5, 5)),
    "wgrad_7x7_s2_pad3": Grad(op="wgrad", filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3), c=8, k=16, hw=(15, 13)),
    "wgrad_half_convolution_mode": Grad(op="wgrad", dtype="half", mode="convolution", hw=(8, 7)),
    "wgrad_split_k": Grad(op="wgrad", n=8, c=64, k=64, hw=(28, 28)),
    "wgrad_batch1_split_k_half": Grad(op="wgrad", n=1, c=16, k=8, hw=(33, 31), dtype="half"),
    # Channels that do not read in 16-byte chunks: the image gathered element by element.
    "wgrad_stem_c3_7x7_s2": Grad(
        op="wgrad", c=3, k=24, filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3), hw=(19, 17)
    ),
    "wgrad_c1_odd": Grad(op="wgrad", c=1, k=40, hw=(9, 11)),
    "wgrad_c5_dil2_s2": Grad(
        op="wgrad", c=5, k=16, hw=(13, 11), stride=(2, 2), dilation=(2, 2), pre=(2, 2), post=(2, 2)
    ),
    "wgrad_c12_half_convolution_mode": Grad(op="wgrad", c=12, k=72, dtype="half", mode="convolution"),
    "wgrad_nchw_image_c16_s2": Grad(op="wgrad", c=16, image_layout="nchw", stride=(2, 2), hw=(9, 11)),
}
ODD_CHANNELS = [case for case, spec in CASES.items() if spec.op == "wgrad" and (spec.c % 8 or spec.image_layout)]


@pytest.mark.parametrize("case", CASES)
def test_gradient_kernels_compile_for_sm80_and_sm90(case: str) -> None:
    graph = CASES[case].build()
    for arch in (80, 90):
        fused = gemm_fused(graph, arch)
        assert fused.family is fr.Family.GEMM, f"{case} should take the tensor-core GEMM on sm_{arch}"
    report = compile_graphs([graph.validate()], (80, 90))
    assert not report.failures, "\n".join(report.failures)
    assert report.kernels >= 2


@pytest.mark.parametrize("case", ODD_CHANNELS)
@pytest.mark.parametrize("arch", [80, 90])
def test_wgrad_of_odd_channels_gathers_the_image_element_by_element(case: str, arch: int) -> None:
    """C = 1, 3, 5, 12, or an NCHW image: no 16-byte chunks along the image's channels, so the
    gather reads it element by element (gemm_wgrad_gather.py) and each dw column whose
    channels are no multiple of 8 finds its own taps."""
    fused = gemm_fused(CASES[case].build(), arch)
    assert fused.family is fr.Family.GEMM and fused.rule == "conv_wgrad_gemm"
    main = emitted(CASES[case].build(), arch).kernels[0]
    assert "px_base[e] + column" in main.source
    assert ("(block_n + col + e)" in main.source) == (CASES[case].c % 8 != 0)
    assert "cp.async" in main.source  # the loss still copies in 16-byte chunks
    assert "px_base" not in emitted(CASES["wgrad_3x3_s1"].build(), arch).kernels[0].source


WGMMA = {"path": "wgmma", "block_m": 128, "block_n": 64, "stages": 4}
WGMMA_CASES = {case: spec for case, spec in CASES.items() if spec.op == "dgrad"}
# wgrad on wgmma (the loss as a transposed A): the tile of the 64-channel 3x3 layers, and 128 rows
# over two warpgroups; a few shapes only (every kernel here is compiled in CI).
WGRAD_WGMMA = {"path": "wgmma", "block_m": 64, "block_n": 192, "stages": 3}
WGRAD_WGMMA_CASES = {
    "wgrad_3x3_s2_odd": (CASES["wgrad_3x3_s2_odd"], {**WGRAD_WGMMA, "split_k": 3}),
    "wgrad_7x7_s2_pad3": (CASES["wgrad_7x7_s2_pad3"], WGRAD_WGMMA),
    "wgrad_1x1_pad0": (CASES["wgrad_1x1_pad0"], {**WGMMA, "split_k": 2}),
    "wgrad_stem_c3_7x7_s2": (CASES["wgrad_stem_c3_7x7_s2"], {**WGRAD_WGMMA, "split_k": 4}),
    "wgrad_c5_dil2_s2": (CASES["wgrad_c5_dil2_s2"], WGMMA),
    "wgrad_stem_c3_160_columns": (CASES["wgrad_stem_c3_7x7_s2"], {**WGRAD_WGMMA, "block_n": 160, "split_k": 2}),
}


@pytest.mark.parametrize("case", WGMMA_CASES)
def test_dgrad_wgmma_kernels_compile_for_sm90a(case: str) -> None:
    from codegen.nvrtc import compile_cubin

    for choice in (WGMMA, {**WGMMA, "split_k": 3}):
        program = emitted(WGMMA_CASES[case].build(), 90, choice)
        assert program.kernels[0].name.startswith("gd_conv_dgrad") and "_wgmma" in program.kernels[0].name
        for kernel in program.kernels:
            assert compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


@pytest.mark.parametrize("case", WGRAD_WGMMA_CASES)
def test_wgrad_wgmma_kernels_compile_for_sm90a(case: str) -> None:
    from codegen.nvrtc import compile_cubin

    spec, choice = WGRAD_WGMMA_CASES[case]
    program = emitted(spec.build(), 90, choice)
    main = program.kernels[0]
    assert main.name.startswith("gd_conv_wgrad_wgmma") and main.block[0] == 2 * int(choice["block_m"])  # type: ignore[call-overload]
    # wgmma with A transposed (m-contiguous) and B too (n-contiguous), but an image gathered
    # element by element, whose tile is k-contiguous
    assert ("1, 1, 1, 1;" if spec.c % 8 == 0 else "1, 1, 1, 0;") in main.source
    assert len(program.kernels) == (2 if "split_k" in choice else 1)
    for kernel in program.kernels:
        assert compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


# -- GPU --------------------------------------------------------------------------------------
RESNET = {
    "resnet_dgrad_3x3_c64_56": Grad(n=4, c=64, k=64, hw=(56, 56)),
    "resnet_dgrad_1x1_c256_to_64": Grad(n=4, c=256, k=64, hw=(56, 56), filt=(1, 1), pre=(0, 0), post=(0, 0)),
    "resnet_dgrad_3x3_s2_c128_28": Grad(n=4, c=128, k=128, hw=(56, 56), stride=(2, 2), epilogue="drelu_add"),
    "resnet_wgrad_3x3_c64_56": Grad(op="wgrad", n=8, c=64, k=64, hw=(56, 56)),
    "resnet_wgrad_1x1_s2_c256_to_512": Grad(
        op="wgrad", n=4, c=256, k=512, hw=(28, 28), filt=(1, 1), stride=(2, 2), pre=(0, 0), post=(0, 0)
    ),
    "resnet_wgrad_7x7_stem_c8": Grad(
        op="wgrad", n=2, c=8, k=64, hw=(64, 64), filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3)
    ),
}
GPU_CASES = {**CASES, **RESNET}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_gradient_matches_reference_on_gpu(case: str) -> None:
    spec = GPU_CASES[case]
    # An fp32 dw sums up to 25k products in fp32 (the reference in float64): rounding grows like
    # sqrt(K) * 2^-24 relative to a sum of random signs, past the 2e-5 of an elementwise fp32 output.
    tolerance = 1e-4 if spec.op == "wgrad" else None
    plan = check_on_gpu(spec.build(), seed=zlib.crc32(case.encode()), tolerance=tolerance)
    tensor_cores = ("_mma_", "_wgmma_")
    assert any(p in k.name for k in plan.kernels for p in tensor_cores), "the gradient did not take the tensor cores"


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 3, 16])
def test_wgrad_split_choices_match_reference_on_gpu(split: int) -> None:
    graph = CASES["wgrad_split_k"].build()
    fused = gemm_fused(graph, current_gpu_arch() or 90)
    choice = {"block_m": 64, "block_n": 128, "stages": 4, "split_k": split}
    check_on_gpu(graph, seed=split, tuning={fused.name: choice}, tolerance=1e-4)


@pytest.mark.gpu
def test_direct_choice_matches_reference_on_gpu() -> None:
    graph = CASES["dgrad_3x3_s2_odd"].build()
    fused = gemm_fused(graph, current_gpu_arch() or 90)
    plan = check_on_gpu(graph, seed=5, tuning={fused.name: {"path": "direct"}})
    assert not any("_mma_" in kernel.name for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["dgrad_3x3_s2_odd", "dgrad_rsck_filter", "dgrad_drelu_add", "dgrad_7x7_s2_pad3"])
@pytest.mark.parametrize("split", [1, 2])
def test_dgrad_wgmma_matches_reference_on_gpu(case: str, split: int) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma path runs on sm_90 GPUs only")
    graph = CASES[case].build()
    fused = gemm_fused(graph, 90)
    plan = check_on_gpu(graph, seed=split, tuning={fused.name: {**WGMMA, "split_k": split}})
    assert any("_wgmma" in kernel.name for kernel in plan.kernels)


# Awkward shapes: K = 40, 8, 136 (not multiples of the 64- or 128-row tile), C = 8 and 24, N*P*Q
# not a multiple of the 64-element k tile or of the slices, stride 2, dilation, padding, batch 1.
WGRAD_GPU = {
    "wgrad_3x3_s2_odd": CASES["wgrad_3x3_s2_odd"],
    "wgrad_3x3_dil2_pad2": CASES["wgrad_3x3_dil2_pad2"],
    "wgrad_7x7_s2_pad3": CASES["wgrad_7x7_s2_pad3"],
    "wgrad_1x1_pad0": CASES["wgrad_1x1_pad0"],
    "wgrad_batch1_split_k_half": CASES["wgrad_batch1_split_k_half"],
    "wgrad_convolution_mode": CASES["wgrad_half_convolution_mode"],
    "wgrad_3x3_c64_28": Grad(op="wgrad", n=2, c=64, k=64, hw=(28, 28)),  # N = 576: three 192-column tiles
    **{case: CASES[case] for case in ODD_CHANNELS},
    "wgrad_stem_c3_n4": Grad(
        op="wgrad", n=4, c=3, k=64, hw=(57, 55), filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3)
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", WGRAD_GPU)
@pytest.mark.parametrize(
    "choice",
    [{**WGRAD_WGMMA, "split_k": 5}, {**WGMMA, "split_k": 3}],  # no split: the default of the small cases
    ids=["64x192_split5", "128x64_split3"],
)
def test_wgrad_wgmma_matches_reference_on_gpu(case: str, choice: dict[str, object]) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma path runs on sm_90 GPUs only")
    graph = WGRAD_GPU[case].build()
    fused = gemm_fused(graph, 90)
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice}, tolerance=1e-4)
    assert any("_wgmma" in kernel.name for kernel in plan.kernels)


def test_160_column_tiles_take_only_k_contiguous_b() -> None:
    """wgmma's 160-column tile (the stem's N = 147) fits a k-contiguous B tile (an image gathered
    element by element), not the n-contiguous one of 64-column blocks."""
    choice = {**WGRAD_WGMMA, "block_n": 160}
    assert "m64n160k16" in emitted(CASES["wgrad_stem_c3_7x7_s2"].build(), 90, choice).kernels[0].source
    with pytest.raises(UnsupportedError, match="160 too where B is k-contiguous; here it is n-contiguous"):
        emitted(CASES["wgrad_3x3_s1"].build(), 90, choice)


def test_gathered_wgrad_defaults_on_sm90() -> None:
    """gemm_wgrad._gathered: one column tile, the narrowest covering N; the stem's 147 columns in
    160, prefetch, slices for two waves (two blocks per SM); a 3x3 over 12 channels (N = 108) in
    128 columns, three blocks per SM without prefetch, slices for three waves (at most K / 256)."""
    stem = Grad(op="wgrad", n=32, c=3, k=64, hw=(224, 224), filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3))
    main, reduce = emitted(stem.build(), 90).kernels
    assert main.grid == (1, 1, 264) and "m64n160k16" in main.source and "gather(kt + STAGES - 1);" in main.source
    assert "_splitk_reduce_" in reduce.name
    twelve = Grad(op="wgrad", n=32, c=12, k=64, hw=(56, 56))
    main = emitted(twelve.build(), 90).kernels[0]
    assert main.grid == (1, 1, 392) and "m64n128k16" in main.source and "pending" not in main.source
    assert "_mma_splitk_" in emitted(stem.build(), 80).kernels[0].name  # sm_80: the mma.sync heuristic


def test_prefetch_is_a_choice_of_a_gathered_image_on_wgmma() -> None:
    """ "prefetch" (the image's loads a tile ahead through registers, on by default) applies to a
    wgrad gathered element by element on the wgmma path only; elsewhere it is refused."""
    stem = CASES["wgrad_stem_c3_7x7_s2"].build()
    ahead = emitted(stem, 90, {**WGRAD_WGMMA, "block_n": 160}).kernels[0].source
    assert "gather(kt + STAGES - 1);" in ahead and "put(" in ahead
    inline = emitted(stem, 90, {**WGRAD_WGMMA, "block_n": 160, "prefetch": False}).kernels[0].source
    assert "gather_tile(stage, kt)" in inline and "pending" not in inline
    with pytest.raises(UnsupportedError, match=r"prefetch .* applies to a conv_wgrad whose image is gathered"):
        emitted(CASES["wgrad_3x3_s1"].build(), 90, {**WGRAD_WGMMA, "prefetch": True})
    with pytest.raises(UnsupportedError, match="prefetch is a choice of the wgmma path"):
        emitted(stem, 90, {"block_m": 64, "block_n": 64, "stages": 4, "prefetch": True})
    assert {"path": "wgmma", "block_m": 64, "block_n": 160, "stages": 3} in candidates(gemm_fused(stem), 90)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [*ODD_CHANNELS, "wgrad_stem_c3_n4"])
@pytest.mark.parametrize("prefetch", [True, False])
def test_wgrad_of_odd_channels_in_160_columns_matches_reference_on_gpu(case: str, prefetch: bool) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma path runs on sm_90 GPUs only")
    graph = WGRAD_GPU[case].build()
    fused = gemm_fused(graph, 90)
    choice = {**WGRAD_WGMMA, "block_n": 160, "split_k": 3, "prefetch": prefetch}
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice}, tolerance=1e-4)
    assert any("_wgmma" in kernel.name for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["wgrad_stem_c3_n4", "wgrad_c5_dil2_s2"])
def test_wgrad_of_odd_channels_on_mma_sync_matches_reference_on_gpu(case: str) -> None:
    """sm_80's path (mma.sync) for an image gathered element by element, run on this GPU."""
    graph = WGRAD_GPU[case].build()
    fused = gemm_fused(graph, current_gpu_arch() or 90)
    choice = {"block_m": 64, "block_n": 128, "stages": 3, "split_k": 3}
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice}, tolerance=1e-4)
    assert any("_mma_" in kernel.name for kernel in plan.kernels)


# -- the mma.sync kernels on the CPU (tests/mma_emulation.py) ------------------------------------
# fp16 (the emulation's half), small shapes: every block's threads run as host threads.
EMULATED: dict[str, tuple[Grad, dict[str, object] | None]] = {
    "dgrad_3x3_s2_odd": (replace(CASES["dgrad_3x3_s2_odd"], dtype="half", n=1), None),
    "dgrad_3x3_dil2_pad2": (replace(CASES["dgrad_3x3_dil2_pad2"], dtype="half", n=1), None),
    "dgrad_1x1_s2_pad0": (replace(CASES["dgrad_1x1_s2_pad0"], dtype="half", n=1, hw=(7, 5)), None),
    "dgrad_7x7_s2_pad3": (replace(CASES["dgrad_7x7_s2_pad3"], dtype="half", hw=(9, 7)), None),
    "dgrad_convolution_mode": (replace(CASES["dgrad_half_convolution_mode"], n=1), None),
    "dgrad_rsck_filter": (replace(CASES["dgrad_rsck_filter"], dtype="half", n=1, hw=(7, 5)), None),
    "dgrad_drelu_add": (replace(CASES["dgrad_drelu_add"], dtype="half", n=1), None),
    "dgrad_split3": (
        replace(CASES["dgrad_asym_pad"], dtype="half", n=1),
        {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 3},
    ),
    "wgrad_3x3_s2_odd": (replace(CASES["wgrad_3x3_s2_odd"], dtype="half", n=1), None),
    "wgrad_3x3_dil2_pad2": (replace(CASES["wgrad_3x3_dil2_pad2"], dtype="half", n=1), None),
    "wgrad_7x7_s2_pad3": (replace(CASES["wgrad_7x7_s2_pad3"], dtype="half", hw=(9, 7), n=1), None),
    "wgrad_convolution_mode": (replace(CASES["wgrad_half_convolution_mode"], n=1), None),
    "wgrad_1x1_tile128": (
        replace(CASES["wgrad_1x1_pad0"], dtype="half", n=1, hw=(3, 5)),
        {"block_m": 128, "block_n": 128, "stages": 3},
    ),
    "wgrad_split_k": (
        replace(CASES["wgrad_batch1_split_k_half"], hw=(17, 15)),
        {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 5},
    ),
    "wgrad_stem_c3_7x7_s2": (
        replace(CASES["wgrad_stem_c3_7x7_s2"], dtype="half", n=1),
        {"block_m": 64, "block_n": 128, "stages": 3, "split_k": 3},
    ),
    "wgrad_c1_odd": (replace(CASES["wgrad_c1_odd"], dtype="half", n=1), None),
    # rows of 22 output pixels: chunks of 8 whose every tap is inside the image (no bounds checks)
    "wgrad_stem_c3_interior": (
        replace(CASES["wgrad_stem_c3_7x7_s2"], dtype="half", n=1, k=16, hw=(40, 44)),
        {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 2},
    ),
    "wgrad_c5_dil2_s2": (replace(CASES["wgrad_c5_dil2_s2"], dtype="half", n=1), None),
    "wgrad_nchw_image_c16_s2": (replace(CASES["wgrad_nchw_image_c16_s2"], dtype="half", n=1), None),
    "wgrad_c12_convolution_mode": (
        replace(CASES["wgrad_c12_half_convolution_mode"], n=1),
        {"block_m": 128, "block_n": 64, "stages": 4},
    ),
}


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", EMULATED)
def test_mma_kernels_match_reference_on_the_cpu(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    spec, choice = EMULATED[case]
    emulate(spec.build(), choice, tmp_path_factory)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
def test_wgrad_of_a_loss_with_padded_rows_on_the_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A loss whose rows are 10 pixels apart for 9 (a view): its pixels are no single run, so the
    loader finds each one's coordinates (a packed loss is addressed from k directly)."""
    g = gd.OperationGraphSpec(name="conv_wgrad_padded_loss", io_data_type="half")
    x = g.tensor(name="x", dim=[2, 16, 7, 9], stride=gd.nhwc_strides([2, 16, 7, 9]))
    dy = g.tensor(name="dy", dim=[2, 24, 7, 9], stride=[7 * 10 * 24, 1, 10 * 24, 24])
    dw = g.conv_wgrad(image=x, loss=dy, padding=[1, 1], filter_dim=[24, 16, 3, 3])
    dw.set_name("dw").set_output(True).set_data_type("float")
    source = emitted(g, 80).kernels[0].source
    assert "q1 * 240" in source and "kk * 24" not in source
    emulate(g, {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 2}, tmp_path_factory)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
def test_wgrad_of_a_3d_image_of_3_channels_on_the_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The element gather and the epilogue's own taps over three spatial axes (NDHWC, C = 3,
    3x3x3, stride 2 along one axis); compiled for sm_90a too."""
    g = gd.OperationGraphSpec(name="conv_wgrad_3d", io_data_type="half")
    x_dim, dy_dim = [1, 3, 5, 6, 7], [1, 16, 5, 3, 7]
    x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
    dy = g.tensor(name="dy", dim=dy_dim, stride=gd.nhwc_strides(dy_dim))
    dw = g.conv_wgrad(image=x, loss=dy, padding=[1, 1, 1], stride=[1, 2, 1], filter_dim=[16, 3, 3, 3, 3])
    dw.set_name("dw").set_output(True).set_data_type("float")
    assert "px_h2[e]" in emitted(g, 90).kernels[0].source
    report = compile_graphs([g.validate()], (80, 90))
    assert not report.failures, "\n".join(report.failures)
    emulate(g, None, tmp_path_factory)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", ["dgrad_drelu_add", "wgrad_split_k"])
def test_unaligned_pointers_copy_element_by_element_on_the_cpu(
    case: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    spec, choice = EMULATED[case]
    emulate(spec.build(), choice, tmp_path_factory, aligned=0)


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
def test_the_emulation_runs_conv_forward_as_the_gpu_does(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The emulation itself, on a forward convolution (its kernels pass on the GPU)."""
    emulate(
        Conv(n=1, c=16, hw=(5, 7), k=24, stride=(2, 1), dtype="half", epilogue="bias_add_relu").build(),
        None,
        tmp_path_factory,
    )


def emulate(
    graph: gd.OperationGraphSpec, choice: dict[str, object] | None, tmp: pytest.TempPathFactory, aligned: int = 1
) -> None:
    build_dir = tmp.getbasetemp() / "mma_emulation"
    build_dir.mkdir(exist_ok=True)
    ir = graph.validate()
    feeds = random_inputs(ir, 0)
    expected = gd.reference.execute(ir, feeds)
    partition = fr.fuse(ir, arch=80)
    gemm = [f for f in partition.nodes if f.family is fr.Family.GEMM]
    assert len(gemm) == 1, partition.describe()
    programs = emit_partition(partition, 80, {gemm[0].name: choice} if choice else None)
    memory = dict(feeds)
    for fused, program in zip(partition.nodes, programs):
        if fused is gemm[0]:
            assert "_mma_" in program.kernels[0].name
        emulated = dataclasses.replace(program, kernels=tuple(on_cpu(k) for k in program.kernels))
        memory.update(cpu_emulation.run(fused, emulated, memory, aligned, build_dir))
    for t in ir.outputs:
        error = relative_error(memory[t.name].astype(np.float64), expected[t.name].astype(np.float64))
        assert error <= tolerance(t.data_type), f"{t.name}: relative error {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", REFUSED)
def test_refused_gradients_run_direct_and_match_reference_on_gpu(case: str) -> None:
    """NCHW, fp32, grouped, odd channel counts: the direct kernels, end to end."""
    spec, _ = REFUSED[case]
    plan = check_on_gpu(spec.build(), seed=zlib.crc32(case.encode()))
    assert not any("_mma" in kernel.name for kernel in plan.kernels)
