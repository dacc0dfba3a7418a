"""Autotuning: candidates are emitted, compiled and timed; the fastest is stored with the plan.

On the CPU the GPU timer is replaced by a fake that prefers one candidate; the GPU test
times the real kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn import autotune
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
    monkeypatch.setattr(autotune, "gpu_measure", lambda ir: (timer, "Fake GPU"))
    return timer


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
