"""The shape of the code: imports point one way, modules stay small, each stage runs once.

The import graph counts every import of the three packages, top-level, lazy (inside a
function) and TYPE_CHECKING alike (the analysis of /work/tools/imports.py): an import
circle is a circle however late it closes. The one documented back-edge is the build
seam (docs/architecture.md): ``OperationGraphSpec.build`` importing the compiler.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

import fusion_rules
import graphdnn as gd
from graphdnn import autotune, signature
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.runtime import driver
from tests import plan_graphs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graphdnn", "fusion_rules", "codegen")
BUILD_SEAM = ("graphdnn.graph", "graphdnn.compiler")
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The project modules that module ``name`` imports, anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in _imported(name, path, modules))
    return graph


def test_the_import_graph_has_no_cycle_but_the_build_seam() -> None:
    graph = import_graph()
    assert graph.has_edge(*BUILD_SEAM), "the analysis no longer sees the build seam: update this test"
    graph.remove_edge(*BUILD_SEAM)
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_no_source_file_is_over_600_lines() -> None:
    lengths = {path.relative_to(ROOT): len(path.read_text().splitlines()) for path in _modules().values()}
    assert not {path: n for path, n in lengths.items() if n > MAX_LINES}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of fusion and canonicalisation (which every signature goes through)."""
    counts = {"fuse": 0, "signature": 0}
    real_fuse, real_canonical = fusion_rules.fuse, signature._canonical

    def fuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["fuse"] += 1
        return real_fuse(*args, **kwargs)

    def canonical(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["signature"] += 1
        return real_canonical(*args, **kwargs)

    monkeypatch.setattr(fusion_rules, "fuse", fuse)
    monkeypatch.setattr(fusion_rules.manager, "fuse", fuse)
    monkeypatch.setattr(signature, "_canonical", canonical)
    return counts


def test_a_compile_fuses_once_and_signs_once(calls: dict[str, int], tmp_path: Path) -> None:
    graph = plan_graphs.matmul_relu()
    ir = graph.validate()
    gd.compile(ir, arch="sm_90", cache=PlanCache(tmp_path))
    assert calls == {"fuse": 1, "signature": 1}
    assert gd.compile(ir, arch="sm_90", cache=PlanCache(tmp_path)).origin == "disk cache"
    assert calls == {"fuse": 1, "signature": 2}  # a hit signs, and never fuses


def test_tuning_by_name_fuses_once(calls: dict[str, int]) -> None:
    ir = plan_graphs.matmul_relu().validate()
    name = gd.fuse(ir, arch=90).nodes[0].name
    calls.update(fuse=0, signature=0)
    gd.compile(ir, arch="sm_90", cache=None, tuning={name: {}})
    assert calls == {"fuse": 1, "signature": 1}


def test_autotuning_fuses_once_and_signs_once(
    calls: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(driver, "current_gpu_arch", lambda: 90)
    monkeypatch.setattr(autotune, "gpu_measure", lambda ir: lambda program, binaries: 1.0)
    monkeypatch.setattr(driver, "current_device", lambda: driver.Device(0, 0, 0, 90, "Fake GPU"))
    gd.compile(plan_graphs.matmul_relu().validate(), arch="sm_90", cache=PlanCache(tmp_path), autotune=True)
    assert calls == {"fuse": 1, "signature": 1}
