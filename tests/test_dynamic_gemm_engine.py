"""Dynamic shapes on the sm_90 warp-specialised GEMM engine (codegen/families/gemm_ws.py): a
matmul with a symbolic M, or symbolic batch dims, takes the engine where the static plan of
the same shape would, per size bucket of M (its split-K for few tiles and a long K). On the
CPU: the plan's choices against the static plans' at awkward Ms, the tensor maps' symbolic
sizes resolved at bind time and the encodings kept per (map, address) (a fake driver), the
plan data's JSON and the cache's checks of it, and NVRTC for sm_90a; the `gpu` tests run the
plans against the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import graphdnn as gd
from codegen import emit_partition
from codegen.nvrtc import compile_cubin
from fusion_rules import fuse
from graphdnn.program import CallExtent, GridExtent, LaunchProgram, TensorMap
from graphdnn.specialize import specialize
from tests import fake_gpu
from tests.test_dynamic_gemm import batched, linear
from tests.test_dynamic_kernels import _fake_pack

Values = dict[str, int]


def _input(ir: gd.Graph, name: str) -> int:
    return next(t.id for t in ir.inputs if t.name == name)


def _maps(launch: gd.program.Launch) -> list[TensorMap]:
    return [a.tensor_map for a in launch.args if a.tensor_map is not None]


# -- the plan's choices -----------------------------------------------------------------------------
def test_a_dynamic_m_takes_the_engine_per_bucket_as_the_static_plans_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """n = k = 1024 up to 16384 rows: 128 x 256 tiles from 4097 rows, 128 x 128 ones down to
    1025, and two K slices below (few tiles, K = 1024): the launches of each call are the
    static plan's, grid included."""
    plan = gd.compile(linear(max_m=16384, n=1024, k=1024), arch="sm_90", cache=None)
    launches = plan.program.launches
    assert [launch.bucket.low for launch in launches if launch.bucket is not None] == [4097, 1025, 1, 1]
    assert all("_ws" in launch.name for launch in launches[:3]) and "_splitk_reduce" in launches[3].name
    assert launches[2].bucket == launches[3].bucket  # the split's two kernels run together
    assert plan.program.workspace_size == 2 * 1024 * 1024 * 4  # partials of the split bucket's largest M
    a = _input(plan.graph, "a")
    blocks = launches[0].blocks
    assert blocks == GridExtent(1, ((a, 0),), 128, 132, multiplier=4)
    assert "grid [min(ceil(m / 128) * 4, 132), 1, 1]" in plan.describe()
    fake = fake_gpu.install(monkeypatch, arch=90)
    for m in (1, 7, 129, 1024, 1025, 1531, 4096, 4097, 16384):
        bound = plan.bind(_fake_pack(fake, plan.graph, {"m": m}, outputs=False))
        static = gd.compile(specialize(plan.graph, {"m": m}), arch="sm_90", cache=None).program.launches
        assert [(x.grid, x.block, x.shared_bytes) for x in bound.launches] == [
            (x.grid, x.block, x.shared_bytes) for x in static
        ], m
        assert [x.name.rsplit("_", 1)[0] for x in bound.launches] == [x.name.rsplit("_", 1)[0] for x in static]


