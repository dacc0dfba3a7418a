"""GEMM family, Hopper engine: the TMA im2col producer of convolutions (gemm_im2col.py).

CPU: offered as engine candidates ("producer": "im2col") for NHWC convolutions of every
spatial rank TMA takes; each compiles with NVRTC for sm_90a with the image's im2col map and the
filter's tiled map as its first parameters, the windows as the convolution asks; the maps survive
the plan's JSON and the driver's rules for them are checked; what TMA cannot express (groups,
NCHW, strides over 8, corners or dilated taps out of range, matmuls) is refused with the node and
the reason, and stays on the gather producer; the default for the convolutions like those it
was measured faster on (ResNet-50 layers of 128 or more output channels), mma.sync elsewhere.
GPU: every im2col tile against the reference on awkward shapes (odd H and W, one image, stride 2
with padding, 8 and 72 channels, 1x1 stride 2, fp8, more tiles than SMs) and with split-K.
"""

from __future__ import annotations

import zlib

import pytest

import graphdnn as gd
from codegen import ParamKind
from codegen.emit import emit_partition
from codegen.families.gemm_im2col import refusal
from codegen.families.gemm_problem import problem_of
from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from graphdnn.program import Arg, ArgKind, Im2colWindow, TensorMap
from graphdnn.runtime.driver import current_gpu_arch
from tests.gpu_check import check_on_gpu
from tests.test_codegen_gemm import SIMT, Conv, Matmul
from tests.test_codegen_gemm_lowp import Fp8Conv, fp8_tolerance
from tests.test_codegen_gemm_sm90 import emit, gemm_node, sass
from tests.test_codegen_gemm_ws import ws_choices

SHAPES: dict[str, Conv | Fp8Conv] = {
    "3x3_padded": Conv(n=2, c=64, hw=(14, 14), k=64),
    "stride2_padded_odd_hw": Conv(n=3, c=32, hw=(15, 9), k=40, stride=(2, 2)),
    "1x1": Conv(c=32, hw=(7, 5), k=40, filt=(1, 1), pre=(0, 0), post=(0, 0), epilogue="bias_add_relu"),
    "1x1_stride2": Conv(n=2, c=64, hw=(9, 9), k=64, filt=(1, 1), stride=(2, 2), pre=(0, 0), post=(0, 0)),
    "odd_channels_72": Conv(n=2, c=72, hw=(9, 7), k=136, epilogue="bias_add_relu"),  # 64 + 8: two channel tiles
    "c8_single_image": Conv(n=1, c=8, hw=(7, 9), k=16),
    "dilated_asymmetric": Conv(c=16, hw=(11, 9), k=24, stride=(2, 2), dilation=(2, 2), pre=(2, 0), post=(1, 3)),
    "half_convolution_mode": Conv(dtype="half", mode="convolution", epilogue="gelu"),
    "conv1d": Conv(c=8, hw=(13,), k=8, filt=(3,), stride=(1,), dilation=(1,), pre=(1,), post=(1,)),
    "conv3d": Conv(
        c=8, hw=(5, 4, 6), k=16, filt=(3, 3, 3), stride=(1, 1, 2), dilation=(1,) * 3, pre=(1,) * 3, post=(1,) * 3
    ),
    "fp8": Fp8Conv(out_type="bfloat16"),
}


def im2col_choices(graph: gd.OperationGraphSpec) -> list[dict[str, object]]:
    return [c for c in ws_choices(graph) if c.get("producer") == "im2col"]


@pytest.mark.parametrize("case", SHAPES)
def test_im2col_candidates_compile_for_sm90a(case: str) -> None:
    graph = SHAPES[case].build()
    choices = im2col_choices(graph)
    assert {c["block_n"] for c in choices} == {128, 256}  # no gathering registers: 256-wide tiles fit
    for choice in choices:
        kernel = emit(graph, choice)
        image, filt = kernel.params[:2]
        assert image.kind is filt.kind is ParamKind.TENSOR_MAP
        assert image.tensor_map is not None and image.tensor_map.im2col is not None
        assert filt.tensor_map is not None and filt.tensor_map.im2col is None
        assert image.tensor_map.box == (128 // image.tensor_map.element_bytes, 128)  # a k tile of 128 pixels
        assert not image.tensor_map.problems() and not filt.tensor_map.problems()
        assert "global.im2col" in kernel.source and "load_tile" not in kernel.source  # no gather
        code = sass(compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix))
        if code is not None:
            assert "UTMALDG" in code and ("HGMMA" in code or "QGMMA" in code) and "LDL" not in code


