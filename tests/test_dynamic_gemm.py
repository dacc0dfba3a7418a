"""Dynamic shapes, GEMM slice: a matmul with a symbolic M (rows of A and C) and symbolic batch
dims compiles once for its range. On the CPU: the lowering (M an EXTENT argument, the grid
computed at launch along x, or z for a symbolic batch), the refusals (mma.sync and wgmma
split-K, a symbolic N or K, convolutions), the range checks before any launch, the
signature, the reference against the static graph, the fp16 mma.sync and fp32 SIMT kernels
run by tests/cpu_emulation.py against the reference, and NVRTC for sm_80 and sm_90(a); the
`gpu` tests run the plans at the ends of the range and awkward values in between. The
warp-specialised engine's dynamic kernels: tests/test_dynamic_gemm_engine.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from codegen import emit_partition
from codegen.nvrtc import compile_cubin
from fusion_rules import Family, FusedNode, fuse
from graphdnn.compare import relative_error, tolerance
from graphdnn.ir import Graph
from graphdnn.program import ArgKind
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.bind import concrete
from graphdnn.signature import signature
from graphdnn.specialize import specialize
from tests import cpu_emulation
from tests.mma_emulation import on_cpu

Values = dict[str, int]


def linear(
    dtype: str = "half", max_m: int = 100, n: int = 24, k: int = 32, residual: bool = True, min_m: int = 1
) -> gd.OperationGraphSpec:
    """[m, k] @ [k, n] + bias (+ residual) -> relu, m a symbol."""
    g = gd.OperationGraphSpec("dyn_linear", io_data_type=dtype, compute_data_type="float")
    m = g.dim("m", min_m, max_m)
    y = g.matmul(g.tensor(name="a", dim=[m, k]), g.tensor(name="w", dim=[k, n]), name="mm")
    y = g.add(y, g.tensor(name="bias", dim=[1, n]))
    if residual:
        y = g.add(y, g.tensor(name="res", dim=[m, n]))
    g.relu(y, name="act").set_output(True)
    return g


def batched(
    dtype: str = "half", max_batch: int = 3, max_m: int = 70, n: int = 24, k: int = 32
) -> gd.OperationGraphSpec:
    """[batch, m, k] @ [k, n] + bias -> gelu, batch and m symbols."""
    g = gd.OperationGraphSpec("dyn_batched", io_data_type=dtype, compute_data_type="float")
    b, m = g.dim("batch", 1, max_batch), g.dim("m", 1, max_m)
    y = g.matmul(g.tensor(name="a", dim=[b, m, k]), g.tensor(name="w", dim=[k, n]), name="mm")
    g.gelu(g.add(y, g.tensor(name="bias", dim=[1, 1, n]))).set_output(True)
    return g


def gemm_node(ir: Graph, arch: int = 90) -> FusedNode:
    (fused,) = [f for f in fuse(ir, arch=arch).nodes if f.family is Family.GEMM]
    return fused


def _input(ir: Graph, name: str) -> int:
    return next(t.id for t in ir.inputs if t.name == name)


# -- lowering --------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_a_dynamic_m_is_an_argument_and_the_grid_is_computed_from_it(arch: str) -> None:
    graph = linear(max_m=4096, n=256, k=64)
    plan = gd.compile(graph, arch=arch, cache=None)
    (launch,) = plan.program.launches
    a = _input(plan.graph, "a")
    assert [x for x in launch.args if x.kind is ArgKind.EXTENT] == [gd.program.Arg(ArgKind.EXTENT, tensor=a, axis=0)]
    assert launch.blocks is not None and launch.blocks.grid_axis == 0 and launch.blocks.dims == ((a, 0),)
    block_m = launch.blocks.divisor
    assert "_mma_" in launch.name and block_m in (64, 128)  # mma.sync on both: the engine takes no symbols
    assert launch.grid == (-(-4096 // block_m), 2, 1)
    for m in (1, 67, 4096):
        assert launch.at({(a, 0): m}).grid == (-(-m // block_m), 2, 1)
    source = plan.kernels[0].source
    assert "const int GM = (int)(dyn0);" in source and "constexpr int GN = 256, GK = 64" in source
    assert f"grid [min(ceil(m / {block_m}), 2147483647), 2, 1]" in plan.describe()
    assert plan.program.workspace_size == 0  # no split-K


def test_a_dynamic_batch_computes_grid_z_and_blocks_past_m_return() -> None:
    plan = gd.compile(batched(max_batch=8, max_m=1000), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    a = _input(plan.graph, "a")
    assert launch.blocks is not None and launch.blocks.grid_axis == 2 and launch.blocks.dims == ((a, 0),)
    assert launch.at({(a, 0): 3, (a, 1): 5}).grid == (launch.grid[0], 1, 3)
    source = plan.kernels[0].source
    assert "if (block_m >= GM) return;" in source
    assert "grid [16, 1, min(batch, 65535)]" in plan.describe()


def test_fp32_takes_the_simt_kernel_with_a_grid_over_the_elements() -> None:
    plan = gd.compile(batched("float", max_batch=4, max_m=50), arch="sm_80", cache=None)
    (launch,) = plan.program.launches
    a = _input(plan.graph, "a")
    assert "_simt_" in launch.name and launch.blocks is not None
    assert launch.blocks.coefficient == 24 and set(launch.blocks.dims) == {(a, 0), (a, 1)}
    assert launch.at({(a, 0): 2, (a, 1): 11}).grid == (-(-2 * 11 * 24 // 256), 1, 1)


def test_static_matmuls_take_no_extents_and_the_engine_as_before() -> None:
    ir = linear(max_m=4096, min_m=4096, n=1024, k=256).validate()
    static = specialize(ir, {"m": 4096})
    plan = gd.compile(static, arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    assert launch.blocks is None and all(x.kind is not ArgKind.EXTENT for x in launch.args)
    assert "_ws" in launch.name  # the engine's default, with its sizes as constants
    assert "dyn" not in plan.kernels[0].source.split("// ---- end of header ----")[1]


def test_candidates_of_a_dynamic_matmul_split_k_on_the_engine_only() -> None:
    from codegen.emit import candidates

    choices = candidates(gemm_node(linear(max_m=64, n=2048, k=8192).validate()), 90)
    assert choices and all(c.get("path") == "ws" for c in choices if "split_k" in c)
    assert any(c.get("path") == "wgmma" for c in choices)
    assert any(c.get("path") == "ws" and "split_k" in c for c in choices)


# -- refusals --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"block_m": 64, "block_n": 64, "stages": 4, "split_k": 2}, "(m in 1..100) takes no mma.sync or wgmma split-K"),
        (
            {"path": "wgmma", "block_m": 128, "block_n": 64, "stages": 4, "split_k": 2},
            "take the warp-specialised engine's split",
        ),
    ],
)
def test_paths_that_cannot_take_symbols_are_refused_naming_the_node(choice: dict[str, object], message: str) -> None:
    ir = linear().validate()
    fused = gemm_node(ir)
    with pytest.raises(gd.UnsupportedError, match=r"node 'mm'") as caught:
        emit_partition(fuse(ir, arch=90), 90, {fused.name: choice})
    assert message in str(caught.value)


def test_a_symbolic_k_is_refused_naming_the_symbol() -> None:
    """(A convolution over a symbolic batch runs: tests/test_dynamic_conv.py.)"""
    g = gd.OperationGraphSpec("dyn_k", io_data_type="half", compute_data_type="float")
    k = g.dim("k", 8, 64)
    g.matmul(g.tensor(name="a", dim=[16, k]), g.tensor(name="w", dim=[k, 8]), name="mm").set_output(True)
    with pytest.raises(gd.UnsupportedError, match=r"multiplies over a symbolic N or K \(k in 8\.\.64\)"):
        gd.compile(g, arch="sm_90", cache=None)


def test_an_out_of_range_m_is_refused_naming_the_symbol_before_any_launch() -> None:
    plan = gd.compile(linear(), arch="sm_80", cache=None)
    ids = {t.name: t.id for t in plan.graph.inputs}
    shapes = {ids["a"]: (101, 32), ids["w"]: (32, 24), ids["bias"]: (1, 24), ids["res"]: (101, 24)}
    with pytest.raises(gd.FeedError, match=r"tensor 'a': dim 0 is 101, outside the range 1\.\.100 of symbol 'm'"):
        concrete(plan.graph, plan.program, shapes)
    shapes[ids["res"]] = (7, 24)
    with pytest.raises(gd.FeedError, match=r"'m'"):
        concrete(plan.graph, plan.program, {**shapes, ids["a"]: (5, 32)})
    tensor, extents = concrete(plan.graph, plan.program, {**shapes, ids["a"]: (7, 32)})
    assert extents == {(ids["a"], 0): 7} and tensor(ids["a"]).dim == (7, 32) and tensor(ids["w"]).dim == (32, 24)


# -- signature and reference ------------------------------------------------------------------
def test_the_signature_covers_the_range_not_a_value() -> None:
    assert signature(linear().validate()) == signature(linear().validate())
    assert signature(linear().validate()) != signature(linear(max_m=101).validate())
    assert signature(linear().validate()) != signature(linear(min_m=2).validate())
    static = specialize(linear().validate(), {"m": 100})
    assert signature(static) != signature(linear().validate())


@pytest.mark.compile_sample
@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), m=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_the_reference_of_the_dynamic_graph_equals_the_static_graph(batch: int, m: int, seed: int) -> None:
    ir = batched("float").validate()
    static = specialize(ir, {"batch": batch, "m": m})
    feeds = random_inputs(static, seed)
    dynamic, fixed = gd.reference.execute(ir, feeds), gd.reference.execute(static, feeds)
    assert dynamic.keys() == fixed.keys()
    for name in fixed:
        np.testing.assert_array_equal(dynamic[name], fixed[name])


# -- the kernels, run on the CPU ------------------------------------------------------------------
EMULATED = [
    pytest.param(lambda: linear(), [{"m": 1}, {"m": 67}, {"m": 100}], id="linear_half"),
    pytest.param(
        lambda: batched(), [{"batch": 1, "m": 1}, {"batch": 3, "m": 13}, {"batch": 2, "m": 70}], id="batched_half"
    ),
    pytest.param(lambda: linear("float", max_m=40), [{"m": 1}, {"m": 37}], id="linear_float_simt"),
]


@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize(("make", "values_list"), EMULATED)
def test_the_kernels_match_the_reference_across_the_range(
    make: Any, values_list: list[Values], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Emitted once for sm_80, run at each value (outputs start as NaN)."""
    build_dir: Path = tmp_path_factory.getbasetemp() / "mma_emulation"
    build_dir.mkdir(exist_ok=True)
    ir = make().validate()
    partition = fuse(ir, arch=80)
    programs = emit_partition(partition, 80)
    for values in values_list:
        feeds = random_inputs(specialize(ir, values), sum(values.values()))
        expected = gd.reference.execute(ir, feeds)
        memory: dict[str, Any] = dict(feeds)
        for fused, program in zip(partition.nodes, programs):
            emulated = dataclasses.replace(program, kernels=tuple(on_cpu(k) for k in program.kernels))
            memory.update(cpu_emulation.run(fused, emulated, memory, 1, build_dir, values))
        for t in ir.outputs:
            error = relative_error(memory[t.name].astype(np.float64), expected[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name} at {values}: {error:.3g}"


# -- NVRTC ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "arch", "choice"),
    [
        pytest.param(linear, 80, None, id="mma_sm80"),
        pytest.param(linear, 90, None, id="mma_sm90"),
        pytest.param(batched, 90, {"path": "wgmma", "block_m": 128, "block_n": 128, "stages": 4}, id="wgmma_sm90a"),
        pytest.param(lambda: batched("bfloat16"), 80, None, id="mma_bf16_batched_sm80"),
        pytest.param(lambda: batched("float"), 90, None, id="simt_sm90"),
    ],
)
def test_the_dynamic_kernels_compile(make: Any, arch: int, choice: dict[str, object] | None) -> None:
    ir = make().validate()
    partition = fuse(ir, arch=arch)
    fused = gemm_node(ir, arch)
    programs = emit_partition(partition, arch, {fused.name: choice} if choice else None)
    (program,) = [p for f, p in zip(partition.nodes, programs) if f.name == fused.name]
    for kernel in program.kernels:
        assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


