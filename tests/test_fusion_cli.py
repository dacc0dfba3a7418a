"""``graphdnn inspect --fused`` and ``--dot``: the partition, explained, on the command line."""

from __future__ import annotations

import re
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
