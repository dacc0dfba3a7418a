"""Autotuning: candidates are emitted, compiled and timed; the fastest is stored with the plan.

On the CPU the GPU timer is replaced by a fake that prefers one candidate; the GPU test
times the real kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn import autotune, cli
from graphdnn.cache.entries import KernelBinary
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.cache.trust import trusted_plan
from graphdnn.program import LaunchProgram
from graphdnn.runtime import driver
from tests import plan_graphs
from tests.gpu_check import check_on_gpu


class PreferSecond:
    """A fake GPU timer: the second candidate timed is the fastest."""

    def __init__(self) -> None:
        self.timed: list[str] = []

    def __call__(self, program: LaunchProgram, binaries: Mapping[str, KernelBinary]) -> float:
        self.timed.append(program.launches[0].name)
        assert all(launch.kernel_key in binaries for launch in program.launches)
        return 1.0 if len(self.timed) == 2 else 5.0


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> PreferSecond:
    timer = PreferSecond()
    monkeypatch.setattr(driver, "current_gpu_arch", lambda: 90)
    monkeypatch.setattr(autotune, "gpu_measure", lambda ir: timer)
    fake_model(monkeypatch, "Fake GPU")
    return timer


def fake_model(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The current GPU is an sm_90 GPU of model ``name``."""
    monkeypatch.setattr(driver, "current_device", lambda: driver.Device(0, 0, 0, 90, name))


def test_the_fastest_candidate_is_built_and_stored(fake_gpu: PreferSecond, tmp_path: Path) -> None:
    from codegen.emit import candidates
    from fusion_rules import fuse

    graph = plan_graphs.matmul_relu()
    (fused,) = fuse(graph.validate(), arch=90).nodes
    options = candidates(fused, 90)
    assert len(options) >= 2
    cache = PlanCache(tmp_path)
    plan = gd.compile(graph, arch="sm_90", cache=cache, autotune=True)
    assert len(fake_gpu.timed) == len(options) == len(set(fake_gpu.timed))  # each candidate is its own kernel
    assert plan.tuned_on == "Fake GPU" and plan.program.tuning == (options[1],)
    assert plan.kernels[0].name == fake_gpu.timed[1]  # the plan runs the winner
    assert cache.counters.compiles == len(options)  # building the plan reused the winner's cubin
    (stored,) = [f for f in cache.store.files() if f.kind == "plan"]  # type: ignore[union-attr]
    entry = trusted_plan(stored.path.read_bytes(), stored.key)
    assert (entry.tuned_on, entry.program.tuning) == ("Fake GPU", (options[1],))
    again = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert (again.origin, again.tuned_on, len(fake_gpu.timed)) == ("disk cache", "Fake GPU", len(options))


def test_an_untuned_plan_is_retuned_only_when_asked(fake_gpu: PreferSecond, tmp_path: Path) -> None:
    graph = plan_graphs.matmul_relu()
    untuned = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path))
    assert untuned.tuned_on is None and untuned.program.tuning == ({},)
    assert gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), require_cached=True, autotune=True).origin == (
        "disk cache"
    )  # require_cached: use what is there
    assert not fake_gpu.timed
    tuned = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert tuned.origin == "compiled" and tuned.tuned_on == "Fake GPU"


def test_autotuning_needs_a_gpu_of_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "current_gpu_arch", lambda: 80)
    with pytest.raises(gd.UnsupportedError, match="a GPU that runs sm_90: the current GPU is sm_80"):
        gd.compile(plan_graphs.matmul_relu(), arch="sm_90", cache=None, autotune=True)
    monkeypatch.setattr(driver, "current_gpu_arch", lambda: None)
    with pytest.raises(gd.UnsupportedError, match="no usable GPU"):
        gd.compile(plan_graphs.matmul_relu(), arch="sm_90", cache=None, autotune=True)


@pytest.mark.gpu
def test_autotuning_on_the_gpu() -> None:
    plan = check_on_gpu(plan_graphs.matmul_relu(), cache=None, autotune=True)
    assert plan.tuned_on is not None and plan.program.tuning[0]
    assert driver.current_gpu_arch() is not None


