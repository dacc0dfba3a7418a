"""The command line and the example graphs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
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
    assert {"resnet50_bottleneck", "transformer_block", "conv_bn_relu_training", "moe_layer", "llama_layer"} <= names


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


def build_graphs() -> ModuleType:
    """examples/build_graphs.py as a module (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location("build_graphs", ROOT / "examples" / "build_graphs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def numpy_rope(x: np.ndarray, theta: float = 10000.0) -> np.ndarray:
    """Rotary embedding of x [..., S, D] at positions 0..S-1 as Llama / GPT-NeoX apply it:
    x cos + rotate_half(x) sin, with the frequencies repeated over both halves."""
    seq, dim = x.shape[-2:]
    inv_freq = theta ** (-np.arange(0, dim, 2) / dim)
    angle = np.arange(seq)[:, None] * np.concatenate([inv_freq, inv_freq])[None, :]
    rotated = np.concatenate([-x[..., dim // 2 :], x[..., : dim // 2]], axis=-1)
    return x * np.cos(angle) + rotated * np.sin(angle)


def rope_graph(io: str, dims: list[int], theta: float = 10000.0) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"rope_{io}", io_data_type=io, intermediate_data_type=io)
    build_graphs().rope(g, g.tensor(dims, name="x"), theta=theta, name="rope").set_name("y").set_output(True)
    return g


def test_rope_from_primitives_equals_numpy_rope() -> None:
    """The helper's graph (float tensors, an odd sequence length) against NumPy within float's
    error; positions, frequencies, sin, cos and the combine in one elementwise kernel, the halves
    swapped by the two slices and the concatenate."""
    ir = rope_graph("float", [2, 3, 37, 16], theta=500.0).validate()
    feeds = {"x": np.random.default_rng(0).standard_normal([2, 3, 37, 16]).astype(np.float32)}
    got = gd.reference.execute(ir, feeds)["y"].astype(np.float64)
    want = numpy_rope(feeds["x"].astype(np.float64), theta=500.0)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()
    partition = gd.fuse(ir)
    kernels = sorted(sorted(n.name for n in f.nodes) for f in partition.nodes)
    assert kernels[1:] == [["rope.swap"], ["rope.x1"], ["rope.x2"]]
    assert {"rope.position", "rope.column", "rope.sin", "rope.cos", "rope"} <= set(kernels[0])


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("io", "dims"), [("float", [2, 3, 37, 16]), ("bfloat16", [1, 8, 129, 96]), ("half", [2, 2, 7, 64])]
)
def test_gpu_rope_matches_the_reference(io: str, dims: list[int]) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(rope_graph(io, dims))


def numpy_llama_layer(
    feeds: dict[str, np.ndarray], heads: int, kv_heads: int, rope: Callable[[np.ndarray], np.ndarray] = numpy_rope
) -> np.ndarray:
    """The layer in float64, rounded to bf16 where the graph stores bf16 values."""
    from ml_dtypes import bfloat16

    def bf16(v: np.ndarray) -> np.ndarray:
        return v.astype(bfloat16).astype(np.float64)

    def rmsnorm(v: np.ndarray, scale: np.ndarray) -> np.ndarray:
        return bf16(v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-5) * scale)

    w = {name: value.astype(np.float64) for name, value in feeds.items()}
    x = w["x"]  # [B, S, hidden]
    batch, seq, _ = x.shape

    def heads_of(t: np.ndarray, count: int) -> np.ndarray:  # [B, S, count * D] -> [B, count, S, D]
        return np.swapaxes(t.reshape(batch, seq, count, -1), 1, 2)

    h = rmsnorm(x, w["attn_norm.scale"])
    q, k, v = (heads_of(bf16(h @ w[name]), n) for name, n in (("wq", heads), ("wk", kv_heads), ("wv", kv_heads)))
    q, k = bf16(rope(q)), bf16(rope(k))
    k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
    dim = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(dim)
    scores = np.where(np.tril(np.ones((seq, seq), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    o = bf16(p / p.sum(axis=-1, keepdims=True) @ v)
    concatenated = np.swapaxes(o, 1, 2).reshape(batch, seq, -1)  # [B, S, H * D]
    residual = bf16(x + bf16(concatenated @ w["wo"]))
    n = rmsnorm(residual, w["mlp_norm.scale"])
    gate, up = bf16(n @ w["w_gate"]), bf16(n @ w["w_up"])
    act = bf16(bf16(gate / (1 + np.exp(-gate))) * up)
    return bf16(residual + bf16(act @ w["w_down"]))


def test_the_llama_layer_runs_on_the_reference_and_equals_numpy(capsys: pytest.CaptureFixture[str]) -> None:
    """The example end to end through the command line, then its reference against a NumPy layer
    on weights scaled by 1/sqrt(fan-in) (softmax far from one-hot, so attention counts); NumPy
    without RoPE is far off, so the check sees the rotary embedding."""
    from ml_dtypes import bfloat16

    from graphdnn.random_inputs import random_inputs

    path = ROOT / "examples" / "graphs" / "llama_layer.json"
    assert main(["run", "--backend", "reference", "--check", str(path)]) == 0
    assert "check: passed" in capsys.readouterr().out
    ir = gd.load(path).validate()
    feeds = random_inputs(ir, seed=5)
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        fan_in = feeds[name].shape[-2]
        feeds[name] = (feeds[name].astype(np.float64) / np.sqrt(fan_in)).astype(bfloat16)
    got = gd.reference.execute(ir, feeds)["y"].astype(np.float64)
    heads, kv_heads = ir.tensor("q.split::y").dim[2], ir.tensor("k.split::y").dim[2]
    want = numpy_llama_layer(feeds, heads, kv_heads)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2
    unrotated = numpy_llama_layer(feeds, heads, kv_heads, rope=lambda v: v)
    assert np.linalg.norm(got - want) < 0.1 * np.linalg.norm(got - unrotated)


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
