"""Dynamic shapes, kernel slice: a dynamic graph of elementwise and row-norm kernels compiles once
for its whole range and runs at any value in it. On the CPU: the lowering (EXTENT arguments,
grids computed at launch, the workspace at the maxima), the plan JSON and cache, binding
through a stand-in driver, the kernels run by tests/cpu_emulation.py against the reference,
and the refusals; the `gpu` tests run the plans at several sizes across the range."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from codegen import emit_partition
from codegen.buckets import size_buckets
from fusion_rules import fuse
from graphdnn.cli import main
from graphdnn.compare import relative_error, tolerance
from graphdnn.program import Arg, ArgKind, GridExtent, LaunchProgram
from graphdnn.random_inputs import random_inputs
from graphdnn.specialize import specialize
from graphdnn.symbolic import Sym
from tests import cpu_emulation, fake_gpu, plan_graphs
from tests.graph_strategies import Recipe, build, pointwise_recipes, random_feeds

ARCH = "sm_90"
Values = dict[str, int]

# Each dynamic graph with the symbol values it is run at: 1, an odd value inside, the maxima.
SMALL_CASES: list[tuple[Callable[[], gd.OperationGraphSpec], list[Values]]] = [
    (lambda: plan_graphs.ln_gelu(width=256, max_rows=9), [{"rows": 1}, {"rows": 5}, {"rows": 9}]),
    (
        lambda: plan_graphs.add_rmsnorm(width=64, max_batch=3, max_seq=5),
        [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 3}, {"batch": 3, "seq": 5}],
    ),
    (plan_graphs.pointwise_chain, [{"batch": 1, "seq": 1}, {"batch": 4, "seq": 7}, {"batch": 9, "seq": 17}]),
]


def _id(case: tuple[Callable[[], gd.OperationGraphSpec], list[Values]]) -> str:
    return case[0]().name


def _input(ir: gd.Graph, name: str) -> int:
    return next(t.id for t in ir.inputs if t.name == name)


# -- lowering --------------------------------------------------------------------------------
def test_a_row_norm_kernel_reads_its_rows_and_computes_its_grid_at_launch() -> None:
    graph = plan_graphs.ln_gelu()
    ir = graph.validate()
    plan = gd.compile(graph, arch=ARCH, cache=None)
    x = _input(ir, "x")
    for launch in plan.program.launches:  # a variant per size bucket (test_size_buckets_*)
        extents = [a for a in launch.args if a.kind is ArgKind.EXTENT]
        assert extents == [Arg(ArgKind.EXTENT, tensor=x, axis=0)]
        assert launch.blocks is not None and launch.blocks.dims == ((x, 0),) and launch.blocks.coefficient == 1
        assert launch.grid == (-(-4096 // launch.blocks.divisor), 1, 1)  # at the maximum
        for rows in (1, 77, 4096):
            assert launch.at({(x, 0): rows}).grid == (-(-rows // launch.blocks.divisor), 1, 1)
    launch = plan.program.launches[0]  # the largest sizes' variant
    assert launch.blocks is not None and launch.bucket is not None and launch.bucket.high == 4096
    rows_per_block = launch.blocks.divisor
    source = plan.kernels[0].source
    assert "const long long dyn0)" in source and "const int ROWS = (dyn0);" in source and "dyn_rows" not in source
    assert "dyn0 = symbol 'rows'" in source  # the header's legend
    assert f"grid [min(ceil(rows / {rows_per_block}), 2147483647), 1, 1]" in plan.describe()
    assert "rows (dim 0 of x)" in plan.describe()


def test_an_elementwise_grid_is_the_product_of_its_symbols() -> None:
    ir = plan_graphs.pointwise_chain().validate()
    (program,) = emit_partition(fuse(ir, arch=90), 90)
    (kernel,) = program.kernels
    assert [p.symbol.name for p in kernel.params if p.symbol is not None] == ["batch", "seq"]
    assert kernel.blocks is not None and str(kernel.blocks.count) == "40*batch*seq"
    assert kernel.grid == (-(-9 * 17 * 40 // kernel.blocks.per_block), 1, 1)
    plan = gd.compile(ir, arch=ARCH, cache=None)
    (launch,) = plan.program.launches
    assert launch.blocks == GridExtent(40, ((_input(ir, "x"), 0), (_input(ir, "x"), 1)), kernel.blocks.per_block, 65535)
    assert launch.at({(_input(ir, "x"), 0): 2, (_input(ir, "x"), 1): 3}).grid[0] == 1


def test_the_workspace_is_laid_out_for_the_maxima() -> None:
    """Two norms in a row: the first one's output crosses fused nodes, in the workspace."""
    g = gd.OperationGraphSpec("two_norms", io_data_type="half")
    x = g.tensor(name="x", dim=[g.dim("rows", 1, 300), 64])
    h = g.rmsnorm("inference", x, g.tensor(name="s1", dim=[1, 64]), epsilon=1e-5)[0]
    assert h is not None
    y = g.rmsnorm("inference", h, g.tensor(name="s2", dim=[1, 64]), epsilon=1e-5)[0]
    assert y is not None
    y.set_output(True)
    plan = gd.compile(g, arch=ARCH, cache=None)
    (buffer,) = plan.workspace
    assert buffer.bytes == 300 * 64 * 4 and plan.workspace_size >= buffer.bytes  # float intermediates
    assert len(plan.program.launches) == 2


