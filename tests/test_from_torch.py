"""gd.from_torch: torch.export programs imported and run on the reference backend, compared
with torch eager; the unmapped-node error."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphdnn as gd
from graphdnn.dtypes import as_data_type


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck block (torchvision's layout: 1x1, 3x3 stride, 1x1, projection)."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = 4 * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        return F.relu(self.bn3(self.conv3(h)) + self.down(x))


class Stem(nn.Module):
    """Conv with bias, then max pooling and both kinds of average pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv(image)), 3, stride=2, padding=1)
        return F.avg_pool2d(h, 3, stride=1, padding=1) - F.avg_pool2d(
            h, 3, stride=1, padding=1, count_include_pad=False
        )


class Block(nn.Module):
    """A Hugging Face-style pre-norm transformer block: attention (sdpa) and a GELU MLP."""

    def __init__(self, dim: int, heads: int, approximate: str = "none") -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.approximate = approximate

    def split(self, t: torch.Tensor) -> torch.Tensor:
        b, s, d = t.shape
        return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, d = hidden_states.shape
        h = self.ln1(hidden_states)
        q, k, v = self.split(self.q_proj(h)), self.split(self.k_proj(h)), self.split(self.v_proj(h))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = hidden_states + self.o_proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.approximate))


class MatmulAttention(nn.Module):
    """Attention written out (matmul, scale, softmax, bmm), with SiLU, sigmoid, tanh, mm and t."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(x, x.transpose(-1, -2)) / 4.0
        z = torch.bmm(torch.softmax(scores, dim=-1), x)
        return F.silu(z) * torch.sigmoid(x) - torch.tanh(torch.mm(y, self.w.t())) + 1.5


def _feeds(graph: gd.OperationGraphSpec, module: nn.Module, inputs: dict[str, torch.Tensor]) -> dict:
    state = {**module.state_dict(), **inputs}
    return {t.name: state[t.name].detach().float().numpy().astype(t.data_type.numpy) for t in graph.validate().inputs}


def _check(module: nn.Module, inputs: dict[str, torch.Tensor], rtol: float = 1e-4) -> gd.OperationGraphSpec:
    module.eval()
    graph = gd.from_torch(module, tuple(inputs.values()))
    with torch.no_grad():
        expected = module(*inputs.values()).float().numpy()
    got = gd.reference.execute(graph, _feeds(graph, module, inputs))["output"].astype(np.float64)
    assert got.shape == expected.shape
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error < rtol, error
    return graph


def _randomize_bn(module: nn.Module) -> None:
    """Non-trivial running statistics, so that batch norm is not the identity."""
    generator = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=generator) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=generator) * 0.1)


def test_resnet_bottleneck_matches_eager() -> None:
    torch.manual_seed(0)
    block = Bottleneck(16, 8, stride=2)
    _randomize_bn(block)
    graph = _check(block, {"x": torch.randn(2, 16, 9, 9)})
    ir = graph.validate()
    names = [t.name for t in ir.inputs]
    assert "x" in names
    assert {"conv1.weight", "bn1.running_mean", "bn1.running_var", "down.0.weight", "down.1.bias"} <= set(names)
    assert "bn1.num_batches_tracked" not in names  # read by no op
    kinds = [node.op for node in graph.nodes]
    assert kinds.count("conv_fprop") == 4 and kinds.count("batchnorm_inference") == 4


def test_stem_conv_bias_and_pooling() -> None:
    torch.manual_seed(0)
    graph = _check(Stem(), {"image": torch.randn(2, 3, 15, 15)})
    modes = {str(node.attributes.mode) for node in graph.nodes if node.op == "pooling"}
    assert len(modes) == 3


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_transformer_block_matches_eager(approximate: str) -> None:
    torch.manual_seed(0)
    graph = _check(Block(32, 4, approximate), {"hidden_states": torch.randn(2, 7, 32)})
    kinds = {node.op for node in graph.nodes}
    assert {"layernorm", "matmul", "sdpa", "gelu_approx_tanh" if approximate == "tanh" else "gelu"} <= kinds


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


@pytest.mark.parametrize(
    ("make", "name", "shape", "targets"),
    [
        (lambda: Mlp(16), "x", (2, 5, 16), {"aten.addmm.default", "aten.native_layer_norm.default"}),
        (Stem, "image", (2, 3, 15, 15), {"aten.convolution.default", "aten.max_pool2d_with_indices.default"}),
        (
            lambda: nn.Sequential(nn.Conv1d(4, 6, 3, stride=2, padding=1), nn.BatchNorm1d(6), nn.Tanh()),
            "input",
            (2, 4, 9),
            {"aten.convolution.default"},
        ),
        (lambda: Bottleneck(8, 4, 1), "x", (1, 8, 6, 6), {"aten._native_batch_norm_legit_no_training.default"}),
    ],
)
def test_core_aten_program_matches_eager(
    make: Callable[[], nn.Module], name: str, shape: tuple[int, ...], targets: set[str]
) -> None:
    """Programs decomposed to core ATen (addmm, native_layer_norm, convolution...) import too."""
    torch.manual_seed(0)
    module = make().eval()
    _randomize_bn(module)
    x = torch.randn(*shape)
    program = torch.export.export(module, (x,)).run_decompositions()
    assert targets <= {str(n.target) for n in program.graph.nodes}
    graph = gd.from_torch(program, (x,))
    with torch.no_grad():
        expected = module(x).numpy()
    got = gd.reference.execute(graph, _feeds(graph, module, {name: x}))["output"]
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-4


def test_matmul_softmax_attention_and_activations() -> None:
    torch.manual_seed(0)
    graph = _check(MatmulAttention(8), {"x": torch.randn(1, 5, 8), "y": torch.randn(5, 8)})
    assert [t.name for t in graph.validate().inputs] == ["w", "x", "y"]


class Arithmetic(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sub(x, y, alpha=2) / (y * y + 1) + torch.add(x, 0.5, alpha=3) * 2 - F.relu(y) / 4


class Passthrough(nn.Module):
    """What Hugging Face code leaves in an eval-mode export: dropout, contiguous, clone."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.linear(x)).transpose(0, 1).contiguous()
        z = F.dropout(y, 0.2, training=self.training).clone() + F.hardtanh(x.t(), -0.5, 0.75)
        return (
            torch.rsqrt(torch.exp(-z.abs()) + 1) * torch.erf(z)
            + torch.sqrt(torch.reciprocal(z * z + 1))
            - torch.log(z * z + 2)
        )