def test_short_k_few_tiles_keep_mma_sync_and_a_symbolic_batch_one_engine_choice() -> None:
    """K = 512 is too short for the engine's split: the small Ms keep the mma.sync tile (no
    split-K), the large ones take the engine. A symbolic batch: one kernel, the engine's
    choice at the maxima, its grid the batch times the tiles of the largest M."""
    plan = gd.compile(linear(max_m=16384, n=1024, k=512), arch="sm_90", cache=None)
    names = [launch.name for launch in plan.program.launches]
    assert len(names) == 3 and "_ws" in names[0] and "_ws" in names[1] and "_mma" in names[2]
    assert plan.program.workspace_size == 0
    plan = gd.compile(batched(max_batch=8, max_m=1000, n=256, k=128), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    a = _input(plan.graph, "a")
    assert "_ws" in launch.name and launch.bucket is None
    assert launch.blocks == GridExtent(1, ((a, 0),), 1, 132, multiplier=8 * 2)
    assert launch.at({(a, 0): 3, (a, 1): 5}).grid == (48, 1, 1)
    assert launch.at({(a, 0): 8, (a, 1): 5}).grid == (128, 1, 1)
    source = plan.kernels[0].source
    assert "const int GM = (int)(dyn0);" in source and "const int TILES = (int)(dyn1) * BATCH_TILES;" in source


def test_the_operands_maps_carry_their_symbolic_sizes() -> None:
    """A [batch, m, k]: dims (k, m, batch), byte strides (2k, 2k * m): m and batch at each call;
    B [k, n] static."""
    plan = gd.compile(batched(max_batch=8, max_m=1000, n=256, k=128), arch="sm_90", cache=None)
    (launch,) = plan.program.launches
    a = _input(plan.graph, "a")
    a_map, b_map = _maps(launch)
    assert a_map.dims == (128, 1000, 8) and a_map.strides == (256, 256 * 1000)
    assert a_map.symbolic == (
        (1, CallExtent(1, ((a, 1),))),
        (2, CallExtent(1, ((a, 0),))),
        (4, CallExtent(256, ((a, 1),))),
    )
    assert not b_map.symbolic and b_map.at({}) is b_map
    resolved = a_map.at({(a, 0): 3, (a, 1): 7})
    assert (resolved.dims, resolved.strides, resolved.symbolic) == ((128, 7, 3), (256, 256 * 7), ())
    assert set(launch.dim_refs) == {(a, 0), (a, 1)}


def test_maps_and_grids_survive_the_plans_json_relabelling_and_the_cache_checks(tmp_path: Path) -> None:
    program = gd.compile(batched(max_batch=8, max_m=1000, n=256, k=128), arch="sm_90", cache=None).program
    assert LaunchProgram.from_json(program.to_json()) == program
    assert program.launches[0].to_json()["blocks"]["multiplier"] == 16
    mapping = {t: t + 100 for launch in program.launches for t, _ in launch.dim_refs}
    mapping.update({a.tensor: a.tensor + 100 for launch in program.launches for a in launch.args if a.tensor})
    relabelled = program.relabel(mapping)
    assert {t for t, _ in relabelled.launches[0].dim_refs} == {t + 100 for t, _ in program.launches[0].dim_refs}
    a_map = _maps(program.launches[0])[0]
    broken = TensorMap(2, (8, 8), (16,), (8, 8), 0, symbolic=((3, CallExtent(1, ((0, 0),))), (0, CallExtent(0, ()))))
    assert broken.problems() == [
        "symbolic sizes at positions [3, 0]",
        "a symbolic size without a positive coefficient or a dim",
    ]
    assert not a_map.problems()
    # a cached plan with symbolic maps and multipliers loads back and serves the range
    cache = gd.PlanCache(tmp_path)
    gd.compile(linear(max_m=4096, n=1024, k=1024), arch="sm_90", cache=cache)
    again = gd.compile(linear(max_m=4096, n=1024, k=1024), arch="sm_90", cache=cache)
    assert cache.counters.hits == 1 and any(_maps(x) and _maps(x)[0].symbolic for x in again.program.launches)


def _a_map_sizes(value: list[Any]) -> Callable[[dict[str, Any]], None]:
    """Replace the symbolic sizes of the first launch's first tensor map (A's) in a plan document."""

    def change(document: dict[str, Any]) -> None:
        (stored, *_) = [a for a in document["program"]["launches"][0]["args"] if a[0] == "tensor_map"]
        stored[3][5] = {"symbolic": value}

    return change


@pytest.mark.parametrize(
    ("sizes", "reason"),
    [
        ([[7, 1, [[0, 0]]]], r"a tensor map with symbolic sizes at positions \[7\]"),
        ([[1, 0, [[0, 0]]]], "a symbolic size without a positive coefficient or a dim"),
        ([[1, 1, [[0, 1]]]], r"an extent reads dim 1 of tensor 0, which is 1024, not a symbol"),
        ([[1, 1, [[999, 0]]]], "an extent names tensor 999"),
    ],
)
def test_a_cached_map_with_bad_symbolic_sizes_is_a_miss(sizes: list[Any], reason: str, tmp_path: Path) -> None:
    from graphdnn.cache.key import key_fields
    from graphdnn.cache.store import CacheWarning, DiskStore
    from tests.test_cache_trust import _reseal_plan

    graph = linear(max_m=4096, n=1024, k=1024)
    gd.compile(graph, arch="sm_90", cache=gd.PlanCache(tmp_path))
    path = DiskStore(tmp_path).plan_path(key_fields(graph.validate(), 90).key)
    _reseal_plan(path, _a_map_sizes(sizes))
    cache = gd.PlanCache(tmp_path)
    with pytest.warns(CacheWarning, match=reason):
        plan = gd.compile(graph, arch="sm_90", cache=cache)
    assert plan.origin == "compiled" and cache.counters.rejected >= 1


# -- tensor maps at bind time ------------------------------------------------------------------------
def test_bind_encodes_each_calls_maps_once_per_shape_and_address(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = gd.compile(batched(max_batch=8, max_m=1000, n=256, k=128), arch="sm_90", cache=None)
    fake = fake_gpu.install(monkeypatch, arch=90)
    pack = _fake_pack(fake, plan.graph, {"batch": 3, "m": 7}, outputs=False)

    def encodings() -> list[tuple[Any, ...]]:
        return [c for c in fake.calls if c[0] == "tensor_map"]

    bound = plan.bind(pack)
    a_address = pack["a"].args[0]
    a_call = next(c for c in encodings() if c[1] == a_address)
    assert a_call[2:4] == ((128, 7, 3), (256, 256 * 7))
    (launch,) = bound.launches
    slot = launch.slot_starts[0]
    assert list(bound._slots[0][slot : slot + 5]) == [a_address, 3, 2, 128, 7]  # the fake's words
    count = len(encodings())
    plan.bind(pack)  # the same buffers and shape: every map from the cache
    assert len(encodings()) == count
    other = _fake_pack(fake, plan.graph, {"batch": 2, "m": 129}, outputs=False)
    plan.bind({**other, "a": fake_gpu.FakeArray(a_address, (2, 129, 128), (129 * 128, 128, 1), "<f2")})
    assert [c[2:4] for c in encodings()[count:] if c[1] == a_address] == [((128, 129, 2), (256, 256 * 129))]


def test_an_out_of_range_call_is_refused_before_any_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = gd.compile(linear(max_m=4096, n=1024, k=1024), arch="sm_90", cache=None)
    fake = fake_gpu.install(monkeypatch, arch=90)
    pack = _fake_pack(fake, plan.graph, {"m": 4096}, outputs=False)
    pack["a"] = fake_gpu.FakeArray(fake.allocate(1 << 24), (4097, 1024), (1024, 1), "<f2")
    with pytest.raises(gd.FeedError, match=r"tensor 'a': dim 0 is 4097, outside the range 1\.\.4096 of symbol 'm'"):
        plan.bind(pack)
    assert not [c for c in fake.calls if c[0] == "tensor_map"]


# -- NVRTC -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: linear(max_m=16384, n=1024, k=1024), id="linear_buckets_split"),
        pytest.param(lambda: batched(max_batch=8, max_m=1000, n=256, k=128), id="batched"),
        pytest.param(lambda: batched("bfloat16", max_batch=2, max_m=200, n=256, k=2048), id="batched_split_bf16"),
    ],
)
def test_the_dynamic_engine_kernels_compile_for_sm90a(make: Any) -> None:
    ir = make().validate()
    programs = emit_partition(fuse(ir, arch=90), 90)
    kernels = [k for program in programs for k in program.kernels]
    assert any(k.arch_suffix == "a" and "_ws" in k.name for k in kernels)
    for kernel in kernels:
        assert compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)


