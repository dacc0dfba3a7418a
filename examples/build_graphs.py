"""Build the example graphs with the Python API and write them to examples/graphs/*.json.

python examples/build_graphs.py          # rewrite the files
python examples/build_graphs.py --check  # exit 1 if a file differs from what this builds
"""

from __future__ import annotations

import argparse
import math
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


def rope(g: gd.OperationGraphSpec, x: gd.TensorSpec, theta: float = 10000.0, name: str = "rope") -> gd.TensorSpec:
    """Rotary position embedding of ``x`` [B, H, S, D] at positions 0..S-1, rotate-half (GPT-NeoX,
    Llama) form, from primitives: ``y = x cos(a) + rotate_half(x) sin(a)`` with ``a = s * theta^(-2i/D)``
    for sequence position s and frequency i = d mod D/2 of column d, ``rotate_half(x) = [-x2, x1]``.

    Positions and frequencies come from gen_index on ``x`` itself, so they, the angles, sin, cos and
    the combine are all pointwise on x's dims and compute in one kernel, in float (a bf16 angle would
    be off by a quarter radian at s = 100); the sign of ``-x2`` is folded into sin, so the halves
    are only swapped, [x2, x1], by two slices and a concatenate."""
    d = x.dim[3]
    half = d // 2

    def fp32(t: gd.TensorSpec) -> gd.TensorSpec:
        return t.set_data_type(gd.DataType.FLOAT)

    position = g.gen_index(x, 2, name=f"{name}.position")
    column = g.gen_index(x, 3, name=f"{name}.column")
    frequency = fp32(g.mod(column, half, name=f"{name}.frequency"))
    inverse = fp32(
        g.exp(fp32(g.mul(frequency, -2.0 * math.log(theta) / d, name=f"{name}.exponent")), name=f"{name}.inv_freq")
    )
    angle = fp32(g.mul(position, inverse, name=f"{name}.angle"))
    first = g.cmp_lt(column, half, name=f"{name}.first_half")
    sign = fp32(g.add(fp32(g.mul(first, -2.0, name=f"{name}.minus_two")), 1.0, name=f"{name}.sign"))
    sin = fp32(g.mul(fp32(g.sin(angle, name=f"{name}.sin")), sign, name=f"{name}.signed_sin"))
    cos = fp32(g.cos(angle, name=f"{name}.cos"))
    x1 = g.slice(x, [slice(None)] * 3 + [slice(0, half)], name=f"{name}.x1")
    x2 = g.slice(x, [slice(None)] * 3 + [slice(half, d)], name=f"{name}.x2")
    rotated = g.concatenate([x2, x1], axis=3, name=f"{name}.swap")
    x_cos = fp32(g.mul(x, cos, name=f"{name}.x_cos"))
    return g.add(x_cos, fp32(g.mul(rotated, sin, name=f"{name}.rot_sin")), name=name)


def llama_layer(
    batch: int = 2, seq: int = 128, hidden: int = 768, heads: int = 8, kv_heads: int = 2, ffn: int = 2048
) -> gd.OperationGraphSpec:
    """One Llama decoder layer, bf16: RMSNorm, Q/K/V projections, RoPE on Q and K, causal
    grouped-query attention (8 query heads on 2 key/value heads, head dim 96), the output
    projection and the residual add, RMSNorm, the SwiGLU MLP and its residual add.

    Laid out as a model is: tokens [B, S, hidden], each projection one GEMM ([hidden, H * D]),
    its output split into heads by a reshape to [B, S, H, D] and a transpose to [B, H, S, D]
    whose output keeps the [B, S, H, D] memory (its strides), as is the attention output's; the
    heads go back together by the reverse transpose and reshape for one output-projection GEMM.
    None of those copies moves an element, so none launches a kernel. The fuzzer shrinks the
    examples' large dims (tests/graph_fuzz.py SMALL_DIMS: 64 -> 4, 2048 -> 6...) but not slice
    bounds, so D and D/2 are none of them (RoPE slices at D/2), and neither is H * D."""
    head_dim = hidden // heads
    g = gd.OperationGraphSpec(name="llama_layer", io_data_type="bf16", intermediate_data_type="bf16")
    x = g.tensor(name="x", dim=[batch, seq, hidden])

    def weight(name: str, *dims: int) -> gd.TensorSpec:
        return g.tensor(name=name, dim=list(dims))

    def split_heads(t: gd.TensorSpec, count: int, name: str) -> gd.TensorSpec:
        """[B, S, count * D] as [B, count, S, D], over the same memory."""
        split = g.reshape(t, shape=[batch, seq, count, head_dim], name=f"{name}.split")
        heads_first = g.transpose(split, [0, 2, 1, 3], name=f"{name}.heads")
        return heads_first.set_stride([seq * count * head_dim, head_dim, count * head_dim, 1])

    h = g.rmsnorm("inference", x, weight("attn_norm.scale", 1, 1, hidden), epsilon=1e-5, name="attn_norm")[0]
    q = split_heads(g.matmul(h, weight("wq", hidden, heads * head_dim), name="q_proj"), heads, "q")
    k = split_heads(g.matmul(h, weight("wk", hidden, kv_heads * head_dim), name="k_proj"), kv_heads, "k")
    v = split_heads(g.matmul(h, weight("wv", hidden, kv_heads * head_dim), name="v_proj"), kv_heads, "v")
    q, k = rope(g, q, name="q_rope"), rope(g, k, name="k_rope")
    o = g.sdpa(q, k, v, attn_scale=1.0 / math.sqrt(head_dim), use_causal_mask=True, name="attention")[0]
    o.set_stride([seq * hidden, head_dim, hidden, 1])
    tokens = g.transpose(o, [0, 2, 1, 3], name="o.tokens")  # [B, S, H, D]
    concatenated = g.reshape(tokens, shape=[batch, seq, hidden], name="o.concat")
    attention = g.matmul(concatenated, weight("wo", hidden, hidden), name="o_proj")
    residual = g.add(x, attention, name="attn_residual")
    n = g.rmsnorm("inference", residual, weight("mlp_norm.scale", 1, 1, hidden), epsilon=1e-5, name="mlp_norm")[0]
    gate = g.matmul(n, weight("w_gate", hidden, ffn), name="gate_proj")
    up = g.matmul(n, weight("w_up", hidden, ffn), name="up_proj")
    act = g.mul(g.silu(gate, name="swiglu.silu"), up, name="swiglu")
    down = g.matmul(act, weight("w_down", ffn, hidden), name="down_proj")
    g.add(residual, down, name="mlp_residual").set_name("y").set_output(True)
    return g


EXAMPLES: dict[str, Callable[[], gd.OperationGraphSpec]] = {
    "resnet50_bottleneck": resnet50_bottleneck,
    "transformer_block": transformer_block,
    "conv_bn_relu_training": conv_bn_relu_training,
    "layernorm_gelu": layernorm_gelu,
    "moe_layer": moe_layer,
    "llama_layer": llama_layer,
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
