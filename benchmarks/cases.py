"""The benchmark cases: each a graphdnn graph and the same computation in its peers.

A case knows its graph, the bytes and FLOPs its roofline counts, the PyTorch function
(timed eagerly and through torch.compile) that computes the same outputs from the same
named inputs, optionally a cuDNN frontend graph of the same fusion, and its target.
Inputs are shared: every peer reads the tensors graphdnn reads, with the same strides.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import graphdnn as gd
from benchmarks.classic import classic_cases

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from build_graphs import resnet50_bottleneck, transformer_block

Tensors = dict[str, Any]
EPS = 1e-5  # torch's batch_norm wants a positive epsilon; variances are derived to cancel it


@dataclass(frozen=True)
class Case:
    name: str
    graph: Callable[[], gd.OperationGraphSpec]
    torch_fn: Callable[[Tensors], Any]  # named inputs -> outputs
    bytes: int
    flops: int = 0
    target: str = ""
    cudnn: Callable[[Tensors, Tensors], Callable[[], Any]] | None = None  # (inputs, outputs) -> runner
    cudnn_anchor: Callable[[Tensors, Tensors], Callable[[], Any]] | None = None  # cuDNN's anchor op alone
    group: str = "kernels"
    extra: dict[str, Any] = field(default_factory=dict)


# -- layernorm + GELU(tanh) --------------------------------------------------------------------
def _rows(g: gd.OperationGraphSpec, rows: int, max_rows: int) -> int | gd.Sym:
    """``rows``, or with ``max_rows``, the symbol rows in 1..max_rows (a dynamic graph)."""
    return g.dim("rows", 1, max_rows) if max_rows else rows


def _ln_gelu_graph(rows: int, hidden: int, max_rows: int = 0) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        name = f"ln_gelu_{f'dyn{max_rows}' if max_rows else rows}x{hidden}"
        g = gd.OperationGraphSpec(name=name, io_data_type="bf16")
        x = g.tensor(name="x", dim=[_rows(g, rows, max_rows), hidden])
        y = g.layernorm(
            "inference", x, g.tensor(name="scale", dim=[1, hidden]), g.tensor(name="bias", dim=[1, hidden]), 1e-5
        )[0]
        g.gelu_approx_tanh(y).set_name("y").set_output(True)
        return g

    return build


def _ln_gelu_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    hidden = t["x"].shape[-1]
    y = F.layer_norm(t["x"], (hidden,), t["scale"].view(hidden), t["bias"].view(hidden), 1e-5)
    return F.gelu(y, approximate="tanh")


def _ln_gelu_cudnn(t: Tensors, out: Tensors, *, gelu: bool = True) -> Callable[[], Any]:
    import cudnn

    rows, hidden = t["x"].shape
    graph, handle = _cudnn_graph()
    row = [hidden, 1, hidden, hidden]
    x = graph.tensor(name="x", dim=[rows, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    scale = graph.tensor(name="scale", dim=[1, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    bias = graph.tensor(name="bias", dim=[1, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    eps = graph.tensor(
        name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT, is_pass_by_value=True
    )
    y, _, _ = graph.layernorm(
        norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=x, scale=scale, bias=bias, epsilon=eps
    )
    if gelu:
        y = graph.gelu_approx_tanh(input=y)
    y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    pack = {x: t["x"], scale: t["scale"], bias: t["bias"], eps: _host_scalar(1e-5), y: out["y"]}
    return _cudnn_runner(graph, handle, pack)


def _ln_cudnn(t: Tensors, out: Tensors) -> Callable[[], Any]:
    return _ln_gelu_cudnn(t, out, gelu=False)


# -- add + RMSNorm -----------------------------------------------------------------------------
def _add_rms_graph(rows: int, hidden: int, max_rows: int = 0) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        name = f"add_rmsnorm_{f'dyn{max_rows}' if max_rows else rows}x{hidden}"
        g = gd.OperationGraphSpec(name=name, io_data_type="bf16")
        n = _rows(g, rows, max_rows)
        x, r = g.tensor(name="x", dim=[n, hidden]), g.tensor(name="residual_in", dim=[n, hidden])
        s = g.add(x, r).set_name("residual").set_output(True)
        g.rmsnorm("inference", s, g.tensor(name="scale", dim=[1, hidden]), epsilon=1e-6)[0].set_name("y").set_output(
            True
        )  # type: ignore[union-attr]
        return g

    return build


def _add_rms_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    hidden = t["x"].shape[-1]
    s = t["x"] + t["residual_in"]
    return s, F.rms_norm(s, (hidden,), t["scale"].view(hidden), 1e-6)


def _add_rms_cudnn(t: Tensors, out: Tensors) -> Callable[[], Any]:
    import cudnn

    rows, hidden = t["x"].shape
    graph, handle = _cudnn_graph()
    row = [hidden, 1, hidden, hidden]
    x = graph.tensor(name="x", dim=[rows, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    r = graph.tensor(name="r", dim=[rows, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    scale = graph.tensor(name="scale", dim=[1, hidden, 1, 1], stride=row, data_type=cudnn.data_type.BFLOAT16)
    eps = graph.tensor(
        name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT, is_pass_by_value=True
    )
    s = graph.add(a=x, b=r)
    s.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    y, _ = graph.rmsnorm(
        norm_forward_phase=cudnn.norm_forward_phase.INFERENCE, input=s, scale=scale, bias=None, epsilon=eps
    )
    y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    pack = {x: t["x"], r: t["residual_in"], scale: t["scale"], eps: _host_scalar(1e-6), s: out["residual"], y: out["y"]}
    return _cudnn_runner(graph, handle, pack)


# -- layernorm / RMSNorm backward ------------------------------------------------------------------
def _norm_bwd_graph(rows: int, hidden: int, rms: bool) -> Callable[[], gd.OperationGraphSpec]:
    def build() -> gd.OperationGraphSpec:
        kind = "rmsnorm" if rms else "layernorm"
        g = gd.OperationGraphSpec(name=f"{kind}_backward_{rows}x{hidden}", io_data_type="bf16")
        dy, x = g.tensor(name="dy", dim=[rows, hidden]), g.tensor(name="x", dim=[rows, hidden])
        scale = g.tensor(name="scale", dim=[1, hidden])
        inv = g.tensor(name="inv_variance", dim=[rows, 1], data_type="float")
        if rms:
            results = g.rmsnorm_backward(dy, x, scale, inv, has_dbias=False)
        else:
            results = g.layernorm_backward(dy, x, scale, g.tensor(name="mean", dim=[rows, 1], data_type="float"), inv)
        for name, t in zip(("dx", "dscale", "dbias"), results):
            if t is not None:
                t.set_name(name).set_output(True)
        return g

    return build


def _ln_bwd_torch(t: Tensors) -> Any:
    """What autograd runs for F.layer_norm's backward."""
    import torch

    hidden = t["x"].shape[-1]
    weight = t["scale"].view(hidden)
    # dbias is asked for, so a bias must be given; its values do not enter any gradient
    return torch.ops.aten.native_layer_norm_backward(
        t["dy"], t["x"], [hidden], t["mean"], t["inv_variance"], weight, weight, [True, True, True]
    )


