"""Every graph the validator accepts compiles for sm_80 and sm_90 (NVRTC, no GPU needed).

Two checks: one graph per op family in every combination of IO type (fp32, fp16, bf16,
fp8, int8) and intermediate type (float, half, bf16), and, after each test, each distinct
kernel of the graphs it validated (tests/compile_check.py; its own tests are here too).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

import graphdnn as gd
from graphdnn.compare import TOLERANCE
from graphdnn.errors import GraphError
from graphdnn.ir import Graph
from graphdnn.signature import signature

from . import plan_graphs
from .compile_check import COMPILE_MEMORY, RECORDER, TARGETS, CompileCheck, KernelStore, compile_graphs, compiled_key

IO_TYPES = ("float", "half", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8")
INTERMEDIATE_TYPES = ("float", "half", "bfloat16")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"

Build = Callable[[gd.OperationGraphSpec], None]


def _nhwc(g: gd.OperationGraphSpec, dims: list[int], name: str) -> gd.TensorSpec:
    return g.tensor(name=name, dim=dims, stride=gd.nhwc_strides(dims))


def _channel(g: gd.OperationGraphSpec, name: str, channels: int) -> gd.TensorSpec:
    return g.tensor(name=name, dim=[1, channels, 1, 1])


def pointwise(g: gd.OperationGraphSpec) -> None:
    """A DAG of elementwise ops with a broadcast operand, a runtime scalar and constants
    (300 does not fit int8: it saturates)."""
    x = g.tensor(name="x", dim=[4, 7, 9])
    b = g.tensor(name="b", dim=[1, 7, 1])
    alpha = g.tensor(name="alpha", dim=[1], is_pass_by_value=True)
    h = g.sub(g.neg(g.add(g.elu(x), b)), x)
    h = g.gelu(g.mul(h, alpha))
    h = g.binary_select(h, g.sigmoid(x), g.cmp_gt(x, 0.5))
    g.add(g.max(h, b), 300.0).set_name("y").set_output(True)


def elementary(g: gd.OperationGraphSpec) -> None:
    """sin, cos, erf, floor, ceil, mod and the logical ops; the discontinuous ones read
    graph inputs, so a rounded intermediate cannot move them across a step."""
    x = g.tensor(name="x", dim=[4, 7, 9])
    b = g.tensor(name="b", dim=[1, 7, 1])
    h = g.erf(g.add(g.sin(x), g.cos(b)))
    g.mul(h, g.mod(x, b)).set_name("y").set_output(True)
    g.logical_or(g.logical_and(g.floor(x), g.ceil(b)), g.logical_not(x)).set_name("l").set_output(True)


def matmul_bias_relu(g: gd.OperationGraphSpec) -> None:
    """8-bit operands are read K-major only: their w is stored transposed (the others' is not)."""
    a = g.tensor(name="a", dim=[2, 48, 64])
    eight_bit = g.io_data_type in (gd.DataType.INT8, gd.DataType.FP8_E4M3, gd.DataType.FP8_E5M2)
    w = g.tensor(name="w", dim=[2, 64, 40], stride=[2560, 1, 64] if eight_bit else [2560, 40, 1])
    bias = g.tensor(name="bias", dim=[1, 1, 40])
    g.relu(g.add(g.matmul(a, w), bias)).set_name("y").set_output(True)


def conv_bn_relu(g: gd.OperationGraphSpec) -> None:
    x = _nhwc(g, [2, 16, 9, 9], "x")
    w = _nhwc(g, [32, 16, 3, 3], "w")
    y = g.conv_fprop(image=x, weight=w, padding=[1, 1])
    stats = {role: _channel(g, role, 32) for role in ("mean", "inv_variance", "scale", "bias")}
    g.relu(g.batchnorm_inference(input=y, **stats)).set_name("y").set_output(True)


def conv_dgrad_wgrad(g: gd.OperationGraphSpec) -> None:
    dy = _nhwc(g, [2, 32, 8, 8], "dy")
    w = _nhwc(g, [32, 16, 3, 3], "w")
    x = _nhwc(g, [2, 16, 8, 8], "x")
    g.conv_dgrad(loss=dy, filter=w, padding=[1, 1], image_dim=[2, 16, 8, 8]).set_name("dx").set_output(True)
    g.conv_wgrad(image=x, loss=dy, padding=[1, 1], filter_dim=[32, 16, 3, 3]).set_name("dw").set_output(True)


def layernorm_gelu(g: gd.OperationGraphSpec) -> None:
    x = g.tensor(name="x", dim=[6, 80])
    scale, bias = g.tensor(name="scale", dim=[1, 80]), g.tensor(name="bias", dim=[1, 80])
    y, mean, inv = g.layernorm("training", x, scale, bias, epsilon=1e-5)
    assert y is not None and mean is not None and inv is not None
    g.gelu(y).set_name("y").set_output(True)
    mean.set_output(True)
    inv.set_output(True)


def rmsnorm_residual(g: gd.OperationGraphSpec) -> None:
    x, r = g.tensor(name="x", dim=[6, 80]), g.tensor(name="r", dim=[6, 80])
    y, _ = g.rmsnorm("inference", g.add(x, r), g.tensor(name="scale", dim=[1, 80]), epsilon=1e-5)
    assert y is not None
    y.set_name("y").set_output(True)


def softmax_and_reductions(g: gd.OperationGraphSpec) -> None:
    x = g.tensor(name="x", dim=[5, 6, 33])
    g.softmax(x).set_name("p").set_output(True)
    total = g.reduction(x, mode="add", axes=[2])
    g.add(x, total).set_name("centered").set_output(True)
    g.reduction(g.abs(x), mode="max", axes=[0, 1]).set_name("amax").set_output(True)


def batchnorm_training(g: gd.OperationGraphSpec) -> None:
    x = _nhwc(g, [4, 8, 5, 5], "x")
    outputs = g.batchnorm(
        x,
        _channel(g, "scale", 8),
        _channel(g, "bias", 8),
        in_running_mean=_channel(g, "running_mean", 8),
        in_running_var=_channel(g, "running_var", 8),
        epsilon=1e-5,
        momentum=0.1,
    )
    for out in outputs:
        if out is not None:
            out.set_output(True)


def group_and_instance_norm(g: gd.OperationGraphSpec) -> None:
    x = _nhwc(g, [2, 8, 5, 6], "x")
    scale, bias = _channel(g, "scale", 8), _channel(g, "bias", 8)
    y, *_ = g.groupnorm(x, scale, bias, epsilon=1e-5, groups=4)
    z, *_ = g.instancenorm("inference", x, scale, bias, epsilon=1e-5)
    assert y is not None and z is not None
    g.relu(y).set_name("y").set_output(True)
    z.set_name("z").set_output(True)


def norm_backward(g: gd.OperationGraphSpec) -> None:
    x, dy = g.tensor(name="x", dim=[6, 40]), g.tensor(name="dy", dim=[6, 40])
    scale = g.tensor(name="scale", dim=[1, 40])
    mean, inv = g.tensor(name="mean", dim=[6, 1]), g.tensor(name="inv", dim=[6, 1])
    for out in g.layernorm_backward(dy, x, scale, mean, inv):
        if out is not None:
            out.set_output(True)
    for out in g.rmsnorm_backward(dy, x, scale, inv, has_dbias=False):
        if out is not None:
            out.set_output(True)


def training_norms(g: gd.OperationGraphSpec) -> None:
    """Adaptive layer norm forward and backward, instance and group norm backward (NHWC)."""
    x, dy, per_sample = g.tensor(name="x", dim=[2, 5, 40]), g.tensor(name="dy", dim=[2, 5, 40]), g.tensor([2, 1, 40])
    y, mean, inv = g.adalayernorm("training", x, per_sample, g.tensor([2, 1, 40]), 1e-5)
    outputs = [y, *g.adalayernorm_backward(dy, x, per_sample, mean, inv)]
    image, dimage = _nhwc(g, [2, 8, 5, 6], "image"), _nhwc(g, [2, 8, 5, 6], "dimage")
    cells, sets = g.tensor(name="cells", dim=[2, 8, 1, 1]), g.tensor(name="sets", dim=[2, 4, 1, 1])
    outputs += g.instancenorm_backward(dimage, image, _channel(g, "scale", 8), cells, cells)
    outputs += g.groupnorm_backward(dimage, image, _channel(g, "gamma", 8), sets, sets, groups=4)
    for out in outputs:
        assert out is not None
        out.set_output(True)


def batchnorm_backward_genstats(g: gd.OperationGraphSpec) -> None:
    x, dy = _nhwc(g, [4, 8, 3, 3], "x"), _nhwc(g, [4, 8, 3, 3], "dy")
    mean, inv = _channel(g, "mean", 8), _channel(g, "inv", 8)
    for out in g.batchnorm_backward(dy, x, _channel(g, "scale", 8), mean, inv):
        if out is not None:
            out.set_output(True)
    for out in g.genstats(x):
        out.set_output(True)


def norm_backward_fused(g: gd.OperationGraphSpec) -> None:
    """The backward norms with the op making the grad (written too) and the residual add on dx."""
    x, dy, mask = (g.tensor(name=n, dim=[6, 40]) for n in ("x", "dy", "mask"))
    scale, mean, inv = (
        g.tensor(name="scale", dim=[1, 40]),
        g.tensor(name="mean", dim=[6, 1]),
        g.tensor(name="inv", dim=[6, 1]),
    )
    grad = g.mul(dy, mask).set_name("grad").set_output(True)
    dx, dscale, dbias = g.layernorm_backward(grad, x, scale, mean, inv)
    g.add(dx, g.tensor(name="dres", dim=[6, 40])).set_name("dx").set_output(True)
    for out in (dscale, dbias):
        out.set_output(True)  # type: ignore[union-attr]
    bx, bdy, bmask = (_nhwc(g, [4, 8, 3, 3], n) for n in ("bx", "bdy", "bmask"))
    bgrad = g.mul(bdy, bmask).set_name("bgrad").set_output(True)
    bdx, bdscale, bdbias = g.batchnorm_backward(bgrad, bx, *(_channel(g, n, 8) for n in ("bscale", "bmean", "binv")))
    g.add(bdx, _nhwc(g, [4, 8, 3, 3], "bdres")).set_name("bdx").set_output(True)
    for out in (bdscale, bdbias):
        out.set_output(True)  # type: ignore[union-attr]


def windows(g: gd.OperationGraphSpec) -> None:
    x = _nhwc(g, [2, 8, 9, 11], "x")
    g.pooling(x, "max", window=[3, 3], stride=[2, 2], padding=[1, 1]).set_name("pmax").set_output(True)
    g.pooling(x, "avg_exclude_padding", window=[2, 2], stride=[2, 2]).set_name("pavg").set_output(True)
    g.resample(x, "linear", size=[13, 7]).set_name("up").set_output(True)
    g.adaptive_pooling(x, "avg", size=[4, 5]).set_name("adaptive").set_output(True)


def pooling_backward(g: gd.OperationGraphSpec) -> None:
    """Its own family: dy and x must be floating, which int8 IO is not."""
    x, dy = _nhwc(g, [2, 8, 9, 11], "x"), _nhwc(g, [2, 8, 5, 6], "dy")
    g.pooling_backward(dy, "max", [3, 3], stride=[2, 2], padding=[1, 1], x=x).set_name("dmax").set_output(True)
    g.pooling_backward(dy, "avg_include_padding", [3, 3], stride=[2, 2], padding=[1, 1], x=x).set_name(
        "davg"
    ).set_output(True)
    _, index = g.pooling(x, "max", [3, 3], stride=[2, 2], padding=[1, 1], generate_index=True)
    g.pooling_backward(dy, "max", [3, 3], stride=[2, 2], padding=[1, 1], x=x, index=index).set_name(
        "dindex"
    ).set_output(True)


def local_response_norm(g: gd.OperationGraphSpec) -> None:
    """Its own family: the input must be floating, which int8 IO is not."""
    x, dy = _nhwc(g, [2, 8, 5, 3], "x"), _nhwc(g, [2, 8, 5, 3], "dy")
    g.lrn(x, lrn_n=5).set_name("lrn").set_output(True)
    g.lrn_backward(dy, x, lrn_n=4).set_name("dlrn").set_output(True)


def spatial_transformer(g: gd.OperationGraphSpec) -> None:
    """Its own family: every role must be floating, which int8 IO is not."""
    x, theta = _nhwc(g, [2, 8, 9, 7], "x"), g.tensor([2, 2, 3], name="theta")
    grid = g.spatial_tf_grid_generator(theta, [5, 6]).set_name("grid")
    g.spatial_tf_sampler(x, grid).set_name("sampled").set_output(True)
    dx, dgrid = g.spatial_tf_sampler_backward(x, grid, _nhwc(g, [2, 8, 5, 6], "dy"))
    dx.set_name("dx").set_output(True)
    g.spatial_tf_grid_generator_backward(dgrid).set_name("dtheta").set_output(True)


def ctc(g: gd.OperationGraphSpec) -> None:
    """Its own family: probs must be floating, which int8 IO is not."""
    probs = g.tensor([9, 3, 6], name="probs")
    ints = [
        g.tensor(dims, data_type="int32", name=name) for dims, name in (([3, 4], "labels"), ([3], "ll"), ([3], "il"))
    ]
    loss, grad = g.ctc_loss(probs, *ints)
    loss.set_name("loss").set_output(True)
    grad.set_name("grad").set_output(True)


def recurrent(g: gd.OperationGraphSpec) -> None:
    """Its own family: x and the weights must be floating, which int8 IO is not."""
    weights = []
    for layer in range(2):
        for direction in range(2):
            width = 6 if layer == 0 else 10
            for name, dims in (("w_ih", [20, width]), ("w_hh", [20, 5]), ("b_ih", [20]), ("b_hh", [20])):
                weights.append(g.tensor(dims, name=f"{name}_{layer}_{direction}"))
    lengths = g.tensor([3], data_type="int32", name="seq_lengths")
    x = g.tensor([4, 3, 6], name="x")
    y, hy, cy = g.rnn(x, weights, "lstm", 5, num_layers=2, bidirectional=True, seq_lengths=lengths)
    for t, name in ((y, "y"), (hy, "hy"), (cy, "cy")):
        t.set_name(name).set_output(True)  # type: ignore[union-attr]


def recurrent_training(g: gd.OperationGraphSpec) -> None:
    """A GRU's forward in training and its backward from the reserve (float32 whatever the IO)."""
    weights = []
    for direction in range(2):
        for name, dims in (("w_ih", [15, 6]), ("w_hh", [15, 5]), ("b_ih", [15]), ("b_hh", [15])):
            weights.append(g.tensor(dims, name=f"{name}_{direction}"))
    x, hx = g.tensor([4, 3, 6], name="x"), g.tensor([2, 3, 5], name="hx")
    lengths = g.tensor([3], data_type="int32", name="seq_lengths")
    y, hy, _, reserve = g.rnn_training(x, weights, "gru", 5, bidirectional=True, hx=hx, seq_lengths=lengths)
    assert y is not None and hy is not None and reserve is not None
    dx, dhx, _, dweights = g.rnn_backward(
        x, weights, reserve, y, "gru", 5, bidirectional=True, hx=hx, seq_lengths=lengths, dhy=hy
    )
    for t, name in ((dx, "dx"), (dhx, "dhx"), (dweights, "dweights")):
        t.set_name(name).set_output(True)  # type: ignore[union-attr]


def movement(g: gd.OperationGraphSpec) -> None:
    x, z = g.tensor(name="x", dim=[4, 6, 10]), g.tensor(name="z", dim=[4, 3, 10])
    cat = g.concatenate([x, z], axis=1)
    g.relu(g.transpose(cat, [0, 2, 1])).set_name("t").set_output(True)
    g.slice(x, [slice(None), slice(1, 5), slice(0, 10, 2)]).set_name("s").set_output(True)
    g.reshape(x, [24, 10]).set_name("r").set_output(True)


def attention(g: gd.OperationGraphSpec) -> None:
    """Grouped-query attention (BSHD Q, BHSD K and V, D != Dv) with a broadcast bias, a
    bottom-right causal window and statistics; and a padded, top-left causal ALiBi one with
    dropout (constant seed and offset)."""
    q = g.tensor(name="q", dim=[2, 4, 7, 16], stride=gd.packed_strides([2, 4, 7, 16], (0, 2, 1, 3)))
    k, v = g.tensor(name="k", dim=[2, 2, 13, 16]), g.tensor(name="v", dim=[2, 2, 13, 8])
    bias = g.tensor(name="bias", dim=[1, 1, 7, 13])
    o, stats = g.sdpa(
        q,
        k,
        v,
        attn_scale=0.25,
        bias=bias,
        use_causal_mask_bottom_right=True,
        sliding_window_length=5,
        generate_stats=True,
    )
    assert stats is not None
    o.set_name("o").set_output(True)
    stats.set_name("stats").set_output(True)
    lengths = {role: g.tensor(name=role, dim=[2, 1, 1, 1], data_type="int32") for role in ("seq_len_q", "seq_len_kv")}
    padded, _ = g.sdpa(
        q, k, v, use_causal_mask=True, use_alibi_mask=True, use_padding_mask=True, dropout=(0.1, 7, 3), **lengths
    )
    padded.set_name("padded").set_output(True)


def block_scaled_quantization(g: gd.OperationGraphSpec) -> None:
    """MXFP8 (e8m0 scales, a partial last block) round trip, and 1x16 fp32-scaled blocks down
    the columns, transposed."""
    x = g.tensor(name="x", dim=[5, 70])
    y, s = g.block_scale_quantize(x, 32)
    s.set_data_type("fp8_e8m0")
    g.block_scale_dequantize(y, s, 32).set_name("back").set_output(True)
    q, scale = g.block_scale_quantize(x, 16, axis=0, transpose=True)
    q.set_name("q").set_output(True).set_data_type("fp8_e5m2")
    scale.set_name("scale").set_output(True)


def mixture_of_experts(g: gd.OperationGraphSpec) -> None:
    """Router (sigmoid with bias, top-2 of 8), permutation, gather, grouped matmul, weighted
    un-permute; and a top-k down the columns."""
    logits, bias = g.tensor(name="logits", dim=[13, 8]), g.tensor(name="bias", dim=[8])
    weights, chosen = g.moe_router(logits, 2, "sigmoid", bias=bias)
    token_index, slot, firsts = g.moe_permutation(chosen, 8)
    rows = g.gather(g.tensor(name="h", dim=[13, 16]), token_index)
    y = g.moe_grouped_matmul(rows, g.tensor(name="w", dim=[8, 16, 12]), firsts)
    g.moe_unpermute(y, slot, weights).set_name("y").set_output(True)
    values, indices = g.topk(logits, 3, axis=0)
    values.set_name("values").set_output(True)
    indices.set_name("indices").set_output(True)


FAMILIES: dict[str, Build] = {
    build.__name__: build
    for build in (
        pointwise,
        elementary,
        matmul_bias_relu,
        conv_bn_relu,
        conv_dgrad_wgrad,
        layernorm_gelu,
        rmsnorm_residual,
        softmax_and_reductions,
        batchnorm_training,
        group_and_instance_norm,
        norm_backward,
        batchnorm_backward_genstats,
        norm_backward_fused,
        training_norms,
        windows,
        pooling_backward,
        local_response_norm,
        spatial_transformer,
        ctc,
        recurrent,
        recurrent_training,
        movement,
        attention,
        block_scaled_quantization,
        mixture_of_experts,
    )
}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_io_and_intermediate_type_compiles(family: str) -> None:
    """Each combination the validator accepts compiles for both targets; float, half and
    bf16 IO are accepted for every family, with any intermediate type."""
    accepted, rejected = [], {}
    for io, intermediate in itertools.product(IO_TYPES, INTERMEDIATE_TYPES):
        g = gd.OperationGraphSpec(
            name=f"{family}_{io}_{intermediate}", io_data_type=io, intermediate_data_type=intermediate
        )
        try:
            FAMILIES[family](g)
            accepted.append(g.validate())
        except GraphError as error:
            rejected[(io, intermediate)] = f"{type(error).__name__}: {error}"
    must = {(io, i) for io in ("float", "half", "bfloat16") for i in INTERMEDIATE_TYPES}
    assert not must & set(rejected), "\n".join(f"{k}: {v}" for k, v in rejected.items() if k in must)
    report = compile_graphs(accepted)
    assert report.failures == [], "\n\n".join(report.failures)
    assert report.graphs == len(accepted) and report.kernels >= len(TARGETS)


@pytest.mark.gpu
@pytest.mark.parametrize("intermediate", ["half", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_narrow_intermediates_of_float_graphs_match_the_reference(family: str, intermediate: str) -> None:
    """The graphs that did not compile before (float IO, half or bf16 intermediates) also
    run as the reference rounds them."""
    from tests.gpu_check import check_on_gpu

    g = gd.OperationGraphSpec(
        name=f"{family}_{intermediate}", io_data_type="float", intermediate_data_type=intermediate
    )
    FAMILIES[family](g)
    check_on_gpu(g, tolerance=TOLERANCE[gd.DataType(intermediate)])


def plan_and_example_graphs() -> list[Graph]:
    """The graphs of tests/plan_graphs.py and examples/graphs/*.json, validated."""
    builds = (
        plan_graphs.add_relu,
        plan_graphs.add_relu_and_sigmoid,
        plan_graphs.scaled,
        plan_graphs.sum_then_add,
        plan_graphs.matmul_relu,
    )
    examples = sorted(EXAMPLES.glob("*.json"))
    assert examples, f"no example graphs under {EXAMPLES}"
    specs = [build() for build in builds] + [gd.OperationGraphSpec.from_json(p.read_text()) for p in examples]
    return [spec.validate() for spec in specs]


def test_plan_and_example_graphs_compile() -> None:
    graphs = plan_and_example_graphs()
    report = compile_graphs(graphs)
    assert report.failures == [], "\n\n".join(report.failures)
    assert report.graphs == len(graphs)


def test_the_recorder_hands_this_tests_graphs_to_the_check(request: pytest.FixtureRequest) -> None:
    graphs = plan_and_example_graphs()
    pending = {signature(graph): test for graph, test in RECORDER.pending()}
    missing = [g.name for g in graphs if pending.get(signature(g)) != request.node.nodeid]
    assert not missing, f"the recorder missed {missing}: is it installed (tests/conftest.py)?"


def test_a_kernel_nvrtc_rejects_fails_the_check_naming_its_graph_and_test(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import codegen.nvrtc

    def reject(source: str, name: str, arch: int, arch_suffix: str = "") -> bytes:
        raise codegen.nvrtc.CompileError(f"NVRTC could not compile kernel '{name}' for sm_{arch}: a planted error")

    graph = plan_graphs.add_relu().validate()
    check = CompileCheck(KernelStore(tmp_path))
    monkeypatch.setattr(codegen.nvrtc, "compile_cubin", reject)
    with pytest.raises(pytest.fail.Exception) as failed:
        check.check([(graph, "tests/test_x.py::test_y")])
    message = str(failed.value)
    assert "tests/test_x.py::test_y" in message and f"graph '{graph.name}'" in message
    assert "a planted error" in message and "sm_80" in message and "sm_90" in message
    check.check([(graph, "tests/test_x.py::test_z")])  # checked once per session: claimed, not compiled again
    assert check.totals.graphs == 1 and check.totals.compiled == check.totals.kernels >= 2


def test_the_store_gives_one_claim_per_kernel_and_whole_cubins(tmp_path: Path) -> None:
    store = KernelStore(tmp_path)
    key = compiled_key("__global__ void k() {}", 90, "a")
    assert key != compiled_key("__global__ void k() {}", 90, "") and store.cubin(key) is None
    assert store.claim(key) and not store.claim(key)
    store.keep(key, b"cubin")
    assert store.cubin(key) == b"cubin" and not KernelStore(tmp_path).claim(key)
    other = compiled_key("__global__ void j() {}", 80, "")
    store.keep(other, b"kept before any claim")
    assert not store.claim(other) and sorted(p.suffix for p in tmp_path.iterdir()) == [".claim", ".cubin", ".cubin"]


def test_a_kernel_compiled_twice_in_the_session_comes_from_the_store() -> None:
    import codegen.nvrtc

    source = 'extern "C" __global__ void graphdnn_store_probe(float* x) { x[threadIdx.x] = 20261128.0f; }'
    first = codegen.nvrtc.compile_cubin(source, "graphdnn_store_probe", 80)
    reused = COMPILE_MEMORY.reused
    assert codegen.nvrtc.compile_cubin(source, "graphdnn_store_probe", 80) == first
    assert COMPILE_MEMORY.reused == reused + 1