def test_static_graphs_lower_as_before() -> None:
    """No extent arguments, no dynamic grid, and a launch's JSON without the new field."""
    plan = gd.compile(plan_graphs.ln_gelu(rows=77), arch=ARCH, cache=None)
    (launch,) = plan.program.launches
    assert launch.blocks is None and all(a.kind is not ArgKind.EXTENT for a in launch.args)
    document = launch.to_json()
    assert "blocks" not in document and all(len(a) == 3 for a in document["args"])
    assert "dyn" not in plan.kernels[0].source.split("// ---- end of header ----")[1]


def test_the_program_round_trips_through_json_and_relabelling() -> None:
    ir = plan_graphs.add_rmsnorm().validate()
    program = gd.compile(ir, arch=ARCH, cache=None).program
    assert LaunchProgram.from_json(json.loads(json.dumps(program.to_json()))) == program
    shift = {t.id: t.id + 100 for t in ir.tensors}
    moved = program.relabel(shift)
    for launch in moved.launches:
        assert launch.blocks is not None and all(t >= 100 for t, _ in launch.blocks.dims)
        assert launch.bucket is not None and all(t >= 100 for t, _ in launch.bucket.dims)
        assert all(a.tensor >= 100 for a in launch.args if a.kind is ArgKind.EXTENT and a.tensor is not None)
    assert moved.relabel({v: k for k, v in shift.items()}) == program
    assert Arg.from_json(["extent", 3, None, 1]) == Arg(ArgKind.EXTENT, tensor=3, axis=1)


# -- refusals --------------------------------------------------------------------------------
def test_a_family_without_runtime_extents_is_refused_naming_the_node_and_symbols() -> None:
    g = gd.OperationGraphSpec("dyn_sum", io_data_type="float")
    x = g.tensor(name="x", dim=[g.dim("m", 1, 128), 32])
    g.reduction(x, mode="add", axes=[1], name="sum").set_output(True)
    with pytest.raises(gd.UnsupportedError) as caught:
        gd.compile(g, arch=ARCH, cache=None)
    assert str(caught.value) == (
        "fused node 'sum' (reduction: sum) has symbolic dims (m in 1..128); reduction kernels do not take runtime "
        "extents yet (only attention, elementwise, gemm and row_norm kernels do, docs/dynamic-shapes.md). Run it "
        "with backend='reference', or build a static graph for each shape"
    )


def test_a_row_norm_over_a_symbolic_axis_is_refused_naming_the_node_and_symbol() -> None:
    """A scale of ones normalizes over every axis but the first: here the symbolic one."""
    g = gd.OperationGraphSpec("dyn_width", io_data_type="float")
    x = g.tensor(name="x", dim=[4, g.dim("width", 1, 512)])
    g.layernorm("inference", x, g.tensor(name="s", dim=[1, 1]), g.tensor(name="b", dim=[1, 1]), 1e-5, name="ln")[
        0
    ].set_output(True)
    with pytest.raises(gd.UnsupportedError) as caught:
        gd.compile(g, arch=ARCH, cache=None)
    assert str(caught.value) == (
        "fused node 'ln' (row_norm: ln) normalizes over symbolic dims (width in 1..512); row_norm kernels take "
        "runtime extents in their rows only (the row's width sizes each thread's registers). Run it with "
        "backend='reference', or build a static graph for each shape"
    )


