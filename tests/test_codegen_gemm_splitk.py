"""GEMM family, split-K (gemm_splitk.py): few-tile problems cut K into slices, one block per
(tile, slice), and a second kernel sums the slices in a fixed order and runs the epilogue.

CPU: the heuristic picks split-K for decode-like and fc2-like problems, not for large ones;
split kernels (mma.sync on sm_80 and sm_90, wgmma on sm_90a) compile for slices that do not
divide K, including slices with no k tile; the scratch counts in the plan's workspace;
autotuning offers split variants; many-tile kernels are unchanged. GPU: results against the
reference (outputs poisoned) for matmul, batched matmul and convolutions forced to split,
on both tensor-core paths, and the same bits on every run.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen import FusedProgram, Kernel, ParamKind
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.kernel import HELPERS
from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from graphdnn.lower import lower
from graphdnn.runtime.driver import current_gpu_arch
from graphdnn.signature import signature
from tests.gpu_check import check_on_gpu, poisoned, to_device
from tests.test_codegen_gemm import Conv, Matmul

DECODE = Matmul(m=128, k=4096, n=4096, epilogue="bias_gelu_add")
FC2 = Matmul(m=2048, k=4096, n=1024, b_transposed=True, epilogue="bias_add")
LARGE = Matmul(m=4096, k=4096, n=4096, epilogue="bias_gelu_add")
WGMMA_128 = {"path": "wgmma", "block_m": 128, "block_n": 128, "stages": 3}


def gemm_node(graph: gd.OperationGraphSpec, arch: int = 90) -> tuple[fr.Partition, fr.FusedNode]:
    partition = fr.fuse(graph, arch=arch)
    (fused,) = [f for f in partition.nodes if f.family is fr.Family.GEMM]
    return fr.Partition(partition.graph, (fused,), (), ()), fused


def program(graph: gd.OperationGraphSpec, arch: int = 90, choice: dict[str, object] | None = None) -> FusedProgram:
    partition, fused = gemm_node(graph, arch)
    (emitted,) = emit_partition(partition, arch, {fused.name: choice} if choice is not None else None)
    return emitted


def split_of(emitted: FusedProgram) -> int:
    """The number of K slices of a GEMM program (1: the single kernel)."""
    if len(emitted.kernels) == 1:
        return 1
    main, reduce = emitted.kernels
    if "_ws_" in main.name:  # the engine walks (tile, slice) units: the split is in its source
        found = re.search(r"SPLIT = (\d+),", main.source)
        assert found is not None
        return int(found.group(1))
    return main.grid[2] // reduce.grid[2]


@pytest.mark.parametrize("arch", [80, 90])
def test_the_heuristic_splits_few_tile_problems_with_long_k_only(arch: int) -> None:
    assert split_of(program(DECODE.build(), arch)) >= 2  # 32 tiles of 128x128 for 108 / 132 SMs
    # 128 tiles: on an A100's 108 SMs a full wave without a split; on sm_90 the persistent TMA
    # engine takes it whole (gemm_ws.py; 0.96x cuBLAS where two slices gave 0.66x)
    assert split_of(program(FC2.build(), arch)) == 1
    assert split_of(program(LARGE.build(), arch)) == 1
    assert split_of(program(Matmul(m=128, k=256, n=4096).build(), arch)) == 1  # K too short to pay
    # 4096 / 512: K bounds the mma.sync split; sm_90's engine takes two slices (gemm_ws.default_choice)
    assert split_of(program(Matmul(m=1, k=4096, n=72).build(), arch)) == (2 if arch == 90 else 8)


def test_tuning_wins_over_the_heuristic() -> None:
    graph = DECODE.build()
    assert split_of(program(graph, 90, {"split_k": 1})) == 1
    assert split_of(program(graph, 90, {"split_k": 3})) == 3
    assert split_of(program(LARGE.build(), 90, {"split_k": 2})) == 2
    # A tuned tile without split_k (chosen before split-K existed) names the single kernel.
    assert split_of(program(graph, 90, {"block_m": 128, "block_n": 128, "stages": 3})) == 1
    assert split_of(program(graph, 90, {**WGMMA_128, "split_k": 4})) == 4
    for wrong in (0, 2.5, 65536):
        with pytest.raises(UnsupportedError, match="split_k must be an integer from 1 to 65535"):
            program(graph, 90, {"split_k": wrong})


def own_text_hash(kernel: Kernel) -> str:
    """The kernel's own text without the shared helper header (graphdnn.cuh), which grows as
    ops are added without changing any existing kernel's code."""
    return hashlib.sha256(kernel.body.replace(HELPERS, "").encode()).hexdigest()


