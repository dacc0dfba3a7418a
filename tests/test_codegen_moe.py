"""Kernels of block-scaled quantization, top-k, the router and the MoE movement ops.

CPU: every case's kernels compile with NVRTC for sm_80 and sm_90, and the emitters make
the documented choices (one router kernel, one warp per block or row). GPU (``gpu``
marker): every case runs against the reference on awkward shapes with poisoned outputs:
fp8, e8m0 and index outputs bit for bit (NaN as any NaN), float outputs within the per-type tolerance;
and crafted inputs for saturation, NaN / inf / zero blocks, ties, NaN rows, an expert with
no token, all tokens to one expert, and the documented behaviour of out-of-range indices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from codegen import compile_cubin
from graphdnn import reference
from graphdnn.compare import relative_error, tolerance
from graphdnn.compilation import Compilation
from graphdnn.ir import Graph, Tensor
from graphdnn.lower import KernelSource, lower
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.frameworks import torch_dtype

Build = Callable[[], gd.OperationGraphSpec]
CASES: dict[str, Build] = {}


def case(build: Build) -> Build:
    CASES[build.__name__] = build
    return build


def outputs(g: gd.OperationGraphSpec, *tensors: Any) -> gd.OperationGraphSpec:
    for t in tensors:
        t.set_output(True)
    return g


def quantized(io: str, dims: list[int], block: int, element: str, scale: str, **kw: Any) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type=io, intermediate_data_type="float")
    y, s = g.block_scale_quantize(g.tensor(dims, name="x"), block, name="q", **kw)
    return outputs(g, y.set_data_type(element), s.set_data_type(scale))


@case
def mxfp8_e4m3_partial_block() -> gd.OperationGraphSpec:
    return quantized("float", [5, 70], 32, "fp8_e4m3", "fp8_e8m0")  # 70 = 2 blocks + 6


@case
def mxfp8_e5m2_bf16_one_token() -> gd.OperationGraphSpec:
    return quantized("bfloat16", [1, 96], 32, "fp8_e5m2", "fp8_e8m0")


@case
def deepseek_1x128_half() -> gd.OperationGraphSpec:
    return quantized("half", [7, 300], 128, "fp8_e4m3", "float")


@case
def blocks_down_columns_transposed() -> gd.OperationGraphSpec:
    return quantized("float", [65, 3, 5], 16, "fp8_e4m3", "float", axis=0, transpose=True)


@case
def dequantize_mxfp8_to_half() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="half", intermediate_data_type="float")
    x = g.tensor([6, 45], name="x", data_type="fp8_e4m3")
    s = g.tensor([6, 2], name="s", data_type="fp8_e8m0")
    return outputs(g, g.block_scale_dequantize(x, s, 32, name="dq"))


@case
def quantize_dequantize_round_trip() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="float", intermediate_data_type="float")
    y, s = g.block_scale_quantize(g.tensor([4, 33], name="x"), 32, name="q")
    return outputs(g, g.block_scale_dequantize(y, s, 32, name="dq"))


@case
def topk_rows_of_1000() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="half")
    values, indices = g.topk(g.tensor([3, 1000], name="x"), 17, name="tk")
    return outputs(g, values, indices)


@case
def topk_down_columns_int64() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="float")
    values, indices = g.topk(g.tensor([9, 4, 5], name="x"), 9, axis=0, name="tk")
    return outputs(g, values, indices.set_data_type("int64"))


@case
def topk_values_only_bf16() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="bfloat16")  # the unread indices are never stored
    values, _ = g.topk(g.tensor([5, 33], name="x"), 4, name="tk")
    return outputs(g, values)


@case
def router_mixtral_top2_of_8() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="bfloat16", intermediate_data_type="float")
    weights, indices = g.moe_router(g.tensor([37, 8], name="logits"), 2, "softmax", name="router")
    return outputs(g, weights.set_data_type("float"), indices)


@case
def router_deepseek_top8_of_256() -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="float")
    logits, bias = g.tensor([19, 256], name="logits"), g.tensor([256], name="bias")
    weights, indices = g.moe_router(logits, 8, "sigmoid", bias=bias, scaling_factor=2.5, name="router")
    return outputs(g, weights, indices)


def pipeline(tokens: int, k: int, experts: int, hidden: int, out: int) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(io_data_type="half", intermediate_data_type="float")
    chosen = g.tensor([tokens, k], name="chosen", data_type="int32")
    weights = g.tensor([tokens, k], name="weights", data_type="float")
    token_index, slot, firsts = g.moe_permutation(chosen, experts, name="perm")
    rows = g.gather(g.tensor([tokens, hidden], name="h"), token_index, name="permute")
    y = g.moe_grouped_matmul(rows, g.tensor([experts, hidden, out], name="w"), firsts, name="experts")
    return outputs(g, token_index, slot, firsts, rows, y, g.moe_unpermute(y, slot, weights, name="combine"))


@case
def moe_pipeline_37_tokens_top2_of_8() -> gd.OperationGraphSpec:
    return pipeline(37, 2, 8, 24, 20)


@case
def moe_pipeline_one_token() -> gd.OperationGraphSpec:
    return pipeline(1, 2, 4, 8, 3)


def sources(g: gd.OperationGraphSpec, arch: int) -> list[KernelSource]:
    job = Compilation.of(g.validate(), arch)
    return list(lower(job.partition, job.target, job.signature, job.fields.kernel_key).sources.values())


# -- CPU ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_compile(name: str, arch: int) -> None:
    for source in sources(CASES[name](), arch):
        assert compile_cubin(source.source, source.name, arch, source.arch_suffix)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_parameter_is_bound_to_its_tensor(name: str) -> None:
    """Kernels read only the fused node's inputs, write only its outputs, and write them all;
    the permutation's offsets scratch is declared."""
    from codegen import ParamKind
    from tests.test_codegen_direct import emit_direct

    for fused, program in emit_direct(CASES[name]()):
        inputs, outputs = {t.id for t in fused.inputs}, {t.id for t in fused.outputs}
        read, written = set(), set()
        for kernel in program.kernels:
            assert kernel.block == (256, 1, 1) and 1 <= kernel.grid[0] <= 65535
            declarations = kernel.source.split(f"{kernel.name}(")[1].split(") {")[0].split(", ")
            assert len(declarations) == len(kernel.params)
            for declaration, param in zip(declarations, kernel.params):
                if param.kind is ParamKind.SCRATCH:
                    assert param.scratch in {s.name for s in program.scratch}
                    continue
                assert param.kind is ParamKind.TENSOR
                writable = not declaration.startswith("const")
                assert param.tensor in (outputs if writable else inputs), declaration
                (written if writable else read).add(param.tensor)
        assert read == inputs and written == outputs, fused.name


