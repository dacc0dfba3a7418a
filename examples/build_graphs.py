"""Build the example graphs with the Python API and write them to examples/graphs/*.json.

python examples/build_graphs.py          # rewrite the files
python examples/build_graphs.py --check  # exit 1 if a file differs from what this builds
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import graphdnn as gd

GRAPHS = Path(__file__).resolve().parent / "graphs"


def _per_channel(g: gd.OperationGraphSpec, name: str, channels: int) -> gd.TensorSpec:
    return g.tensor(name=name, dim=[1, channels, 1, 1], data_type=gd.DataType.FLOAT)


def _conv_bn(g: gd.OperationGraphSpec, x: gd.TensorSpec, name: str, k: int, c: int, size: int) -> gd.TensorSpec:
    """conv (size x size, 'same' padding) followed by inference batch norm."""
    w = g.tensor(name=f"{name}.weight", dim=[k, c, size, size], stride=gd.nhwc_strides([k, c, size, size]))
    y = g.conv_fprop(image=x, weight=w, padding=[size // 2] * 2, name=f"{name}.conv")
    return g.batchnorm_inference(
        input=y,
        mean=_per_channel(g, f"{name}.bn.mean", k),
        inv_variance=_per_channel(g, f"{name}.bn.inv_variance", k),
        scale=_per_channel(g, f"{name}.bn.scale", k),
        bias=_per_channel(g, f"{name}.bn.bias", k),
        name=f"{name}.bn",
    )


def resnet50_bottleneck(batch: int = 32) -> gd.OperationGraphSpec:
    """ResNet-50 conv2_x bottleneck, NHWC bf16: 1x1 256->64, 3x3 64->64, 1x1 64->256, residual.

    Intermediates are bf16, as in a bf16 network: every virtual value is rounded to bf16,
    so the activations passed between fused kernels are stored at that precision too
    (the arithmetic itself is fp32).
    """
    g = gd.OperationGraphSpec(name="resnet50_bottleneck", io_data_type="bf16", intermediate_data_type="bf16")
    dims = [batch, 256, 56, 56]
    x = g.tensor(name="x", dim=dims, stride=gd.nhwc_strides(dims))
    h = g.relu(_conv_bn(g, x, "conv1", 64, 256, 1), name="conv1.relu")
    h = g.relu(_conv_bn(g, h, "conv2", 64, 64, 3), name="conv2.relu")
    h = _conv_bn(g, h, "conv3", 256, 64, 1)
    g.relu(g.add(h, x, name="residual"), name="out.relu").set_name("y").set_output(True)
    return g


def transformer_block(tokens: int = 2048, hidden: int = 1024) -> gd.OperationGraphSpec:
    """LayerNorm+GELU, an MLP of two matmuls with bias epilogues, then residual add+RMSNorm (bf16 throughout)."""
    g = gd.OperationGraphSpec(name="transformer_block", io_data_type="bf16", intermediate_data_type="bf16")
    x = g.tensor(name="x", dim=[tokens, hidden])

    def row(name: str, size: int) -> gd.TensorSpec:
        return g.tensor(name=name, dim=[1, size])

    ln = g.layernorm("inference", x, row("ln.scale", hidden), row("ln.bias", hidden), 1e-5, name="ln")[0]
    a = g.gelu_approx_tanh(ln, name="ln.gelu")
    h = g.matmul(a, g.tensor(name="fc1.weight", dim=[hidden, 4 * hidden]), name="fc1")
    h = g.gelu_approx_tanh(g.bias(h, row("fc1.bias", 4 * hidden), name="fc1.bias"), name="fc1.gelu")
    o = g.matmul(h, g.tensor(name="fc2.weight", dim=[4 * hidden, hidden]), name="fc2")
    o = g.bias(o, row("fc2.bias", hidden), name="fc2.bias")
    residual = g.add(o, x, name="residual").set_name("residual").set_output(True)
    y = g.rmsnorm("inference", residual, row("rms.scale", hidden), epsilon=1e-6, name="rms")[0]
    y.set_name("y").set_output(True)
    return g


def conv_bn_relu_training(batch: int = 32) -> gd.OperationGraphSpec:
    """conv 3x3 64->64 then training batch norm (with running statistics) and ReLU, NHWC bf16."""
    g = gd.OperationGraphSpec(name="conv_bn_relu_training", io_data_type="bf16")
    dims = [batch, 64, 56, 56]
    x = g.tensor(name="x", dim=dims, stride=gd.nhwc_strides(dims))
    w = g.tensor(name="weight", dim=[64, 64, 3, 3], stride=gd.nhwc_strides([64, 64, 3, 3]))
    y = g.conv_fprop(image=x, weight=w, padding=[1, 1], name="conv")
    stats = [_per_channel(g, f"bn.{n}", 64) for n in ("scale", "bias", "running_mean", "running_var")]
    bn, mean, inv_var, next_mean, next_var = g.batchnorm(y, *stats, epsilon=1e-5, momentum=0.1, name="bn")
    g.relu(bn, name="relu").set_name("y").set_output(True)
    for tensor, name in (
        (mean, "saved_mean"),
        (inv_var, "saved_inv_variance"),
        (next_mean, "next_running_mean"),
        (next_var, "next_running_var"),
    ):
        assert tensor is not None
        tensor.set_name(name).set_output(True).set_data_type(gd.DataType.FLOAT)
    return g


def layernorm_gelu(rows: int = 4096, hidden: int = 1024) -> gd.OperationGraphSpec:
    """The smallest useful graph: LayerNorm followed by GELU(tanh), bf16 rows."""
    g = gd.OperationGraphSpec(name="layernorm_gelu", io_data_type="bf16")
    x = g.tensor(name="x", dim=[rows, hidden])
    scale, bias = g.tensor(name="scale", dim=[1, hidden]), g.tensor(name="bias", dim=[1, hidden])
    y = g.layernorm("inference", x, scale, bias, 1e-5, name="ln")[0]
    g.gelu_approx_tanh(y, name="gelu").set_name("y").set_output(True)
    return g


def moe_layer(
    tokens: int = 120, hidden: int = 48, ffn: int = 80, experts: int = 8, k: int = 2
) -> gd.OperationGraphSpec:
    """A Mixtral-style MoE feed-forward layer, bf16: softmax router choosing 2 of 8 experts
    (weights renormalised), the tokens permuted by expert, one grouped matmul to the SwiGLU
    gate and up projections, SwiGLU, a grouped matmul back, and the weighted un-permute.

    Small dims, none of which the fuzzer shrinks (tests/graph_fuzz.py SMALL_DIMS), so that the
    slices and expert shapes stay consistent there, and the reference runs in a blink."""
    g = gd.OperationGraphSpec(name="moe_layer", io_data_type="bf16", intermediate_data_type="bf16")
    x = g.tensor(name="x", dim=[tokens, hidden])
    logits = g.matmul(x, g.tensor(name="router.weight", dim=[hidden, experts]), name="router.logits")
    weights, chosen = g.moe_router(logits, k, "softmax", name="router")
    weights.set_data_type(gd.DataType.FLOAT)
    token_index, slot, first_token_offset = g.moe_permutation(chosen, experts, name="permutation")
    rows = g.gather(x, token_index, name="permute")
    gate_up = g.moe_grouped_matmul(
        rows, g.tensor(name="experts.w13", dim=[experts, hidden, 2 * ffn]), first_token_offset, name="experts.fc1"
    )
    gate = g.slice(gate_up, [slice(None), slice(0, ffn)], name="gate")
    up = g.slice(gate_up, [slice(None), slice(ffn, 2 * ffn)], name="up")
    act = g.mul(g.silu(gate, name="swiglu.silu"), up, name="swiglu")
    down = g.moe_grouped_matmul(
        act, g.tensor(name="experts.w2", dim=[experts, ffn, hidden]), first_token_offset, name="experts.fc2"
    )
    g.moe_unpermute(down, slot, weights, name="combine").set_name("y").set_output(True)
    return g


EXAMPLES: dict[str, Callable[[], gd.OperationGraphSpec]] = {
    "resnet50_bottleneck": resnet50_bottleneck,
    "transformer_block": transformer_block,
    "conv_bn_relu_training": conv_bn_relu_training,
    "layernorm_gelu": layernorm_gelu,
    "moe_layer": moe_layer,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args()
    stale = []
    for name, build in EXAMPLES.items():
        path = GRAPHS / f"{name}.json"
        text = build().to_json() + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    for path in stale:
        print(f"{path} is out of date: run python examples/build_graphs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