# -- the plan cache and warmup -------------------------------------------------------------------
def test_one_cache_entry_serves_the_range_and_renamed_symbols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = gd.PlanCache(tmp_path)
    built = gd.compile(plan_graphs.dynamic_rows(), arch=ARCH, cache=cache)
    assert built.origin == "compiled" and cache.counters.compiles == 1
    renamed = gd.compile(plan_graphs.dynamic_rows(symbol="tokens"), arch=ARCH, cache=gd.PlanCache(tmp_path))
    assert isinstance(renamed, gd.Plan) and renamed.origin == "disk cache" and renamed.compiled == 0
    assert renamed.program == built.program
    fake = fake_gpu.install(monkeypatch)
    for rows, blocks in ((1, 1), (31, 1), (64, 2)):  # 8 halves per thread, 256 threads: 2048 elements a block
        bound = renamed.bind(_fake_pack(fake, renamed.graph, {"tokens": rows}))
        assert bound.launches[0].grid[0] == blocks and _extent_slots(bound) == [rows]


def test_warmup_compiles_a_dynamic_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ln_gelu.json"
    gd.save(plan_graphs.ln_gelu(), path)
    assert main(["warmup", str(path), "--arch", ARCH, "--cache-dir", str(tmp_path / "cache")]) == 0
    assert "1 graphs (0 cache hits, 1 built)" in capsys.readouterr().out
    plan = gd.compile(gd.load(path), arch=ARCH, cache=tmp_path / "cache", require_cached=True)
    assert isinstance(plan, gd.Plan) and plan.origin in ("memory cache", "disk cache") and plan.compiled == 0
    buckets = [launch.bucket for launch in plan.program.launches]
    assert len(buckets) == 3 and all(b is not None for b in buckets)  # every size bucket's variant, compiled
    assert all(launch.kernel_key in plan.binaries for launch in plan.program.launches)


# -- size buckets --------------------------------------------------------------------------------
# a step function of the size over a range: its bottom, its span, where the choice changes, the most buckets
STEP_FUNCTIONS = given(
    low=st.integers(1, 50),
    span=st.integers(0, 5000),
    steps=st.lists(st.integers(1, 5050), max_size=4),
    most=st.integers(1, 4),
)


@settings(max_examples=60, deadline=None)
@STEP_FUNCTIONS
def test_size_buckets_cover_the_range_with_the_choice_at_each_top(
    low: int, span: int, steps: list[int], most: int
) -> None:
    """A step function of the size (the choice changes at ``steps``): the buckets cover the
    range from the top without gaps or overlap, each with the choice at its top, which holds
    down to its bottom but in the last bucket (there are at most ``most``)."""
    g = gd.OperationGraphSpec("b")
    count = g.dim("n", low, low + span)
    assert isinstance(count, Sym)

    def choose(size: int) -> int:
        return sum(size >= step for step in steps)

    found = size_buckets(count, choose, most)
    assert 1 <= len(found) <= most
    assert found[0][0].high == low + span and found[-1][0].low == low
    for (upper_bucket, _), (lower_bucket, _) in itertools.pairwise(found):
        assert lower_bucket.high == upper_bucket.low - 1
    for bucket, choice in found:
        assert choice == choose(bucket.high)
    for bucket, choice in found[:-1]:
        assert choose(bucket.low) == choice and choose(bucket.low - 1) != choice
    if len(found) < most:
        assert choose(low) == found[-1][1]