def test_many_tile_kernels_are_unchanged() -> None:
    """The kernels of problems that do not split, as emitted before split-K existed (784531a;
    with the header of that time, their content hashes were dc92a832…, c776da87…, 6e6d2139…)."""
    (kernel,) = program(LARGE.build(), 80).kernels  # on sm_90 the warp-specialised engine takes it
    assert own_text_hash(kernel) == "1ba306a24c429184b126cabb517a1a8dad89a3c69e67b64fb722c49b1530e3a3"
    (kernel,) = program(Conv(n=32, c=64, hw=(56, 56), k=64).build(), 80).kernels
    assert own_text_hash(kernel) == "cf67dce488d4221836adccf393dcefa9ebe662fd2d35fbd1830dd79ae4068d9e"
    # The wgmma kernel's text changed with the 8-bit operands (issue 12): wgmma_k16 became
    # wgmma_step, its k-step count a literal, its comments name both element sizes; same code.
    (kernel,) = program(LARGE.build(), 90, WGMMA_128).kernels
    assert own_text_hash(kernel) == "c32f4284debab4e0e7d251a17b6512012a5fdca196d9404023c2d3556d2bd64e"
    assert program(DECODE.build(), 90, {"block_m": 128, "block_n": 128, "stages": 3, "split_k": 1}).kernels == (
        program(DECODE.build(), 90, {"block_m": 128, "block_n": 128, "stages": 3}).kernels
    )


def test_split_variants_are_candidates_for_few_tile_problems_only() -> None:
    _, fused = gemm_node(DECODE.build())
    choices = candidates(fused, 90)
    mma_splits = [c for c in choices if "split_k" in c and "path" not in c]
    wgmma_splits = [c for c in choices if "split_k" in c and c.get("path") == "wgmma"]
    assert mma_splits and wgmma_splits
    assert all(2 <= int(c["split_k"]) <= 8 for c in mma_splits + wgmma_splits)  # type: ignore[call-overload]
    assert [c for c in choices if "split_k" not in c] == candidates(gemm_node(LARGE.build())[1], 90)
    assert not [c for c in candidates(gemm_node(LARGE.build())[1], 90) if "split_k" in c]


def test_the_partials_count_in_the_plan_workspace() -> None:
    spec = Matmul(batch_a=(3,), batch_b=(3,), m=17, k=1000, n=72, epilogue="bias_gelu_add")
    graph = spec.build()
    emitted = program(graph, 90, {"split_k": 3})
    ((name, size),) = [(s.name, s.bytes) for s in emitted.scratch]
    assert (name, size) == ("partials", 3 * 3 * 17 * 72 * 4)  # batch x slice x M x N (N a multiple of 8)
    main, reduce = emitted.kernels
    assert main.grid[2] == 9 and reduce.grid[2] == 3
    for kernel in emitted.kernels:
        assert [p.scratch for p in kernel.params if p.kind is ParamKind.SCRATCH] == ["partials"]
    padded = program(Matmul(m=5, k=1024, n=20, b_transposed=True, epilogue="").build(), 90, {"split_k": 2}).scratch[0]
    assert padded.bytes == 2 * 5 * 24 * 4  # rows of N rounded up to 8 floats
    ir = graph.validate()
    lowered = lower(fr.fuse(ir, arch=90), 90, signature(ir), lambda key: key, tuning={0: {"split_k": 3}})
    assert lowered.program.workspace_size >= size
    assert any(b.scratch == "partials" and b.bytes == size for b in lowered.program.workspace)


# K of 1000 (32 mma.sync tiles, 16 wgmma ones: slices that do not divide K) and of 80 (3 and
# 2 tiles: split 7 and 3 leave slices with no k tile), batched, and a 3x3 convolution.
COMPILE_CASES = {
    "matmul_kn_k1000": Matmul(m=17, k=1000, n=72, epilogue="bias_gelu_add"),
    "matmul_nk_batched_k80": Matmul(batch_a=(2,), batch_b=(2,), m=33, k=80, n=8, b_transposed=True, dtype="half"),
    "conv3x3_c64": Conv(n=1, c=64, hw=(9, 9), k=72, epilogue="bias_add_relu"),
}


@pytest.mark.parametrize("case", COMPILE_CASES)
def test_split_kernels_compile_for_sm80_sm90_and_sm90a(case: str) -> None:
    graph = COMPILE_CASES[case].build()
    jobs = []
    for split in (2, 3, 7):
        for arch, choice in ((80, {}), (90, {}), (90, {"path": "wgmma", "block_m": 64, "block_n": 128, "stages": 4})):
            emitted = program(graph, arch, {**choice, "split_k": split})
            main, reduce = emitted.kernels
            assert split_of(emitted) == split and "_splitk_" in main.name and "_splitk_reduce_" in reduce.name
            assert main.arch_suffix == ("a" if choice else "") and reduce.arch_suffix == ""
            jobs += [(kernel, arch) for kernel in emitted.kernels]
    distinct = {(kernel.content_hash, arch): (kernel, arch) for kernel, arch in jobs}
    import cuda.core  # noqa: F401  (its first import is not thread-safe; NVRTC runs in parallel below)

    with ThreadPoolExecutor(2) as pool:
        cubins = list(
            pool.map(
                lambda job: compile_cubin(job[0].source, job[0].name, job[1], job[0].arch_suffix), distinct.values()
            )
        )
    assert all(cubins)