# -- on the GPU -----------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(
        lambda: linear(max_m=8192, n=1024, k=64),
        [{"m": 1}, {"m": 4096}, {"m": 4097}, {"m": 8192}],
        None,
        id="linear_half_buckets",  # 64-row tiles up to 4096, 128-row ones above
    ),
    pytest.param(
        lambda: linear(max_m=4096, n=256, k=512),
        [{"m": 1}, {"m": 127}, {"m": 1021}, {"m": 4096}],
        None,
        id="linear_half",
    ),
    pytest.param(
        lambda: linear("bfloat16", max_m=3000, n=72, k=200, residual=False),
        [{"m": 1}, {"m": 97}, {"m": 3000}],
        None,
        id="linear_bf16_odd",
    ),
    pytest.param(
        lambda: batched(max_batch=9, max_m=777, n=136, k=96),
        [{"batch": 1, "m": 1}, {"batch": 7, "m": 131}, {"batch": 9, "m": 777}],
        None,
        id="batched_half",
    ),
    pytest.param(
        lambda: batched(max_batch=5, max_m=600, n=128, k=128),
        [{"batch": 1, "m": 1}, {"batch": 3, "m": 257}, {"batch": 5, "m": 600}],
        {"path": "wgmma", "block_m": 128, "block_n": 128, "stages": 4},
        id="batched_wgmma",
    ),
    pytest.param(
        lambda: batched("float", max_batch=4, max_m=300),
        [{"batch": 1, "m": 1}, {"batch": 4, "m": 293}],
        None,
        id="batched_simt",
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("make", "values_list", "choice"), GPU_CASES)
def test_one_dynamic_matmul_plan_runs_across_the_range_on_the_gpu(
    make: Any, values_list: list[Values], choice: dict[str, object] | None, tmp_path: Path
) -> None:
    import torch

    from tests.gpu_check import check_across_the_range

    if choice is not None and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma runs on sm_90")
    ir = make().validate()
    tuning = {gemm_node(ir, 90).name: choice} if choice is not None else None
    cache = gd.PlanCache(tmp_path)
    plan = gd.compile(ir, cache=cache, tuning=tuning)
    compiles = cache.counters.compiles
    check_across_the_range(plan, ir, values_list)
    assert cache.counters.compiles == compiles  # no compile inside the range