def _rms_bwd_torch(t: Tensors) -> Any:
    """RMSNorm's gradients written out (eager runs it op by op; torch.compile fuses it)."""
    x, inv, dy = t["x"].float(), t["inv_variance"], t["dy"].float()
    xhat, g = x * inv, dy * t["scale"].float()
    dx = inv * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    return dx.to(t["x"].dtype), (dy * xhat).sum(dim=0, keepdim=True).to(t["scale"].dtype)


def _norm_bwd_cudnn(t: Tensors, out: Tensors, *, rms: bool) -> Callable[[], Any]:
    """The frontend's layernorm_backward / rmsnorm_backward sample graphs."""
    import cudnn

    rows, hidden = t["x"].shape
    graph, handle = _cudnn_graph()
    row, stat = [hidden, 1, hidden, hidden], [1, 1, 1, 1]
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    dy = graph.tensor(name="dy", dim=[rows, hidden, 1, 1], stride=row, data_type=bf16)
    x = graph.tensor(name="x", dim=[rows, hidden, 1, 1], stride=row, data_type=bf16)
    scale = graph.tensor(name="scale", dim=[1, hidden, 1, 1], stride=row, data_type=bf16)
    inv = graph.tensor(name="inv_variance", dim=[rows, 1, 1, 1], stride=stat, data_type=f32)
    pack = {dy: t["dy"], x: t["x"], scale: t["scale"], inv: t["inv_variance"]}
    if rms:
        dx, dscale, _ = graph.rmsnorm_backward(grad=dy, input=x, scale=scale, inv_variance=inv, has_dbias=False)
        results = {dx: out["dx"], dscale: out["dscale"]}
    else:
        mean = graph.tensor(name="mean", dim=[rows, 1, 1, 1], stride=stat, data_type=f32)
        pack[mean] = t["mean"]
        dx, dscale, dbias = graph.layernorm_backward(grad=dy, input=x, scale=scale, mean=mean, inv_variance=inv)
        results = {dx: out["dx"], dscale: out["dscale"], dbias: out["dbias"]}
    for tensor in results:
        tensor.set_output(True).set_data_type(bf16)
    return _cudnn_runner(graph, handle, {**pack, **results})