def test_the_window_is_the_convolutions_padding_strides_and_dilation() -> None:
    """pre (2, 0), post (1, 3), stride 2, dilation 2, 3x3 over 11 x 9: W (innermost) from 0 to
    3 - 2 * 2 past its end, H from -2 to 1 - 4; the filter map walks one tap a copy."""
    kernel = emit(SHAPES["dilated_asymmetric"].build(), im2col_choices(SHAPES["dilated_asymmetric"].build())[0])
    image, filt = (p.tensor_map for p in kernel.params[:2])
    assert image is not None and filt is not None
    assert image.dims == (16, 9, 11, 2) and image.strides == (32, 288, 3168)
    assert image.im2col == Im2colWindow(lower=(0, -2), upper=(-1, -3), strides=(2, 2))
    assert filt.dims == (16, 3, 3, 24) and filt.box == (64, 1, 1, 128)
    assert "(unsigned short)(f1 * 2), (unsigned short)(f0 * 2)" in kernel.source  # dilated tap offsets, W first


def test_channels_past_c_are_zero_filled_tap_by_tap() -> None:
    """72 channels take two k tiles per tap (the second 8 wide, zero-filled): 18 for a 3x3, not
    the gather's ceil(648 / 64) = 11."""
    kernel = emit(SHAPES["odd_channels_72"].build(), im2col_choices(SHAPES["odd_channels_72"].build())[0])
    assert "KTILES = 18;" in kernel.source and "CTILES = 2;" in kernel.source


