"""The command line and the example graphs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "graphs").glob("*.json"))


def test_example_files_match_the_script_that_builds_them() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "build_graphs.py"), "--check"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    assert result.returncode == 0, result.stderr


def test_the_required_examples_exist() -> None:
    names = {path.stem for path in EXAMPLES}
    assert {"resnet50_bottleneck", "transformer_block", "conv_bn_relu_training", "moe_layer"} <= names


def test_validate_accepts_every_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", *map(str, EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(EXAMPLES)


def test_the_moe_layer_runs_on_the_reference_and_equals_a_dense_mixture(capsys: pytest.CaptureFixture[str]) -> None:
    """The example end to end: each token's output is the renormalised-softmax-weighted sum,
    over its top-2 experts, of that expert's SwiGLU MLP (rounded where the graph rounds)."""
    import numpy as np
    from ml_dtypes import bfloat16

    from graphdnn.random_inputs import random_inputs

    path = ROOT / "examples" / "graphs" / "moe_layer.json"
    assert main(["run", "--backend", "reference", str(path)]) == 0
    assert "11 nodes; backend reference" in capsys.readouterr().out
    ir = gd.load(path).validate()
    feeds = random_inputs(ir, seed=4)
    got = gd.reference.execute(ir, feeds)["y"].astype(np.float64)

    def bf16(v: np.ndarray) -> np.ndarray:
        return v.astype(bfloat16).astype(np.float64)

    x, router, w13, w2 = (feeds[n].astype(np.float64) for n in ("x", "router.weight", "experts.w13", "experts.w2"))
    logits = bf16(x @ router)
    ffn = w2.shape[1]
    want = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-logits[t], kind="stable")[:2]
        p = np.exp(logits[t, top] - logits[t].max())
        for e, weight in zip(top, (p / p.sum()).astype(np.float32)):
            h = bf16(x[t] @ w13[e])
            gate, up = h[:ffn], h[ffn:]
            act = bf16(bf16(gate / (1 + np.exp(-gate))) * up)
            want[t] += float(weight) * bf16(act @ w2[e])
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2


def test_inspect_prints_shapes_and_signature(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "graphs" / "resnet50_bottleneck.json"
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert gd.load(path).signature() in out
    assert "conv1.conv: conv_fprop(image=x, weight=conv1.weight)" in out
    assert "-> y: y: 32x256x56x56 bfloat16 stride [802816, 1, 14336, 256]" in out
    assert "\\x0a" not in out  # names are escaped line by line; the listing keeps its lines
    assert "\n      -> y: y: 32x256x56x56" in out


def test_a_bad_file_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(EXAMPLES[0].read_text().replace('"conv_fprop"', '"conv_fprom"'))
    assert main(["validate", str(EXAMPLES[0]), str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"graphdnn: error: {bad}: nodes[")
    assert "unknown op 'conv_fprom'" in err[0]


def test_the_installed_command_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "graphdnn.cli", "inspect", str(EXAMPLES[0])],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0
    assert "signature" in result.stdout
