"""The depthwise and small-group weight gradient over runs of channels (codegen/families/wgrad_runs.py).

CPU: the layout each filter gets (taps owned per thread, kept indices and pixel ranges per
block); every tuning choice's kernels run in the CPU emulation against the reference (float
and half; odd images, stride 2, dilation, asymmetric padding, true convolution, 1-d and 3-d,
bands of taps, several chunks of kept indices, several blocks of partials) at both alignments,
and compile with NVRTC for sm_80 and sm_90; a bad choice is refused by name. GPU: the benchmark's
layers (batch 4) and awkward shapes in bf16, fp16 and fp32 under each choice, against the reference.
"""

from __future__ import annotations

import pytest

import graphdnn as gd
from codegen import emitter
from codegen.context import EmitContext
from codegen.families.wgrad_runs import layout
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn.errors import UnsupportedError
from graphdnn.signature import signature
from tests import cpu_emulation
from tests.test_cpu_emulation import check


def wgrad(
    io: str,
    channels: int,
    group: int,
    image: list[int],
    taps: list[int],
    *,
    n: int = 2,
    stride: int = 1,
    **conv: object,
) -> gd.OperationGraphSpec:
    """An NHWC (or NWC, NDHWC) conv_wgrad of ``group`` channels a group (1: depthwise), padding
    ``taps // 2`` unless given, named after its shape."""
    spatial = len(image)
    options: dict[str, object] = {"padding": [t // 2 for t in taps], "stride": [stride] * spatial, **conv}
    pre = options.get("pre_padding", options["padding"])
    post = options.get("post_padding", options["padding"])
    dilation = options.get("dilation", [1] * spatial)
    out = [
        (size + p + q - d * (t - 1) - 1) // stride + 1
        for size, p, q, d, t in zip(image, pre, post, dilation, taps)  # type: ignore[call-overload]
    ]
    if "pre_padding" in options:
        options.pop("padding")
    name = f"wgrad_{io}_c{channels}_g{group}_{'x'.join(map(str, image))}_f{'x'.join(map(str, taps))}_s{stride}"
    g = gd.OperationGraphSpec(name=name + "".join(f"_{k}" for k in conv), io_data_type=io)
    x_dim, y_dim = [n, channels, *image], [n, channels, *out]

    def tensor(name: str, dim: list[int]) -> gd.TensorSpec:
        return g.tensor(name=name, dim=dim, stride=gd.nhwc_strides(dim))

    w_dim = [channels, group, *taps]
    dw = g.conv_wgrad(tensor("x", x_dim), tensor("dy", y_dim), filter_dim=w_dim, **options)  # type: ignore[arg-type]
    dw.set_name("dw").set_output(True).set_stride(gd.nhwc_strides(w_dim))
    return g


def fused_of(graph: gd.OperationGraphSpec):
    ir = graph.validate()
    (fused,) = fuse(ir).nodes
    return ir, fused


def programs(graph: gd.OperationGraphSpec, tuning: dict[str, object], arch: int = 90):
    ir, fused = fused_of(graph)
    return emitter(fused.family)(fused, EmitContext(ir, signature(ir), arch, tuning))


# Emulated: (graph, tuning). The CPU emulation has no bf16: float (runs of 4) and half (runs of 8).
EMULATED = [
    (wgrad("float", 12, 1, [9, 7], [3, 3]), {}),  # every tap owned, 3 runs, one block
    (wgrad("half", 24, 1, [9, 10], [3, 3], n=3), {"prefetch": 1}),  # the next pixel's loads ahead
    (wgrad("half", 16, 2, [11, 9], [3, 3], stride=2), {"owned_dims": 1}),  # bands: a thread per tap row
    (wgrad("half", 24, 4, [7, 8], [3, 3], dilation=[2, 2], convolution_mode="CONVOLUTION"), {"owned_dims": 0}),
    (wgrad("float", 16, 4, [10, 7], [3, 2], pre_padding=[2, 0], post_padding=[0, 1]), {"width": 5}),  # 4 chunks
    (wgrad("half", 16, 8, [23, 21], [3, 3], n=3), {"blocks_per_sm": 1, "width": 3}),  # 8 channels a group
    (wgrad("float", 8, 1, [64, 48], [3, 3]), {}),  # 6144 pixels: several blocks of partials
    (wgrad("float", 8, 2, [64, 32], [5, 5], stride=2), {"owned_dims": 2, "width": 4}),  # 100 sums
    (wgrad("half", 16, 1, [37], [7], stride=3, dilation=[2]), {}),  # 1-d
    (wgrad("float", 8, 2, [5, 6, 7], [3, 3, 3]), {}),  # 3-d: bands of the first dim's taps
    (wgrad("half", 16, 8, [6, 5, 7], [3, 1, 3], stride=2), {"owned_dims": 3}),
    # the image columns of the previous pixel of a row reused (window): stride / dilation = 1 or 2
    (wgrad("half", 24, 1, [9, 10], [3, 3], n=3), {"window": 1}),
    (wgrad("float", 12, 4, [11, 9], [3, 3], stride=2), {"window": 1, "owned_dims": 1, "prefetch": 1}),
    (wgrad("half", 16, 2, [12, 13], [3, 5], stride=2, dilation=[1, 2]), {"window": 1, "width": 7}),
    (wgrad("float", 8, 1, [29], [4], pre_padding=[2], post_padding=[1]), {"window": 1}),
    # whole groups: a thread sums every ci of its run's groups from one image vector a tap
    (wgrad("half", 16, 8, [9, 11], [3, 3], n=3, stride=2), {"whole_groups": 1}),
    (wgrad("half", 24, 4, [7, 8], [3, 3], dilation=[2, 2], convolution_mode="CONVOLUTION"), {"whole_groups": 1}),
    (
        wgrad("float", 16, 2, [10, 7], [3, 2], pre_padding=[2, 0], post_padding=[0, 1]),
        {"whole_groups": 1, "owned_dims": 1, "window": 1, "width": 3},
    ),
    (wgrad("half", 16, 8, [6, 5, 7], [3, 1, 3], stride=2), {"whole_groups": 1, "prefetch": 1}),
]


def case_id(case: tuple[gd.OperationGraphSpec, dict[str, object]]) -> str:
    graph, tuning = case
    return graph.name + "".join(f"-{k}{v}" for k, v in tuning.items())


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_matches_reference_on_the_cpu(case, tmp_path_factory: pytest.TempPathFactory) -> None:
    graph, tuning = case
    kernels = programs(graph, tuning).kernels
    assert [k.name.rsplit("_", 1)[0] for k in kernels] == ["gd_conv_wgrad_runs", "gd_conv_wgrad_runs_total_sums"]
    check(graph, tuning, tmp_path_factory, marker="= this_image[" if tuning.get("window") else "")


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", EMULATED, ids=case_id)
def test_kernels_compile(case, arch: int) -> None:
    graph, tuning = case
    for kernel in programs(graph, tuning, arch).kernels:
        assert compile_cubin(kernel.source, kernel.name, arch)


def test_layouts_of_the_benchmark_layers() -> None:
    """A bf16 3x3 run of 8 channels a group owns its 9 taps (72 sums, 2 blocks per SM); a
    depthwise one a row of 3 (24 sums, 4 blocks per SM), of a 5x5 filter a row of 5 (40 sums,
    2 blocks per SM); kept indices in chunks of up to 32; enough pixel ranges per block to fill
    256 threads; no loads ahead, no window."""
    cases = {
        # (channels, group, size, taps): (owned, width, slots, chunks, blocks per SM)
        (144, 1, 56, 3): (1, 27, 9, 2, 4),
        (576, 1, 14, 3): (1, 31, 8, 7, 4),
        (256, 8, 28, 3): (2, 32, 8, 8, 2),
        (128, 4, 56, 3): (2, 32, 8, 2, 2),
        (144, 1, 56, 5): (1, 30, 8, 3, 2),
    }
    for (channels, group, size, taps), want in cases.items():
        _, fused = fused_of(wgrad("bfloat16", channels, group, [size, size], [taps, taps], n=32))
        dy, dw = fused.inputs[1], fused.outputs[0]
        plan = layout(dy, dw, fused.anchor.attributes, 8, 90, {})
        assert (plan.owned, plan.width, plan.slots, plan.chunks, plan.resident) == want
        assert (plan.prefetch, plan.window) == (0, 0)
        pixels = 32 * size * size
        assert plan.blocks * plan.slots * plan.pixels >= pixels > (plan.blocks - 1) * plan.slots * plan.pixels


@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"owned_dims": 3}, "owned_dims must be an integer in 0..2"),
        ({"width": 0}, "width must be an integer in 1..256"),
        ({"blocks": 2}, r"unknown \['blocks'\]"),
        ({"prefetch": 2}, "prefetch must be an integer in 0..1"),
        ({"window": 1, "owned_dims": 0}, "window must be an integer in 0..0"),
    ],
)
def test_a_bad_choice_is_refused_by_name(tuning: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedError, match=r"^node '\w+': conv_wgrad runs tuning .*" + message):
        programs(wgrad("float", 12, 1, [9, 7], [3, 3]), tuning)


