"""Programs written as cuDNN frontend users write them, for ``graphdnn.cudnn``.

Each takes the torch device its buffers live on: "cpu" runs them on graphdnn's NumPy
reference plan (tests/test_cudnn_compat.py), "cuda" on the compiled GPU plan
(tests/test_gpu_cudnn.py). The graph-building code is the frontend's, unchanged: only the
import differs. Each returns its results and the expected values, computed apart from
graphdnn (NumPy in float64, torch's CPU autograd for gradients).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import graphdnn.cudnn as cudnn
from graphdnn.compare import relative_error, tolerance
from graphdnn.dtypes import DataType


@dataclass(frozen=True)
class Result:
    name: str
    got: Any  # the torch tensor the graph wrote
    want: np.ndarray
    data_type: DataType

    def check(self) -> None:
        got = self.got.detach().to("cpu", torch.float64).numpy()
        error = relative_error(got, self.want)
        assert error <= tolerance(self.data_type), f"{self.name}: relative error {error:.3g}"


def f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _stream(handle: cudnn.Handle, device: str) -> None:
    if device == "cuda":
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)


def conv_bias_relu(device: str) -> list[Result]:
    """The frontend's conv + bias + relu sample: NHWC fp16, tensors from tensor_like,
    a [K] bias buffer for the [1, K, 1, 1] bias tensor, the handle's stream."""
    torch.manual_seed(1)
    x = torch.randn(4, 16, 8, 8, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(32, 16, 3, 3, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    b = torch.randn(32, dtype=torch.half, device=device)

    handle = cudnn.create_handle()
    _stream(handle, device)
    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    X = graph.tensor_like(x)
    W = graph.tensor_like(w)
    B = graph.tensor(name="B", dim=[1, 32, 1, 1], stride=[32, 1, 32, 32], data_type=cudnn.data_type.HALF)
    conv_output = graph.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    bias_output = graph.bias(name="bias", input=conv_output, bias=B)
    Y = graph.relu(name="relu", input=bias_output)
    Y.set_output(True)
    graph.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])

    y = torch.empty(Y.get_dim(), dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({X: x, W: w, B: b, Y: y}, workspace, handle=handle)
    cudnn.destroy_handle(handle)

    ref = torch.nn.functional.conv2d(torch.from_numpy(f64(x)), torch.from_numpy(f64(w)), padding=1)
    want = np.maximum(ref.numpy() + f64(b).reshape(1, -1, 1, 1), 0)
    return [Result("relu::OUT_0", y, want, DataType.HALF)]


def batchnorm_training(device: str) -> list[Result]:
    """The frontend's BN training sample: pass-by-value epsilon and momentum declared with
    tensor(), their values as CPU tensors; five outputs, running statistics updated."""
    torch.manual_seed(2)
    n, c, h, w = 4, 16, 6, 6
    x = torch.randn(n, c, h, w, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    scale = torch.randn(1, c, 1, 1, device=device)
    bias = torch.randn(1, c, 1, 1, device=device)
    running_mean = torch.randn(1, c, 1, 1, device=device)
    running_var = torch.rand(1, c, 1, 1, device=device) + 0.5
    epsilon_cpu = torch.full((1, 1, 1, 1), 1e-3)
    momentum_cpu = torch.full((1, 1, 1, 1), 0.1)

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    X = graph.tensor(name="X", dim=x.size(), stride=x.stride(), data_type=x.dtype)
    stats = dict(dim=[1, c, 1, 1], stride=[c, 1, c, c], data_type=cudnn.data_type.FLOAT)
    SCALE = graph.tensor(name="scale", **stats)
    BIAS = graph.tensor(name="bias", **stats)
    IN_MEAN = graph.tensor(name="in_running_mean", **stats)
    IN_VAR = graph.tensor(name="in_running_var", **stats)
    scalar = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT, is_pass_by_value=True)
    EPSILON = graph.tensor(name="epsilon", **scalar)
    MOMENTUM = graph.tensor(name="momentum", **scalar)
    Y, MEAN, INV_VAR, NEXT_MEAN, NEXT_VAR = graph.batchnorm(
        name="BN",
        input=X,
        scale=SCALE,
        bias=BIAS,
        in_running_mean=IN_MEAN,
        in_running_var=IN_VAR,
        epsilon=EPSILON,
        momentum=MOMENTUM,
    )
    Y.set_output(True)
    for t in (MEAN, INV_VAR, NEXT_MEAN, NEXT_VAR):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()

    y = torch.empty_like(x)
    mean, inv_var, next_mean, next_var = (torch.empty_like(running_mean) for _ in range(4))
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    pack = {X: x, SCALE: scale, BIAS: bias, IN_MEAN: running_mean, IN_VAR: running_var, EPSILON: epsilon_cpu}
    pack |= {MOMENTUM: momentum_cpu, Y: y, MEAN: mean, INV_VAR: inv_var, NEXT_MEAN: next_mean, NEXT_VAR: next_var}
    graph.execute(pack, workspace)

    xs = f64(x)
    m = xs.mean(axis=(0, 2, 3), keepdims=True)
    var = xs.var(axis=(0, 2, 3), keepdims=True)
    inv = 1 / np.sqrt(var + 1e-3)
    count = n * h * w
    return [
        Result("BN::Y", y, (xs - m) * inv * f64(scale) + f64(bias), DataType.HALF),
        Result("BN::MEAN", mean, m, DataType.FLOAT),
        Result("BN::INV_VARIANCE", inv_var, inv, DataType.FLOAT),
        Result("BN::NEXT_RUNNING_MEAN", next_mean, 0.9 * f64(running_mean) + 0.1 * m, DataType.FLOAT),
        Result(
            "BN::NEXT_RUNNING_VAR", next_var, 0.9 * f64(running_var) + 0.1 * var * count / (count - 1), DataType.FLOAT
        ),
    ]


def layernorm_forward_backward(device: str) -> list[Result]:
    """The frontend's layer norm samples: a [B*S, H, 1, 1] channels-last input, tensor_like
    everywhere (a CPU epsilon becomes pass-by-value); the backward graph fed by uids."""
    torch.manual_seed(3)
    rows, hidden = 24, 64
    x = torch.randn(rows, hidden, 1, 1, dtype=torch.float32, device=device).to(memory_format=torch.channels_last)
    scale = torch.randn(1, hidden, 1, 1, device=device).to(memory_format=torch.channels_last)
    bias = torch.randn(1, hidden, 1, 1, device=device).to(memory_format=torch.channels_last)
    epsilon_cpu = torch.full((1, 1, 1, 1), 1e-5, dtype=torch.float32)

    forward = cudnn.pygraph(intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    X = forward.tensor_like(x.detach())
    SCALE = forward.tensor_like(scale.detach())
    BIAS = forward.tensor_like(bias.detach())
    EPSILON = forward.tensor_like(epsilon_cpu)
    Y, MEAN, INV_VAR = forward.layernorm(
        name="LN",
        norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
        input=X,
        scale=SCALE,
        bias=BIAS,
        epsilon=EPSILON,
    )
    Y.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    MEAN.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    INV_VAR.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    forward.build([cudnn.heur_mode.A])
    y = torch.empty_like(x)
    mean = torch.empty(rows, 1, 1, 1, device=device)
    inv_var = torch.empty(rows, 1, 1, 1, device=device)
    workspace = torch.empty(forward.get_workspace_size(), device=device, dtype=torch.uint8)
    forward.execute(
        {X: x, SCALE: scale, BIAS: bias, EPSILON: epsilon_cpu, Y: y, MEAN: mean, INV_VAR: inv_var}, workspace
    )

    dy = torch.randn_like(x)
    backward = cudnn.pygraph(intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    DY = backward.tensor_like(dy)
    X_BWD = backward.tensor_like(x)
    SCALE_BWD = backward.tensor_like(scale)
    MEAN_BWD = backward.tensor_like(mean)
    INV_VAR_BWD = backward.tensor_like(inv_var)
    DX, DSCALE, DBIAS = backward.layernorm_backward(
        name="DLN", grad=DY, input=X_BWD, scale=SCALE_BWD, mean=MEAN_BWD, inv_variance=INV_VAR_BWD
    )
    for t in (DX, DSCALE, DBIAS):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    backward.build([cudnn.heur_mode.A])
    dx, dscale, dbias = torch.empty_like(x), torch.empty_like(scale), torch.empty_like(bias)
    by_uid = {t.get_uid(): v for t, v in ((DY, dy), (X_BWD, x), (SCALE_BWD, scale), (MEAN_BWD, mean))}
    by_uid |= {t.get_uid(): v for t, v in ((INV_VAR_BWD, inv_var), (DX, dx), (DSCALE, dscale), (DBIAS, dbias))}
    workspace = torch.empty(backward.get_workspace_size(), device=device, dtype=torch.uint8)
    backward.execute(by_uid, workspace)

    x64 = torch.from_numpy(f64(x).reshape(rows, hidden)).requires_grad_()
    s64 = torch.from_numpy(f64(scale).reshape(hidden)).requires_grad_()
    b64 = torch.from_numpy(f64(bias).reshape(hidden)).requires_grad_()
    out = torch.nn.functional.layer_norm(x64, (hidden,), s64, b64, eps=1e-5)
    out.backward(torch.from_numpy(f64(dy).reshape(rows, hidden)))
    assert x64.grad is not None and s64.grad is not None and b64.grad is not None
    xs = f64(x).reshape(rows, hidden)
    return [
        Result("LN::Y", y, out.detach().numpy().reshape(rows, hidden, 1, 1), DataType.FLOAT),
        Result("LN::MEAN", mean, xs.mean(axis=1).reshape(rows, 1, 1, 1), DataType.FLOAT),
        Result("LN::INV_VARIANCE", inv_var, 1 / np.sqrt(xs.var(axis=1) + 1e-5).reshape(rows, 1, 1, 1), DataType.FLOAT),
        Result("DLN::DX", dx, x64.grad.numpy().reshape(rows, hidden, 1, 1), DataType.FLOAT),
        Result("DLN::DSCALE", dscale, s64.grad.numpy().reshape(1, hidden, 1, 1), DataType.FLOAT),
        Result("DLN::DBIAS", dbias, b64.grad.numpy().reshape(1, hidden, 1, 1), DataType.FLOAT),
    ]


def rmsnorm_inference(device: str) -> list[Result]:
    """RMS norm in inference, bias None, bf16 input; the pack keyed by tensor names."""
    torch.manual_seed(4)
    rows, hidden = 32, 128
    x = torch.randn(rows, hidden, 1, 1, dtype=torch.bfloat16, device=device)
    scale = torch.randn(1, hidden, 1, 1, dtype=torch.float32, device=device)
    epsilon_cpu = torch.full((1, 1, 1, 1), 1e-6, dtype=torch.float32)

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    X = graph.tensor(name="X", dim=list(x.shape), stride=list(x.stride()), data_type=cudnn.data_type.BFLOAT16)
    SCALE = graph.tensor_like(scale, name="scale")
    EPSILON = graph.tensor_like(epsilon_cpu, name="epsilon")
    Y, INV_VAR = graph.rmsnorm(
        name="RMS",
        norm_forward_phase=cudnn.norm_forward_phase.INFERENCE,
        input=X,
        scale=SCALE,
        bias=None,
        epsilon=EPSILON,
    )
    assert INV_VAR is None
    Y.set_output(True)
    graph.build([cudnn.heur_mode.A])
    y = torch.empty_like(x)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({"X": x, "scale": scale, "epsilon": epsilon_cpu, "RMS::Y": y}, workspace)

    xs = f64(x)
    want = xs / np.sqrt((xs**2).mean(axis=1, keepdims=True) + 1e-6) * f64(scale)
    return [Result("RMS::Y", y, want, DataType.BFLOAT16)]


def matmul_bias(device: str) -> list[Result]:
    """Batched matmul + bias, executed with raw ``data_ptr()`` integers as buffers."""
    torch.manual_seed(5)
    batch, m, k, n = 2, 16, 32, 24
    a = torch.randn(batch, m, k, dtype=torch.half, device=device)
    b = torch.randn(batch, k, n, dtype=torch.half, device=device)
    bias = torch.randn(1, 1, n, dtype=torch.half, device=device)

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    A = graph.tensor(name="A", dim=a.size(), stride=a.stride(), data_type=a.dtype)
    B = graph.tensor(name="B", dim=b.size(), stride=b.stride(), data_type=b.dtype)
    BIAS = graph.tensor(name="bias", dim=bias.size(), stride=bias.stride(), data_type=bias.dtype)
    C = graph.matmul(name="matmul", A=A, B=B)
    D = graph.add(name="add", a=C, b=BIAS)
    D.set_output(True).set_data_type(cudnn.data_type.HALF)
    graph.build([cudnn.heur_mode.A])
    d = torch.empty(batch, m, n, dtype=torch.half, device=device)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    pack = {A: a.data_ptr(), B: b.data_ptr(), BIAS: bias.data_ptr(), D: d.data_ptr()}
    graph.execute(pack, workspace.data_ptr())
    return [Result("add::OUT_0", d, f64(a) @ f64(b) + f64(bias), DataType.HALF)]


def genstats(device: str) -> list[Result]:
    """Per-channel sum and sum of squares of an NHWC activation."""
    torch.manual_seed(6)
    x = torch.randn(8, 32, 5, 5, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    X = graph.tensor_like(x)
    SUM, SQ_SUM = graph.genstats(name="genstats", input=X)
    SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    SQ_SUM.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.build([cudnn.heur_mode.A])
    total = torch.empty(1, 32, 1, 1, device=device)
    squares = torch.empty(1, 32, 1, 1, device=device)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({X: x, SUM: total, SQ_SUM: squares}, workspace)
    xs = f64(x)
    return [
        Result("genstats::SUM", total, xs.sum(axis=(0, 2, 3), keepdims=True), DataType.FLOAT),
        Result("genstats::SQ_SUM", squares, (xs**2).sum(axis=(0, 2, 3), keepdims=True), DataType.FLOAT),
    ]


def moe_grouped_matmul(device: str) -> list[Result]:
    """The frontend's MoE layout: token [1, S, K], weight [E, K, N] with K contiguous, offsets
    [E, 1, 1] int32 (an expert without rows among them); mode NONE, and GATHER picking rows by
    token_index [1, S', 1]."""
    torch.manual_seed(9)
    experts, rows, k, n, picked = 4, 40, 64, 48, 56
    token = torch.randn(1, rows, k, dtype=torch.bfloat16, device=device)
    weight = torch.randn(experts, n, k, dtype=torch.bfloat16, device=device).transpose(1, 2)  # K contiguous
    offsets = torch.tensor([0, 9, 9, 25], dtype=torch.int32, device=device).view(experts, 1, 1)
    picks = torch.randint(0, rows, (1, picked, 1), dtype=torch.int32, device=device)
    gathered_offsets = torch.tensor([0, 20, 31, 31], dtype=torch.int32, device=device).view(experts, 1, 1)

    graph = cudnn.pygraph(intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    TOKEN, WEIGHT = graph.tensor_like(token), graph.tensor_like(weight)
    OFFSETS, GATHERED_OFFSETS, INDEX = (
        graph.tensor_like(offsets),
        graph.tensor_like(gathered_offsets),
        graph.tensor_like(picks),
    )
    Y = graph.moe_grouped_matmul(TOKEN, WEIGHT, OFFSETS, mode=cudnn.moe_grouped_matmul_mode.NONE, name="moe")
    G = graph.moe_grouped_matmul(
        token=TOKEN,
        weight=WEIGHT,
        first_token_offset=GATHERED_OFFSETS,
        token_index=INDEX,
        mode=cudnn.moe_grouped_matmul_mode.GATHER,
        name="moe_gather",
    )
    for out in (Y, G):
        out.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    graph.build([cudnn.heur_mode.A])
    y = torch.empty(1, rows, n, dtype=torch.bfloat16, device=device)
    g = torch.empty(1, picked, n, dtype=torch.bfloat16, device=device)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    pack = {TOKEN: token, WEIGHT: weight, OFFSETS: offsets, GATHERED_OFFSETS: gathered_offsets, INDEX: picks}
    graph.execute(pack | {Y: y, G: g}, workspace)

    def grouped(rows_in: np.ndarray, firsts: list[int]) -> np.ndarray:
        bounds = [*firsts, len(rows_in)]
        w = f64(weight)
        return np.concatenate([rows_in[a:b] @ w[e] for e, (a, b) in enumerate(itertools.pairwise(bounds))])[None]

    tokens = f64(token)[0]
    return [
        Result("moe::Output", y, grouped(tokens, [0, 9, 9, 25]), DataType.BFLOAT16),
        Result(
            "moe_gather::Output",
            g,
            grouped(tokens[f64(picks).astype(int)[0, :, 0]], [0, 20, 31, 31]),
            DataType.BFLOAT16,
        ),
    ]


def sdpa(device: str) -> list[Result]:
    """The frontend's causal SDPA sample: BSHD tensors seen as [B, H, S, D] through strides,
    a Python float attention scale, training statistics."""
    torch.manual_seed(7)
    b, h, s, d = 2, 3, 32, 16
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.half, device=device).transpose(1, 2) for _ in range(3))
    attn_scale = d**-0.5

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    Q = graph.tensor_like(q)
    K = graph.tensor_like(k)
    V = graph.tensor_like(v)
    OUT, STATS = graph.sdpa(
        name="sdpa", q=Q, k=K, v=V, generate_stats=True, attn_scale=attn_scale, use_causal_mask=True
    )
    o = torch.empty(b, s, h, d, dtype=torch.half, device=device).transpose(1, 2)
    OUT.set_output(True).set_dim(o.size()).set_stride(o.stride())
    STATS.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.build([cudnn.heur_mode.A])
    stats = torch.empty(b, h, s, 1, dtype=torch.float32, device=device)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({Q: q, K: k, V: v, OUT: o, STATS: stats}, workspace)

    scores = np.einsum("bhqd,bhkd->bhqk", f64(q), f64(k)) * attn_scale
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True))
    want = np.einsum("bhqk,bhkd->bhqd", np.exp(scores - lse), f64(v))
    return [Result("sdpa::O", o, want, DataType.HALF), Result("sdpa::Stats", stats, lse, DataType.FLOAT)]


def sdpa_backward(device: str) -> list[Result]:
    """The frontend's SDPA backward sample: a forward graph saves O and Stats, a backward graph
    takes them with dO (GQA, causal, BSHD strides); gradients against torch's CPU autograd."""
    torch.manual_seed(9)
    b, h, h_kv, s, d = 2, 4, 2, 48, 32
    q = torch.randn(b, s, h, d, dtype=torch.half, device=device).transpose(1, 2)
    k, v = (torch.randn(b, s, h_kv, d, dtype=torch.half, device=device).transpose(1, 2) for _ in range(2))
    d_o = torch.randn(b, s, h, d, dtype=torch.half, device=device).transpose(1, 2)
    attn_scale = d**-0.5
    types = dict(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )

    forward = cudnn.pygraph(**types)
    Q, K, V = (forward.tensor_like(t) for t in (q, k, v))
    OUT, STATS = forward.sdpa(
        name="sdpa", q=Q, k=K, v=V, generate_stats=True, attn_scale=attn_scale, use_causal_mask=True
    )
    o = torch.empty_like(q)
    OUT.set_output(True).set_dim(o.size()).set_stride(o.stride())
    STATS.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    forward.build([cudnn.heur_mode.A])
    stats = torch.empty(b, h, s, 1, dtype=torch.float32, device=device)
    forward.execute({Q: q, K: k, V: v, OUT: o, STATS: stats})

    backward = cudnn.pygraph(**types)
    Q, K, V, OUT, DO = (backward.tensor_like(t) for t in (q, k, v, o, d_o))
    S = backward.tensor_like(stats)
    DQ, DK, DV = backward.sdpa_backward(
        name="sdpa_backward", q=Q, k=K, v=V, o=OUT, dO=DO, stats=S, attn_scale=attn_scale, use_causal_mask=True
    )
    grads = [torch.empty_like(t) for t in (q, k, v)]
    for tensor, grad in zip((DQ, DK, DV), grads):
        tensor.set_output(True).set_dim(grad.size()).set_stride(grad.stride())
    backward.build([cudnn.heur_mode.A])
    workspace = torch.empty(backward.get_workspace_size(), device=device, dtype=torch.uint8)
    backward.execute({Q: q, K: k, V: v, OUT: o, DO: d_o, S: stats, DQ: grads[0], DK: grads[1], DV: grads[2]}, workspace)

    leaves = [t.detach().to("cpu", torch.float64).requires_grad_(True) for t in (q, k, v)]
    scores = leaves[0] @ leaves[1].repeat_interleave(2, 1).transpose(-1, -2) * attn_scale
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -torch.inf)
    out = torch.softmax(scores, -1) @ leaves[2].repeat_interleave(2, 1)
    out.backward(d_o.to("cpu", torch.float64))
    return [
        Result(f"sdpa_backward::{name}", grad, f64(leaf.grad), DataType.HALF)
        for name, grad, leaf in zip(("dQ", "dK", "dV"), grads, leaves)
    ]


