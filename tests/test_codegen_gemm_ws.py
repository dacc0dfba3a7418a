"""GEMM family, Hopper engine (gemm_ws.py): persistent, warp-specialised; TMA-fed matmuls,
gathered convolutions.

CPU: offered for 16-bit tensor-core problems on sm_90 only; each candidate emits a 384-thread
kernel (a matmul's or an im2col-fed convolution's first parameters: the two tensor maps) that
NVRTC compiles for sm_90a (and, where cuobjdump is installed, that runs on HGMMA, fed by UTMALDG
for those, without local memory); the default for matmuls that fill the GPU, not yet for convolutions; tensor maps
survive the plan's JSON form, and the driver's rules for them are checked. GPU: every
candidate against the reference on ragged, batched, broadcast and transposed matmuls, the
convolutions of the tensor-core cases, more tiles than SMs (each block walks several), and
operands that start mid-row (TMA reads an aligned copy).
"""

from __future__ import annotations

import zlib

import pytest

import graphdnn as gd
from codegen import ParamKind
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.families.gemm_ws import THREADS
from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from graphdnn.program import Arg, ArgKind, Launch, TensorMap
from graphdnn.runtime.driver import current_gpu_arch
from tests.gpu_check import check_on_gpu, poisoned, relative_error, to_numpy
from tests.test_codegen_gemm import SIMT, TENSOR_CORE, Conv, Matmul
from tests.test_codegen_gemm_sm90 import emit, gemm_node, sass

MATMULS = {name: case for name, case in TENSOR_CORE.items() if isinstance(case, Matmul)}


def ws_choices(graph: gd.OperationGraphSpec, arch: int = 90) -> list[dict[str, object]]:
    _, fused = gemm_node(graph)
    return [c for c in candidates(fused, arch) if c.get("path") == "ws"]


def test_the_engine_is_offered_for_matmuls_on_sm90_only() -> None:
    matmul = MATMULS["matmul_nk"].build()
    choices = ws_choices(matmul)
    assert {c["block_n"] for c in choices} == {128, 256}
    assert ws_choices(matmul, 80) == [] and ws_choices(matmul, 100) == []
    conv = ws_choices(TENSOR_CORE["resnet_3x3"].build())
    assert conv == [c for c in choices if c["block_n"] == 128] + [{**c, "producer": "im2col"} for c in choices]
    assert ws_choices(SIMT["grouped"].build()) == []
    assert ws_choices(Matmul(k=37).build()) == []  # rows not in 16-byte chunks: no tensor map
    with pytest.raises(UnsupportedError, match="sm_90 only"):
        emit(matmul, choices[0], arch=80)
    with pytest.raises(UnsupportedError, match="block_n"):
        emit(matmul, {"path": "ws", "block_n": 64, "stages": 4})
    with pytest.raises(UnsupportedError, match="shared memory"):
        emit(matmul, {"path": "ws", "block_n": 256, "stages": 5})


def test_the_engine_is_the_default_for_matmuls_that_fill_the_gpu() -> None:
    """Enough 128 x 128 tiles for half the SMs: the engine (128 x 256 tiles where those fill all
    of them); fewer: the engine with two K slices for a long K, the other paths otherwise."""
    large, fc2, decode = (Matmul(m=4096, k=512, n=4096), Matmul(m=2048, k=4096, n=1024), Matmul(m=128, k=4096, n=4096))
    for case, block_n in ((large, 256), (fc2, 128), (Matmul(m=500, k=64, n=3000, batch_a=(2,), batch_b=(2,)), 128)):
        partition, _ = gemm_node(case.build())
        (program,) = emit_partition(partition, 90)
        (kernel,) = program.kernels
        assert "_ws_" in kernel.name and f"BN = {block_n}," in kernel.source
    partition, _ = gemm_node(decode.build())
    engine, _ = emit_partition(partition, 90)[0].kernels  # few tiles, long K: two K slices
    assert "_ws_" in engine.name and "SPLIT = 2," in engine.source
    partition, _ = gemm_node(Matmul(m=128, k=512, n=4096).build())
    assert "_ws_" not in emit_partition(partition, 90)[0].kernels[0].name  # few tiles, short K
    partition, _ = gemm_node(large.build())
    assert "_mma_" in emit_partition(partition, 80)[0].kernels[0].name
    partition, _ = gemm_node(Conv(n=32, c=64, hw=(56, 56), k=64).build())
    assert "_mma_" in emit_partition(partition, 90)[0].kernels[0].name  # 64 output channels (gemm_im2col tests)


