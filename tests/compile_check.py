"""Every graph the test suite validates must compile for sm_80 and sm_90.

conftest installs :data:`RECORDER`, which keeps each graph the validator accepts during the
session (deduplicated by signature); ``test_compile_every_graph`` compiles them after every
other test. :func:`compile_graphs` fuses and emits each graph for each target, then gives
NVRTC each distinct kernel (by content hash) once, in parallel: the suite's ~1,000 distinct
graphs share most of their kernels, and a kernel compiled once in the session is not
compiled again.

Tests marked ``compile_sample`` (property tests drawing hundreds of random graphs of the same
few families, and sweeps such as 400 dropout offsets whose graphs differ in one constant) give
only their first :data:`SAMPLE` validations: their graphs' kernels were most of the check's
NVRTC time (over 6,000 of 11,800 kernels) for kernel families the deterministic cases already
cover. Their sample is compiled all the same, and hypothesis's draws change from run to run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from codegen.kernel import Kernel
from graphdnn.ir import Graph
from graphdnn.signature import signature

TARGETS = (80, 90)
# Graphs larger than this are built to time the passes (linear-cost tests): fusing and
# compiling them would dominate the suite's run time, and their kernels repeat the small
# graphs' ones.
MAX_NODES = 2000
SAMPLE = 25  # validations kept from each test marked compile_sample


class GraphRecorder:
    """Keeps every graph ``OperationGraphSpec.validate`` returns while installed (counting,
    not keeping, those over MAX_NODES and those using ops a test registers for a while, such
    as the docs' example op, gone by the time the graphs compile): builders, files and
    ``gd.compile`` all validate through it. Dynamic graphs are kept and counted; the ones with
    a fused node whose family takes no runtime extents are left out when they compile."""

    def __init__(self) -> None:
        self._graphs: list[tuple[Graph, str]] = []
        self.test = "(collection)"  # the running test's id (conftest sets it): where each graph came from
        self.sampled = False  # the running test is marked compile_sample
        self.kept = 0  # validations kept from the running test
        self.sampled_out = 0  # validations of compile_sample tests beyond their first SAMPLE
        self.origin: dict[str, str] = {}  # graph signature -> the first test that validated it
        self.too_large = 0
        self.test_ops = 0
        self.dynamic = 0
        self._original: Callable[[Any], Graph] | None = None

    def install(self) -> None:
        from graphdnn.graph import OperationGraphSpec
        from graphdnn.ops.base import op_kinds

        original = self._original = OperationGraphSpec.validate
        built_in = frozenset(op_kinds())

        @functools.wraps(original)  # what it stands in for, as seen by docs/api.md's generator
        def validate(spec: OperationGraphSpec) -> Graph:
            graph = original(spec)
            if len(graph.nodes) > MAX_NODES:
                self.too_large += 1
            elif any(node.op not in built_in for node in graph.nodes):
                self.test_ops += 1
            elif self.sampled and self.kept >= SAMPLE:
                self.sampled_out += 1
            else:
                self.kept += 1
                self.dynamic += graph.is_dynamic
                self._graphs.append((graph, self.test))  # deduplicated later: a validate costs nothing more
            return graph

        OperationGraphSpec.validate = validate  # type: ignore[method-assign]

    def start(self, test: str, sampled: bool) -> None:
        """The next graphs come from ``test``; ``sampled``: keep only its first SAMPLE."""
        self.test, self.sampled, self.kept = test, sampled, 0

    def graphs(self) -> dict[str, Graph]:
        """The graphs recorded so far, one per signature."""
        distinct: dict[str, Graph] = {}
        for graph, test in self._graphs:
            key = signature(graph)
            if key not in distinct:
                distinct[key] = graph
                self.origin.setdefault(key, test)
        self._graphs = [(graph, self.origin[key]) for key, graph in distinct.items()]
        return distinct

    def uninstall(self) -> None:
        from graphdnn.graph import OperationGraphSpec

        if self._original is not None:
            OperationGraphSpec.validate = self._original  # type: ignore[method-assign]
            self._original = None


RECORDER = GraphRecorder()


@dataclass
class CompileReport:
    graphs: int = 0  # graphs fused and emitted for every target
    refused: int = 0  # dynamic graphs with a fused node whose kernels cannot take its symbols (not emitted)
    kernels: int = 0  # distinct (target, kernel) pairs these graphs need
    compiled: int = 0  # of them, compiled now (the others were compiled earlier in the session)
    compiled_for: dict[str, int] = field(default_factory=dict)  # graph signature -> kernels compiled first for it
    lower_seconds: float = 0.0  # fusing and emitting
    compile_seconds: float = 0.0  # NVRTC
    failures: list[str] = field(default_factory=list)


_COMPILED: set[str] = set()  # every kernel NVRTC compiled in this session (compiled_key)


def compiled_key(source: str, arch: int, arch_suffix: str) -> str:
    return f"sm_{arch}{arch_suffix}:" + hashlib.sha256(source.encode()).hexdigest()


class CompileMemory:
    """While installed, every kernel NVRTC compiles in the session is remembered: the codegen
    tests compile their graphs' kernels (every tuning candidate) themselves, and the last test
    does not compile those again."""

    def __init__(self) -> None:
        self._original: Callable[..., bytes] | None = None
        self.repeats = 0  # compiles of a kernel compiled before in the session
        self.repeat_seconds = 0.0

    def install(self) -> None:
        import codegen
        import codegen.nvrtc

        original = self._original = codegen.nvrtc.compile_cubin

        @functools.wraps(original)  # what it stands in for, as seen by docs/api.md's generator
        def compile_cubin(source: str, name: str, arch: int, arch_suffix: str = "") -> bytes:
            key = compiled_key(source, arch, arch_suffix)
            start = time.perf_counter()
            cubin = original(source, name, arch, arch_suffix)
            if key in _COMPILED:
                self.repeats += 1
                self.repeat_seconds += time.perf_counter() - start
            _COMPILED.add(key)
            return cubin

        codegen.nvrtc.compile_cubin = codegen.compile_cubin = compile_cubin  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        import codegen
        import codegen.nvrtc

        if self._original is not None:
            codegen.nvrtc.compile_cubin = codegen.compile_cubin = self._original  # type: ignore[attr-defined]
            self._original = None


COMPILE_MEMORY = CompileMemory()


def compile_graphs(graphs: Iterable[Graph], targets: Iterable[int] = TARGETS) -> CompileReport:
    """Fuse, emit and NVRTC-compile ``graphs`` for each target; every failure, never only the first."""
    from codegen.emit import extents_refusal
    from codegen.nvrtc import compile_cubin
    from fusion_rules import fuse
    from graphdnn.lower import KernelSource, lower
    from graphdnn.signature import signature

    report = CompileReport()
    start = time.perf_counter()
    pending: dict[tuple[int, str], tuple[KernelSource, Graph]] = {}
    first_for: dict[tuple[int, str], str] = {}  # the signature of the first graph needing each kernel
    for graph in graphs:
        if graph.is_dynamic and any(extents_refusal(f) for t in targets for f in fuse(graph, arch=t).nodes):
            report.refused += 1
            continue
        report.graphs += 1
        graph_signature = signature(graph)
        for target in targets:
            try:
                sources = lower(
                    fuse(graph, arch=target), target, graph_signature, lambda content_hash: content_hash
                ).sources
            except Exception as error:  # every defect is reported, with its graph
                report.failures.append(f"{describe(graph)} for sm_{target}: {type(error).__name__}: {error}")
                continue
            for content_hash, source in sources.items():
                pending.setdefault((target, content_hash), (source, graph))
                first_for.setdefault((target, content_hash), graph_signature)
    report.kernels = len(pending)
    todo = [
        (key, (source, graph))
        for key, (source, graph) in pending.items()
        if compiled_key(source.source, key[0], source.arch_suffix) not in _COMPILED
    ]
    report.compiled_for = Counter(first_for[key] for key, _ in todo)
    report.lower_seconds = time.perf_counter() - start

    def one(item: tuple[tuple[int, str], tuple[KernelSource, Graph]]) -> str | None:
        (target, _), (source, graph) = item
        try:
            compile_cubin(source.source, source.name, target, source.arch_suffix)
        except Exception as error:
            log = "\n".join(str(error).splitlines()[:24])  # the first errors and their lines are enough
            return f"{describe(graph)}: kernel {source.name} for sm_{target}{source.arch_suffix}: {log}"
        _COMPILED.add(compiled_key(source.source, target, source.arch_suffix))  # also when not installed
        return None

    if todo:
        import cuda.core  # noqa: F401  (its first import is not thread-safe)

        with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(todo)))) as pool:
            report.failures += [failure for failure in pool.map(one, todo) if failure is not None]
    report.compiled = len(todo)
    report.compile_seconds = time.perf_counter() - start - report.lower_seconds
    return report


def describe(graph: Graph) -> str:
    """Enough of a graph to find it again: name, types and ops."""
    ops = ", ".join(dict.fromkeys(node.op for node in graph.nodes))
    return (
        f"graph '{graph.name}' (io {graph.io_data_type.value}, intermediate {graph.intermediate_data_type.value}, "
        f"{len(graph.nodes)} nodes: {ops})"
    )


def ptxas_report(kernel: Kernel, arch: int) -> str:
    """ptxas's resource report (registers, spills) for the kernel, through NVRTC."""
    import io

    from cuda.core import Program, ProgramOptions

    from codegen.nvrtc import COMPILE_OPTIONS, include_paths

    options = ProgramOptions(
        name=f"{kernel.name}.cu",
        arch=f"sm_{arch}",
        include_path=list(include_paths()),
        ptxas_options="-v",
        **dict(COMPILE_OPTIONS),
    )
    program = Program(kernel.source, code_type="c++", options=options)
    log = io.StringIO()
    try:
        program.compile("cubin", logs=log)
    finally:
        program.close()
    return log.getvalue()