def _ln_bwd_cudnn(t: Tensors, out: Tensors) -> Callable[[], Any]:
    return _norm_bwd_cudnn(t, out, rms=False)


def _rms_bwd_cudnn(t: Tensors, out: Tensors) -> Callable[[], Any]:
    return _norm_bwd_cudnn(t, out, rms=True)


def _norm_bwd_bytes(rows: int, hidden: int, rms: bool) -> int:
    """dy and x read and dx written (bf16), the float statistics, scale read and its gradients written."""
    parameters = 2 if rms else 3
    return 3 * 2 * rows * hidden + (1 if rms else 2) * 4 * rows + parameters * 2 * hidden


# -- ReLU backward (a given mask) + add backward + batch norm backward -------------------------
def _dbn_graph(n: int, c: int, hw: int) -> Callable[[], gd.OperationGraphSpec]:
    """The frontend's drelu-dadd-dbn sample, NHWC: grad = dy * mask (written: the residual
    branch's gradient), batch norm backward, dx + dskip."""

    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"drelu_dadd_dbn_n{n}_c{c}_{hw}", io_data_type="bf16")
        dims = [n, c, hw, hw]
        dy, x, mask, skip = (
            g.tensor(name=k, dim=dims, stride=gd.nhwc_strides(dims)) for k in ("dy", "x", "mask", "dskip")
        )
        scale, mean, inv = (
            g.tensor(name=k, dim=[1, c, 1, 1], data_type="float") for k in ("scale", "mean", "inv_variance")
        )
        grad = g.mul(dy, mask).set_name("dresidual").set_output(True)
        dx, dscale, dbias = g.batchnorm_backward(grad, x, scale, mean, inv)
        g.add(dx, skip).set_name("dx").set_output(True)
        for name, t in (("dscale", dscale), ("dbias", dbias)):
            t.set_name(name).set_output(True).set_data_type("float")  # type: ignore[union-attr]
        return g

    return build


def _dbn_torch(t: Tensors) -> Any:
    import torch

    c = t["x"].shape[1]
    grad = t["dy"] * t["mask"]
    dx, dscale, dbias = torch.ops.aten.native_batch_norm_backward(
        grad,
        t["x"],
        t["scale"].view(c),
        None,
        None,
        t["mean"].view(c),
        t["inv_variance"].view(c),
        True,
        EPS,
        [True, True, True],
    )
    return grad, dx + t["dskip"], dscale, dbias


def _dbn_cudnn(t: Tensors, out: Tensors) -> Callable[[], Any]:
    import cudnn

    graph, handle = _cudnn_graph()
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    full = {
        k: graph.tensor(name=k, dim=list(t[k].shape), stride=list(t[k].stride()), data_type=bf16)
        for k in ("dy", "x", "mask", "dskip")
    }
    channel = {
        k: graph.tensor(name=k, dim=list(t[k].shape), stride=list(t[k].stride()), data_type=f32)
        for k in ("scale", "mean", "inv_variance")
    }
    grad = graph.mul(a=full["dy"], b=full["mask"])
    grad.set_output(True).set_data_type(bf16)
    dx, dscale, dbias = graph.batchnorm_backward(
        grad=grad, input=full["x"], scale=channel["scale"], mean=channel["mean"], inv_variance=channel["inv_variance"]
    )
    total = graph.add(a=dx, b=full["dskip"])
    total.set_output(True).set_data_type(bf16)
    dscale.set_output(True).set_data_type(f32)
    dbias.set_output(True).set_data_type(f32)
    pack = {tensor: t[k] for k, tensor in (*full.items(), *channel.items())}
    pack |= {grad: out["dresidual"], total: out["dx"], dscale: out["dscale"], dbias: out["dbias"]}
    return _cudnn_runner(graph, handle, pack)


