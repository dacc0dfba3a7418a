"""Every code block of README.md and docs/*.md runs, so the docs cannot drift from the code.

How blocks are run (the conventions a doc writer follows):

- ```python blocks run in order, in one namespace per file, in a temporary directory in
  which ``examples/`` is the repository's. A block of ``>>>`` lines is a doctest: what
  it shows is checked.
- A ```text block after a line ``Output:`` is what the python block before it prints.
- ```bash and ```console blocks: every ``graphdnn ...`` or ``python -m graphdnn.cli ...``
  command runs through :func:`graphdnn.cli.main` (other commands, such as pip and pytest,
  prepare the environment and are not run). In a console block the lines after a
  ``$`` command are its output (stdout, then stderr), compared with numbers and hex
  digests masked (timings, signatures, dates) and ``...`` standing for any lines.
- ``<!-- gpu -->`` on the line before a block: it needs a GPU, and runs only in the
  file's ``gpu`` test, which runs every block of the file (skipped without a GPU).
- ``<!-- output not checked: why -->`` before a console block: its commands run and must
  succeed, but the output shown is an illustration (a damaged cache, another machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import glob
import io
import re
import shlex
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from graphdnn import cli
from graphdnn.ops import registry

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "console")
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")


@dataclasses.dataclass(frozen=True)
class Block:
    file: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    markers: tuple[str, ...]  # HTML comments on the lines just before the fence
    after_output_label: bool  # the line before is "Output:"

    @property
    def gpu(self) -> bool:
        return "gpu" in self.markers

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = [line for line in lines[:i] if line.strip()][-3:]
        markers = []
        for line in reversed(before):
            marker = _MARKER.match(line.strip())
            if not marker:
                break
            markers.append(marker.group(1))
        label = bool(before) and before[-1].strip() == "Output:"
        found.append(
            Block(path.name, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", tuple(markers), label)
        )
        i = end + 1
    return found


# -- python --------------------------------------------------------------------------------------
def run_python(block: Block, namespace: dict[str, Any]) -> str:
    """Run a python block in ``namespace``; return what it printed. Doctests check their output."""
    if ">>>" in block.text:
        test = doctest.DocTestParser().get_doctest(block.text, namespace, block.where, block.file, block.line)
        # a DocTest runs in a copy of the namespace; torch.compile's guards look the globals
        # of compiled code up in sys.modules, which holds the namespace itself
        test.globs = namespace
        report = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, out=report.write, clear_globs=False)
        assert runner.failures == 0, f"{block.where}: doctest failed\n{report.getvalue()}"
        return ""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.text, block.where, "exec"), namespace)
    return printed.getvalue()


# -- shell ---------------------------------------------------------------------------------------
def graphdnn_args(command: str) -> list[str] | None:
    """The arguments of a ``graphdnn`` command line (globs expanded), None for any other command."""
    argv = shlex.split(command, comments=True)
    if argv[:1] == ["graphdnn"]:
        args = argv[1:]
    elif len(argv) >= 3 and argv[0] in ("python", "python3") and argv[1:3] == ["-m", "graphdnn.cli"]:
        args = argv[3:]
    else:
        return None
    return [item for arg in args for item in (sorted(glob.glob(arg)) if glob.has_magic(arg) else [arg])]


def run_cli(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(args)
        except SystemExit as exit:  # argparse
            status = exit.code if isinstance(exit.code, int) else 1
    return status, out.getvalue() + err.getvalue()


def mask(text: str) -> list[str]:
    """Lines with the parts that change from run to run masked: digests, numbers, spacing."""
    text = re.sub(r"[0-9a-f]{12,}…?", "H", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def matches(shown: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` is ``shown``, where a ``...`` line of ``shown`` stands for any lines."""
    if not shown:
        return not actual
    if shown[0] == "...":
        return any(matches(shown[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and shown[0] == actual[0] and matches(shown[1:], actual[1:])


def run_shell(block: Block) -> None:
    """Run the graphdnn commands of a shell block; check a console block's shown output."""
    if block.lang == "bash":
        commands = [(part, []) for line in block.text.splitlines() for part in line.split("&&") if part.strip()]
    else:
        commands = []
        for line in block.text.splitlines():
            if line.startswith("$ "):
                commands.append((line[2:], []))
            elif commands:
                commands[-1][1].append(line)
    checked = block.lang == "console" and not any(m.startswith("output not checked") for m in block.markers)
    for command, shown in commands:
        args = graphdnn_args(command)
        if args is None:
            continue
        status, output = run_cli(args)
        failing = any(line.startswith("graphdnn: error:") for line in shown)
        assert status == (1 if failing else 0), f"{block.where}: `{command}` exited {status}:\n{output}"
        if checked:
            assert matches(mask("\n".join(shown)), mask(output)), (
                f"{block.where}: `{command}` printed\n{output}\nthe doc shows\n" + "\n".join(shown)
            )


# -- one test per file ---------------------------------------------------------------------------
def run_file(path: Path, with_gpu: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run a file's blocks in order, in a module of their own (dataclasses need one); return
    how many ran. Ops a doc registers (architecture.md's recipe) are forgotten afterwards."""
    module = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    known = dict(registry.DEFINITIONS)
    try:
        return _run_blocks(path, with_gpu, module.__dict__)
    finally:
        registry.DEFINITIONS.clear()
        registry.DEFINITIONS.update(known)


def _run_blocks(path: Path, with_gpu: bool, namespace: dict[str, object]) -> int:
    printed, ran = "", 0
    for block in blocks(path):
        if block.gpu and not with_gpu:
            continue
        if block.lang == "python":
            printed = run_python(block, namespace)
            ran += 1
        elif block.lang == "text" and block.after_output_label:
            assert printed.splitlines() == block.text.splitlines(), (
                f"{block.where}: the block before prints\n{printed}\nthe doc shows\n{block.text}"
            )
        elif block.lang in SHELL:
            run_shell(block)
            ran += 1
    return ran


@pytest.fixture
def in_scratch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory in which ``examples/`` is the repository's, and the compile
    options a user has (not the check's GRAPHDNN_FAST_COMPILE: docs print compile options)."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAPHDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GRAPHDNN_FAST_COMPILE", raising=False)
    return tmp_path


def _runs_without_a_gpu(path: Path) -> bool:
    return any(b.lang in ("python", *SHELL) and not b.gpu for b in blocks(path))


@pytest.mark.parametrize("path", [p for p in DOCS if _runs_without_a_gpu(p)], ids=lambda p: p.name)
def test_doc_runs_without_a_gpu(path: Path, in_scratch_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_file(path, False, monkeypatch) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("path", [p for p in DOCS if any(b.gpu for b in blocks(p))], ids=lambda p: p.name)
def test_doc_runs_on_a_gpu(path: Path, in_scratch_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_file(path, True, monkeypatch) > 0


def test_every_runnable_block_is_recognised() -> None:
    """Each block is python, a shell block, or a kind that is shown, never run (text, json)."""
    kinds = {block.lang for path in DOCS for block in blocks(path)}
    assert kinds <= {"python", *SHELL, "text", "json", ""}, kinds


def test_output_masking_and_ellipsis() -> None:
    shown = mask("reference: 9 nodes in 1877.1 ms\n...\nkey 42978e7921abbdf12dd5…\n")
    assert shown == ["reference: N nodes in N ms", "...", "key H"]
    assert matches(shown, ["reference: N nodes in N ms", "a", "b", "key H"])
    assert not matches(shown, ["reference: N nodes in N ms", "key H", "extra"])


def test_the_api_reference_is_up_to_date() -> None:
    from graphdnn.commands import api_reference

    assert api_reference.main(["--check"]) == 0, (
        "docs/api.md is out of date: run python -m graphdnn.commands.api_reference"
    )
    text = api_reference.DOCUMENT.read_text()
    assert "### `gd.compile(graph: Any, *, arch: str | int | None = None" in text
    assert "- `gd.OperationGraphSpec.matmul(" in text and "### `gd.torch.custom_op(" in text
    assert "- `gd.cudnn.pygraph.build_operation_graph(" in text