@pytest.mark.parametrize("case", TENSOR_CORE)
def test_every_candidate_compiles_for_sm90a(case: str) -> None:
    graph = TENSOR_CORE[case].build()
    for choice in ws_choices(graph):
        mapped = isinstance(TENSOR_CORE[case], Matmul) or choice.get("producer") == "im2col"  # TMA-fed
        kernel = emit(graph, choice)
        assert "_ws_" in kernel.name and kernel.arch_suffix == "a" and kernel.block == (THREADS, 1, 1)
        assert 1 <= kernel.grid[0] <= 132 and kernel.grid[1:] == (1, 1)  # persistent: at most one block per SM
        maps = [p for p in kernel.params if p.kind is ParamKind.TENSOR_MAP]
        assert len(maps) == (2 if mapped else 0) and kernel.params[: len(maps)] == tuple(maps)  # no padding first
        assert all(m.tensor_map is not None and not m.tensor_map.problems() for m in maps)
        code = sass(compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix))
        if code is not None:
            assert "HGMMA" in code and "LDL" not in code and "STL" not in code
            assert ("UTMALDG" in code) == mapped


DECODE = Matmul(m=128, k=4096, n=4096, epilogue="bias")


def test_few_tile_problems_are_offered_split_k_on_the_engine() -> None:
    """The decode-like shape has 32 tiles of 128 x 128: the engine walks (tile, K slice) units
    and gemm_splitk's kernel sums the slices and runs the epilogue."""
    graph = DECODE.build()
    splits = [c["split_k"] for c in ws_choices(graph) if "split_k" in c]
    assert splits == [2, 4, 8]
    assert all("split_k" not in c for c in ws_choices(MATMULS["matmul_nk"].build()))  # K too short to split
    partition, fused = gemm_node(graph)
    choice = next(c for c in ws_choices(graph) if c.get("split_k") == 4)
    (program,) = emit_partition(partition, 90, {fused.name: choice})
    engine, reduce = program.kernels
    assert "_ws_" in engine.name and "SPLIT = 4," in engine.source and engine.grid == (128, 1, 1)
    assert [s.name for s in program.scratch] == ["partials"]
    assert any(p.kind is ParamKind.SCRATCH for p in engine.params) and "reduce" in reduce.name
    code = sass(compile_cubin(engine.source, engine.name, 90, engine.arch_suffix))
    if code is not None:
        assert "HGMMA" in code and "LDL" not in code and "STL" not in code
    for bad in (0, 65, True, "2"):
        with pytest.raises(UnsupportedError, match="split_k must be an integer from 1 to the 64 k tiles"):
            emit_partition(partition, 90, {fused.name: {**choice, "split_k": bad}})


def test_tensor_maps_survive_the_plans_json_and_bad_ones_are_named() -> None:
    good = TensorMap(2, (72, 1000, 3), (160, 320000), (64, 128, 1), 128)
    arg = Arg(ArgKind.TENSOR_MAP, tensor=4, tensor_map=good)
    assert Arg.from_json(arg.to_json()) == arg and arg.words == 16 and arg.reads_memory
    assert Arg.from_json(Arg(ArgKind.TENSOR, tensor=1).to_json()).tensor_map is None
    launch = Launch("k", "x" * 64, "h", 0, (1, 1, 1), (1, 1, 1), 0, 16, (arg, Arg(ArgKind.TENSOR, tensor=2), arg))
    assert launch.slot_starts == (0, 16, 17, 33) and launch.parameter_bytes == 33 * 8
    assert good.problems() == []
    assert TensorMap(2, (72, 1000), (100,), (64, 128), 128).problems() == [
        "strides [100] (multiples of 16 bytes below 2^40)"
    ]
    assert "box [64, 300]" in TensorMap(2, (72, 1000), (160,), (64, 300), 128).problems()
    assert "swizzle 64" in TensorMap(2, (72, 1000), (160,), (64, 128), 64).problems()  # 128-byte rows