# -- conv + BN(inference) + ReLU --------------------------------------------------------------
def _conv_graph(
    n: int, c: int, hw: int, k: int, size: int, max_n: int = 0, stride: int = 1
) -> Callable[[], gd.OperationGraphSpec]:
    """With ``max_n``, the batch is the symbol batch in 1..max_n (a dynamic graph)."""

    def build() -> gd.OperationGraphSpec:
        name = (
            f"conv{size}x{size}_{c}to{k}_{hw}"
            + (f"_s{stride}" if stride > 1 else "")
            + (f"_dyn{max_n}" if max_n else "")
        )
        g = gd.OperationGraphSpec(name=name, io_data_type="bf16")
        batch = g.dim("batch", 1, max_n) if max_n else n
        x_dim, w_dim = [batch, c, hw, hw], [k, c, size, size]
        x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
        w = g.tensor(name="w", dim=w_dim, stride=gd.nhwc_strides(w_dim))
        y = g.conv_fprop(x, w, padding=[size // 2] * 2, stride=[stride] * 2)
        stats = [
            g.tensor(name=s, dim=[1, k, 1, 1], data_type="float") for s in ("mean", "inv_variance", "gamma", "beta")
        ]
        g.relu(g.batchnorm_inference(y, *stats)).set_name("y").set_output(True)
        return g

    return build


def _conv_torch(t: Tensors, stride: int = 1) -> Any:
    import torch.nn.functional as F

    k = t["w"].shape[0]
    pad = t["w"].shape[-1] // 2
    variance = t["inv_variance"].reshape(k).float().pow(-2) - EPS  # the same normalisation as graphdnn's
    y = F.conv2d(t["x"], t["w"], padding=pad, stride=stride)
    y = F.batch_norm(
        y, t["mean"].reshape(k), variance, t["gamma"].reshape(k), t["beta"].reshape(k), training=False, eps=EPS
    )
    return F.relu(y)


def _conv_cudnn(t: Tensors, out: Tensors, stride: int = 1) -> Callable[[], Any]:
    """The cuDNN frontend's fused conv + bias + ReLU (inference BN folds into the bias)."""
    import cudnn
    import torch

    graph, handle = _cudnn_graph()
    x_t, w_t = t["x"], t["w"]
    k, pad = w_t.shape[0], w_t.shape[-1] // 2
    bias_t = torch.randn(1, k, 1, 1, device="cuda", dtype=torch.bfloat16)
    x = graph.tensor(name="x", dim=list(x_t.shape), stride=list(x_t.stride()), data_type=cudnn.data_type.BFLOAT16)
    w = graph.tensor(name="w", dim=list(w_t.shape), stride=list(w_t.stride()), data_type=cudnn.data_type.BFLOAT16)
    b = graph.tensor(name="b", dim=[1, k, 1, 1], stride=[k, 1, k, k], data_type=cudnn.data_type.BFLOAT16)
    y = graph.conv_fprop(image=x, weight=w, padding=[pad, pad], stride=[stride] * 2, dilation=[1, 1])
    y = graph.relu(input=graph.bias(input=y, bias=b))
    y.set_output(True).set_data_type(cudnn.data_type.BFLOAT16)
    return _cudnn_runner(graph, handle, {x: x_t, w: w_t, b: bias_t, y: out["y"]})


# -- conv backward: dgrad and wgrad ----------------------------------------------------------------
def _grad_graph(op: str, n: int, c: int, hw: int, k: int, size: int) -> Callable[[], gd.OperationGraphSpec]:
    """dx = conv_dgrad(dy, w) or dw = conv_wgrad(x, dy) of a stride-1 'same' convolution, NHWC bf16."""

    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"conv_{op}{size}x{size}_{c}to{k}_{hw}", io_data_type="bf16")
        x_dim, w_dim, y_dim = [n, c, hw, hw], [k, c, size, size], [n, k, hw, hw]
        dy = g.tensor(name="dy", dim=y_dim, stride=gd.nhwc_strides(y_dim))
        if op == "dgrad":
            w = g.tensor(name="w", dim=w_dim, stride=gd.nhwc_strides(w_dim))
            g.conv_dgrad(dy, w, padding=[size // 2] * 2, image_dim=x_dim).set_name("dx").set_output(True)
        else:
            x = g.tensor(name="x", dim=x_dim, stride=gd.nhwc_strides(x_dim))
            dw = g.conv_wgrad(x, dy, padding=[size // 2] * 2, filter_dim=w_dim)
            dw.set_name("dw").set_output(True).set_stride(gd.nhwc_strides(w_dim))
        return g

    return build


def _grad_torch(op: str, n: int, c: int, hw: int, k: int, size: int) -> Callable[[Tensors], Any]:
    """torch.nn.grad's conv2d_input / conv2d_weight (aten's convolution backward on cuDNN)."""

    def run(t: Tensors) -> Any:
        import torch

        if op == "dgrad":
            return torch.nn.grad.conv2d_input([n, c, hw, hw], t["w"], t["dy"], padding=size // 2)
        return torch.nn.grad.conv2d_weight(t["x"], [k, c, size, size], t["dy"], padding=size // 2)

    return run


GRAD_LAYERS = [(32, 64, 56, 64, 3), (32, 64, 56, 256, 1)]


# -- matmul (few output tiles: split-K) ---------------------------------------------------------
MATMULS = [(128, 4096, 4096), (2048, 1024, 4096)]  # (M, N, K): decode-like, transformer fc2


def _matmul_graph(m: int, n: int, k: int, max_m: int = 0) -> Callable[[], gd.OperationGraphSpec]:
    """With ``max_m``, M is the symbol rows in 1..max_m (a dynamic graph)."""

    def build() -> gd.OperationGraphSpec:
        g = gd.OperationGraphSpec(name=f"matmul_m{f'dyn{max_m}' if max_m else m}_n{n}_k{k}", io_data_type="bf16")
        a, b = g.tensor(name="a", dim=[_rows(g, m, max_m), k]), g.tensor(name="b", dim=[k, n])
        g.matmul(a, b).set_name("y").set_output(True)
        return g

    return build


def _square_matmul_graph(rows: int, hidden: int, max_rows: int = 0) -> Callable[[], gd.OperationGraphSpec]:
    """[rows, hidden] @ [hidden, hidden]: the dynamic cases' projection."""
    return _matmul_graph(rows, hidden, hidden, max_rows)


def _matmul_torch(t: Tensors) -> Any:
    return t["a"] @ t["b"]  # cuBLAS


# -- cuDNN frontend plumbing ------------------------------------------------------------------
def _cudnn_graph() -> tuple[Any, Any]:
    import cudnn

    handle = cudnn.create_handle()
    graph = cudnn.pygraph(
        io_data_type=cudnn.data_type.BFLOAT16,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    return graph, handle


def _cudnn_runner(graph: Any, handle: Any, pack: dict[Any, Any]) -> Callable[[], Any]:
    import cudnn
    import torch

    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(max(graph.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    return lambda: graph.execute(pack, workspace, handle=handle)


def _host_scalar(value: float) -> Any:
    import torch

    return torch.full((1, 1, 1, 1), value, dtype=torch.float32)


# -- example graphs end to end ---------------------------------------------------------------
def _transformer_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    hidden = t["x"].shape[-1]
    h = F.gelu(
        F.layer_norm(t["x"], (hidden,), t["ln.scale"].view(hidden), t["ln.bias"].view(hidden), 1e-5), approximate="tanh"
    )
    h = F.gelu(h @ t["fc1.weight"] + t["fc1.bias"], approximate="tanh")
    residual = h @ t["fc2.weight"] + t["fc2.bias"] + t["x"]
    return residual, F.rms_norm(residual, (hidden,), t["rms.scale"].view(hidden), 1e-6)


def _bottleneck_torch(t: Tensors) -> Any:
    import torch.nn.functional as F

    def conv_bn(x: Any, name: str, size: int) -> Any:
        w = t[f"{name}.weight"]
        k = w.shape[0]
        y = F.conv2d(x, w, padding=size // 2)
        var = t[f"{name}.bn.inv_variance"].reshape(k).pow(-2) - EPS
        return F.batch_norm(
            y,
            t[f"{name}.bn.mean"].reshape(k),
            var,
            t[f"{name}.bn.scale"].reshape(k),
            t[f"{name}.bn.bias"].reshape(k),
            training=False,
            eps=EPS,
        )

    h = F.relu(conv_bn(t["x"], "conv1", 1))
    h = F.relu(conv_bn(h, "conv2", 3))
    return F.relu(conv_bn(h, "conv3", 1) + t["x"])


def _conv_out(hw: int, size: int, stride: int) -> int:
    """The output's height and width ('same' padding, size // 2 on each side)."""
    return (hw + 2 * (size // 2) - size) // stride + 1


def _conv_bytes(n: int, c: int, hw: int, k: int, size: int, stride: int = 1) -> int:
    pq = _conv_out(hw, size, stride)
    return 2 * (n * c * hw * hw + k * c * size * size + n * k * pq * pq) + 4 * 4 * k


def _conv_flops(n: int, c: int, hw: int, k: int, size: int, stride: int = 1) -> int:
    return 2 * n * _conv_out(hw, size, stride) ** 2 * k * c * size * size


# Dynamic shapes (issue 11): one plan for rows in 1..DYNAMIC_MAX_ROWS against the static plan
# of each concrete shape, at a small, an odd middle and the largest size of the range.
DYNAMIC_MAX_ROWS = 16384
DYNAMIC_ROWS = (64, 1531, DYNAMIC_MAX_ROWS)
DYNAMIC_HIDDEN = 1024
# ResNet-50's 3x3 128->128 at 28² (NHWC bf16) + BN + ReLU over a batch in 1..DYNAMIC_MAX_BATCH
DYNAMIC_CONV, DYNAMIC_MAX_BATCH, DYNAMIC_BATCHES = (128, 28, 128, 3), 64, (1, 13, 64)

RESNET_LAYERS = [(32, 64, 56, 64, 3), (32, 64, 56, 256, 1), (32, 128, 28, 128, 3), (32, 256, 14, 256, 3)]
# ResNet-50's stride-2 layers entering stage 2 (torchvision's layout: the stride on the 3x3, and
# the projection): timed beside the stride-1 ones, not in EAGER_CONV_US
STRIDED_LAYERS = [(32, 128, 56, 128, 3), (32, 256, 56, 512, 1)]
EAGER_CONV_US = {
    (32, 64, 56, 64, 3): 91,
    (32, 64, 56, 256, 1): 106,
    (32, 128, 28, 128, 3): 42,
    (32, 256, 14, 256, 3): 40,
}


def cases() -> list[Case]:
    rows_hidden = [(16384, 4096), (4096, 1024)]
    out = []
    for rows, hidden in rows_hidden:
        big = rows == 16384
        out.append(
            Case(
                f"layernorm+gelu {rows}x{hidden}",
                _ln_gelu_graph(rows, hidden),
                _ln_gelu_torch,
                bytes=2 * 2 * rows * hidden + 2 * 2 * hidden,
                target="≥ 85% of roofline" if big else "≤ cuDNN layernorm's time",
                cudnn=_ln_gelu_cudnn,
                cudnn_anchor=_ln_cudnn,
            )
        )
        out.append(
            Case(
                f"add+rmsnorm {rows}x{hidden}",
                _add_rms_graph(rows, hidden),
                _add_rms_torch,
                bytes=4 * 2 * rows * hidden + 2 * hidden,
                target="≥ 93% of roofline" if big else "≤ 12 µs",
                cudnn=_add_rms_cudnn,
            )
        )
    for rows in DYNAMIC_ROWS:
        hidden, top = DYNAMIC_HIDDEN, DYNAMIC_MAX_ROWS
        for kind, graph, torch_fn, moved in (
            ("layernorm+gelu", _ln_gelu_graph, _ln_gelu_torch, 2 * 2 * rows * hidden + 2 * 2 * hidden),
            ("add+rmsnorm", _add_rms_graph, _add_rms_torch, 4 * 2 * rows * hidden + 2 * hidden),
            ("matmul", _square_matmul_graph, _matmul_torch, 2 * (2 * rows * hidden + hidden * hidden)),
        ):
            out.append(
                Case(
                    f"dynamic {kind} {rows}x{hidden} (rows 1..{top})",
                    graph(rows, hidden),  # the static plan of this shape: graphdnn_us
                    torch_fn,
                    bytes=moved,
                    target="dynamic plan within 5% of the static plan",
                    group="dynamic",
                    extra={"dynamic": graph(rows, hidden, top)},  # one plan for the range, timed at this shape
                )
            )
    for n in DYNAMIC_BATCHES:
        c, hw, k, size = DYNAMIC_CONV
        out.append(
            Case(
                f"dynamic conv{size}x{size}+bn+relu {c}->{k} @{hw}² n{n} (batch 1..{DYNAMIC_MAX_BATCH})",
                _conv_graph(n, *DYNAMIC_CONV),  # the static plan of this batch: graphdnn_us
                _conv_torch,
                bytes=_conv_bytes(n, *DYNAMIC_CONV),
                flops=_conv_flops(n, *DYNAMIC_CONV),
                target="dynamic plan within 5% of the static plan",
                group="dynamic",
                extra={"dynamic": _conv_graph(n, *DYNAMIC_CONV, max_n=DYNAMIC_MAX_BATCH)},
            )
        )
    for rows, hidden in [(2048, 1024), (16384, 4096)]:
        big = rows == 16384
        for rms, kind in ((False, "layernorm"), (True, "rmsnorm")):
            out.append(
                Case(
                    f"{kind} backward {rows}x{hidden}",
                    _norm_bwd_graph(rows, hidden, rms),
                    _rms_bwd_torch if rms else _ln_bwd_torch,
                    bytes=_norm_bwd_bytes(rows, hidden, rms),
                    target="≥ 85% of roofline" if big else "≥ 0.9x cuDNN",
                    cudnn=_rms_bwd_cudnn if rms else _ln_bwd_cudnn,
                    group="backward",
                )
            )
    n, c, hw = 4, 16, 56  # the table: the frontend sample's shape
    out.append(
        Case(
            f"drelu+dadd+batchnorm backward n{n} c{c} {hw}²",
            _dbn_graph(n, c, hw),
            _dbn_torch,
            bytes=2 * 6 * n * c * hw * hw + 4 * 5 * c,  # dy, x, mask, dskip read; dresidual, dx written
            target="≥ 0.9x cuDNN",
            cudnn=_dbn_cudnn,
            group="backward",
        )
    )
    for layer, stride in [*((layer, 1) for layer in RESNET_LAYERS), *((layer, 2) for layer in STRIDED_LAYERS)]:
        n, c, hw, k, size = layer
        out.append(
            Case(
                f"conv{size}x{size}{f' s{stride}' if stride > 1 else ''}+bn+relu {c}->{k} @{hw}² n{n}",
                _conv_graph(*layer, stride=stride),
                partial(_conv_torch, stride=stride),
                bytes=_conv_bytes(*layer, stride),
                flops=_conv_flops(*layer, stride),
                target="faster than eager; geomean ≥ 0.8x cuDNN fused",
                cudnn=partial(_conv_cudnn, stride=stride),
                group="conv",
            )
        )
    for layer in GRAD_LAYERS:
        n, c, hw, k, size = layer
        for op in ("dgrad", "wgrad"):
            out.append(
                Case(
                    f"conv{size}x{size} {op} {c}->{k} @{hw}² n{n}",
                    _grad_graph(op, *layer),
                    _grad_torch(op, *layer),
                    bytes=_conv_bytes(*layer) - 4 * 4 * k,
                    flops=_conv_flops(*layer),
                    target="≥ 0.8x cuDNN (torch's conv backward, eager)",
                    group="conv backward",
                )
            )
    for m, n, k in MATMULS:
        out.append(
            Case(
                f"matmul m{m} n{n} k{k}",
                _matmul_graph(m, n, k),
                _matmul_torch,
                bytes=2 * (m * k + k * n + m * n),
                flops=2 * m * n * k,
                target="≥ 0.8x eager (cuBLAS)",
                group="gemm",
            )
        )
    out.append(
        Case(
            "transformer block (example)",
            transformer_block,
            _transformer_torch,
            bytes=2 * (4 * 2048 * 1024 + 2 * 1024 * 4096 + 2 * 2048 * 4096),
            flops=2 * 2 * 2048 * 1024 * 4096,
            target="faster than eager and torch.compile",
            group="end to end",
        )
    )
    out.append(
        Case(
            "resnet50 bottleneck (example)",
            resnet50_bottleneck,
            _bottleneck_torch,
            bytes=2 * (2 * 32 * 256 * 56 * 56 + 2 * 32 * 64 * 56 * 56 * 2),
            flops=sum(
                _conv_flops(*layer) for layer in [(32, 256, 56, 64, 1), (32, 64, 56, 64, 3), (32, 64, 56, 256, 1)]
            ),
            target="faster than eager and torch.compile",
            group="end to end",
        )
    )
    out += classic_cases(Case)
    assert all(math.isfinite(c.bytes) for c in out)
    return out
