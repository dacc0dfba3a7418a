"""``graphdnn inspect --fused``, ``--dot`` and ``--svg``: the partition, explained, on the command line."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"
RESNET = str(EXAMPLES / "resnet50_bottleneck.json")
TRANSFORMER = str(EXAMPLES / "transformer_block.json")


def test_fused_prints_the_partition_after_the_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--fused", RESNET]) == 0
    out = capsys.readouterr().out
    listing, partition = out.split("\n\npartition of ")
    assert listing.startswith("graph 'resnet50_bottleneck'  signature ")
    assert partition.splitlines()[:2] == [
        "'resnet50_bottleneck': 10 nodes -> 3 fused nodes",
        "  conv_bn_act_0 [gemm, rule conv_bn_act]: conv1.conv, conv1.bn, conv1.relu",
    ]
    assert "  conv_bn_act_2 [gemm, rule conv_bn_act]: conv3.conv, conv3.bn, residual, out.relu" in partition
    assert "  intermediates in the workspace: conv1.relu::y, conv2.relu::y" in partition


def test_without_fused_there_is_no_partition(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", RESNET]) == 0
    assert "partition of" not in capsys.readouterr().out


def test_disable_is_repeatable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--fused", "--disable", "add_norm", "--disable", "matmul_epilogue", TRANSFORMER]) == 0
    out = capsys.readouterr().out
    assert "  rms [row_norm, rule single]: rms" in out
    assert "  fc2 [gemm, rule single]: fc2" in out
    assert "  pointwise_group_1 [elementwise, rule pointwise_group]: fc2.bias, residual" in out


def test_arch_and_the_reasons_for_what_was_not_fused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = gd.OperationGraphSpec(name="fp8", io_data_type="fp8_e4m3", intermediate_data_type="float")
    x, w = g.tensor(name="x", dim=[1, 4, 3, 3]), g.tensor(name="w", dim=[8, 4, 1, 1])
    g.relu(g.conv_fprop(x, w, name="conv"), name="act").set_output(True)
    path = tmp_path / "fp8.json"
    gd.save(g, path)
    assert main(["inspect", "--fused", "--arch", "sm_80", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  not fused:\n" in out
    assert (
        "    conv_epilogue: conv not fused: conv uses fp8 tensor 'x'; "
        "fused fp8 kernels need sm_89 or newer, the target is sm_80"
    ) in out
    assert main(["inspect", "--fused", "--arch", "sm_90", str(path)]) == 0
    assert "conv_epilogue_0 [gemm, rule conv_epilogue]: conv, act" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--disable", "nope"], "graphdnn: error: unknown fusion rule(s) ['nope']; rules: conv_bn_act, "),
        (["--arch", "ampere"], "graphdnn: error: unknown target architecture 'ampere'; expected e.g. 'sm_80'"),
        (["--arch", "sm_12"], "graphdnn: error: sm_12 is not a target NVRTC compiles for; choose one of sm_75, "),
        (["--dot", "/nonexistent/dir/out.dot"], "graphdnn: error: cannot write /nonexistent/dir/out.dot: "),
    ],
)
def test_bad_options_are_one_line_errors(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--fused", *flags, TRANSFORMER]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(message)


def clusters(dot: str) -> dict[str, list[str]]:
    """Cluster label -> the op nodes declared inside it."""
    found: dict[str, list[str]] = {}
    for block in re.findall(r"subgraph cluster_\d+ \{(.*?)\n  \}", dot, flags=re.S):
        label = re.search(r'label="([^"]*)"; style=filled', block)
        assert label is not None
        found[label.group(1)] = re.findall(r'"node:([^"]+)" \[label=', block)
    return found


def test_dot_clusters_the_graph_by_fused_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "transformer.dot"
    assert main(["inspect", "--dot", str(out), TRANSFORMER]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    dot = out.read_text()
    assert dot.startswith('digraph "transformer_block" {') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert clusters(dot) == {
        "norm_epilogue_0 [row_norm, rule norm_epilogue]": ["ln", "ln.gelu"],
        "matmul_epilogue_0 [gemm, rule matmul_epilogue]": ["fc1", "fc1.bias", "fc1.gelu"],
        "matmul_epilogue_1 [gemm, rule matmul_epilogue]": ["fc2", "fc2.bias"],
        "add_norm_0 [row_norm, rule add_norm]": ["residual", "rms"],
    }
    # inside a fused node an edge is a register (dashed); between fused nodes, memory (solid)
    assert '"node:fc1" -> "node:fc1.bias" [label="fc1::C", style=dashed, color=gray40];' in dot
    assert '"node:fc1.gelu" -> "node:fc2" [label="fc1.gelu::y"];' in dot
    assert '"tensor:x" -> "node:residual";' in dot
    assert '"node:residual" -> "tensor:residual";' in dot
    assert '"tensor:y" [label="y", shape=ellipse, peripheries=2];' in dot
    assert '[label="ln\\nlayernorm (anchor)", shape=box' in dot


def test_dot_follows_disable(tmp_path: Path) -> None:
    out = tmp_path / "resnet.dot"
    assert main(["inspect", "--dot", str(out), "--disable", "conv_bn_act", "--disable", "conv_epilogue", RESNET]) == 0
    found = clusters(out.read_text())
    assert len(found) == 6
    assert found["conv1.conv [gemm, rule single]"] == ["conv1.conv"]
    assert found["pointwise_group_2 [elementwise, rule pointwise_group]"] == ["conv3.bn", "residual", "out.relu"]


def test_svg_without_graphviz_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot program there
    assert main(["inspect", "--svg", str(tmp_path / "out.svg"), TRANSFORMER]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "graphdnn: error: --svg renders with Graphviz's 'dot' program, which is not on PATH: install Graphviz "
        "(e.g. apt-get install graphviz, brew install graphviz), or write the DOT text with --dot"
    ]
    assert not (tmp_path / "out.svg").exists()


def _stand_in_dot(directory: Path, script: str) -> None:
    """A ``dot`` program on PATH that runs ``script`` (sh): what graphdnn passes it is observable."""
    program = directory / "dot"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)


def test_svg_passes_the_dot_picture_to_graphviz(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stand_in_dot(tmp_path, 'echo "$@" > "$0.args"; cat > "$3"')  # writes its input as the "SVG"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")  # before any real dot
    svg, dot = tmp_path / "out.svg", tmp_path / "out.dot"
    assert main(["inspect", "--dot", str(dot), "--svg", str(svg), TRANSFORMER]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {dot}\nwrote {svg}\n")
    assert (tmp_path / "dot.args").read_text() == f"-Tsvg -o {svg}\n"
    assert svg.read_text() == dot.read_text()


def test_a_graphviz_failure_is_one_line_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stand_in_dot(tmp_path, 'echo "Error: syntax error in line 1" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["inspect", "--svg", str(tmp_path / "out.svg"), TRANSFORMER]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"graphdnn: error: Graphviz's dot ({tmp_path / 'dot'}) could not write {tmp_path / 'out.svg'}: "
        "Error: syntax error in line 1"
    ]


@pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot program is not installed (apt-get install graphviz)"
)
def test_svg_renders_with_graphviz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "transformer.svg"
    assert main(["inspect", "--svg", str(out), TRANSFORMER]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    svg = out.read_text()
    assert "<svg" in svg and svg.rstrip().endswith("</svg>")
    for cluster in ("norm_epilogue_0", "matmul_epilogue_0", "matmul_epilogue_1", "add_norm_0"):
        assert cluster in svg