# -- on the GPU ----------------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param(
        lambda: linear(max_m=4096, n=1024, k=1024),
        [{"m": 1}, {"m": 7}, {"m": 129}, {"m": 1024}, {"m": 1025}, {"m": 1531}, {"m": 4096}],
        id="linear_split_and_engine",  # bias + residual + relu epilogue; two K slices up to 1024 rows
    ),
    pytest.param(
        lambda: linear("bfloat16", max_m=16384, n=1024, k=512, residual=False),
        [{"m": 1}, {"m": 7}, {"m": 129}, {"m": 1531}, {"m": 16384}],
        id="linear_bf16_engine_and_mma",
    ),
    pytest.param(
        lambda: batched(max_batch=9, max_m=1531, n=256, k=256),
        [{"batch": 1, "m": 1}, {"batch": 3, "m": 7}, {"batch": 7, "m": 129}, {"batch": 9, "m": 1531}],
        id="batched_engine",  # bias + gelu epilogue
    ),
    pytest.param(
        lambda: batched(max_batch=2, max_m=200, n=256, k=2048),
        [{"batch": 1, "m": 1}, {"batch": 2, "m": 129}, {"batch": 2, "m": 200}],
        id="batched_engine_split",
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("make", "values_list"), GPU_CASES)
def test_the_dynamic_engine_matches_the_reference_on_the_gpu(
    make: Any, values_list: list[Values], tmp_path: Path
) -> None:
    import torch

    from tests.gpu_check import check_across_the_range

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised engine runs on sm_90")
    ir = make().validate()
    cache = gd.PlanCache(tmp_path)
    plan = gd.compile(ir, cache=cache)
    assert any("_ws" in launch.name for launch in plan.program.launches)
    compiles = cache.counters.compiles
    check_across_the_range(plan, ir, values_list)
    assert cache.counters.compiles == compiles  # no compile inside the range
