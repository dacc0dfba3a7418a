"""The frontend's block-scaled quantization through ``graphdnn.cudnn``: its MXFP8 and
DeepSeek-style programs (graph code as the frontend's tests and samples write it) against
NumPy, the block_scaled_matmul rule firing on the frontend's graph, the refusals, and the
JSON round trip. The programs run on the reference plan here and on the GPU (`gpu`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import graphdnn.cudnn as cudnn
from fusion_rules import fuse
from graphdnn.dtypes import DataType
from graphdnn.errors import AttributeValueError, GraphError, UnsupportedError

E4M3, E8M0, F32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FP8_E8M0, cudnn.data_type.FLOAT
TILED = cudnn.tensor_reordering.F8_128x4
Check = Callable[[], None]


def f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def powers_of_two(*dims: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(2.0 ** np.random.default_rng(seed).integers(-3, 4, dims)).float()


def mxfp8_scales(c: np.ndarray, block: int) -> np.ndarray:
    """OCP MX: the smallest power of two s with amax / s <= 448 (e4m3's largest), per block of the last dim."""
    amax = np.abs(c.reshape(*c.shape[:-1], -1, block)).max(axis=-1)
    return 2.0 ** np.ceil(np.log2(amax / 448.0))


def check_quantized(y: np.ndarray, scale: np.ndarray, c: np.ndarray, block: int) -> None:
    """y is c / scale to within half an fp8_e4m3 step (3 mantissa bits, subnormals below 2^-6)."""
    s = np.repeat(scale, block, axis=-1)
    step = np.maximum(2.0 ** np.floor(np.log2(np.maximum(np.abs(c / s), 2.0**-6))), 2.0**-6) * 2.0**-3
    slack = 1e-5 * np.abs(c / s)  # c's own rounding where the kernel sums in another order
    assert np.all(np.abs(y - c / s) <= step / 2 + slack), "fp8 values off by more than half a step"


def f8_128x4_tiles(scales: torch.Tensor) -> torch.Tensor:
    """[b, rows, blocks] e8m0 scales in cuBLAS's block scaling factors layout (what F8_128x4
    means): padded to 128 x 4 tiles of 512 bytes, tile rows then K tiles, byte (r % 32) * 16
    + (r // 32 % 4) * 4 + c % 4 inside a tile; the padding holds NaN (0xff), never read."""
    bytes_ = scales.to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    b, rows, cols = bytes_.shape
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-cols // 4) * 4
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    at = (r // 128) * (padded_cols // 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
    out = np.full((b, padded_rows * padded_cols), 0xFF, np.uint8)
    out[:, at] = bytes_
    return torch.from_numpy(out.reshape(b, padded_rows, padded_cols)).view(torch.float8_e8m0fnu)


def mxfp8_matmul_quantize(device: str, tiled: str = "", m: int = 40, k: int = 96, **options: Any) -> Check:
    """test_block_scale_quantize.py's graph (MXFP8: e4m3 operands, e8m0 scales of 32 blocks,
    dequantize -> matmul -> block_scale_quantize). ``tiled``: the scales reordered F8_128x4, as
    the frontend's test declares them ("declared": in the blocks' dims; "padded": in the tiles'
    padded dims), their buffers the tiles; else in their own dims."""
    b, n, block_size = 2, 64, 32
    handle = cudnn.create_handle()
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
        **options,
    )
    sk = k // block_size
    tensor_a = g.tensor(name="tensor_a", dim=[b, m, k], stride=[m * k, k, 1], data_type=E4M3)
    tensor_b = g.tensor(name="tensor_b", dim=[b, k, n], stride=[k * n, 1, k], data_type=E4M3)
    reordering = cudnn.tensor_reordering.F8_128x4 if tiled else cudnn.tensor_reordering.NONE
    padded = (-(-m // 128) * 128, -(-n // 128) * 128, -(-sk // 4) * 4)
    sm, sn, skp = padded if tiled == "padded" else (m, n, sk)  # the declared scale dims
    block_descale_a = g.tensor(
        name="block_descale_a",
        dim=[b, sm, skp],
        stride=[sm * skp, skp, 1],
        data_type=E8M0,
        reordering_type=reordering,
    )
    block_descale_b = g.tensor(
        name="block_descale_b",
        dim=[b, skp, sn],
        stride=[sn * skp, 1, skp],
        data_type=E8M0,
        reordering_type=reordering,
    )
    dequant_tensor_a = g.block_scale_dequantize(
        tensor_a, block_descale_a, block_size=[1, block_size], name="dequantize_a"
    )
    dequant_tensor_b = g.block_scale_dequantize(
        tensor_b, block_descale_b, block_size=[block_size, 1], name="dequantize_b"
    )
    tensor_c = g.matmul(dequant_tensor_a, dequant_tensor_b, compute_data_type=cudnn.data_type.FLOAT, name="matmul")
    tensor_d, block_scale = g.block_scale_quantize(
        tensor_c, block_size=block_size, axis=2, transpose=False, name="quantize_output"
    )
    tensor_d.set_output(True).set_data_type(cudnn.data_type.FP8_E4M3)
    block_scale.set_output(True).set_data_type(cudnn.data_type.FP8_E8M0)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()

    torch.manual_seed(3)
    a = torch.randn(b, m, k).to(torch.float8_e4m3fn)
    b_t = torch.randn(b, n, k).to(torch.float8_e4m3fn)  # B stored K-major, as the strides say
    scale_a = powers_of_two(b, m, sk, seed=1)
    scale_b_t = powers_of_two(b, n, sk, seed=2)
    d = torch.empty(b, m, n, dtype=torch.float8_e4m3fn, device=device)
    scale_out = torch.empty(b, m, n // block_size, dtype=torch.float8_e8m0fnu, device=device)
    workspace = torch.empty(g.get_workspace_size(), device=device, dtype=torch.uint8)
    descale_a, descale_b = (
        (f8_128x4_tiles(scale_a), f8_128x4_tiles(scale_b_t))
        if tiled
        else (scale_a.to(torch.float8_e8m0fnu), scale_b_t.to(torch.float8_e8m0fnu).transpose(1, 2))
    )
    variant_pack = {
        tensor_a: a.to(device),
        tensor_b: b_t.to(device).transpose(1, 2),
        block_descale_a: descale_a.to(device),
        block_descale_b: descale_b.to(device),
        tensor_d: d,
        block_scale: scale_out,
    }
    g.execute(variant_pack, workspace, handle=handle)

    def check() -> None:
        a64 = f64(a) * np.repeat(f64(scale_a), block_size, axis=2)
        b64 = f64(b_t) * np.repeat(f64(scale_b_t), block_size, axis=2)
        c = np.float32(a64 @ b64.transpose(0, 2, 1)).astype(np.float64)  # C is FLOAT (the intermediate type)
        np.testing.assert_array_equal(f64(scale_out), mxfp8_scales(c, block_size))
        check_quantized(f64(d), f64(scale_out), c, block_size)

    return check


def deepseek_matmul(device: str, weight_block: tuple[int, int], **options: Any) -> Check:
    """general_block_scale_matmul's graph with DeepSeek-V3's recipe: fp8 A with float [1, 128]
    scales, fp8 B with float scales per ``weight_block`` ([128, 1]: along K, which the
    block_scaled_matmul rule fuses; [128, 128]: weight blocks, graphdnn's block-scaled
    matmul), bf16 C; on sm_90 one fp8 GEMM either way."""
    m, n, k, (bk, bn) = 72, 200, 384, weight_block
    g = cudnn.pygraph(intermediate_data_type=F32, compute_data_type=F32, **options)
    sk, sn = k // bk, -(-n // bn)
    tensor_a = g.tensor(name="tensor_a", dim=[m, k], stride=[k, 1], data_type=E4M3)
    tensor_b = g.tensor(name="tensor_b", dim=[k, n], stride=[1, k], data_type=E4M3)
    block_descale_a = g.tensor(name="block_descale_a", dim=[m, sk], stride=[sk, 1], data_type=F32)
    block_descale_b = g.tensor(name="block_descale_b", dim=[sk, sn], stride=[1, sk], data_type=F32)
    dequant_tensor_a = g.block_scale_dequantize(tensor_a, block_descale_a, [1, bk], compute_data_type=F32)
    dequant_tensor_b = g.block_scale_dequantize(tensor_b, block_descale_b, [bk, bn], compute_data_type=F32)
    tensor_d = g.matmul(dequant_tensor_a, dequant_tensor_b, compute_data_type=F32, name="GEMM")
    tensor_d.set_data_type(cudnn.data_type.BFLOAT16).set_is_virtual(False)
    g.build([cudnn.heur_mode.A])

    torch.manual_seed(4)
    a, b_t = torch.randn(m, k).to(torch.float8_e4m3fn), torch.randn(n, k).to(torch.float8_e4m3fn)
    rng = np.random.default_rng(5)
    scale_a = torch.from_numpy(rng.uniform(0.01, 0.1, (m, sk))).float()
    scale_b_t = torch.from_numpy(rng.uniform(0.01, 0.1, (sn, sk))).float()
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    g.execute(
        {
            tensor_a: a.to(device),
            tensor_b: b_t.to(device).t(),
            block_descale_a: scale_a.to(device),
            block_descale_b: scale_b_t.to(device).t(),
            tensor_d: d,
        },
        torch.empty(g.get_workspace_size(), device=device, dtype=torch.uint8),
    )

    def check() -> None:
        a64 = f64(a) * np.repeat(f64(scale_a), bk, axis=1)
        b64 = f64(b_t) * np.repeat(np.repeat(f64(scale_b_t), bn, axis=0), bk, axis=1)[:n]
        want = a64 @ b64.T
        np.testing.assert_allclose(f64(d), want, rtol=2**-7, atol=2**-7 * np.abs(want).max())

    return check


PROGRAMS: dict[str, Callable[..., Check]] = {
    "mxfp8_matmul_quantize": mxfp8_matmul_quantize,
    "mxfp8_f8_128x4_scales": functools.partial(mxfp8_matmul_quantize, tiled="declared"),
    "mxfp8_f8_128x4_padded_dims": functools.partial(mxfp8_matmul_quantize, tiled="padded"),
    # 2 row tiles of A's scales, 3 K tiles
    "mxfp8_f8_128x4_many_tiles": functools.partial(mxfp8_matmul_quantize, tiled="declared", m=200, k=288),
    "deepseek_k_blocks": functools.partial(deepseek_matmul, weight_block=(128, 1)),
    "deepseek_weight_blocks": functools.partial(deepseek_matmul, weight_block=(128, 128)),
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_block_scale_program_matches_numpy(program: str) -> None:
    PROGRAMS[program]("cpu")()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_block_scale_program_compiles_for_the_gpu_without_one(program: str, arch: int) -> None:
    """sm_version builds the NVRTC plan here (sm_90: the deepseek graph is one block-scaled GEMM);
    host buffers still run the reference plan."""
    PROGRAMS[program]("cpu", sm_version=arch)()


@pytest.mark.gpu
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_frontend_block_scale_program_matches_numpy_on_the_gpu(program: str) -> None:
    check = PROGRAMS[program]("cuda")
    torch.cuda.synchronize()
    check()


# -- the mapping ----------------------------------------------------------------------------------
def graph_with(x_dim: list[int], data_type: Any = E4M3) -> tuple[cudnn.pygraph, Any]:
    g = cudnn.pygraph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32)
    return g, g.tensor(name="x", dim=x_dim, data_type=data_type)


def test_quantize_outputs_take_the_frontend_names_arguments_and_types() -> None:
    g, x = graph_with([4, 64], F32)
    y, scale = g.block_scale_quantize(x, 32)  # block_size positional, axis None: the last dim
    assert (y.get_name(), scale.get_name()) == ("0::Y", "0::scale")
    y.set_output(True)
    scale.set_output(True).set_data_type(E8M0)
    g.build()
    assert scale.get_dim() == [4, 2] and y.get_data_type() is E4M3 and scale.get_data_type() is E8M0
    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    got_y, got_scale = np.empty((4, 64), ml_dtypes.float8_e4m3fn), np.empty((4, 2), ml_dtypes.float8_e8m0fnu)
    g.execute({x: values, y: got_y, scale: got_scale})
    np.testing.assert_array_equal(got_scale.astype(np.float64), mxfp8_scales(values.astype(np.float64), 32))
    check_quantized(got_y.astype(np.float64), got_scale.astype(np.float64), values.astype(np.float64), 32)


def test_quantize_along_another_axis_transposed_puts_the_block_axis_innermost() -> None:
    g, x = graph_with([64, 6], F32)
    y, scale = g.block_scale_quantize(input=x, block_size=16, axis=0, transpose=True, name="q")
    y.set_output(True)
    scale.set_output(True)
    g.build()
    assert scale.get_dim() == [4, 6] and scale.get_stride() == [1, 4] and y.get_stride() == [1, 64]


@pytest.mark.parametrize(
    ("block_size", "axis"), [([1, 32], 1), ([32, 1], 0), ([32], 1), ([1, 1], None), ([1, 1, 32], 2)]
)
def test_dequantize_block_size_lists_map_to_one_axis(block_size: list[int], axis: int | None) -> None:
    dims = [64, 64] if len(block_size) < 3 else [2, 64, 64]
    g, x = graph_with(dims)
    blocked = axis if axis is not None else len(dims) - 1
    size = max(block_size)
    scale_dim = [d // size if i == blocked else d for i, d in enumerate(dims)]
    scale = g.tensor(name="s", dim=scale_dim, data_type=F32)
    y = g.block_scale_dequantize(x, scale, block_size, is_negative_scale=True, name="dq")
    g.relu(y).set_output(True)
    g.build()
    (node,) = [n for n in g.ir.nodes if n.op == "block_scale_dequantize"]
    assert (node.attributes.axis, node.attributes.block_size) == (axis, size)


def test_the_frontend_s_dequantize_matmul_graph_becomes_one_block_scaled_gemm_on_sm90() -> None:
    g = cudnn.pygraph(intermediate_data_type=F32, compute_data_type=F32)
    a = g.tensor(name="a", dim=[128, 256], stride=[256, 1], data_type=E4M3)
    b = g.tensor(name="b", dim=[256, 64], stride=[1, 256], data_type=E4M3)
    sa = g.tensor(name="sa", dim=[128, 2], stride=[2, 1], data_type=F32)
    sb = g.tensor(name="sb", dim=[2, 64], stride=[1, 2], data_type=F32)
    c = g.matmul(g.block_scale_dequantize(a, sa, [1, 128]), g.block_scale_dequantize(b, sb, [128, 1]), name="GEMM")
    c.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    g.build()
    (fused,) = fuse(g.ir, arch=90).nodes
    assert fused.rule == "block_scaled_matmul"
    assert {t.name for t in fused.inputs} == {"a", "b", "sa", "sb"}


def test_a_block_scaled_graph_round_trips_through_serialize() -> None:
    g, x = graph_with([4, 64], F32)
    y, scale = g.block_scale_quantize(x, 32, name="q")
    scale.set_data_type(E8M0)
    back = g.block_scale_dequantize(y, scale, [1, 32], name="dq")
    g.relu(back).set_output(True)
    g.build()
    loaded = cudnn.pygraph()
    loaded.deserialize(g.serialize())
    assert loaded.key() == g.key()
    assert {(n.op, n.attributes) for n in loaded.ir.nodes} == {(n.op, n.attributes) for n in g.ir.nodes}


# -- what graphdnn cannot do, said in the frontend's terms ----------------------------------------------
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda g, x: g.relu(g.block_scale_dequantize(x, x, [128, 128], name="deq_w")),
            UnsupportedError,
            r"node 'deq_w': .*block_size=\[128, 128\] has blocks over 2 dims: graphdnn takes 2-D blocks only as B",
        ),
        (
            lambda g, x: g.matmul(x, g.block_scale_dequantize(x, x, [128, 128], name="deq_w")),
            UnsupportedError,
            r"node 'deq_w': .*B of a matmul whose A is not a rank-2 block_scale_dequantize with \[1, 128\]",
        ),
        (
            lambda g, x: (g.block_scale_dequantize(x, x, [64, 64], name="deq_w"), g.validate()),
            UnsupportedError,
            r"node 'deq_w': .*block_size=\[64, 64\] has blocks over 2 dims",
        ),
        (lambda g, x: g.block_scale_dequantize(x, x, 32, name="d"), AttributeValueError, "takes a list"),
        (lambda g, x: g.block_scale_dequantize(x, x, [1, 1, 32], name="d"), AttributeValueError, "1 to 2 sizes"),
        (lambda g, x: g.block_scale_quantize(x, [32], name="q"), AttributeValueError, "takes one int"),
        (
            lambda g, x: g.tensor(name="sf", dim=[128, 4], reordering_type=cudnn.tensor_reordering.F16x16),
            UnsupportedError,
            r"tensor 'sf': tensor reordering .*F16x16.* is not supported",
        ),
        (
            lambda g, x: g.block_scale_quantize(x, 32, name="q")[1].set_reordering_type(
                cudnn.tensor_reordering.F8_128x4
            ),
            UnsupportedError,
            r"tensor 'q::scale': set_reordering_type.*F8_128x4 as pygraph.tensor's reordering_type, on a block-scale input",
        ),
        (
            lambda g, x: g.tensor(name="sf", dim=[128, 4], data_type=F32, reordering_type=TILED),
            UnsupportedError,
            r"tensor 'sf': tensor reordering F8_128x4 holds 1-byte block scales \(FP8_E8M0 or FP8_E4M3\), not float",
        ),
        (
            lambda g, x: g.tensor(name="sf", dim=[512], data_type=E8M0, reordering_type=TILED),
            UnsupportedError,
            r"tensor 'sf': tensor reordering F8_128x4 takes static dims \[..., rows, blocks\] of rank 2",
        ),
        (
            lambda g, x: g.tensor(name="sf", dim=[8, 4, 2], stride=[1, 16, 64], data_type=E8M0, reordering_type=TILED),
            UnsupportedError,
            r"tensor 'sf': tensor reordering F8_128x4 with strides \[1, 16, 64\]: one of the last two dims must",
        ),
        (
            lambda g, x: g.tensor(name="sf", dim=[128, 4], data_type=E8M0, is_virtual=True, reordering_type=TILED),
            UnsupportedError,
            r"tensor 'sf': tensor reordering F8_128x4 is taken on block-scale inputs only",
        ),
        (
            lambda g, x: g.block_scale_dequantize(
                g.tensor(name="x8", dim=[128, 128], data_type=E4M3),
                g.tensor(name="sf", dim=[128, 2], data_type=E8M0, reordering_type=TILED),
                [1, 32],
                name="d",
            ),
            UnsupportedError,
            r"tensor 'sf': an op reads the F8_128x4 scales as \[128, 4\]; their tiles hold \[128, 2\]",
        ),
    ],
)
def test_what_graphdnn_lacks_is_refused_naming_the_node_or_tensor(call: Any, error: type, message: str) -> None:
    g, x = graph_with([128, 128], F32)
    with pytest.raises(error, match=message):
        call(g, x)


def test_unsupported_types_are_refused_naming_the_node() -> None:
    g, x = graph_with([64, 64], cudnn.data_type.HALF)  # the frontend's general sample dequantizes half
    scale = g.tensor(name="s", dim=[64, 1], data_type=F32)
    with pytest.raises(
        GraphError, match=r"node 'dq'.*'x' is half; block_scale_dequantize takes fp8, 4-bit or int8 values"
    ):
        g.block_scale_dequantize(x, scale, [1, 64], name="dq")


def test_f8_128x4_tiles_are_the_input_and_the_plain_scales_are_read_once() -> None:
    """The buffer bound to a tiled tensor is the tiles (the padded matrices); the movement
    nodes that undo the tiling run once however many ops read the scales."""
    g, x = graph_with([200, 96])
    sf = g.tensor(name="sf", dim=[200, 3], stride=[3, 1], data_type=E8M0, reordering_type=TILED)
    assert sf.get_dim() == [256, 4] and sf.get_reordering_type() is TILED
    g.block_scale_dequantize(x, sf, [1, 32], name="d1").set_output(True)
    g.block_scale_dequantize(x, sf, [1, 32], name="d2").set_output(True)
    g.build([cudnn.heur_mode.A])
    ops = [n.op for n in g.ir.nodes]
    assert ops.count("reshape") == 2 and ops.count("transpose") == 1 and ops.count("slice") == 1, ops
    assert ops.count("block_scale_dequantize") == 2
    (tiles,) = [t for t in g.ir.inputs if t.name == "sf"]
    assert tiles.dim == (256, 4) and tiles.stride == (4, 1)


def test_reordering_none_is_accepted_and_reported() -> None:
    g, _ = graph_with([4])
    t = g.tensor(name="t", dim=[4], reordering_type=cudnn.tensor_reordering.NONE)
    assert t.set_reordering_type(cudnn.tensor_reordering.NONE).get_reordering_type() is cudnn.tensor_reordering.NONE


def test_the_high_level_graph_quantizes_framework_tensors() -> None:
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    with cudnn.Graph(io_data_type=F32, inputs=["q::input"], outputs=["q::Y", "q::scale"]) as g:
        y, scale = g.block_scale_quantize(input=x, block_size=32, name="q")
        y.set_output(True)
        scale.set_output(True).set_data_type(E8M0)
    got_y, got_scale = g(2 * x)
    want = 2 * x.astype(np.float64)
    np.testing.assert_array_equal(got_scale.astype(np.float64), mxfp8_scales(want, 32))
    check_quantized(got_y.astype(np.float64), got_scale.astype(np.float64), want, 32)


def test_data_type_is_graphdnn_s_data_type_but_for_the_frontend_only_names() -> None:
    assert cudnn.data_type.FP8_E8M0 is DataType.FP8_E8M0 and cudnn.data_type["HALF"] is DataType.HALF
    assert isinstance(DataType.FLOAT, cudnn.data_type) and cudnn.data_type("bfloat16") is DataType.BFLOAT16
    assert list(cudnn.data_type) == list(DataType)
    assert cudnn.data_type.INT4 is DataType.INT4 and cudnn.data_type.FP4_E2M1 is DataType.FP4_E2M1
    with pytest.raises(UnsupportedError, match="INT8x4 is not supported: graphdnn has no vectorized types"):
        cudnn.data_type.INT8x4  # noqa: B018


def test_weight_blocks_become_one_block_scaled_matmul_named_as_the_frontend_names() -> None:
    g = cudnn.pygraph(io_data_type=F32, intermediate_data_type=F32, compute_data_type=F32)
    a = g.tensor(name="a", dim=[64, 256], data_type=E4M3)
    w = g.tensor(name="w", dim=[256, 64], stride=[1, 256], data_type=E4M3)
    a_deq = g.block_scale_dequantize(a, g.tensor(name="sa", dim=[64, 2]), [1, 128])
    w_deq = g.block_scale_dequantize(w, g.tensor(name="sw", dim=[2, 1]), [128, 128])
    c = g.matmul(a_deq, w_deq)
    g.relu(a_deq, name="act").set_output(True)  # A's dequantized values read elsewhere too
    c.set_output(True)
    assert (a_deq.get_name(), w_deq.get_name(), c.get_name()) == ("0::Y", "1::Y", "2::C")
    g.build()
    nodes = {n.name: n for n in g.ir.nodes}
    assert sorted(nodes) == ["0", "2", "act"]  # B's dequantize is the matmul's B_scale
    assert {role: t.name for role, t in nodes["2"].inputs} == {"A": "a", "B": "w", "A_scale": "sa", "B_scale": "sw"}
    loaded = cudnn.pygraph()
    loaded.deserialize(g.serialize())
    assert loaded.key() == g.key()
