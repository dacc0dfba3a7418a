"""Names never change generated code: control characters are refused by the one check the
builder and the JSON reader share, anything else reaching a kernel's header comment is
escaped, NVRTC never sees a NUL, and every cubin must export its entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import graphdnn as gd
from codegen import CompileError, compile_cubin
from codegen.cubin import CubinError, entry_points, parameter_bytes
from codegen.kernel import comment_safe, compose, strip_header
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.names import check_name, printable
from tests import plan_graphs

REFUSED = [
    "a\0b",
    "x\x1b[31m",
    "tab\there",
    "new\nline",
    "del\x7f",
    "c1\x85",
    "c1\x9b",
    "ls\u2028",
    "\u202eevil",
    "\u2066x",
]


@pytest.mark.parametrize("name", REFUSED, ids=[ascii(name) for name in REFUSED])
def test_the_builder_refuses_control_and_bidi_characters_in_every_name(name: str) -> None:
    position = next(i for i, c in enumerate(name) if not (c.isalnum() or c in "[_ "))
    with pytest.raises(gd.GraphError, match=rf"tensor name .* at position {position}"):
        gd.OperationGraphSpec().tensor(dim=[2], name=name)
    g = gd.OperationGraphSpec()
    x = g.tensor(dim=[2], name="x")
    with pytest.raises(gd.GraphError, match="node name"):
        g.relu(x, name=name)
    with pytest.raises(gd.GraphError, match="tensor name"):
        x.set_name(name)
    with pytest.raises(gd.GraphError, match="graph name"):
        gd.OperationGraphSpec(name=name)
    with pytest.raises(gd.GraphError, match="graph name"):
        g.name = name


def test_names_in_any_script_are_allowed() -> None:
    assert check_name("x_μσ_画像", "tensor") == "x_μσ_画像"
    assert check_name("a b/c*d", "node") == "a b/c*d"


@pytest.mark.parametrize(
    ("where", "name"), [("tensors[0]", "x\u0000"), ("nodes[0]", "n\x1b"), ("tensors[0]", "\ud800"), ("", "g\r")]
)
def test_the_json_reader_goes_through_the_same_check(tmp_path: Path, where: str, name: str) -> None:
    g = gd.OperationGraphSpec(name="g", io_data_type="float")
    g.relu(g.tensor(dim=[2], name="x"), name="n").set_output(True)
    saved = tmp_path / "saved.json"
    gd.save(g, saved)
    document = json.loads(saved.read_text())
    if where.startswith("tensors"):
        document["tensors"][0]["name"] = name
    elif where.startswith("nodes"):
        document["nodes"][0]["name"] = name
    else:
        document["name"] = name
    path = tmp_path / "named.json"
    path.write_text(json.dumps(document))
    with pytest.raises(gd.GraphError, match=rf"{re.escape(where)}.*name .* holds a"):
        gd.load(path)


def test_comment_safe_output_is_printable_ascii_that_cannot_end_a_comment() -> None:
    assert comment_safe("a*/b") == "a*\\x2fb"
    assert comment_safe("ends with \\") == "ends with \\x5c"
    assert comment_safe("x_μ 😀\0") == "x_\\u03bc \\U0001f600\\x00"
    source = compose(header="graph 'a\nb\\' */ \u2028", headers=[], body="int k;\n")
    head = source.split("// ---- end of header ----")[0]
    assert all(line.startswith("// ") and min(line) >= " " and max(line) <= "~" for line in head.splitlines())
    assert not any(line.endswith("\\") for line in head.splitlines())


def test_a_name_spelling_the_header_mark_does_not_change_the_body() -> None:
    plain = compose(header="graph 'g'", headers=[], body="int k;\n")
    marked = compose(header="graph '// ---- end of header ----'", headers=[], body="int k;\n")
    assert strip_header(plain) == strip_header(marked)


def test_nvrtc_never_sees_a_nul_and_every_cubin_must_export_its_entry_point() -> None:
    with pytest.raises(CompileError, match=r"NUL character \(line 2\)"):
        compile_cubin("// graph 'a\n\0'\nextern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }\n", "k", 90)
    # what a source cut at a NUL compiled to: a valid cubin without the kernel
    with pytest.raises(CompileError, match="does not export 'k'"):
        compile_cubin("// graph 'a\n", "k", 90)
    cubin = compile_cubin('extern "C" __global__ void k(float* x, double a) { x[0] = a; }\n', "k", 80)
    assert entry_points(cubin) == {"k"} and parameter_bytes(cubin, "k") == 16
    assert parameter_bytes(cubin, "other") is None


@pytest.mark.parametrize("data", [b"", b"\x7fELF" + b"\0" * 60, b"not an elf" * 10])
def test_entry_points_of_garbage_raise_a_cubin_error(data: bytes) -> None:
    with pytest.raises(CubinError):
        entry_points(data)


def test_a_cut_or_damaged_cubin_raises_nothing_but_a_cubin_error() -> None:
    cubin = compile_cubin('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n', "k", 90)
    outcomes = set()
    for size in range(0, len(cubin), 97):
        for data in (cubin[:size], cubin[:size] + bytes(len(cubin) - size)):
            try:
                outcomes.add("k" in entry_points(data))
            except CubinError:
                outcomes.add("refused")
    assert "refused" in outcomes  # and no IndexError, struct.error or UnicodeError on the way


def test_a_nul_in_a_name_cannot_poison_the_kernel_another_graph_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defect: a NUL in a name cut the source handed to NVRTC, and the empty cubin was
    stored under the real kernel's key. With the name check bypassed, the header comment
    still escapes the NUL: the kernel compiles whole, and another graph loads a cubin that
    exports its entry point."""
    monkeypatch.setattr("graphdnn.graph.check_name", lambda name, what: name)
    poisoned = plan_graphs.add_relu("evil\0graph", names=("x\0", "b", "y"))
    cache = PlanCache(tmp_path / "cache")
    plan = gd.compile(poisoned, arch="sm_90", cache=cache)
    (kernel,) = plan.kernels
    assert "\0" not in kernel.source and "evil\\x00graph" in kernel.source
    assert kernel.name in entry_points(kernel.cubin)
    other = gd.compile(plan_graphs.add_relu(), arch="sm_90", cache=PlanCache(tmp_path / "cache"), require_cached=False)
    (shared,) = other.kernels
    assert shared.kernel_key == kernel.kernel_key and other.compiled == 0
    assert shared.name in entry_points(shared.cubin)


def test_printable_escapes_what_names_refuse() -> None:
    assert printable("plain μ") == "plain μ"
    assert printable("\x1b[31mred\u202e\n") == "\\x1b[31mred\\u202e\\x0a"
    assert printable("log:\n\x1b[2Jline", lines=True) == "log:\n\\x1b[2Jline"