# GPU: ragged M/N/K, both B layouts, batches with broadcast, convolutions, more tiles than SMs.
GPU_CASES = {
    **TENSOR_CORE,
    "conv_136_channels": Conv(n=3, c=32, hw=(9, 11), k=136, epilogue="bias_add_relu"),
    "resnet_56": Conv(n=2, c=64, hw=(56, 56), k=64),
    "kn_long_k_batched": Matmul(batch_a=(2,), batch_b=(2,), m=300, k=1000, n=200, epilogue="bias_gelu_add"),
    "nk_long_k": Matmul(m=257, k=1032, n=136, b_transposed=True, epilogue="bias"),
    "more_tiles_than_sms": Matmul(m=2000, k=520, n=1100, epilogue="bias_add"),
    "single_row_half": Matmul(m=1, k=8, n=8, dtype="half", epilogue=""),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_every_candidate_matches_reference_on_gpu(case: str) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    graph = GPU_CASES[case].build()
    _, fused = gemm_node(graph)
    for choice in ws_choices(graph):
        plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice})
        assert any("_ws_" in kernel.name for kernel in plan.kernels)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("case", "split"),
    [
        (Matmul(m=200, k=2048, n=296, epilogue="bias_gelu_add"), 4),
        (Matmul(batch_a=(3,), batch_b=(3,), m=130, k=1104, n=72, b_transposed=True, epilogue="bias"), 2),
        (Matmul(m=64, k=320, n=136, epilogue="bias_add"), 4),  # 5 k tiles in 4 slices: the last holds none
        (Conv(n=2, c=256, hw=(7, 7), k=128, epilogue="bias_add_relu"), 3),
    ],
)
def test_split_k_on_the_engine_matches_reference_on_gpu(case: Matmul | Conv, split: int) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    graph = case.build()
    _, fused = gemm_node(graph)
    choice = {**ws_choices(graph)[0], "block_n": 128, "split_k": split}
    choice["stages"] = next(c["stages"] for c in ws_choices(graph) if c["block_n"] == 128)
    plan = check_on_gpu(graph, seed=split, tuning={fused.name: choice})
    assert len(plan.kernels) == 2 and "_ws_" in plan.kernels[0].name


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 3, 8])
def test_operands_that_start_mid_row_on_gpu(offset: int) -> None:
    """A and B are views ``offset`` elements into larger buffers, off 16-byte alignment unless
    ``offset`` is 8: TMA cannot start there, so binding gives the kernel aligned copies."""
    import torch

    if current_gpu_arch() != 90:
        pytest.skip("the warp-specialised engine runs on sm_90 GPUs only")
    m, k, n, row = 150, 200, 136, 216  # row stride: 432 bytes, a multiple of 16
    g = gd.OperationGraphSpec(name="views", io_data_type="bf16")
    a = g.tensor(name="A", dim=[m, k], stride=[row, 1])
    b = g.tensor(name="B", dim=[k, n], stride=[row, 1])
    g.matmul(a, b, name="mm").set_name("C").set_output(True)
    ir = g.validate()
    views = {
        name: torch.randn(rows * row + offset, dtype=torch.bfloat16, device="cuda")[offset:].as_strided(
            (rows, cols), (row, 1)
        )
        for name, rows, cols in (("A", m, k), ("B", k, n))
    }
    assert all(v.data_ptr() % 16 == 2 * offset % 16 for v in views.values())
    _, fused = gemm_node(g)
    for choice in ws_choices(g):
        out = poisoned(ir.outputs[0])
        gd.compile(g, tuning={fused.name: choice}).execute({**views, "C": out})
        torch.cuda.synchronize()
        want = views["A"].double() @ views["B"].double()
        assert relative_error(to_numpy(out), want.cpu().numpy()) < 1e-2, choice
