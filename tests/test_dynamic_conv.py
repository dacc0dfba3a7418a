"""Dynamic shapes, convolution forward over a symbolic batch N (codegen/families/gemm*.py): one
plan for the range, M = N*P*Q bucketed like a dynamic matmul's M, each bucket taking what the
static plan of its sizes takes (mma.sync with its split-K, or on sm_90 the warp-specialised
engine fed by TMA im2col, whose image map's batch dim is resolved at each call). On the CPU:
the plan's launches against the static plans' (a fake driver), the image map's symbolic size,
the plan's JSON and the cache, what stays refused, NVRTC for sm_80 and sm_90a; the `gpu` tests
run the plans against the reference at the ends of the range, a prime and every bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import graphdnn as gd
from codegen import emit_partition
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn.program import CallExtent, LaunchProgram
from graphdnn.symbolic import Sym
from tests import fake_gpu
from tests.test_dynamic_kernels import _fake_pack


def conv(
    top: int,
    n: int | None = None,
    *,
    c: int = 128,
    k: int = 128,
    hw: int = 14,
    size: int = 3,
    stride: int = 1,
    epilogue: str = "bn",
) -> gd.OperationGraphSpec:
    """conv_fprop (NHWC fp16) over the batch N in 1..``top`` (``n``: the static graph of that N),
    then BN (inference) + ReLU, or bias + ReLU: the conv_bn_act fusion."""
    g = gd.OperationGraphSpec(f"conv_{'dyn' if n is None else n}", io_data_type="half", compute_data_type="float")
    batch: int | Sym = g.dim("batch", 1, top) if n is None else n
    x_dim, w_dim = [batch, c, hw, hw], [k, c, size, size]
    x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
    w = g.tensor(name="w", dim=w_dim, stride=gd.nhwc_strides(w_dim))
    y = g.conv_fprop(x, w, padding=[size // 2] * 2, stride=[stride] * 2, name="conv")
    if epilogue == "bn":
        stats = [g.tensor(name=s, dim=[1, k, 1, 1], data_type="float") for s in ("mean", "inv_var", "gamma", "beta")]
        y = g.batchnorm_inference(y, *stats, name="bn")
    else:
        y = g.bias(y, g.tensor(name="b", dim=[1, k, 1, 1], data_type="float"), name="bias")
    g.relu(y, name="act").set_name("y").set_output(True)
    return g


def _batch_ranges(plan: gd.Plan, pixels: int) -> list[tuple[int, int]]:
    """The batches each bucket of the plan serves (its M range over ``pixels`` per image)."""
    buckets = dict.fromkeys(launch.bucket for launch in plan.program.launches if launch.bucket is not None)
    return [(-(-b.low // pixels), b.high // pixels) for b in buckets if b is not None]


def _stem(name: str) -> str:
    return name.rsplit("_", 1)[0]


# -- the plan's choices -----------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [80, 90])
def test_each_batch_launches_what_the_static_plan_of_that_batch_launches(
    arch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3x3 128->128 at 14², N in 1..48: on sm_90 mma.sync with two K slices up to N = 42, then
    the engine with TMA im2col (its tiles fill half the SMs); on sm_80 mma.sync's split over the
    whole range (one variant). Every N gives the static plan's kernels, grids and shared memory."""
    plan = gd.compile(conv(48), arch=f"sm_{arch}", cache=None)
    assert isinstance(plan, gd.Plan)
    fake = fake_gpu.install(monkeypatch, arch=arch)
    names = [launch.name for launch in plan.program.launches]
    if arch == 90:
        assert _batch_ranges(plan, 196) == [(43, 48), (1, 42)]
        assert "_ws" in names[0] and "_mma_splitk" in names[1] and "_splitk_reduce" in names[2]
    else:
        assert _batch_ranges(plan, 196) == [] and "_mma_splitk" in names[0] and "_splitk_reduce" in names[1]
    for n in (1, 7, 42, 43, 48):
        bound = plan.bind(_fake_pack(fake, plan.graph, {"batch": n}, outputs=False))
        static = gd.compile(conv(48, n), arch=f"sm_{arch}", cache=None).program.launches
        assert [(x.grid, x.block, x.shared_bytes) for x in bound.launches] == [
            (x.grid, x.block, x.shared_bytes) for x in static
        ], n
        assert [_stem(x.name) for x in bound.launches] == [_stem(x.name) for x in static], n