GPU = [
    wgrad("bfloat16", 144, 1, [56, 56], [3, 3], n=4),
    wgrad("bfloat16", 144, 1, [56, 56], [3, 3], n=4, stride=2),
    wgrad("bfloat16", 576, 1, [14, 14], [3, 3], n=4),
    wgrad("bfloat16", 128, 4, [56, 56], [3, 3], n=4),
    wgrad("bfloat16", 256, 8, [28, 28], [3, 3], n=4),
    wgrad("half", 40, 8, [17, 13], [3, 3], n=3, stride=2, dilation=[2, 1]),
    wgrad("float", 36, 2, [15, 31], [5, 5], n=3, pre_padding=[2, 1], post_padding=[1, 2]),
    wgrad("bfloat16", 24, 1, [7, 9, 11], [3, 3, 3], n=2),
]
GPU_TUNINGS = [
    {},
    {"owned_dims": 2, "prefetch": 1},
    {"owned_dims": 0, "width": 8},
    {"window": 1, "blocks_per_sm": 3},
    {"whole_groups": 1},
]


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", GPU_TUNINGS, ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()) or "default")
@pytest.mark.parametrize("graph", GPU, ids=lambda g: g.name)
def test_matches_reference_on_gpu(graph: gd.OperationGraphSpec, tuning: dict[str, object]) -> None:
    from tests.gpu_check import check_on_gpu

    _, fused = fused_of(graph)
    check_on_gpu(graph, tuning={fused.name: tuning} if tuning else None, cache=None)