# -- size buckets --------------------------------------------------------------------------------
def test_m_buckets_launch_the_tile_a_static_plan_would_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    """sm_80 (where the static plans take mma.sync too), K short enough that they take no split-K."""
    from tests import fake_gpu
    from tests.test_dynamic_kernels import _fake_pack

    plan = gd.compile(linear(max_m=8192, n=1024, k=64), arch="sm_80", cache=None)
    buckets = [launch.bucket for launch in plan.program.launches]
    assert len(buckets) == 2 and all(b is not None for b in buckets)
    assert "when m in 1.." in plan.describe()
    fake = fake_gpu.install(monkeypatch, arch=80)
    for m in (1, 97, 4096, 4097, 8192):  # 128-row tiles from 33 of them (264 blocks)
        (launch,) = plan.bind(_fake_pack(fake, plan.graph, {"m": m}, outputs=False)).launches
        (expected,) = gd.compile(specialize(plan.graph, {"m": m}), arch="sm_80", cache=None).program.launches
        assert (launch.grid, launch.block, launch.shared_bytes) == (
            expected.grid,
            expected.block,
            expected.shared_bytes,
        )


def test_a_plan_with_buckets_round_trips_and_the_cache_checks_them() -> None:
    from graphdnn.program import LaunchBucket, LaunchProgram

    program = gd.compile(linear(max_m=8192, n=1024, k=64), arch="sm_80", cache=None).program
    assert LaunchProgram.from_json(program.to_json()) == program
    bucket = program.launches[0].bucket
    assert bucket is not None and LaunchBucket.from_json(bucket.to_json()) == bucket
    assert bucket.holds({bucket.dims[0]: bucket.low}) and not bucket.holds({bucket.dims[0]: bucket.low - 1})
    batched_program = gd.compile(batched(), arch="sm_90", cache=None).program
    assert LaunchProgram.from_json(batched_program.to_json()) == batched_program
    blocks = batched_program.launches[0].blocks
    assert blocks is not None and blocks.to_json()["grid_axis"] == 2
    assert "grid_axis" not in program.launches[0].to_json()["blocks"]  # x: as before the field existed