def high_level_graph(device: str) -> list[Result]:
    """The frontend's ``cudnn.Graph``: framework tensors as op arguments, ``inputs=`` and
    ``outputs=`` naming the call's order, the built graph called with new buffers."""
    torch.manual_seed(8)
    x = torch.randn(4, 32, 5, 5, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(16, 32, 3, 3, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    b = torch.randn(1, 16, 1, 1, dtype=torch.half, device=device)
    with cudnn.Graph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        inputs=["conv2d::image", "conv2d::weight", b],
        outputs=["act::OUT_0"],
    ) as graph:
        y = graph.conv_fprop(image=x, weight=w, padding=[1, 1], stride=[1, 1], dilation=[1, 1], name="conv2d")
        y = graph.bias(input=y, bias=b)
        y = graph.relu(y, name="act")
        y.set_output(True).set_data_type(cudnn.data_type.HALF)

    x2 = torch.randn_like(x)
    out = graph(x2, w, b)
    by_name = graph({"conv2d::image": x, "conv2d::weight": w, "bias.0::bias": b})
    want = [
        np.maximum(
            torch.nn.functional.conv2d(torch.from_numpy(f64(image)), torch.from_numpy(f64(w)), padding=1).numpy()
            + f64(b),
            0,
        )
        for image in (x2, x)
    ]
    return [
        Result("act::OUT_0 (positional)", out, want[0], DataType.HALF),
        Result("act::OUT_0 (by name)", by_name["act::OUT_0"], want[1], DataType.HALF),
    ]


def conv_backward(device: str) -> list[Result]:
    """Data and weight gradients of a strided convolution; DW's dims set by the user, as
    the frontend asks."""
    torch.manual_seed(9)
    x = torch.randn(2, 8, 9, 9, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3, dtype=torch.half, device=device).to(memory_format=torch.channels_last)
    dy = torch.randn(2, 16, 5, 5, dtype=torch.half, device=device).to(memory_format=torch.channels_last)

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    DY, W, X = graph.tensor_like(dy), graph.tensor_like(w), graph.tensor_like(x)
    DX = graph.conv_dgrad(loss=DY, filter=W, padding=[1, 1], stride=[2, 2], dilation=[1, 1], name="dgrad")
    DX.set_output(True).set_dim(x.size()).set_stride(x.stride())
    DW = graph.conv_wgrad(image=X, loss=DY, padding=[1, 1], stride=[2, 2], dilation=[1, 1], name="wgrad")
    DW.set_output(True).set_dim(w.size()).set_stride(w.stride())
    graph.build([cudnn.heur_mode.A])
    dx, dw = torch.empty_like(x), torch.empty_like(w)
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({DY: dy, W: w, X: x, DX: dx, DW: dw}, workspace)

    x64 = torch.from_numpy(f64(x)).requires_grad_()
    w64 = torch.from_numpy(f64(w)).requires_grad_()
    torch.nn.functional.conv2d(x64, w64, padding=1, stride=2).backward(torch.from_numpy(f64(dy)))
    assert x64.grad is not None and w64.grad is not None
    return [
        Result("dgrad::DX", dx, x64.grad.numpy(), DataType.HALF),
        Result("wgrad::DW", dw, w64.grad.numpy(), DataType.HALF),
    ]


def norms_inference_and_backward(device: str) -> list[Result]:
    """Batch norm inference, instance norm inference, and the batch and RMS norm
    backwards from saved statistics, in one graph."""
    torch.manual_seed(10)
    n, c, h, w = 4, 8, 3, 3
    x = torch.randn(n, c, h, w, device=device)
    dy = torch.randn(n, c, h, w, device=device)
    scale, bias = torch.randn(1, c, 1, 1, device=device), torch.randn(1, c, 1, 1, device=device)
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    inv_var = (x.var(dim=(0, 2, 3), keepdim=True, unbiased=False) + 1e-5).rsqrt()
    rms_inv = (x.square().mean(dim=(1, 2, 3), keepdim=True) + 1e-5).rsqrt()
    rms_scale = torch.randn(1, c, h, w, device=device)
    epsilon_cpu = torch.full((1, 1, 1, 1), 1e-5)

    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    X, DY, SCALE, BIAS = (graph.tensor_like(t) for t in (x, dy, scale, bias))
    MEAN, INV_VAR, RMS_INV, RMS_SCALE = (graph.tensor_like(t) for t in (mean, inv_var, rms_inv, rms_scale))
    EPSILON = graph.tensor_like(epsilon_cpu)
    BN = graph.batchnorm_inference(X, MEAN, INV_VAR, SCALE, BIAS, name="bn")
    IN, IN_MEAN, IN_INV_VAR = graph.instancenorm(cudnn.norm_forward_phase.INFERENCE, X, SCALE, BIAS, EPSILON, name="in")
    DX, DSCALE, DBIAS = graph.batchnorm_backward(DY, X, SCALE, MEAN, INV_VAR, name="dbn")
    RMS_DX, RMS_DSCALE, RMS_DBIAS = graph.rmsnorm_backward(DY, X, RMS_SCALE, RMS_INV, False, name="drms")
    assert IN_MEAN is None and IN_INV_VAR is None and RMS_DBIAS is None
    outputs = {BN: x, IN: x, DX: x, DSCALE: scale, DBIAS: bias, RMS_DX: x, RMS_DSCALE: rms_scale}
    for t in outputs:
        t.set_output(True)
    graph.build([cudnn.heur_mode.A])
    buffers = {t: torch.empty_like(like) for t, like in outputs.items()}
    pack = {X: x, DY: dy, SCALE: scale, BIAS: bias, MEAN: mean, INV_VAR: inv_var, RMS_INV: rms_inv}
    pack |= {RMS_SCALE: rms_scale, EPSILON: epsilon_cpu, **buffers}
    graph.execute(pack, torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8))

    xs, sc, bi = f64(x), f64(scale), f64(bias)
    instance = (xs - xs.mean(axis=(2, 3), keepdims=True)) / np.sqrt(xs.var(axis=(2, 3), keepdims=True) + 1e-5)
    x64, s64, b64 = (torch.from_numpy(a).requires_grad_() for a in (xs, sc.reshape(c), bi.reshape(c)))
    torch.nn.functional.batch_norm(x64, None, None, s64, b64, training=True, eps=1e-5).backward(
        torch.from_numpy(f64(dy))
    )
    r64, rs64 = torch.from_numpy(xs).requires_grad_(), torch.from_numpy(f64(rms_scale)).requires_grad_()
    rms = r64 * (r64.square().mean(dim=(1, 2, 3), keepdim=True) + 1e-5).rsqrt() * rs64
    rms.backward(torch.from_numpy(f64(dy)))
    grads = [g.grad for g in (x64, s64, b64, r64, rs64)]
    assert all(g is not None for g in grads)
    dx, dscale, dbias, rms_dx, rms_dscale = (g.numpy() for g in grads if g is not None)
    return [
        Result("bn::Y", buffers[BN], (xs - f64(mean)) * f64(inv_var) * sc + bi, DataType.FLOAT),
        Result("in::Y", buffers[IN], instance * sc + bi, DataType.FLOAT),
        Result("dbn::DX", buffers[DX], dx, DataType.FLOAT),
        Result("dbn::DSCALE", buffers[DSCALE], dscale.reshape(1, c, 1, 1), DataType.FLOAT),
        Result("dbn::DBIAS", buffers[DBIAS], dbias.reshape(1, c, 1, 1), DataType.FLOAT),
        Result("drms::DX", buffers[RMS_DX], rms_dx, DataType.FLOAT),
        Result("drms::DSCALE", buffers[RMS_DSCALE], rms_dscale, DataType.FLOAT),
    ]


