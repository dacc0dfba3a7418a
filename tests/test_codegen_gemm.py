"""GEMM family: convolution forward and matmul with fused epilogues.

CPU: every kernel is emitted and compiled with NVRTC for sm_80 and sm_90, and takes the
path (tensor cores, SIMT, depthwise or small groups) its layout calls for. GPU: results against the reference on
awkward shapes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.nvrtc import compile_cubin
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.frameworks import to_torch
from tests.gpu_check import check_on_gpu, poisoned, to_numpy


@dataclass(frozen=True)
class Conv:
    """A conv + optional BN/bias/residual/activation graph description."""

    n: int = 2
    c: int = 16
    hw: tuple[int, ...] = (9, 7)
    k: int = 24
    filt: tuple[int, ...] = (3, 3)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    pre: tuple[int, ...] = (1, 1)
    post: tuple[int, ...] = (1, 1)
    groups: int = 1
    dtype: str = "bf16"
    nhwc: bool = True
    out_nhwc: bool | None = None
    epilogue: str = "bn_relu"  # "", "bn_relu", "bias_add_relu", "gelu"
    mode: str = "cross_correlation"

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name="conv", io_data_type=self.dtype)
        layout = gd.nhwc_strides if self.nhwc else gd.nchw_strides
        x_dim = [self.n, self.c, *self.hw]
        w_dim = [self.k, self.c // self.groups, *self.filt]
        x = g.tensor(name="x", dim=x_dim, stride=layout(x_dim))
        w = g.tensor(name="w", dim=w_dim, stride=layout(w_dim))
        y = g.conv_fprop(
            x,
            w,
            pre_padding=self.pre,
            post_padding=self.post,
            stride=self.stride,
            dilation=self.dilation,
            convolution_mode=self.mode,
        )
        per_channel = [1, self.k, *[1] * len(self.hw)]
        if "bn" in self.epilogue:
            stats = [g.tensor(name=n, dim=per_channel, data_type="float") for n in ("mean", "inv_var", "gamma", "beta")]
            y = g.batchnorm_inference(y, *stats)
        if "bias" in self.epilogue:
            y = g.bias(y, g.tensor(name="b", dim=per_channel, data_type="float"))
        if "add" in self.epilogue:
            assert y.dim is not None
            y = g.add(y, g.tensor(name="residual", dim=y.dim, stride=layout(list(y.dim))))
        if "relu" in self.epilogue:
            y = g.relu(y)
        if "gelu" in self.epilogue:
            y = g.gelu(y)
        y.set_output(True)
        if self.out_nhwc is not None and y.dim is not None:
            y.set_stride(gd.nhwc_strides(list(y.dim)) if self.out_nhwc else gd.nchw_strides(list(y.dim)))
        return g


@dataclass(frozen=True)
class Matmul:
    batch_a: tuple[int, ...] = ()
    batch_b: tuple[int, ...] = ()
    m: int = 37
    k: int = 40
    n: int = 48
    dtype: str = "bf16"
    b_transposed: bool = False  # B stored k-contiguous (as B^T row-major)
    epilogue: str = "bias_gelu"

    def build(self) -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name="matmul", io_data_type=self.dtype)
        a = g.tensor(name="A", dim=[*self.batch_a, self.m, self.k])
        b_dim = [*self.batch_b, self.k, self.n]
        b_stride = list(gd.packed_strides(b_dim))
        if self.b_transposed:
            order = [*range(len(self.batch_b)), len(b_dim) - 1, len(b_dim) - 2]
            b_stride = list(gd.packed_strides(b_dim, order))
        b = g.tensor(name="B", dim=b_dim, stride=b_stride)
        y = g.matmul(a, b)
        if "bias" in self.epilogue:
            y = g.bias(y, g.tensor(name="bias", dim=[1, self.n]))
        if "gelu" in self.epilogue:
            y = g.gelu_approx_tanh(y)
        if "add" in self.epilogue:
            assert y.dim is not None
            y = g.add(y, g.tensor(name="residual", dim=list(y.dim)))
        y.set_output(True)
        return g


TENSOR_CORE = {
    "resnet_3x3": Conv(n=2, c=64, hw=(14, 14), k=64),
    "odd_pixels_1x1": Conv(c=32, hw=(7, 5), k=40, filt=(1, 1), pre=(0, 0), post=(0, 0), epilogue="bias_add_relu"),
    "stride2_dilation2_asym": Conv(c=16, hw=(11, 9), k=24, stride=(2, 2), dilation=(2, 2), pre=(2, 0), post=(1, 3)),
    "half_conv_mode": Conv(dtype="half", mode="convolution", epilogue="gelu"),
    "nchw_output": Conv(out_nhwc=False, epilogue=""),
    "conv1d": Conv(c=8, hw=(13,), k=8, filt=(3,), stride=(1,), dilation=(1,), pre=(1,), post=(1,)),
    "conv3d": Conv(
        c=8, hw=(5, 4, 6), k=16, filt=(3, 3, 3), stride=(1, 1, 2), dilation=(1, 1, 1), pre=(1, 1, 1), post=(1, 1, 1)
    ),
    "k_not_multiple_of_tile": Conv(c=8, hw=(3, 3), k=3, filt=(1, 1), pre=(0, 0), post=(0, 0), epilogue="bias_add_relu"),
    "matmul_nk": Matmul(b_transposed=True),
    "matmul_kn_batched": Matmul(batch_a=(3, 2), batch_b=(2,), m=19, k=24, n=64, epilogue="bias_gelu_add"),
    "matmul_half_single_row": Matmul(m=1, k=64, n=16, dtype="half", epilogue=""),
}

SIMT = {
    "fp32_conv": Conv(dtype="float"),
    "c3_first_layer": Conv(c=3, hw=(15, 13), k=16, filt=(7, 7), stride=(2, 2), pre=(3, 3), post=(3, 3)),
    "grouped": Conv(c=16, k=24, groups=4),
    "depthwise_multiplier": Conv(c=16, k=32, groups=16, epilogue="bias_add_relu"),  # 2 filters a channel
    "depthwise_c_not_a_vector": Conv(c=12, k=12, groups=12),
    "grouped_filter_over_48k": Conv(n=1, c=512, hw=(4, 5), k=512, groups=64),  # 8 channels a group, 72 KiB
    "nchw_input": Conv(nhwc=False),
    "double_conv": Conv(dtype="double", epilogue="bias_add_relu"),
    "matmul_fp32": Matmul(dtype="float"),
    "matmul_k_odd": Matmul(k=37),
    "matmul_double_batched": Matmul(batch_a=(2,), batch_b=(2,), dtype="double", epilogue="bias"),
}

# Depthwise and small-group NHWC with runs of 16 bytes of channels: codegen/families/gemm_grouped_conv.py
DEPTHWISE = {
    "depthwise": Conv(c=16, k=16, groups=16, epilogue="bias_add_relu"),
    "depthwise_half_conv_mode_stride2": Conv(c=24, k=24, groups=24, dtype="half", stride=(2, 2), mode="convolution"),
    "depthwise_fp32_dilation2_asym": Conv(
        c=12, hw=(11, 6), k=12, groups=12, dtype="float", dilation=(2, 2), pre=(2, 0), post=(1, 3), epilogue="gelu"
    ),
    "depthwise_5x5_nchw_output": Conv(c=32, k=32, groups=32, filt=(5, 5), pre=(2, 2), post=(2, 2), out_nhwc=False),
    "depthwise_filter_over_48k_in_memory": Conv(
        n=1, c=1008, hw=(5, 4), k=1008, groups=1008, filt=(5, 5), pre=(2, 2), post=(2, 2), mode="convolution"
    ),
}
GROUPED = {
    "grouped_4_channels": Conv(c=32, k=32, groups=8, epilogue="bias_add_relu"),  # ResNeXt 32x4d's kind
    "grouped_8_channels_half_stride2": Conv(c=16, hw=(9, 8), k=16, groups=2, dtype="half", stride=(2, 2)),
    "grouped_2_channels_fp32_conv_mode": Conv(c=8, k=8, groups=4, dtype="float", mode="convolution", epilogue="gelu"),
}


def gemm_kernels(graph: gd.OperationGraphSpec, arch: int) -> list:
    partition = fr.fuse(graph, arch=arch)
    programs = emit_partition(partition, arch)
    return [
        k
        for fused, program in zip(partition.nodes, programs)
        if fused.family is fr.Family.GEMM
        for k in program.kernels
    ]


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize(
    ("case", "path"),
    [
        *[(c, "mma") for c in TENSOR_CORE],
        *[(c, "simt") for c in SIMT],
        *[(c, "depthwise") for c in DEPTHWISE],
        *[(c, "grouped") for c in GROUPED],
    ],
)
def test_gemm_kernels_compile_and_take_their_path(case: str, path: str, arch: int) -> None:
    spec = {**TENSOR_CORE, **SIMT, **DEPTHWISE, **GROUPED}[case]
    (kernel,) = gemm_kernels(spec.build(), arch)
    assert f"_{path}_" in kernel.name
    assert max(kernel.block) <= 1024 and kernel.block[0] % 32 == 0
    assert kernel.shared_bytes <= 227 * 1024
    assert all(0 < g < 2**31 for g in kernel.grid) and kernel.grid[1] <= 65535 and kernel.grid[2] <= 65535
    assert compile_cubin(kernel.source, kernel.name, arch)


def test_every_tile_candidate_compiles() -> None:
    graph = TENSOR_CORE["resnet_3x3"].build()
    partition = fr.fuse(graph)
    (fused,) = [f for f in partition.nodes if f.family is fr.Family.GEMM]
    choices = candidates(fused, 80)  # the mma.sync tiles (sm_90 adds the wgmma ones: test_codegen_gemm_sm90)
    assert len(choices) >= 3
    for choice in choices:
        (program,) = emit_partition(fr.Partition(partition.graph, (fused,), (), ()), 90, {fused.name: choice})
        kernel = program.kernels[0]
        assert kernel.block[0] == (choice["block_m"] // 64) * (choice["block_n"] // 32) * 32  # type: ignore[operator]
        assert compile_cubin(kernel.source, kernel.name, 90)


def test_kernel_header_names_the_graph_and_nodes() -> None:
    graph = TENSOR_CORE["resnet_3x3"].build()
    (kernel,) = gemm_kernels(graph, 90)
    assert graph.signature() in kernel.source
    assert "conv_fprop_0 (conv_fprop), batchnorm_inference_0 (batchnorm_inference), relu_0 (relu)" in kernel.source


@pytest.mark.gpu
@pytest.mark.parametrize("case", [*TENSOR_CORE, *SIMT, *DEPTHWISE, *GROUPED])
def test_gemm_matches_reference_on_gpu(case: str) -> None:
    check_on_gpu({**TENSOR_CORE, **SIMT, **DEPTHWISE, **GROUPED}[case].build(), seed=zlib.crc32(case.encode()))


@pytest.mark.gpu
def test_depthwise_reads_a_misaligned_image_element_by_element() -> None:
    """An image two bytes past a 16-byte boundary: the runtime's aligned flag is 0 and the
    kernel reads its channels one by one, with the same result."""
    import torch

    graph = DEPTHWISE["depthwise"].build()
    ir = graph.validate()
    feeds = random_inputs(ir, 7)
    expected = reference.execute(ir, feeds)
    pack = {t.name: to_torch(feeds[t.name], t) for t in ir.inputs}
    x = pack["x"]
    pack["x"] = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device).as_strided(x.shape, x.stride(), 1)
    pack["x"].copy_(x)
    (out,) = ir.outputs
    result = poisoned(out)
    gd.compile(graph).execute({**pack, out.name: result})
    torch.cuda.synchronize()
    assert relative_error(to_numpy(result), expected[out.name].astype(np.float64)) <= tolerance(out.data_type)


@pytest.mark.gpu
@pytest.mark.parametrize("choice", range(4))
def test_every_tile_candidate_matches_reference_on_gpu(choice: int) -> None:
    graph = Conv(n=3, c=32, hw=(9, 11), k=136, epilogue="bias_add_relu").build()
    fused = next(f for f in fr.fuse(graph).nodes if f.family is fr.Family.GEMM)
    check_on_gpu(graph, tuning={fused.name: candidates(fused, 80)[choice]})
