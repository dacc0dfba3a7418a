"""GEMM family, Hopper path (wgmma, sm_90a): offered only on sm_90, compiled for sm_90a.

CPU: every wgmma candidate of every tensor-core case of test_codegen_gemm emits a
256-thread kernel that NVRTC compiles for sm_90a (and, where cuobjdump is installed, whose
SASS runs on HGMMA without local-memory traffic); the arch-specific target reaches the
compiler and the kernel key. GPU: every candidate against the reference.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen import Kernel
from codegen.emit import emit_partition
from codegen.families.gemm import candidates
from codegen.nvrtc import compile_cubin
from graphdnn.errors import UnsupportedError
from graphdnn.kernel_build import compile_sources
from graphdnn.lower import lower
from graphdnn.runtime.driver import current_gpu_arch
from graphdnn.signature import signature
from tests.gpu_check import check_on_gpu
from tests.test_codegen_gemm import SIMT, TENSOR_CORE, Conv, Matmul


def gemm_node(graph: gd.OperationGraphSpec) -> tuple[fr.Partition, fr.FusedNode]:
    partition = fr.fuse(graph, arch=90)
    (fused,) = [f for f in partition.nodes if f.family is fr.Family.GEMM]
    return fr.Partition(partition.graph, (fused,), (), ()), fused


def wgmma_choices(fused: fr.FusedNode) -> list[dict[str, object]]:
    """The wgmma tiles (their split-K variants: test_codegen_gemm_splitk)."""
    return [c for c in candidates(fused, 90) if c.get("path") == "wgmma" and "split_k" not in c]


def emit(graph: gd.OperationGraphSpec, choice: dict[str, object], arch: int = 90) -> Kernel:
    partition, fused = gemm_node(graph)
    (program,) = emit_partition(partition, arch, {fused.name: choice})
    (kernel,) = program.kernels
    return kernel


def sass(cubin: bytes) -> str | None:
    """The cubin's disassembly, or None where cuobjdump (and its nvdisasm) is not installed."""
    if shutil.which("cuobjdump") is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(["cuobjdump", "--dump-sass", str(path)], capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None


def test_wgmma_is_offered_on_sm90_only_and_for_tensor_core_layouts() -> None:
    _, fused = gemm_node(TENSOR_CORE["resnet_3x3"].build())
    assert not [c for c in candidates(fused, 80) if "path" in c]
    assert not [c for c in candidates(fused, 100) if "path" in c]  # Blackwell has no wgmma
    choices = wgmma_choices(fused)
    assert {(c["block_m"], c["block_n"]) for c in choices} == {(m, n) for m in (64, 128) for n in (64, 128, 256)}
    assert candidates(fused, 90)[: len(candidates(fused, 80))] == candidates(fused, 80)  # mma.sync first
    _, simt = gemm_node(SIMT["grouped"].build())
    assert candidates(simt, 90) == []


def test_the_default_stays_on_mma_sync_and_wgmma_off_sm90_is_refused() -> None:
    graph = TENSOR_CORE["resnet_3x3"].build()
    partition, fused = gemm_node(graph)
    (program,) = emit_partition(partition, 90)
    assert "_mma_" in program.kernels[0].name and program.kernels[0].arch_suffix == ""
    with pytest.raises(UnsupportedError, match=r"sm_90 only.*sm_80"):
        emit(graph, wgmma_choices(fused)[0], arch=80)
    with pytest.raises(UnsupportedError, match="block_n 64, 128, 192 or 256"):
        emit(graph, {"path": "wgmma", "block_m": 128, "block_n": 96, "stages": 4})
    with pytest.raises(UnsupportedError, match="shared memory"):
        emit(graph, {"path": "wgmma", "block_m": 128, "block_n": 256, "stages": 5})


@pytest.mark.parametrize("case", TENSOR_CORE)
def test_every_wgmma_candidate_compiles_for_sm90a(case: str) -> None:
    graph = TENSOR_CORE[case].build()
    _, fused = gemm_node(graph)
    out = fused.outputs[0]
    columns = out.dim[-1] if isinstance(TENSOR_CORE[case], Matmul) else out.dim[1]
    kernels = [emit(graph, choice) for choice in wgmma_choices(fused)]
    for choice, kernel in zip(wgmma_choices(fused), kernels):
        assert "_wgmma_" in kernel.name and kernel.arch_suffix == "a"
        assert kernel.block == (2 * int(choice["block_m"]), 1, 1)  # type: ignore[call-overload]  # a warpgroup per 64 rows
        assert 48 * 1024 < kernel.shared_bytes <= 227 * 1024  # opts in to more than 48 KB
        assert kernel.grid[1] == -(-columns // int(choice["block_n"]))  # type: ignore[call-overload]
        assert all(0 < g < 2**31 for g in kernel.grid) and kernel.grid[2] <= 65535
        assert f"m64n{choice['block_n']}k16" in kernel.source
    import cuda.core  # noqa: F401  (its first import is not thread-safe; NVRTC runs in parallel below)

    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda k: compile_cubin(k.source, k.name, 90, k.arch_suffix), kernels))
    for cubin in cubins:
        code = sass(cubin)
        if code is not None:
            assert "HGMMA" in code and "LDL" not in code and "STL" not in code, "wgmma path off the tensor cores"


def test_the_arch_suffix_reaches_the_kernel_key_and_the_compiler() -> None:
    graph = TENSOR_CORE["matmul_nk"].build()
    _, fused = gemm_node(graph)
    kernel = emit(graph, wgmma_choices(fused)[0])
    assert kernel.content_hash != dataclasses.replace(kernel, arch_suffix="").content_hash
    ir = graph.validate()
    lowered = lower(
        fr.fuse(ir, arch=90), 90, signature(ir), lambda content_hash: content_hash, tuning={0: wgmma_choices(fused)[0]}
    )
    ((key, source),) = lowered.sources.items()
    assert source.arch_suffix == "a" and key == kernel.content_hash
    (binary,) = compile_sources(lowered.sources, 90, jobs=1)
    assert binary.arch == "sm_90a" and binary.cubin


# GPU: the tensor-core cases, plus shapes with many k tiles (the pipeline wraps around its
# stages), M and N not multiples of any tile, both B layouts, batches and a ResNet layer.
GPU_CASES = {
    **TENSOR_CORE,
    "matmul_kn_long_k": Matmul(batch_a=(2,), batch_b=(2,), m=300, k=1000, n=200, epilogue="bias_gelu_add"),
    "matmul_nk_long_k": Matmul(m=257, k=1032, n=136, b_transposed=True, epilogue="bias"),
    "conv_136_channels": Conv(n=3, c=32, hw=(9, 11), k=136, epilogue="bias_add_relu"),
    "resnet_56": Conv(n=2, c=64, hw=(56, 56), k=64),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_every_wgmma_candidate_matches_reference_on_gpu(case: str) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma path runs on sm_90 GPUs only")
    graph = GPU_CASES[case].build()
    _, fused = gemm_node(graph)
    for choice in wgmma_choices(fused):
        plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice})
        assert any("_wgmma_" in kernel.name for kernel in plan.kernels)