def test_the_router_is_one_kernel() -> None:
    (kernel,) = sources(CASES["router_deepseek_top8_of_256"](), 90)
    assert "moe_router" in kernel.name and "gd::warp_first" in kernel.source and "float chosen_w[8];" in kernel.source


def test_quantize_is_a_warp_per_block_and_stores_e8m0_scales() -> None:
    (kernel,) = sources(CASES["mxfp8_e4m3_partial_block"](), 80)
    assert "gd::lanes_reduce<32>(amax, gd::NanMax())" in kernel.source
    assert "gd::from<__nv_fp8_e8m0>(s)" in kernel.source and "(c1 * 32 + j) < 70" in kernel.source


# -- GPU ------------------------------------------------------------------------------------------
EXACT = {gd.DataType.FP8_E4M3, gd.DataType.FP8_E5M2, gd.DataType.FP8_E8M0, gd.DataType.INT32, gd.DataType.INT64}
NAN_BYTE = {gd.DataType.FP8_E4M3: 0x7F, gd.DataType.FP8_E5M2: 0x7F, gd.DataType.FP8_E8M0: 0xFF}


def run_on_gpu(ir: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of ``ir`` computed on the GPU from poisoned buffers, as NumPy arrays of its
    type (1-byte floats by their bits, so that NaN payloads and saturation compare exactly)."""
    import torch

    from tests.gpu_check import poisoned, to_device

    def poison(t: Tensor) -> Any:
        if t.data_type in NAN_BYTE:  # torch cannot fill every fp8 type: poison the bytes
            out = torch.empty_strided(t.dim, t.stride, dtype=torch.uint8, device="cuda").fill_(NAN_BYTE[t.data_type])
            return out.view(torch_dtype(t.data_type))
        return poisoned(t)

    plan = gd.compile(ir)
    results = {t.name: poison(t) for t in ir.outputs}
    plan.execute({**{t.name: to_device(feeds[t.name], t) for t in ir.inputs}, **results})
    torch.cuda.synchronize()
    arrays = {}
    for t in ir.outputs:
        value = results[t.name].cpu()
        if t.data_type in NAN_BYTE:
            arrays[t.name] = value.view(torch.uint8).numpy().view(t.data_type.numpy)
        elif t.data_type.is_floating:
            arrays[t.name] = value.to(torch.float64).numpy()
        else:
            arrays[t.name] = value.numpy()
    return arrays


def assert_matches(ir: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    want = reference.execute(ir, feeds)
    got = run_on_gpu(ir, feeds)
    for t in ir.outputs:
        if t.data_type in EXACT:
            expected = np.asarray(want[t.name]).astype(t.data_type.numpy)
            if t.data_type in NAN_BYTE:  # bit for bit, but any NaN for NaN (payloads and signs vary)
                nan = np.isnan(expected.astype(np.float64))
                np.testing.assert_array_equal(np.isnan(got[t.name].astype(np.float64)), nan, err_msg=t.name)
                bytes_got, bytes_want = got[t.name].view(np.uint8), expected.view(np.uint8)
                np.testing.assert_array_equal(bytes_got[~nan], bytes_want[~nan], err_msg=t.name)
            else:
                np.testing.assert_array_equal(got[t.name], expected, err_msg=t.name)
        else:
            error = relative_error(got[t.name], want[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name}: relative error {error:.3g}"
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_the_reference(name: str) -> None:
    ir = CASES[name]().validate()
    assert_matches(ir, random_inputs(ir, seed=7))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mxfp8_e4m3_partial_block", "deepseek_1x128_half"])
def test_quantize_saturation_nan_inf_and_zero_blocks(name: str) -> None:
    ir = CASES[name]().validate()
    x = random_inputs(ir, seed=1)["x"].astype(np.float64) * 1e4  # beyond e4m3's range before scaling
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    x[2, :] = 0.0
    x[3, :] = np.float64(2.0**-140) if name.startswith("mx") else 1e-4  # below e4m3 once scaled by 1
    assert_matches(ir, {"x": x.astype(ir.inputs[0].data_type.numpy)})


@pytest.mark.gpu
def test_topk_ties_and_nan() -> None:
    ir = CASES["topk_rows_of_1000"]().validate()
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, (3, 1000)).astype(np.float16)  # hundreds of ties: lower index first
    x[1, [5, 700]] = np.nan
    assert_matches(ir, {"x": x})


@pytest.mark.gpu
def test_all_tokens_to_one_expert_and_experts_without_tokens() -> None:
    ir = CASES["moe_pipeline_37_tokens_top2_of_8"]().validate()
    feeds = random_inputs(ir, seed=5)
    feeds["chosen"] = np.tile(np.int32([6, 1]), (37, 1))  # experts 0, 2-5 and 7 get nothing
    got = assert_matches(ir, feeds)
    np.testing.assert_array_equal(got["perm::first_token_offset"], [0, 0, 37, 37, 37, 37, 37, 74])


@pytest.mark.gpu
def test_out_of_range_indices_are_ignored_on_the_gpu() -> None:
    """What docs/ops.md promises: a dropped choice (slot -1, left-over rows token -1), a zero
    gathered row, a skipped combine term; never an access outside a buffer."""
    ir = CASES["moe_pipeline_one_token"]().validate()
    feeds = random_inputs(ir, seed=2)
    feeds["chosen"] = np.int32([[2, 9]])  # expert 9 of 4
    got = run_on_gpu(ir, feeds)
    np.testing.assert_array_equal(got["perm::slot"], [[0, -1]])
    np.testing.assert_array_equal(got["perm::token_index"], [0, -1])
    np.testing.assert_array_equal(got["perm::first_token_offset"], [0, 0, 0, 1])
    np.testing.assert_array_equal(got["permute::y"][1], 0.0)
    h, w = feeds["h"].astype(np.float64), feeds["w"].astype(np.float64)
    want = float(feeds["weights"][0, 0]) * (h[0] @ w[2])
    assert relative_error(got["combine::y"][0], want) <= tolerance(gd.DataType.HALF)