REFUSED = {
    "stride_9": (Conv(c=16, hw=(40, 40), k=16, stride=(9, 9)), "strides \\[9, 9\\] \\(1 to 8\\)"),
    "dilated_past_the_offsets": (Conv(c=16, hw=(300, 9), k=16, dilation=(128, 1)), "spans 257 pixels"),
    "conv3d_padding_17": (
        Conv(
            c=8, hw=(20, 4, 4), k=8, filt=(1, 1, 1), dilation=(1,) * 3, stride=(1,) * 3, pre=(17, 0, 0), post=(0,) * 3
        ),
        "corners .*within \\[-16, 15\\]",
    ),
    "conv3d_dilated": (
        Conv(
            c=8, hw=(40, 4, 4), k=8, dilation=(16, 1, 1), filt=(3, 1, 1), stride=(1,) * 3, pre=(0,) * 3, post=(0,) * 3
        ),
        "reach 31 at most",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_tma_im2col_cannot_express_is_refused_by_name(case: str) -> None:
    """Not offered; asked for by tuning, an UnsupportedError naming the node and why; the gather
    producer still takes it."""
    spec, reason = REFUSED[case]
    graph = spec.build()
    assert ws_choices(graph) and not im2col_choices(graph)
    choice = {**ws_choices(graph)[0], "producer": "im2col"}
    with pytest.raises(UnsupportedError, match=f"node 'conv_fprop.*im2col producer cannot feed.*{reason}"):
        emit(graph, choice)
    assert "_ws_" in emit(graph, ws_choices(graph)[0]).name


def test_groups_nchw_and_matmuls_are_refused_with_their_reason() -> None:
    """Grouped and NCHW convolutions never reach the engine (the tensor cores take neither), and
    a matmul's producer is TMA's tiled mode: the reasons still say so."""
    for spec, reason in ((SIMT["grouped"], "grouped convolution \\(4 groups\\)"), (SIMT["nchw_input"], "NHWC")):
        _, fused = gemm_node(spec.build())
        assert fused.anchor is not None
        assert reason.replace("\\", "") in (refusal(problem_of(fused.anchor), 64) or "")
    matmul = Matmul(b_transposed=True).build()
    _, fused = gemm_node(matmul)
    assert fused.anchor is not None and "not a matmul" in (refusal(problem_of(fused.anchor), 64) or "")
    with pytest.raises(UnsupportedError, match=r"node 'matmul.*producer is TMA's tiled mode"):
        emit(matmul, {**ws_choices(matmul)[0], "producer": "im2col"})
    conv = SHAPES["3x3_padded"].build()
    with pytest.raises(UnsupportedError, match="producer must be one of \\['gather', 'im2col'\\], not 'tma'"):
        emit(conv, {**ws_choices(conv)[0], "producer": "tma"})


@pytest.mark.parametrize(
    ("case", "block_n"),
    [
        (Conv(n=32, c=64, hw=(56, 56), k=256, filt=(1, 1), pre=(0, 0), post=(0, 0)), 256),  # ResNet-50, measured
        (Conv(n=32, c=128, hw=(28, 28), k=128), 128),
        (Conv(n=32, c=256, hw=(14, 14), k=256), 128),  # 128 x 256 tiles would not fill the SMs
        (Conv(n=32, c=64, hw=(56, 56), k=64), None),  # 64 output channels: measured slower, mma.sync
        (Conv(n=32, c=128, hw=(56, 56), k=128, stride=(2, 2)), 128),  # ResNet-50's stride-2 3x3, measured
        (Conv(n=32, c=256, hw=(56, 56), k=512, filt=(1, 1), stride=(2, 2), pre=(0, 0), post=(0, 0)), 256),
        (Conv(n=32, c=128, hw=(56, 56), k=128, stride=(3, 3)), None),  # not measured
        (Conv(n=32, c=72, hw=(28, 28), k=128), None),  # channels not in whole k tiles
        (Conv(n=2, c=128, hw=(14, 14), k=128), None),  # tiles for fewer than half the SMs
        (Conv(n=32, c=128, hw=(28, 28), k=128, dtype="float"), None),  # SIMT
    ],
)
def test_im2col_is_the_default_where_it_measured_faster(case: Conv, block_n: int | None) -> None:
    partition, _ = gemm_node(case.build())
    kernel = emit_partition(partition, 90)[0].kernels[0]  # then split-K's reduction, where it takes one
    assert ("global.im2col" in kernel.source) == (block_n is not None)
    if block_n is not None:
        assert "_ws_" in kernel.name and f"BN = {block_n}," in kernel.source
    partition, _ = gemm_node(case.build())
    assert "im2col" not in emit_partition(partition, 80)[0].kernels[0].source  # sm_90 only


def test_im2col_maps_survive_the_plans_json_and_bad_ones_are_named() -> None:
    window = Im2colWindow(lower=(-1, -1), upper=(-1, -1), strides=(1, 2))
    good = TensorMap(2, (64, 56, 56, 32), (128, 7168, 401408), (64, 128), 128, window)
    arg = Arg(ArgKind.TENSOR_MAP, tensor=0, tensor_map=good)
    assert Arg.from_json(arg.to_json()) == arg and good.problems() == []
    assert TensorMap.from_json(good.to_json()[:5]).im2col is None  # a tiled map's JSON is as before
    assert (
        "im2col corners [-129, -1], [-1, -1] (within [-128, 127])"
        in TensorMap(
            2, (64, 56, 56, 32), (128, 7168, 401408), (64, 128), 128, Im2colWindow((-129, -1), (-1, -1), (1, 1))
        ).problems()
    )
    assert (
        "im2col strides [1, 9] (1 to 8)"
        in TensorMap(
            2, (64, 56, 56, 32), (128, 7168, 401408), (64, 128), 128, Im2colWindow((0, 0), (0, 0), (1, 9))
        ).problems()
    )
    assert (
        "box [64, 1025]" in TensorMap(2, (64, 56, 56, 32), (128, 7168, 401408), (64, 1025), 128, window).problems()
    )  # up to 1024 pixels
    assert "for rank 2" in TensorMap(2, (64, 56), (128,), (64, 128), 128, Im2colWindow((), (), ())).problems()[0]


GPU_SHAPES: dict[str, Conv | Fp8Conv] = {
    **SHAPES,
    "more_tiles_than_sms": Conv(n=20, c=64, hw=(29, 31), k=64, epilogue="bias_add_relu"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_im2col_matches_reference_on_gpu(case: str) -> None:
    """The deepest ring of each tile width."""
    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    spec = GPU_SHAPES[case]
    graph = spec.build()
    _, fused = gemm_node(graph)
    tolerance = fp8_tolerance(spec) if isinstance(spec, Fp8Conv) else None
    for choice in im2col_choices(graph)[::2]:
        plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tolerance=tolerance, tuning={fused.name: choice})
        assert any("_ws_" in kernel.name for kernel in plan.kernels), choice


@pytest.mark.gpu
def test_im2col_with_split_k_matches_reference_on_gpu() -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    graph = Conv(n=2, c=256, hw=(7, 7), k=128, epilogue="bias_add_relu").build()
    _, fused = gemm_node(graph)
    choice = {**im2col_choices(graph)[0], "split_k": 3}
    plan = check_on_gpu(graph, seed=3, tuning={fused.name: choice})
    assert len(plan.kernels) == 2 and "_ws_" in plan.kernels[0].name
