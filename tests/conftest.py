"""Shared fixtures: a seeded generator and a one-call run of the reference backend; the
recording of every graph the suite validates, which the check after each test compiles."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn import reference

from . import compile_check
from .compile_check import CHECK, COMPILE_MEMORY, RECORDER


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator, so every random case is reproducible."""
    return np.random.default_rng(20240611)


@pytest.fixture
def run_random(rng: np.random.Generator) -> Callable[..., tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Validate a graph, feed every input uniform values in [low, high), run the reference.

    Returns ``(outputs by name, feeds by name)``; pass-by-value runtime scalars get a value too.
    """

    def run(
        graph: gd.OperationGraphSpec, low: float = -2.0, high: float = 2.0, **fixed: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        ir = graph.validate()
        feeds = {
            t.name: fixed[t.name] if t.name in fixed else rng.uniform(low, high, t.dim).astype(t.data_type.numpy)
            for t in ir.inputs
        }
        return reference.execute(ir, feeds), feeds

    return run


@pytest.fixture(autouse=True, scope="session")
def _private_plan_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Plans compiled by the tests go to a session directory, never the user's cache. Without a
    GPU nothing the tests compile runs, so NVRTC compiles with GRAPHDNN_FAST_COMPILE (every
    kernel still goes through the front end and ptxas; the check takes about 30% less time)."""
    names = ("GRAPHDNN_CACHE_DIR", "GRAPHDNN_REQUIRE_CACHED", "GRAPHDNN_FAST_COMPILE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["GRAPHDNN_CACHE_DIR"] = str(tmp_path_factory.mktemp("plan-cache"))
    os.environ.pop("GRAPHDNN_REQUIRE_CACHED", None)
    if not _gpu_present():
        os.environ["GRAPHDNN_FAST_COMPILE"] = "1"
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@functools.cache
def _gpu_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


_OWN_STORE = pytest.StashKey[Path | None]()  # the kernel store this process made (not a worker's)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "compile_sample: the compile check keeps only the first graphs this test validates (compile_check.SAMPLE)",
    )
    config.stash[_OWN_STORE] = compile_check.open_session_store()
    RECORDER.install()
    COMPILE_MEMORY.install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    RECORDER.start(item.nodeid, sampled=item.get_closest_marker("compile_sample") is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once the test's fixtures are gone, the graphs it validated must compile (the check
    fails the test's teardown otherwise). Not after a `gpu` test that ran: its plans were
    compiled for the GPU and run there, which is more than the check asks of them."""
    yield
    graphs = RECORDER.take()
    if not ("gpu" in item.keywords and _gpu_present()):
        CHECK.check(graphs)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.config.pluginmanager.has_plugin("dsession"):  # not the xdist controller: it runs no test
        CHECK.write_totals(RECORDER)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = compile_check.summary()
    if lines:
        terminalreporter.write_sep("-", "NVRTC check of the graphs the tests validated")
    for line in lines:
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    RECORDER.uninstall()
    COMPILE_MEMORY.uninstall()
    compile_check.close_session_store(config.stash[_OWN_STORE])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip, visibly, where there is no NVIDIA GPU (or no torch to drive it)."""
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
