"""Every graph the test suite validates must compile for sm_80 and sm_90.

conftest installs :data:`RECORDER`, which keeps each graph the validator accepts, and checks
after each test (in its teardown, so a failure names the test) that the graphs it validated
compile: :func:`compile_graphs` fuses and emits each graph for each target and gives NVRTC
each distinct kernel it has not seen yet. The suite runs on several pytest-xdist workers, so
what has been compiled is a :class:`KernelStore` on disk that every worker shares: a kernel is
compiled once in the session, by the first worker to claim it, and a test compiling a kernel
another test compiled gets the same cubin back from the store.

Tests marked ``compile_sample`` (property tests drawing hundreds of random graphs of the same
few families, and sweeps such as 400 dropout offsets whose graphs differ in one constant) give
only their first :data:`SAMPLE` validations: their graphs' kernels were most of the check's
NVRTC time (over 6,000 of 11,800 kernels) for kernel families the deterministic cases already
cover. Their sample is compiled all the same, and hypothesis's draws change from run to run.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest

from codegen.kernel import Kernel
from graphdnn.ir import Graph
from graphdnn.signature import signature

TARGETS = (80, 90)
# Graphs larger than this are built to time the passes (linear-cost tests): fusing and
# compiling them would dominate the suite's run time, and their kernels repeat the small
# graphs' ones.
MAX_NODES = 2000
SAMPLE = 25  # validations kept from each test marked compile_sample
STORE_VARIABLE = "GRAPHDNN_TEST_KERNEL_STORE"  # the session's KernelStore directory, for the workers


class GraphRecorder:
    """Keeps every graph ``OperationGraphSpec.validate`` returns while installed (counting,
    not keeping, those over MAX_NODES and those using ops a test registers for a while, such
    as the docs' example op, gone by the time the graphs compile): builders, files and
    ``gd.compile`` all validate through it. Dynamic graphs are kept and counted; the ones with
    a fused node whose family takes no runtime extents are left out when they compile."""

    def __init__(self) -> None:
        self._graphs: list[tuple[Graph, str]] = []  # validated since the last take, with the test
        self.test = "(collection)"  # the running test's id (conftest sets it): where each graph came from
        self.sampled = False  # the running test is marked compile_sample
        self.kept = 0  # validations kept from the running test
        self.sampled_out = 0  # validations of compile_sample tests beyond their first SAMPLE
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
                self._graphs.append((graph, self.test))  # deduplicated by the check: a validate costs nothing more
            return graph

        OperationGraphSpec.validate = validate  # type: ignore[method-assign]

    def start(self, test: str, sampled: bool) -> None:
        """The next graphs come from ``test``; ``sampled``: keep only its first SAMPLE."""
        self.test, self.sampled, self.kept = test, sampled, 0

    def pending(self) -> list[tuple[Graph, str]]:
        """The graphs validated since the last :meth:`take`, each with the test that validated it."""
        return list(self._graphs)

    def take(self) -> list[tuple[Graph, str]]:
        """The pending graphs, handed over once (the check after each test takes them)."""
        taken, self._graphs = self._graphs, []
        return taken

    def uninstall(self) -> None:
        from graphdnn.graph import OperationGraphSpec

        if self._original is not None:
            OperationGraphSpec.validate = self._original  # type: ignore[method-assign]
            self._original = None


RECORDER = GraphRecorder()


def compiled_key(source: str, arch: int, arch_suffix: str) -> str:
    """Names a compiled kernel: the target, the compile options (GRAPHDNN_LINEINFO changes the
    cubin) and the source."""
    from codegen.nvrtc import options_key

    digest = hashlib.sha256(f"{options_key()}\0{source}".encode()).hexdigest()
    return f"sm_{arch}{arch_suffix}-{digest}"


class KernelStore:
    """The cubins compiled in this test session, by :func:`compiled_key`, in a directory every
    xdist worker shares. A cubin appears whole (written aside, then renamed), and a claim is
    an exclusive create, so no two workers compile one kernel and none reads half a cubin."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def cubin(self, key: str) -> bytes | None:
        try:
            return (self.directory / f"{key}.cubin").read_bytes()
        except FileNotFoundError:
            return None

    def keep(self, key: str, cubin: bytes) -> None:
        path = self.directory / f"{key}.cubin"
        partial = self.directory / f"{key}.{os.getpid()}.{threading.get_ident()}.partial"
        partial.write_bytes(cubin)
        os.replace(partial, path)

    def claim(self, key: str) -> bool:
        """True for the first caller in the session, whichever worker: it compiles the kernel
        (and reports it if NVRTC rejects it); False once a cubin is kept or a claim made."""
        if (self.directory / f"{key}.cubin").exists():
            return False
        try:
            os.close(os.open(self.directory / f"{key}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def open_session_store() -> Path | None:
    """Make the session's store directory and name it in the environment, where no outer
    process did (the xdist controller does, before its workers start): the directory to
    remove at the end, or None."""
    if os.environ.get(STORE_VARIABLE):
        return None
    directory = Path(tempfile.mkdtemp(prefix="graphdnn-test-kernels-"))
    os.environ[STORE_VARIABLE] = str(directory)
    return directory


def close_session_store(directory: Path | None) -> None:
    if directory is not None:
        os.environ.pop(STORE_VARIABLE, None)
        shutil.rmtree(directory, ignore_errors=True)


def session_store() -> KernelStore:
    """The store the environment names; a private temporary one outside a test session."""
    if not os.environ.get(STORE_VARIABLE):
        atexit.register(close_session_store, open_session_store())
    return KernelStore(Path(os.environ[STORE_VARIABLE]))


class CompileMemory:
    """While installed, every kernel compiled in the session goes to the store, and compiling
    it again (a codegen test compiles its candidates itself; another test or worker compiled it
    first) returns the stored cubin."""

    def __init__(self) -> None:
        self._original: Callable[..., bytes] | None = None
        self.reused = 0  # compiles answered from the store

    def install(self) -> None:
        import codegen
        import codegen.nvrtc

        original = self._original = codegen.nvrtc.compile_cubin

        @functools.wraps(original)  # what it stands in for, as seen by docs/api.md's generator
        def compile_cubin(source: str, name: str, arch: int, arch_suffix: str = "") -> bytes:
            store, key = session_store(), compiled_key(source, arch, arch_suffix)
            cubin = store.cubin(key)
            if cubin is not None:
                self.reused += 1
                return cubin
            cubin = original(source, name, arch, arch_suffix)
            store.keep(key, cubin)
            return cubin

        codegen.nvrtc.compile_cubin = codegen.compile_cubin = compile_cubin  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        import codegen
        import codegen.nvrtc

        if self._original is not None:
            codegen.nvrtc.compile_cubin = codegen.compile_cubin = self._original  # type: ignore[attr-defined]
            self._original = None


COMPILE_MEMORY = CompileMemory()


@dataclass
class CompileReport:
    graphs: int = 0  # graphs fused and emitted for every target
    refused: int = 0  # dynamic graphs with a fused node whose kernels cannot take its symbols (not emitted)
    kernels: int = 0  # distinct (target, kernel) pairs these graphs need
    compiled: int = 0  # of them, compiled now (the others were compiled or claimed earlier in the session)
    compiled_for: dict[str, int] = field(default_factory=dict)  # graph signature -> kernels compiled first for it
    lower_seconds: float = 0.0  # fusing and emitting
    compile_seconds: float = 0.0  # NVRTC
    failures: list[str] = field(default_factory=list)


def compile_threads() -> int:
    """NVRTC threads: the cores, shared among the xdist workers."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def compile_graphs(
    graphs: Iterable[Graph], targets: Iterable[int] = TARGETS, *, store: KernelStore | None = None
) -> CompileReport:
    """Fuse, emit and NVRTC-compile ``graphs`` for each target; every failure, never only the
    first. A kernel the session compiled already (``store``) is not compiled again."""
    from codegen.emit import extents_refusal
    from fusion_rules import fuse
    from graphdnn.lower import KernelSource, lower

    store = store or session_store()
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
        if store.claim(compiled_key(source.source, key[0], source.arch_suffix))
    ]
    report.compiled_for = Counter(first_for[key] for key, _ in todo)
    report.lower_seconds = time.perf_counter() - start

    def one(item: tuple[tuple[int, str], tuple[KernelSource, Graph]]) -> str | None:
        import codegen.nvrtc  # the session's memory stands in for compile_cubin where installed

        (target, _), (source, graph) = item
        try:
            codegen.nvrtc.compile_cubin(source.source, source.name, target, source.arch_suffix)
        except Exception as error:
            log = "\n".join(str(error).splitlines()[:24])  # the first errors and their lines are enough
            return f"{describe(graph)}: kernel {source.name} for sm_{target}{source.arch_suffix}: {log}"
        return None

    if todo:
        import cuda.core  # noqa: F401  (its first import is not thread-safe)

        with ThreadPoolExecutor(max(1, min(compile_threads(), len(todo)))) as pool:
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


@dataclass
class CheckTotals:
    """One process's share of the check, summed over the workers for the session's summary."""

    graphs: int = 0
    refused: int = 0
    kernels: int = 0
    compiled: int = 0
    lower_seconds: float = 0.0
    compile_seconds: float = 0.0
    by_test: Counter[str] = field(default_factory=Counter)  # kernels compiled, by test function
    # the recorder's counts, and compiles the store answered (written with the totals)
    too_large: int = 0
    test_ops: int = 0
    sampled_out: int = 0
    dynamic: int = 0
    reused: int = 0

    def add(self, other: CheckTotals) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class CompileCheck:
    """After each test, the graphs it validated (those no earlier test on this worker did)
    compile, or the test fails in its teardown, naming each graph and kernel NVRTC rejected."""

    def __init__(self, store: KernelStore | None = None) -> None:
        self._store = store
        self._seen: set[str] = set()  # graph signatures checked by this process
        self.totals = CheckTotals()

    def check(self, graphs: list[tuple[Graph, str]]) -> None:
        new: dict[str, tuple[Graph, str]] = {}
        for graph, test in graphs:
            key = signature(graph)
            if key not in self._seen:
                self._seen.add(key)
                new[key] = (graph, test)
        if not new:
            return
        report = compile_graphs([graph for graph, _ in new.values()], store=self._store)
        by_test: Counter[str] = Counter()
        for graph_signature, count in report.compiled_for.items():
            by_test[new[graph_signature][1].split("[")[0]] += count
        self.totals.add(
            CheckTotals(
                report.graphs,
                report.refused,
                report.kernels,
                report.compiled,
                report.lower_seconds,
                report.compile_seconds,
                by_test,
            )
        )
        if report.failures:
            tests = sorted({test for _, test in new.values()})
            pytest.fail(
                f"{len(report.failures)} kernels of graphs validated by {', '.join(tests)} do not compile:\n\n"
                + "\n\n".join(report.failures),
                pytrace=False,
            )

    def write_totals(self, recorder: GraphRecorder) -> None:
        """This process's totals, next to the store, for :func:`summary` in the controller."""
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        totals = dataclasses.replace(
            self.totals,
            too_large=recorder.too_large,
            test_ops=recorder.test_ops,
            sampled_out=recorder.sampled_out,
            dynamic=recorder.dynamic,
            reused=COMPILE_MEMORY.reused,
        )
        record = {f.name: getattr(totals, f.name) for f in fields(CheckTotals)}
        (session_store().directory / f"totals-{worker}.json").write_text(json.dumps(record))


CHECK = CompileCheck()


def summary() -> list[str]:
    """The check over the session, from every process's totals."""
    records = [json.loads(p.read_text()) for p in sorted(session_store().directory.glob("totals-*.json"))]
    if not records:
        return []
    total = CheckTotals()
    for record in records:
        total.add(CheckTotals(**{**record, "by_test": Counter(record["by_test"])}))
    lines = [
        f"{total.graphs} distinct graphs validated by the tests ({total.too_large} over {MAX_NODES} nodes, "
        f"{total.test_ops} with ops a test registered and {total.sampled_out} validations of compile_sample "
        f"tests beyond their first {SAMPLE} left out; of {total.dynamic} dynamic validations, {total.refused} "
        f"distinct graphs whose kernels cannot take their symbols left out): {total.kernels} kernels for "
        f"{', '.join(f'sm_{t}' for t in TARGETS)}, {total.compiled} compiled by the check (fusing and emitting "
        f"{total.lower_seconds:.0f} s, NVRTC {total.compile_seconds:.0f} s over {len(records)} processes); "
        f"{total.reused} compiles answered from the session's store",
        "kernels the check compiled, by the test that first validated their graph:",
    ]
    lines += [f"{count:6d}  {test}" for test, count in total.by_test.most_common(15)]
    return lines


def ptxas_report(kernel: Kernel, arch: int) -> str:
    """ptxas's resource report (registers, spills) for the kernel, through NVRTC (for sm_90a
    where the kernel needs it)."""
    import io

    from cuda.core import Program, ProgramOptions

    from codegen.nvrtc import COMPILE_OPTIONS, include_paths

    options = ProgramOptions(
        name=f"{kernel.name}.cu",
        arch=f"sm_{arch}{kernel.arch_suffix}",
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