@settings(max_examples=60, deadline=None)
@STEP_FUNCTIONS
def test_size_buckets_from_the_bottom_take_each_bottom_choice(low: int, span: int, steps: list[int], most: int) -> None:
    """A choice that grows with the size (a decode's split over its keys), cut from the bottom:
    the buckets cover the range without gaps or overlap, largest first, each holding its
    bottom's choice through its top but the last (the top of the range), which takes the
    maximum's choice."""
    g = gd.OperationGraphSpec("b")
    count = g.dim("n", low, low + span)
    assert isinstance(count, Sym)

    def choose(size: int) -> int:
        return sum(size >= step for step in steps)

    found = size_buckets(count, choose, most, from_top=False)
    assert 1 <= len(found) <= most
    assert found[0][0].high == low + span and found[-1][0].low == low
    for (upper_bucket, _), (lower_bucket, _) in itertools.pairwise(found):
        assert lower_bucket.high == upper_bucket.low - 1
    assert found[0][1] == choose(low + span)
    for bucket, choice in found[1:]:
        assert choose(bucket.low) == choose(bucket.high) == choice and choose(bucket.high + 1) != choice
    if len(found) < most:
        assert choose(found[0][0].low) == found[0][1]


@pytest.mark.parametrize(
    ("make", "symbols"), [(plan_graphs.ln_gelu, ("rows",)), (plan_graphs.add_rmsnorm, ("batch", "seq"))]
)
def test_bind_launches_the_variant_a_static_plan_would_choose(
    make: Callable[..., gd.OperationGraphSpec], symbols: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each size, the launch shape of the bucket's variant is the static plan's (the
    heuristic's for those rows), and exactly one variant runs."""
    plan = gd.compile(make(), arch=ARCH, cache=None)
    assert len(plan.program.launches) > 1
    fake = fake_gpu.install(monkeypatch)
    for values in (
        {"rows": 1, "batch": 1, "seq": 1},
        {"rows": 64, "batch": 2, "seq": 32},
        {"rows": 1500, "batch": 3, "seq": 500},
        {"rows": 4096, "batch": 8, "seq": 512},
    ):
        values = {name: values[name] for name in symbols}
        bound = plan.bind(_fake_pack(fake, plan.graph, values, outputs=False))
        (launch,) = bound.launches
        static = gd.compile(specialize(plan.graph, values), arch=ARCH, cache=None)
        (expected,) = static.program.launches
        assert (launch.grid, launch.block) == (expected.grid, expected.block), values


def test_run_draws_extents_in_range_or_takes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "add_rmsnorm.json"
    gd.save(plan_graphs.add_rmsnorm(width=64), path)
    assert main(["run", str(path), "--backend", "reference", "--check", "--symbol", "batch=3"]) == 0
    out = capsys.readouterr().out
    assert "extents: batch = 3 (1..8), seq = " in out and "check: passed" in out
    assert main(["run", str(path), "--backend", "reference", "--symbol", "seq=513"]) != 0
    assert "--symbol seq=513: the value must be an integer in 1..512" in capsys.readouterr().err
    assert main(["run", str(path), "--backend", "reference", "--symbol", "rows=3"]) != 0
    assert "has no symbol 'rows' (its symbols: batch, seq)" in capsys.readouterr().err


# -- binding through a stand-in driver ---------------------------------------------------------------
def _fake_pack(fake: fake_gpu.FakeDriver, ir: gd.Graph, values: Values, outputs: bool = True) -> dict[str, Any]:
    """A FakeArray per input (and output) of the static graph of ``values``."""
    static = specialize(ir, values)
    tensors = [*static.inputs, *(static.outputs if outputs else ())]
    return {
        t.name: fake_gpu.FakeArray(fake.allocate(1 << 20), t.dim, t.stride, f"<f{t.data_type.itemsize}")
        for t in tensors
    }


def _extent_slots(bound: Any) -> list[int]:
    (launch,) = bound.launches
    starts = launch.slot_starts
    return [int(bound._slots[0][starts[i]]) for i, a in enumerate(launch.args) if a.kind is ArgKind.EXTENT]


def test_bind_reads_the_symbols_from_the_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = gd.compile(plan_graphs.add_rmsnorm(), arch=ARCH, cache=None)
    assert isinstance(plan, gd.Plan)
    fake = fake_gpu.install(monkeypatch)
    for batch, seq in ((1, 1), (3, 77), (8, 512)):
        bound = plan.bind(_fake_pack(fake, plan.graph, {"batch": batch, "seq": seq}, outputs=False))
        (launch,) = bound.launches  # the variant of this size's bucket
        assert launch.blocks is not None and launch.bucket is not None
        assert launch.bucket.low <= batch * seq <= launch.bucket.high
        assert launch.grid[0] == -(-batch * seq // launch.blocks.divisor)
        assert sorted(_extent_slots(bound)) == sorted([batch, seq])
        assert bound.outputs["y"].shape == (batch, seq, 1024)  # allocated for this call's extents
    with pytest.raises(gd.FeedError) as caught:
        plan.bind(_fake_pack(fake, plan.graph, {"batch": 9, "seq": 2}))
    assert str(caught.value) == (
        "tensor 'x': dim 0 is 9, outside the range 1..8 of symbol 'batch' (dims [batch, seq, 1024])"
    )
    pack = _fake_pack(fake, plan.graph, {"batch": 2, "seq": 5})
    pack["r"] = _fake_pack(fake, plan.graph, {"batch": 2, "seq": 6})["r"]
    with pytest.raises(gd.FeedError, match=r"tensor 'r': dim 1 is 6, but symbol 'seq' is 5 from dim 1 of 'x'"):
        plan.bind(pack)


def test_execute_serves_every_size_with_one_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = gd.compile(plan_graphs.pointwise_chain(), arch=ARCH, cache=None)
    fake = fake_gpu.install(monkeypatch)
    for batch, seq in ((1, 1), (4, 7), (9, 17), (4, 7)):
        outputs = plan.execute(_fake_pack(fake, plan.graph, {"batch": batch, "seq": seq}))
        assert outputs["y"].__cuda_array_interface__["shape"] == (batch, seq, 40)
    assert [c for c in fake.calls if c[0] == "launch"] == [("launch", plan.program.launches[0].name)] * 4


def test_execute_binds_each_size_of_a_range_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's loop: buffers of the largest size, a view of each call's rows; up to 256
    sizes bind once each (a static plan remembers 8 bindings)."""
    from graphdnn.runtime import bind as binding

    plan = gd.compile(plan_graphs.ln_gelu(width=64, max_rows=300), arch=ARCH, cache=None)
    fake = fake_gpu.install(monkeypatch)
    binds: list[int] = []
    original = binding.bind
    monkeypatch.setattr(binding, "bind", lambda plan, pack, *rest: binds.append(1) or original(plan, pack, *rest))
    memory = {t.name: fake.allocate(300 * 64 * 2) for t in (*plan.graph.inputs, *plan.graph.outputs)}

    def pack(rows: int) -> dict[str, Any]:
        static = specialize(plan.graph, {"rows": rows})
        tensors = (*static.inputs, *static.outputs)
        return {t.name: fake_gpu.FakeArray(memory[t.name], t.dim, t.stride, "<f2") for t in tensors}

    sizes = [*range(1, 257), *range(256, 0, -3)]
    for rows in sizes:
        assert plan.execute(pack(rows))["y"].__cuda_array_interface__["shape"] == (rows, 64)
    assert len(binds) == 256  # the second pass found every size bound
    plan.execute(pack(300))  # a 257th size: the least recently used (2, not in the second pass) goes
    plan.execute(pack(1))
    assert len(binds) == 257
    plan.execute(pack(2))
    assert len(binds) == 258


# -- the kernels, run on the CPU ------------------------------------------------------------------
@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@pytest.mark.parametrize("aligned", [1, 0], ids=["vectors", "elements"])
@pytest.mark.parametrize("case", SMALL_CASES, ids=_id)
def test_the_kernels_match_the_reference_across_the_range(
    case: tuple[Callable[[], gd.OperationGraphSpec], list[Values]],
    aligned: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Emitted once, run at each value: the symbols are the kernels' arguments only."""
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    make, values_list = case
    ir = make().validate()
    partition = fuse(ir, arch=90)
    programs = emit_partition(partition, 90)
    for values in values_list:
        feeds = random_inputs(specialize(ir, values), sum(values.values()))
        expected = gd.reference.execute(ir, feeds)
        memory: dict[str, Any] = dict(feeds)
        for fused, program in zip(partition.nodes, programs):
            memory.update(cpu_emulation.run(fused, program, memory, aligned, build_dir, values))
        for t in ir.outputs:
            error = relative_error(memory[t.name].astype(np.float64), expected[t.name].astype(np.float64))
            assert error <= tolerance(t.data_type), f"{t.name} at {values}: {error:.3g}"


@pytest.mark.compile_sample
@pytest.mark.skipif(not cpu_emulation.available(), reason="needs g++ (C++20)")
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(recipe=pointwise_recipes(max_steps=4), data=st.data())
def test_random_pointwise_graphs_with_a_symbolic_axis_match_the_reference(
    recipe: Recipe, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Random graphs of tests/graph_strategies.py (float and half) with one axis of the full
    inputs made a symbol (NHWC strides then hold it: symbolic strides), run at a value in range.
    Not the ops whose float path is inline PTX (the emulation compiles C++ only)."""
    assume(recipe.io_type != "bfloat16" and recipe.intermediate_type != "bfloat16")
    assume(not {step.op for step in recipe.steps} & {"sigmoid", "swish", "gelu_approx_tanh"})
    base = recipe.input_dims[0]
    axis = data.draw(st.sampled_from([a for a, extent in enumerate(base) if extent > 1] or [None]))
    assume(axis is not None)
    g = gd.OperationGraphSpec("probe")
    n = g.dim("n", 1, 7)
    symbolic = dataclasses.replace(
        recipe,
        input_dims=[
            tuple(n if a == axis and d == base[axis] else d for a, d in enumerate(dims)) for dims in recipe.input_dims
        ],
    )
    ir = build(symbolic)[0].validate()
    value = data.draw(st.integers(1, 7))
    static = specialize(ir, {"n": value})
    partition = fuse(ir, arch=90)
    programs = emit_partition(partition, 90)
    build_dir: Path = tmp_path_factory.getbasetemp() / "cpu_emulation"
    build_dir.mkdir(exist_ok=True)
    feeds = random_feeds(static, value)
    memory: dict[str, Any] = dict(feeds)
    for fused, program in zip(partition.nodes, programs):
        memory.update(cpu_emulation.run(fused, program, memory, 1, build_dir, {"n": value}))
    expected = gd.reference.execute(ir, feeds)
    for t in ir.outputs:
        error = relative_error(memory[t.name].astype(np.float64), expected[t.name].astype(np.float64))
        assert error <= tolerance(t.data_type), f"{t.name} at n = {value}: {error:.3g}"


# -- on the GPU -----------------------------------------------------------------------------------
GPU_CASES = [
    pytest.param((plan_graphs.ln_gelu, [{"rows": 1}, {"rows": 1001}, {"rows": 4096}]), id="ln_gelu"),
    pytest.param(
        (
            lambda: plan_graphs.ln_gelu(width=1000, max_rows=777, dtype="bfloat16"),
            [{"rows": 1}, {"rows": 99}, {"rows": 777}],
        ),
        id="ln_gelu_bf16_odd_width",  # 125 vectors per row: the group's last threads hold none
    ),
    pytest.param(
        (plan_graphs.add_rmsnorm, [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 127}, {"batch": 8, "seq": 512}]),
        id="add_rmsnorm",
    ),
    pytest.param(
        (plan_graphs.pointwise_chain, [{"batch": 1, "seq": 1}, {"batch": 5, "seq": 11}, {"batch": 9, "seq": 17}]),
        id="pointwise_chain",
    ),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES)
def test_one_plan_runs_across_the_range_on_the_gpu(
    case: tuple[Callable[[], gd.OperationGraphSpec], list[Values]], tmp_path: Path
) -> None:
    from tests.gpu_check import check_across_the_range

    make, values_list = case
    cache = gd.PlanCache(tmp_path)
    plan = gd.compile(make(), cache=cache)
    compiles = cache.counters.compiles
    ir = plan.graph
    check_across_the_range(plan, ir, values_list)
    assert gd.compile(make(), cache=cache).program == plan.program
    assert cache.counters.compiles == compiles  # no compile inside the range