def test_the_image_map_resolves_the_batch_at_each_call() -> None:
    """The im2col map of x [N, 128, 14, 14] NHWC: dims (C, W, H, N), N at each call; its byte
    strides static (N's is H*W*C*2 whatever N); the filter's map static."""
    plan = gd.compile(conv(48), arch="sm_90", cache=None)
    engine = plan.program.launches[0]
    image, filt = [a.tensor_map for a in engine.args if a.tensor_map is not None]
    x = next(t.id for t in plan.graph.inputs if t.name == "x")
    assert image.im2col is not None and image.dims == (128, 14, 14, 48)
    assert image.strides == (256, 256 * 14, 256 * 196)
    assert image.symbolic == ((3, CallExtent(1, ((x, 0),))),)
    assert image.at({(x, 0): 13}).dims == (128, 14, 14, 13)
    assert not filt.symbolic
    source = plan.kernels[0].source
    assert "const int GM = (int)(196 * dyn0);" in source and "const int TILES = (int)1 * BATCH_TILES;" in source


def test_the_gather_producer_and_wgmma_take_a_dynamic_batch_when_tuned() -> None:
    """Tuned choices: the engine's gathering producer (with its split-K), wgmma, an mma.sync
    split, one variant for the range; a wgmma split stays refused for a dynamic M (gemm.py)."""
    graph = conv(48)
    mma = {"block_m": 128, "block_n": 128, "stages": 3}
    for tuning, path in (
        ({"path": "ws", "block_n": 128, "stages": 6}, "_ws"),
        ({"path": "ws", "block_n": 128, "stages": 6, "split_k": 2}, "_ws"),
        ({"path": "wgmma", **mma}, "_wgmma"),
        ({**mma, "split_k": 3}, "_mma_splitk"),
    ):
        plan = gd.compile(graph, arch="sm_90", cache=None, tuning={"conv_bn_act_0": tuning})
        assert path in plan.program.launches[0].name and plan.program.launches[0].blocks is not None
    with pytest.raises(
        gd.UnsupportedError, match=r"node 'conv'.*conv_fprop with symbolic dims .* takes no wgmma split"
    ):
        gd.compile(graph, arch="sm_90", cache=None, tuning={"conv_bn_act_0": {"path": "wgmma", **mma, "split_k": 2}})


def test_the_plan_json_round_trips_and_the_cache_serves_the_range(tmp_path: Path) -> None:
    program = gd.compile(conv(48), arch="sm_90", cache=None).program
    assert LaunchProgram.from_json(program.to_json()) == program
    cache = gd.PlanCache(tmp_path)
    first = gd.compile(conv(48), arch="sm_90", cache=cache)
    compiles = cache.counters.compiles
    assert compiles == len(first.kernels) == 3
    again = gd.compile(conv(48), arch="sm_90", cache=gd.PlanCache(tmp_path))
    assert again.origin == "disk cache" and again.program == first.program


def test_an_out_of_range_batch_is_refused_before_any_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = gd.compile(conv(48), arch="sm_90", cache=None)
    fake = fake_gpu.install(monkeypatch, arch=90)
    pack = _fake_pack(fake, plan.graph, {"batch": 48})
    pack["x"] = fake_gpu.FakeArray(fake.allocate(1 << 20), (49, 128, 14, 14), gd.nhwc_strides([49, 128, 14, 14]), "<f2")
    with pytest.raises(gd.FeedError, match=r"tensor 'x': dim 0 is 49, outside the range 1\.\.48 of symbol 'batch'"):
        plan.execute(pack)
    assert not [c for c in fake.calls if c[0] in ("launch", "tensor_map")]