def test_each_gpu_model_keeps_its_own_tuned_plan(
    fake_gpu: PreferSecond, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = plan_graphs.matmul_relu()
    untuned = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path))
    fake_model(monkeypatch, "NVIDIA H200")
    h200 = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    fake_model(monkeypatch, "NVIDIA H100 80GB HBM3")
    h100 = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert (h200.origin, h200.tuned_on, h100.origin, h100.tuned_on) == (
        "compiled",
        "NVIDIA H200",
        "compiled",
        "NVIDIA H100 80GB HBM3",
    )  # the H200's tuned plan was not used on the H100
    assert len({untuned.key, h200.key, h100.key}) == 3
    stored = {
        entry.tuned_on
        for f in PlanCache(tmp_path).store.files()  # type: ignore[union-attr]
        if f.kind == "plan"
        for entry in [trusted_plan(f.path.read_bytes(), f.key)]
    }
    assert stored == {None, "NVIDIA H200", "NVIDIA H100 80GB HBM3"}  # nobody overwrote anybody
    assert cli.main(["cache", "ls", "--cache-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "tuned on NVIDIA H200" in listed and "tuned on NVIDIA H100 80GB HBM3" in listed
    fake_model(monkeypatch, "NVIDIA H200")
    again = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert (again.origin, again.tuned_on, again.key) == ("disk cache", "NVIDIA H200", h200.key)
    plain = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path))  # untuned plans stay shared per arch
    assert (plain.origin, plain.tuned_on, plain.key) == ("disk cache", None, untuned.key)


def test_a_tuned_plan_filed_under_another_models_key_is_rejected(
    fake_gpu: PreferSecond, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph = plan_graphs.matmul_relu()
    fake_model(monkeypatch, "NVIDIA H200")
    h200 = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    store = PlanCache(tmp_path).store
    assert store is not None and h200.key is not None
    h100_key = trusted_plan(store.plan_path(h200.key).read_bytes(), h200.key).fields.tuned_key("NVIDIA H100")
    store.plan_path(h100_key).parent.mkdir(parents=True, exist_ok=True)
    store.plan_path(h100_key).write_bytes(store.plan_path(h200.key).read_bytes())
    fake_model(monkeypatch, "NVIDIA H100")
    with pytest.warns(gd.CacheWarning, match="holds plan"):
        h100 = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert (h100.origin, h100.tuned_on, h100.key) == ("compiled", "NVIDIA H100", h100_key)


# -- dynamic graphs: timed across the range ---------------------------------------------------------
@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        (plan_graphs.ln_gelu(max_rows=4096), [{"rows": 1}, {"rows": 8}, {"rows": 64}, {"rows": 512}, {"rows": 4096}]),
        (
            plan_graphs.add_rmsnorm(width=64, max_batch=3, max_seq=5),
            [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 2}, {"batch": 2, "seq": 3}, {"batch": 3, "seq": 5}],
        ),
        (plan_graphs.ln_gelu(max_rows=2), [{"rows": 1}, {"rows": 2}]),  # values that coincide, timed once
    ],
)
def test_candidates_are_timed_at_sizes_spaced_geometrically_across_the_range(
    graph: gd.OperationGraphSpec, expected: list[dict[str, int]]
) -> None:
    assert autotune.sample_values(graph.validate()) == expected


def test_the_winner_is_fastest_relative_to_each_size_not_in_total_time() -> None:
    # 10 µs saved at the large size does not make up for 50% lost at each small one
    assert autotune.fastest([[1.0, 1.0, 100.0], [1.5, 1.5, 90.0]]) == 0
    assert autotune.fastest([[1.0, 1.0, 180.0], [1.1, 1.1, 90.0]]) == 1
    assert autotune.fastest([[2.0, 2.0], [1.0, 4.0], [4.0, 1.0]]) == 0  # ties go to the first: 1.5 each