# -- GPU --------------------------------------------------------------------------------------
# (graph, tuning choice: None for the heuristic's split). K of 16 is less than one k tile: with
# 3 slices, two hold no tile and store zeros.
GPU_CASES: dict[str, tuple[Matmul | Conv, dict[str, object] | None]] = {
    "m1_n72_k4096_bf16": (Matmul(m=1, k=4096, n=72, epilogue="bias_gelu"), None),
    "m17_n4096_k4096_half": (Matmul(m=17, k=4096, n=4096, dtype="half", epilogue="bias_gelu_add"), None),
    "m128_n4096_k4096_bf16": (DECODE, None),
    "m128_n72_k4096_nk_bf16": (Matmul(m=128, k=4096, n=72, b_transposed=True, epilogue="bias_gelu_add"), None),
    "m17_n264_k1000_half_split3": (Matmul(m=17, k=1000, n=264, dtype="half", epilogue="bias_gelu_add"), {"split_k": 3}),
    "m1_n4096_k1000_bf16_split7": (Matmul(m=1, k=1000, n=4096, epilogue="bias_gelu"), {"split_k": 7}),
    "m128_n8_k16_half_split3": (Matmul(m=128, k=16, n=8, dtype="half", epilogue="bias_gelu_add"), {"split_k": 3}),
    "m17_n8_k4096_bf16_tile64x64_split5": (
        Matmul(m=17, k=4096, n=8, epilogue=""),
        {"block_m": 64, "block_n": 64, "stages": 4, "split_k": 5},
    ),
    "batched_broadcast_split2": (
        Matmul(batch_a=(2, 3), batch_b=(3,), m=17, k=1000, n=72, epilogue="bias_gelu_add"),
        {"split_k": 2},
    ),
    "batched_nk_half_split3": (
        Matmul(batch_a=(3,), batch_b=(3,), m=128, k=1000, n=72, b_transposed=True, dtype="half"),
        {"split_k": 3},
    ),
    "conv1x1_c64_split3": (
        Conv(n=2, c=64, hw=(7, 7), k=64, filt=(1, 1), pre=(0, 0), post=(0, 0), epilogue="bias_add_relu"),
        {"split_k": 3},
    ),
    "conv3x3_c64_split4": (Conv(n=1, c=64, hw=(9, 9), k=72), {"split_k": 4}),
}
WGMMA_GPU_CASES: dict[str, tuple[Matmul | Conv, dict[str, object]]] = {
    "wgmma_m128_n4096_k4096": (DECODE, {**WGMMA_128, "split_k": 4}),
    "wgmma_m17_n72_k1000_kn": (
        Matmul(m=17, k=1000, n=72, epilogue="bias_gelu_add"),
        {"path": "wgmma", "block_m": 64, "block_n": 64, "stages": 4, "split_k": 3},
    ),
    "wgmma_m128_n8_k16_half": (
        Matmul(m=128, k=16, n=8, dtype="half", b_transposed=True, epilogue="bias_gelu_add"),
        {"path": "wgmma", "block_m": 128, "block_n": 64, "stages": 4, "split_k": 2},
    ),
    "wgmma_conv3x3_c64": (Conv(n=1, c=64, hw=(9, 9), k=72, epilogue="bias_add_relu"), {**WGMMA_128, "split_k": 3}),
}


def check_split(graph: gd.OperationGraphSpec, choice: dict[str, object] | None, seed: int) -> gd.Plan:
    _, fused = gemm_node(graph, current_gpu_arch() or 90)
    tuning = {fused.name: choice} if choice is not None else None
    plan = check_on_gpu(graph, seed=seed, tuning=tuning)
    assert any("_splitk_reduce_" in kernel.name for kernel in plan.kernels), "the plan did not split K"
    return plan


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_split_k_matches_reference_on_gpu(case: str) -> None:
    spec, choice = GPU_CASES[case]
    check_split(spec.build(), choice, zlib.crc32(case.encode()))


@pytest.mark.gpu
@pytest.mark.parametrize("case", WGMMA_GPU_CASES)
def test_wgmma_split_k_matches_reference_on_gpu(case: str) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma path runs on sm_90 GPUs only")
    spec, choice = WGMMA_GPU_CASES[case]
    check_split(spec.build(), choice, zlib.crc32(case.encode()))


@pytest.mark.gpu
def test_split_k_gives_the_same_bits_every_run() -> None:
    import torch

    from graphdnn.random_inputs import random_inputs

    graph = Matmul(m=128, k=4096, n=1024, epilogue="bias_gelu_add").build()
    plan = check_split(graph, {"split_k": 7}, seed=3)
    ir = graph.validate()
    feeds = random_inputs(ir, 3)
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    results = []
    for _ in range(2):
        outputs = {t.name: poisoned(t) for t in ir.outputs}
        plan.execute({**pack, **outputs})
        torch.cuda.synchronize()
        results.append(outputs)
    for t in ir.outputs:
        assert torch.equal(results[0][t.name], results[1][t.name]), f"output '{t.name}' differs between runs"