def adaptive_and_instance_norm_training(device: str) -> list[Result]:
    """The frontend's adaptive layer norm sample (training forward, then the backward from its
    saved statistics; scale and bias per sample) and instance norm backward, checked against
    torch's CPU autograd in float64."""
    torch.manual_seed(12)
    batch, seq, hidden = 2, 5, 24
    x = torch.randn(batch, seq, hidden, device=device)
    scale, bias = torch.randn(batch, 1, hidden, device=device), torch.randn(batch, 1, hidden, device=device)
    dy = torch.randn(batch, seq, hidden, device=device)
    n, c, h, w = 2, 3, 4, 5
    image, dimage = torch.randn(n, c, h, w, device=device), torch.randn(n, c, h, w, device=device)
    gamma = torch.randn(1, c, 1, 1, device=device)
    image_mean = image.mean(dim=(2, 3), keepdim=True)
    image_inv = (image.var(dim=(2, 3), keepdim=True, unbiased=False) + 1e-5).rsqrt()
    epsilon_cpu = torch.full((1, 1, 1), 1e-5)

    forward = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    X, SCALE, BIAS, EPSILON = (forward.tensor_like(t) for t in (x, scale, bias, epsilon_cpu))
    Y, MEAN, INV_VAR = forward.adalayernorm(
        norm_forward_phase=cudnn.norm_forward_phase.TRAINING,
        input=X,
        scale=SCALE,
        bias=BIAS,
        epsilon=EPSILON,
        name="AdaLN",
    )
    for t in (Y, MEAN, INV_VAR):
        t.set_output(True)
    forward.build([cudnn.heur_mode.A])
    y = torch.empty_like(x)
    mean, inv_var = torch.empty(batch, seq, 1, device=device), torch.empty(batch, seq, 1, device=device)
    pack = {X: x, SCALE: scale, BIAS: bias, EPSILON: epsilon_cpu, Y: y, MEAN: mean, INV_VAR: inv_var}
    forward.execute(pack, torch.empty(forward.get_workspace_size(), device=device, dtype=torch.uint8))

    backward = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)
    DY, X_BWD, SCALE_BWD, MEAN_BWD, INV_BWD = (backward.tensor_like(t) for t in (dy, x, scale, mean, inv_var))
    DX, DSCALE, DBIAS = backward.adalayernorm_backward(DY, X_BWD, SCALE_BWD, MEAN_BWD, INV_BWD, name="DAdaLN")
    DIMAGE, X_IN, GAMMA, MEAN_IN, INV_IN = (
        backward.tensor_like(t) for t in (dimage, image, gamma, image_mean, image_inv)
    )
    IN_DX, IN_DSCALE, IN_DBIAS = backward.instancenorm_backward(
        grad=DIMAGE, input=X_IN, scale=GAMMA, mean=MEAN_IN, inv_variance=INV_IN, name="DIN"
    )
    outputs = {DX: x, DSCALE: scale, DBIAS: bias, IN_DX: image, IN_DSCALE: gamma, IN_DBIAS: gamma}
    for t in outputs:
        t.set_output(True)
    backward.build([cudnn.heur_mode.A])
    buffers = {t: torch.empty_like(like) for t, like in outputs.items()}
    pack = {DY: dy, X_BWD: x, SCALE_BWD: scale, MEAN_BWD: mean, INV_BWD: inv_var, DIMAGE: dimage, X_IN: image}
    pack |= {GAMMA: gamma, MEAN_IN: image_mean, INV_IN: image_inv, **buffers}
    backward.execute(pack, torch.empty(backward.get_workspace_size(), device=device, dtype=torch.uint8))

    x64, s64, b64 = (torch.from_numpy(f64(t)).requires_grad_() for t in (x, scale, bias))
    ada = torch.nn.functional.layer_norm(x64, (hidden,), eps=1e-5) * s64 + b64
    ada.backward(torch.from_numpy(f64(dy)))
    i64, g64 = torch.from_numpy(f64(image)).requires_grad_(), torch.from_numpy(f64(gamma).reshape(c)).requires_grad_()
    beta64 = torch.zeros(c, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.instance_norm(i64, weight=g64, bias=beta64, eps=1e-5).backward(torch.from_numpy(f64(dimage)))
    grads = [t.grad for t in (x64, s64, b64, i64, g64, beta64)]
    assert all(g is not None for g in grads)
    dx, dscale, dbias, in_dx, in_dscale, in_dbias = (g.numpy() for g in grads if g is not None)
    xs = f64(x)
    return [
        Result("AdaLN::Y", y, ada.detach().numpy(), DataType.FLOAT),
        Result("AdaLN::MEAN", mean, xs.mean(axis=2, keepdims=True), DataType.FLOAT),
        Result("AdaLN::INV_VARIANCE", inv_var, 1 / np.sqrt(xs.var(axis=2, keepdims=True) + 1e-5), DataType.FLOAT),
        Result("DAdaLN::DX", buffers[DX], dx, DataType.FLOAT),
        Result("DAdaLN::DSCALE", buffers[DSCALE], dscale, DataType.FLOAT),
        Result("DAdaLN::DBIAS", buffers[DBIAS], dbias, DataType.FLOAT),
        Result("DIN::DX", buffers[IN_DX], in_dx, DataType.FLOAT),
        Result("DIN::DSCALE", buffers[IN_DSCALE], in_dscale.reshape(1, c, 1, 1), DataType.FLOAT),
        Result("DIN::DBIAS", buffers[IN_DBIAS], in_dbias.reshape(1, c, 1, 1), DataType.FLOAT),
    ]


def rope_in_place(device: str) -> list[Result]:
    """Rotary position embedding written over its input (the output's buffer is the
    input's), from slices, pointwise ops and a concatenation."""
    torch.manual_seed(11)
    b, h, s, d = 2, 4, 16, 32
    x = torch.randn(b, h, s, d, dtype=torch.half, device=device)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(d // 2) / (d // 2))
    cos = angles.cos().float().reshape(1, 1, s, d // 2).to(device)
    sin = angles.sin().float().reshape(1, 1, s, d // 2).to(device)
    before = f64(x)

    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    X, COS, SIN = graph.tensor_like(x), graph.tensor_like(cos), graph.tensor_like(sin)
    whole = [slice(0, b), slice(0, h), slice(0, s)]
    X1 = graph.slice(X, slices=[*whole, slice(0, d // 2)])
    X2 = graph.slice(X, slices=[*whole, slice(d // 2, d)])
    OUT1 = graph.sub(a=graph.mul(a=X1, b=COS), b=graph.mul(a=X2, b=SIN))
    OUT2 = graph.add(a=graph.mul(a=X2, b=COS), b=graph.mul(a=X1, b=SIN))
    Y = graph.concatenate([OUT1, OUT2], axis=3, name="rope")
    Y.set_output(True).set_stride(x.stride())
    graph.build([cudnn.heur_mode.A])
    workspace = torch.empty(graph.get_workspace_size(), device=device, dtype=torch.uint8)
    graph.execute({X: x, COS: cos, SIN: sin, Y: x}, workspace)

    x1, x2 = before[..., : d // 2], before[..., d // 2 :]
    c, sn = f64(cos), f64(sin)
    want = np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], axis=3)
    return [Result("rope::Y (in place)", x, want, DataType.HALF)]


def _ragged_offsets(lengths: list[int], token: int) -> torch.Tensor:
    """The frontend's ragged offsets: [B + 1, 1, 1, 1] element offsets of cumulative tokens."""
    tokens = np.concatenate([[0], np.cumsum(lengths)])
    return torch.tensor(tokens * token, dtype=torch.int32).reshape(-1, 1, 1, 1)


def _dense_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence alone ([1, H, s, d] tensors) through the dense frontend sdpa: causal, with Stats."""
    graph = _half_graph()
    Q, K, V = (graph.tensor_like(t) for t in (q, k, v))
    OUT, STATS = graph.sdpa(q=Q, k=K, v=V, generate_stats=True, attn_scale=scale, use_causal_mask=True)
    o = torch.empty_like(q)
    stats = torch.empty(*q.shape[:3], 1, dtype=torch.float32, device=q.device)
    OUT.set_output(True).set_dim(o.size()).set_stride(o.stride())
    STATS.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    graph.build([cudnn.heur_mode.A])
    graph.execute({Q: q, K: k, V: v, OUT: o, STATS: stats})
    return o, stats


def sdpa_ragged(device: str) -> list[Result]:
    """The frontend's ragged (THD) SDPA: Q, K, V, O and Stats declared [B, H, S, d] with BSHD
    strides and element offsets, the sequences packed at the front of [B, S, H, d] buffers;
    each sequence checked against the dense frontend sdpa run on it alone."""
    torch.manual_seed(11)
    b, h, s, d = 3, 2, 12, 16
    len_q, len_kv = [5, 12, 7], [9, 4, 12]
    scale = d**-0.5
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.half, device=device) for _ in range(3))
    graph = _half_graph()
    int32 = dict(data_type=cudnn.data_type.INT32)
    offsets = {name: graph.tensor(dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], name=name, **int32) for name in "QKVOS"}
    lengths = [graph.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], name=name, **int32) for name in ("sq", "skv")]
    bshd = [s * h * d, d, h * d, 1]
    Q, K, V = (graph.tensor(dim=[b, h, s, d], stride=bshd, ragged_offset=offsets[name], name=name) for name in "QKV")
    OUT, STATS = graph.sdpa(
        q=Q, k=K, v=V, generate_stats=True, attn_scale=scale, use_causal_mask=True, use_padding_mask=True,
        seq_len_q=lengths[0], seq_len_kv=lengths[1], name="sdpa",
    )  # fmt: skip
    OUT.set_output(True).set_dim([b, h, s, d]).set_stride(bshd).set_ragged_offset(offsets["O"])
    STATS.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_ragged_offset(offsets["S"])
    graph.build([cudnn.heur_mode.A])
    o = torch.zeros(b, s, h, d, dtype=torch.half, device=device)
    stats = torch.zeros(b * s, h, 1, dtype=torch.float32, device=device)  # a packed [T, H, 1] buffer
    pack = {Q: q, K: k, V: v, OUT: o, STATS: stats}
    pack |= {offsets[n]: _ragged_offsets(len_q, h * d) for n in "QO"}
    pack |= {offsets[n]: _ragged_offsets(len_kv, h * d) for n in "KV"} | {offsets["S"]: _ragged_offsets(len_q, h)}
    pack |= {lengths[0]: torch.tensor(len_q, dtype=torch.int32), lengths[1]: torch.tensor(len_kv, dtype=torch.int32)}
    graph.execute({key: value.to(device) for key, value in pack.items()})

    def sequences(buffer: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
        """Each sequence of a packed buffer as [1, H, s, d]."""
        tokens = buffer.reshape(b * s, h, -1)
        ends = np.cumsum(lengths)
        return [tokens[end - n : end].transpose(0, 1)[None] for n, end in zip(lengths, ends, strict=True)]

    alone = [
        _dense_sdpa(*qkv, scale)
        for qkv in zip(sequences(q, len_q), sequences(k, len_kv), sequences(v, len_kv), strict=True)
    ]
    total = sum(len_q)
    want_o = np.concatenate([f64(out[0].transpose(0, 1)) for out, _ in alone])
    want_stats = np.concatenate([f64(lse[0].transpose(0, 1)) for _, lse in alone])
    return [
        Result("sdpa::O (ragged)", o.reshape(b * s, h, d)[:total], want_o, DataType.HALF),
        Result("sdpa::Stats (ragged)", stats[:total], want_stats, DataType.FLOAT),
    ]


def _half_graph() -> cudnn.pygraph:
    return cudnn.pygraph(
        io_data_type=cudnn.data_type.HALF,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )


def _dense_sdpa_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_o: torch.Tensor, scale: float
) -> list[torch.Tensor]:
    """One sequence alone ([1, H, s, d] tensors) through the dense frontend sdpa and
    sdpa_backward, causal: [dQ, dK, dV]."""
    o, stats = _dense_sdpa(q, k, v, scale)
    graph = _half_graph()
    Q, K, V, OUT, DO = (graph.tensor_like(t) for t in (q, k, v, o, d_o))
    S = graph.tensor_like(stats)
    grads = graph.sdpa_backward(q=Q, k=K, v=V, o=OUT, dO=DO, stats=S, attn_scale=scale, use_causal_mask=True)
    buffers = [torch.empty_like(t) for t in (q, k, v)]
    for tensor, buffer in zip(grads, buffers, strict=True):
        assert tensor is not None
        tensor.set_output(True).set_dim(buffer.size()).set_stride(buffer.stride())
    graph.build([cudnn.heur_mode.A])
    graph.execute({Q: q, K: k, V: v, OUT: o, DO: d_o, S: stats} | dict(zip(grads, buffers, strict=True)))
    return buffers


def sdpa_backward_ragged(device: str) -> list[Result]:
    """The frontend's ragged SDPA backward: Q, K, V, O, dO, Stats and the gradients declared
    [B, H, S, d] with BSHD strides and element offsets (Stats [B, H, S, 1] token-major); O and
    Stats from the dense forward of each sequence; each sequence's gradients against the dense
    frontend sdpa_backward run on it alone."""
    torch.manual_seed(12)
    b, h, s, d = 3, 2, 10, 16
    len_q, len_kv = [4, 10, 6], [7, 3, 10]
    scale = d**-0.5
    q, k, v, d_o = (torch.randn(b, s, h, d, dtype=torch.half, device=device) for _ in range(4))

    def sequences(buffer: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
        tokens, ends = buffer.reshape(b * s, h, -1), np.cumsum(lengths)
        return [tokens[end - n : end].transpose(0, 1)[None] for n, end in zip(lengths, ends, strict=True)]

    def packed(parts: list[torch.Tensor], width: int, dtype: torch.dtype) -> torch.Tensor:
        """[B, S, H, width] with the [1, H, s, width] sequences at the front, zeros after."""
        out = torch.zeros(b * s, h, width, dtype=dtype, device=device)
        tokens = torch.cat([part[0].transpose(0, 1) for part in parts])
        out[: len(tokens)] = tokens
        return out.reshape(b, s, h, width)

    qs, ks, vs, dos = sequences(q, len_q), sequences(k, len_kv), sequences(v, len_kv), sequences(d_o, len_q)
    forward = [_dense_sdpa(*qkv, scale) for qkv in zip(qs, ks, vs, strict=True)]
    o = packed([out for out, _ in forward], d, torch.half)
    stats = packed([lse for _, lse in forward], 1, torch.float32)

    graph = _half_graph()
    int32 = dict(data_type=cudnn.data_type.INT32)
    names = ("Q", "K", "V", "O", "dO", "Stats", "dQ", "dK", "dV")
    offsets = {
        name: graph.tensor(dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], name=f"{name}_offsets", **int32) for name in names
    }
    lengths = [graph.tensor(dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], name=name, **int32) for name in ("sq", "skv")]
    bshd = [s * h * d, d, h * d, 1]
    Q, K, V, OUT, DO = (
        graph.tensor(dim=[b, h, s, d], stride=bshd, ragged_offset=offsets[name], name=name) for name in names[:5]
    )
    S = graph.tensor(
        dim=[b, h, s, 1], stride=[s * h, 1, h, 1], data_type=cudnn.data_type.FLOAT, ragged_offset=offsets["Stats"]
    )
    grads = graph.sdpa_backward(
        q=Q, k=K, v=V, o=OUT, dO=DO, stats=S, attn_scale=scale, use_causal_mask=True, use_padding_mask=True,
        seq_len_q=lengths[0], seq_len_kv=lengths[1], max_total_seq_len_q=sum(len_q),
        max_total_seq_len_kv=sum(len_kv), name="sdpa_backward",
    )  # fmt: skip
    for name, tensor in zip(names[6:], grads, strict=True):
        assert tensor is not None
        tensor.set_output(True).set_dim([b, h, s, d]).set_stride(bshd).set_ragged_offset(offsets[name])
    graph.build([cudnn.heur_mode.A])
    buffers = [torch.zeros(b, s, h, d, dtype=torch.half, device=device) for _ in range(3)]
    pack = {Q: q, K: k, V: v, OUT: o, DO: d_o, S: stats} | dict(zip(grads, buffers, strict=True))
    for name in names:
        side = len_kv if name in ("K", "V", "dK", "dV") else len_q
        pack[offsets[name]] = _ragged_offsets(side, h if name == "Stats" else h * d)
    pack |= {lengths[0]: torch.tensor(len_q, dtype=torch.int32), lengths[1]: torch.tensor(len_kv, dtype=torch.int32)}
    graph.execute({key: value.to(device) for key, value in pack.items()})

    alone = [_dense_sdpa_backward(*args, scale) for args in zip(qs, ks, vs, dos, strict=True)]
    results = []
    for i, (name, buffer) in enumerate(zip(names[6:], buffers, strict=True)):
        total = sum(len_kv if i else len_q)
        want = np.concatenate([f64(grad[i][0].transpose(0, 1)) for grad in alone])
        results.append(
            Result(f"sdpa_backward::{name} (ragged)", buffer.reshape(b * s, h, d)[:total], want, DataType.HALF)
        )
    return results


PROGRAMS: dict[str, Callable[[str], list[Result]]] = {
    program.__name__: program
    for program in (
        conv_bias_relu,
        batchnorm_training,
        layernorm_forward_backward,
        rmsnorm_inference,
        matmul_bias,
        genstats,
        moe_grouped_matmul,
        sdpa,
        sdpa_backward,
        sdpa_ragged,
        sdpa_backward_ragged,
        high_level_graph,
        conv_backward,
        norms_inference_and_backward,
        adaptive_and_instance_norm_training,
        rope_in_place,
    )
}