def test_eval_passthrough_and_more_pointwise_ops() -> None:
    torch.manual_seed(0)
    graph = _check(Passthrough(), {"x": torch.randn(8, 8)})
    assert {"neg", "abs", "exp", "log", "rsqrt", "erf", "sqrt", "reciprocal", "relu"} <= {
        node.op for node in graph.nodes
    }


def test_elementwise_with_scalars_and_alpha() -> None:
    torch.manual_seed(0)
    _check(Arithmetic(), {"x": torch.randn(3, 4), "y": torch.randn(4)})


class MaskedAttention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def test_sdpa_with_an_additive_mask_and_a_scale() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    graph = _check(MaskedAttention(), {"q": q, "k": k, "v": v, "mask": torch.randn(5, 7)})
    (sdpa,) = [node for node in graph.nodes if node.op == "sdpa"]
    assert sdpa.inputs["ATTN_SCALE"].value == pytest.approx(0.3)


def test_bf16_transformer_block_matches_eager() -> None:
    """The io type follows the example inputs; fp32 intermediates are closer to the exact
    result than bf16 eager, so the comparison allows bf16's error."""
    torch.manual_seed(0)
    block = Block(32, 4).to(torch.bfloat16)
    graph = _check(block, {"hidden_states": torch.randn(2, 7, 32, dtype=torch.bfloat16)}, rtol=2e-2)
    assert graph.io_data_type == gd.DataType.BFLOAT16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_data_types_follow_the_example_inputs(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.SiLU()).to(dtype).eval()
    x = torch.randn(3, 8, dtype=dtype)
    graph = gd.from_torch(block, (x,))
    ir = graph.validate()
    assert {t.data_type for t in ir.inputs} | {t.data_type for t in ir.outputs} == {as_data_type(dtype)}
    assert [t.name for t in ir.inputs] == ["0.weight", "0.bias", "input"]