def test_the_first_candidate_stays_unless_another_wins_by_the_margin() -> None:
    times = [[1.0, 1.0], [0.97, 0.99]]  # 2% faster on average
    assert autotune.fastest(times) == 1
    assert autotune.fastest(times, margin=0.03) == 0
    assert autotune.fastest([[1.0, 1.0], [0.9, 0.99]], margin=0.03) == 1  # 5.5%


class TimedBySize:
    """A fake GPU timer per size: at each size, candidate i (in timing order, the dynamic
    heuristic first) takes ``times[i][size]`` (9 µs where not given)."""

    def __init__(self, times: dict[int, list[float]]) -> None:
        self.times = times
        self.timed: list[tuple[dict[str, int], int]] = []  # (size, candidate)

    def measure(self, ir: gd.Graph, values: Mapping[str, int] | None = None) -> autotune.Measure:
        assert values is not None, "a dynamic graph is timed at sizes of its range"
        size = dict(values)
        position = autotune.sample_values(ir).index(size)

        def measure(program: LaunchProgram, binaries: Mapping[str, KernelBinary]) -> float:
            assert all(launch.kernel_key in binaries for launch in program.launches)
            candidate = sum(1 for s, _ in self.timed if s == size)
            self.timed.append((size, candidate))
            return self.times.get(candidate, [9.0] * len(autotune.sample_values(ir)))[position]

        return measure


@pytest.mark.parametrize(
    ("times", "winner"),
    [
        ({0: [1.0] * 5, 2: [1.1, 1.1, 1.0, 0.6, 0.5]}, 2),  # twice as fast at the top: worth 10% below
        ({0: [1.0] * 5, 2: [3.0, 3.0, 1.0, 0.6, 0.5]}, 0),  # the heuristic's buckets stay
        ({0: [1.0] * 5, 2: [1.0, 1.0, 1.0, 1.0, 0.9]}, 0),  # 2% better on average: within the margin
    ],
)
def test_a_dynamic_graph_is_tuned_across_its_range(
    times: dict[int, list[float]], winner: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from codegen.emit import candidates
    from fusion_rules import fuse

    graph = plan_graphs.ln_gelu(max_rows=4096)
    (fused,) = fuse(graph.validate(), arch=90).nodes
    options = [{}, *candidates(fused, 90)]  # the heuristic's size buckets first
    timer = TimedBySize(times)
    monkeypatch.setattr(driver, "current_gpu_arch", lambda: 90)
    monkeypatch.setattr(autotune, "gpu_measure", timer.measure)
    fake_model(monkeypatch, "Fake GPU")
    plan = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    sizes = autotune.sample_values(graph.validate())
    assert sorted(timer.timed, key=lambda t: (sizes.index(t[0]), t[1])) == [
        (size, i) for size in sizes for i in range(len(options))
    ]  # every candidate at every size
    untuned = gd.compile(graph, arch="sm_90", cache=None)
    assert plan.tuned_on == "Fake GPU" and plan.program.tuning == (options[winner],)
    if winner == 0:
        assert [k.name for k in plan.kernels] == [k.name for k in untuned.kernels]
        assert all(launch.bucket is not None for launch in plan.program.launches)
    else:
        assert [launch.bucket for launch in plan.program.launches] == [None]  # one variant for the range
    rebuilt = gd.compile(graph, arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert (rebuilt.origin, rebuilt.program.tuning) == ("disk cache", (options[winner],))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "graph", [plan_graphs.ln_gelu(max_rows=4096), plan_graphs.add_rmsnorm(max_batch=8, max_seq=300)]
)
def test_a_dynamic_plan_tuned_on_the_gpu_runs_across_its_range(graph: gd.OperationGraphSpec) -> None:
    from tests.gpu_check import check_across_the_range

    ir = graph.validate()
    plan = gd.compile(ir, cache=None, autotune=True)
    assert plan.tuned_on is not None
    sizes = autotune.sample_values(ir)
    check_across_the_range(plan, ir, [*sizes, {name: 7 for name in sizes[0]}])  # 7: in range, not sampled