def test_what_stays_refused_names_the_node_and_the_symbol() -> None:
    """An image whose channel stride holds N (CNHW in memory), and a gradient over a symbolic batch."""
    g = gd.OperationGraphSpec("dyn_cnhw", io_data_type="half", compute_data_type="float")
    n = g.dim("n", 1, 8)
    x = g.tensor(name="x", dim=[n, 16, 6, 6], stride=[36, n * 36, 6, 1])
    w = g.tensor(name="w", dim=[16, 16, 3, 3], stride=gd.nhwc_strides([16, 16, 3, 3]))
    g.conv_fprop(x, w, padding=[1, 1], name="conv").set_output(True)
    with pytest.raises(
        gd.UnsupportedError,
        match=r"fused node 'conv' \(gemm: conv\) has symbolic strides or dims besides its batch \(n in 1\.\.8\)",
    ):
        gd.compile(g, arch="sm_90", cache=None)
    g = gd.OperationGraphSpec("dyn_dgrad", io_data_type="bf16", compute_data_type="float")
    n = g.dim("n", 1, 8)
    dy = g.tensor(name="dy", dim=[n, 16, 6, 6], stride=gd.nhwc_strides([n, 16, 6, 6]))
    w = g.tensor(name="w", dim=[16, 16, 3, 3], stride=gd.nhwc_strides([16, 16, 3, 3]))
    g.conv_dgrad(dy, w, padding=[1, 1], name="dgrad").set_output(True)
    with pytest.raises(
        gd.UnsupportedError, match=r"fused node 'dgrad' \(direct: dgrad\) has symbolic dims \(n in 1\.\.8\)"
    ):
        gd.compile(g, arch="sm_90", cache=None)


# -- NVRTC -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [80, 90])
def test_the_dynamic_conv_kernels_compile(arch: int) -> None:
    """The GPU tests' plan (every bucket's kernels) for sm_80 and sm_90(a)."""
    kernels = [k for p in emit_partition(fuse(conv(48).validate(), arch=arch), arch) for k in p.kernels]
    assert (arch == 90) == any("_ws" in k.name and k.bucket is not None for k in kernels)
    assert any("_mma_splitk" in k.name for k in kernels)
    for kernel in kernels:
        assert compile_cubin(kernel.source, kernel.name, arch, kernel.arch_suffix)


# -- on the GPU ----------------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(lambda: conv(48), 196, id="bn_relu_3x3_128_14"),  # on sm_90 mma.sync split-K, the engine from N = 43
    pytest.param(lambda: conv(9, c=32, k=64, hw=15, stride=2, epilogue="bias"), 64, id="bias_relu_3x3s2_15"),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("make", "pixels"), GPU_CASES)
def test_the_dynamic_conv_matches_the_reference_on_the_gpu(make: Any, pixels: int, tmp_path: Path) -> None:
    """N = 1, a prime, the range's maximum and both ends of every bucket; no compile in the range."""
    from tests.gpu_check import check_across_the_range

    ir = make().validate()
    cache = gd.PlanCache(tmp_path)
    plan = gd.compile(ir, cache=cache)
    assert isinstance(plan, gd.Plan)
    top = ir.symbols[0].max
    ranges = _batch_ranges(plan, pixels) or [(1, top)]
    batches = sorted({1, 7, top, *(n for r in ranges for n in r)})
    compiles = cache.counters.compiles
    check_across_the_range(plan, ir, [{"batch": n} for n in batches])
    assert cache.counters.compiles == compiles


@pytest.mark.gpu
def test_the_gather_producer_matches_the_reference_on_the_gpu() -> None:
    import torch

    from tests.gpu_check import check_across_the_range

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised engine runs on sm_90")
    ir = conv(48).validate()
    plan = gd.compile(ir, cache=None, tuning={"conv_bn_act_0": {"path": "ws", "block_n": 128, "stages": 6}})
    check_across_the_range(plan, ir, [{"batch": n} for n in (1, 13, 48)])