def test_unmapped_nodes_are_all_named() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(x, 0).relu() + torch.flip(x, [1])

    with pytest.raises(gd.UnsupportedError) as error:
        gd.from_torch(Odd(), (torch.randn(3, 4),))
    message = str(error.value)
    assert "2 node(s)" in message
    assert re.search(r"'cumsum' \(aten\.cumsum\.default\)", message)
    assert re.search(r"'flip' \(aten\.flip\.default\)", message)
    assert "relu" not in message  # downstream of an unmapped node: not reported itself


def test_unmapped_arguments_say_why() -> None:
    pool = nn.MaxPool2d(2, ceil_mode=True)
    with pytest.raises(gd.UnsupportedError, match=r"'max_pool2d' \(aten\.max_pool2d\.default\): .*ceil_mode"):
        gd.from_torch(pool, (torch.randn(1, 4, 5, 5),))


def test_grouped_and_depthwise_convolution() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 4, 1, groups=2))
    graph = _check(module, {"input": torch.randn(2, 8, 5, 5)})
    assert [node.op for node in graph.nodes].count("conv_fprop") == 2


def test_a_classifier_head_global_pooling_flatten_linear() -> None:
    torch.manual_seed(0)
    head = nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(6, 5))
    graph = _check(head, {"input": torch.randn(2, 6, 7, 5)})
    assert [node.op for node in graph.nodes][:2] == ["adaptive_pooling", "reshape"]
    pools = nn.Sequential(nn.AdaptiveMaxPool2d((3, 2)), nn.AdaptiveAvgPool2d(2))  # bins that overlap
    _check(pools, {"input": torch.randn(2, 3, 7, 5)})


class InPlace(nn.Module):
    """torchvision's residual end: ``out += identity`` then ``relu(inplace=True)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        out += x
        return self.relu(out) * 2


def test_in_place_ops_on_intermediates_map_to_their_functional_form() -> None:
    torch.manual_seed(0)
    graph = _check(InPlace(), {"x": torch.randn(3, 6)})
    assert {"add", "relu", "mul"} <= {node.op for node in graph.nodes}


class WritesThroughAView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 3
        h.view(-1).relu_()  # changes h too
        return h + 1


class WritesOverItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu_() + 1


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (
            WritesThroughAView(),
            r"'relu_' \(aten\.relu_\.default\): it writes in place over 'view', a view that may share",
        ),
        (WritesOverItsInput(), r"it writes over the input 'x' in place, which graphdnn cannot hand back"),
    ],
)
def test_in_place_writes_graphdnn_cannot_follow_are_named(module: nn.Module, message: str) -> None:
    with pytest.raises(gd.UnsupportedError, match=message):
        gd.from_torch(module, (torch.randn(2, 4),))


@pytest.mark.gpu
def test_torchvision_resnet50_runs_on_the_gpu() -> None:
    """The whole torchvision ResNet-50 (stem, four stages of bottlenecks, pooling, classifier):
    imported against eager on the CPU, then run on the GPU against the reference."""
    torchvision = pytest.importorskip("torchvision")
    from tests.gpu_check import check_on_gpu

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    _randomize_bn(model)
    x = torch.randn(2, 3, 64, 64)
    graph = _check(model, {"x": x}, rtol=1e-3)
    kinds = [node.op for node in graph.nodes]
    assert kinds.count("conv_fprop") == 53 and "adaptive_pooling" in kinds
    check_on_gpu(graph, feeds=_feeds(graph, model, {"x": x}))


def test_without_torch_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ImportError, match=r"gd\.from_torch needs PyTorch"):
        gd.from_torch(object(), ())
