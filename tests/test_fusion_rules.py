"""Each fusion rule fires on its pattern and refuses its near misses, with the reasons it gives.

Small hand-built graphs; the log (``partition.rewrites``, ``partition.rejections``) is part
of the contract, so the tests compare it exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import graphdnn as gd
from fusion_rules import (
    Epilogue,
    Family,
    Partition,
    Pattern,
    Rejection,
    Rewrite,
    Rule,
    op,
    register_rule,
    registered_rules,
    unregister_rule,
)
from fusion_rules.guards import FUSED_GUARDS
from fusion_rules.partition_reference import execute_partition
from tests.graph_strategies import random_feeds
from tests.test_fusion_property import check_partition, relative_error

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"
N, C, K, H, W = 2, 4, 6, 5, 5


def members(partition: Partition) -> list[tuple[str, str, list[str]]]:
    """(rule, family, member names) of every fused node, in the partition's order."""
    return [(f.rule, f.family.value, [n.name for n in f.nodes]) for f in partition.nodes]


def conv(g: gd.OperationGraphSpec, name: str = "conv0", data_type: str | None = None) -> gd.TensorSpec:
    x = g.tensor(name="x", dim=[N, C, H, W], stride=gd.nhwc_strides([N, C, H, W]), data_type=data_type)
    w = g.tensor(name="w", dim=[K, C, 3, 3], data_type=data_type)
    return g.conv_fprop(x, w, padding=[1, 1], name=name)


def per_channel(g: gd.OperationGraphSpec, name: str, data_type: str | None = None) -> gd.TensorSpec:
    return g.tensor(name=name, dim=[1, K, 1, 1], data_type=data_type)


def bn_inference(g: gd.OperationGraphSpec, y: gd.TensorSpec, name: str = "bn0", mean_type: str | None = None):
    stats = [per_channel(g, f"{name}.{role}") for role in ("inv_variance", "scale", "bias")]
    return g.batchnorm_inference(y, per_channel(g, f"{name}.mean", mean_type), *stats, name=name)


def float_graph(name: str = "g") -> gd.OperationGraphSpec:
    return gd.OperationGraphSpec(name=name, io_data_type="float")


def assert_runs_like_the_reference(partition: Partition) -> None:
    feeds = random_feeds(partition.graph, 7)
    want = gd.reference.execute(partition.graph, feeds)
    got = execute_partition(partition, feeds)
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-5, name


# -- conv + bias + batch norm + activation ----------------------------------------------------
def test_conv_bn_act_fuses_conv_bias_bn_and_activation() -> None:
    g = float_graph()
    y = g.bias(conv(g), per_channel(g, "b"), name="bias0")
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("conv_bn_act", "conv_bn_act_0", ("conv0", "bias0", "bn0", "relu0")),)
    assert p.rejections == ()
    (fused,) = p.nodes
    assert (fused.family, fused.anchor.name, [n.name for n in fused.epilogue]) == (
        Family.GEMM,
        "conv0",
        ["bias0", "bn0", "relu0"],
    )
    assert_runs_like_the_reference(p)


def test_conv_bn_act_without_bias_or_activation() -> None:
    g = float_graph()
    bn_inference(g, conv(g)).set_output(True)
    assert gd.fuse(g).rewrites == (Rewrite("conv_bn_act", "conv_bn_act_0", ("conv0", "bn0")),)


def test_a_per_element_bias_is_not_the_per_channel_bias_of_conv_bn_act() -> None:
    g = float_graph()
    y = g.add(conv(g), g.tensor(name="full", dim=[N, K, H, W]), name="bias0")
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    p = gd.fuse(g)
    assert p.rejections == (
        Rejection(
            "conv_bn_act",
            ("conv0", "bias0"),
            "bias0's operand 'full' has dims [2, 6, 5, 5], not one value per output channel [1, 6, 1, 1]",
        ),
    )
    # The generic epilogue still takes it all: a per-element operand is fine there.
    assert p.rewrites == (Rewrite("conv_epilogue", "conv_epilogue_0", ("conv0", "bias0", "bn0", "relu0")),)
    assert_runs_like_the_reference(p)


def test_an_extra_reader_of_the_conv_output_blocks_conv_bn_act() -> None:
    g = float_graph()
    y = conv(g)
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    g.add(y, g.tensor(name="other", dim=[N, K, H, W]), name="add3").set_output(True)
    p = gd.fuse(g)
    assert Rejection("conv_bn_act", ("conv0", "bn0"), "conv0's output is also read by add3") in p.rejections
    # The conv epilogue takes both readers: the kernel writes relu0's and add3's results.
    assert members(p) == [("conv_epilogue", "gemm", ["conv0", "bn0", "relu0", "add3"])]
    assert [t.name for t in p.nodes[0].outputs] == ["relu0::y", "add3::y"]
    assert_runs_like_the_reference(p)


def test_a_non_elementwise_extra_reader_keeps_the_conv_output_in_memory() -> None:
    g = float_graph()
    y = conv(g)
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    g.softmax(y, axis=1, name="sm").set_output(True)
    p = gd.fuse(g)
    assert p.rejections == (
        Rejection("conv_bn_act", ("conv0", "bn0"), "conv0's output is also read by sm"),
        Rejection("conv_epilogue", ("conv0", "bn0"), "conv0's output is also read by sm"),
        Rejection("conv_epilogue", ("bn0", "relu0"), "its input 'bn0::y' is computed from the fused nodes (a cycle)"),
    )
    assert members(p) == [
        ("single", "gemm", ["conv0"]),
        ("pointwise_group", "elementwise", ["bn0", "relu0"]),
        ("single", "reduction", ["sm"]),
    ]
    assert_runs_like_the_reference(p)


def test_an_output_marked_intermediate_is_not_fused_away() -> None:
    g = float_graph()
    y = conv(g).set_name("c").set_output(True)
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    p = gd.fuse(g)
    assert Rejection("conv_bn_act", ("conv0", "bn0"), "conv0's output 'c' is a graph output") in p.rejections
    assert members(p) == [("single", "gemm", ["conv0"]), ("pointwise_group", "elementwise", ["bn0", "relu0"])]
    assert [t.name for t in p.nodes[0].outputs] == ["c"]
    assert_runs_like_the_reference(p)


def test_a_double_tensor_keeps_its_node_out_of_fused_kernels() -> None:
    g = float_graph()
    g.relu(bn_inference(g, conv(g), mean_type="double"), name="relu0").set_output(True)
    p = gd.fuse(g)
    reason = "bn0's tensor 'bn0.mean' is double; fused kernels take float, half, bfloat16, fp8 and integer tensors"
    assert p.rejections[0] == Rejection("conv_bn_act", ("conv0", "bn0"), reason)
    assert Rejection("conv_epilogue", ("conv0", "bn0"), reason) in p.rejections
    assert members(p) == [
        ("single", "gemm", ["conv0"]),
        ("single", "elementwise", ["bn0"]),
        ("single", "elementwise", ["relu0"]),
    ]


def test_fp8_fuses_on_sm_89_and_later_only() -> None:
    g = float_graph()
    g.relu(conv(g, data_type="fp8_e4m3"), name="relu0").set_output(True)
    reason = "conv0 uses fp8 tensor 'x'; fused fp8 kernels need sm_89 or newer, the target is sm_80"
    old = gd.fuse(g, arch="sm_80")
    assert old.rewrites == ()
    assert Rejection("conv_epilogue", ("conv0",), reason) in old.rejections
    for arch in ("sm_89", "sm_90a", 90):
        assert gd.fuse(g, arch=arch).rewrites == (Rewrite("conv_epilogue", "conv_epilogue_0", ("conv0", "relu0")),)
    with pytest.raises(gd.GraphError, match=r"unknown target architecture 'volta'; expected e.g. 'sm_80'"):
        gd.fuse(g, arch="volta")


# -- GEMM epilogues ----------------------------------------------------------------------------
def test_conv_epilogue_takes_bias_residual_and_activation() -> None:
    g = float_graph()
    y = g.bias(conv(g), per_channel(g, "b"), name="bias0")
    y = g.add(y, g.tensor(name="residual", dim=[N, K, H, W]), name="add0")
    g.gelu(y, name="gelu0").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("conv_epilogue", "conv_epilogue_0", ("conv0", "bias0", "add0", "gelu0")),)
    assert_runs_like_the_reference(p)


def matmul_graph() -> tuple[gd.OperationGraphSpec, gd.TensorSpec]:
    g = float_graph()
    a = g.tensor(name="a", dim=[3, 5, 7])
    b = g.tensor(name="b", dim=[7, 4])
    return g, g.matmul(a, b, name="mm")


def test_matmul_epilogue_takes_bias_and_activation() -> None:
    g, y = matmul_graph()
    y = g.bias(y, g.tensor(name="bias", dim=[1, 1, 4]), name="mm.bias")
    g.swish(y, name="mm.act").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("matmul_epilogue", "matmul_epilogue_0", ("mm", "mm.bias", "mm.act")),)
    assert p.nodes[0].family is Family.GEMM
    assert_runs_like_the_reference(p)


def test_a_cycle_through_a_non_elementwise_op_is_refused() -> None:
    """conv0 -> reduction -> add(., conv0's output): the add would need the reduction,
    which needs the whole conv output: fusing it into conv0's epilogue forms a cycle."""
    g = float_graph()
    y = conv(g)
    stats = g.reduction(y, mode="avg", axes=[0, 2, 3], name="mean0")
    g.add(stats, y, name="center").set_output(True)
    p = gd.fuse(g)
    assert p.rejections == (
        Rejection("conv_bn_act", ("conv0", "center"), "conv0's output is also read by mean0"),
        Rejection(
            "conv_epilogue", ("mean0", "center"), "its input 'mean0::y' is computed from the fused nodes (a cycle)"
        ),
        Rejection(
            "reduction_epilogue",
            ("mean0", "center"),
            "center broadcasts to dims [2, 6, 5, 5], beyond the fused output's [1, 6, 1, 1]",
        ),
    )
    assert p.rewrites == ()
    assert_runs_like_the_reference(p)


def test_an_epilogue_op_may_not_broadcast_beyond_the_anchor_output() -> None:
    g = float_graph()
    x = g.tensor(name="x", dim=[4, 6])
    r = g.reduction(x, mode="max", axes=[1], name="rowmax")
    g.sub(x, r, name="shift").set_output(True)
    p = gd.fuse(g)
    assert p.rejections == (
        Rejection(
            "reduction_epilogue",
            ("rowmax", "shift"),
            "shift broadcasts to dims [4, 6], beyond the fused output's [4, 1]",
        ),
    )
    assert members(p) == [("single", "reduction", ["rowmax"]), ("single", "elementwise", ["shift"])]


def test_reduction_epilogue_applies_to_the_reduced_values() -> None:
    g = float_graph()
    x = g.tensor(name="x", dim=[4, 6])
    r = g.reduction(x, mode="norm2", axes=[1], name="norm")
    g.reciprocal(g.add(r, 1e-6, name="eps"), name="inv").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("reduction_epilogue", "reduction_epilogue_0", ("norm", "eps", "inv")),)
    assert_runs_like_the_reference(p)


# -- norms ---------------------------------------------------------------------------------------
def rows_graph(rows: int = 5, hidden: int = 8) -> tuple[gd.OperationGraphSpec, gd.TensorSpec, gd.TensorSpec]:
    g = float_graph()
    return g, g.tensor(name="x", dim=[rows, hidden]), g.tensor(name="scale", dim=[1, hidden])


def test_norm_epilogue_fuses_layernorm_with_a_pointwise_chain() -> None:
    g, x, s = rows_graph()
    y = g.layernorm("inference", x, s, g.tensor(name="bias", dim=[1, 8]), 1e-5, name="ln")[0]
    y = g.mul(g.gelu(y, name="gelu"), g.tensor(name="gate", dim=[1, 8]), name="gate.mul")
    y.set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("norm_epilogue", "norm_epilogue_0", ("ln", "gelu", "gate.mul")),)
    assert p.nodes[0].family is Family.ROW_NORM
    assert_runs_like_the_reference(p)


def test_norm_epilogue_fuses_groupnorm_into_the_group_norm_family() -> None:
    g = float_graph()
    x = g.tensor(name="x", dim=[N, K, H, W])
    y = g.groupnorm(x, per_channel(g, "s"), per_channel(g, "b"), 1e-5, groups=3, name="gn")[0]
    g.silu(y, name="act").set_output(True)
    p = gd.fuse(g)
    assert members(p) == [("norm_epilogue", "group_norm", ["gn", "act"])]
    assert_runs_like_the_reference(p)


def test_a_non_elementwise_op_after_a_norm_is_not_an_epilogue() -> None:
    g, x, s = rows_graph()
    y = g.layernorm("inference", x, s, g.tensor(name="bias", dim=[1, 8]), 1e-5, name="ln")[0]
    g.softmax(y, name="sm").set_output(True)
    p = gd.fuse(g)
    assert p.rejections == (
        Rejection(
            "norm_epilogue",
            ("ln", "sm"),
            "ln's output is read only by sm (softmax), which cannot join an epilogue (not elementwise)",
        ),
    )
    assert members(p) == [("single", "row_norm", ["ln"]), ("single", "reduction", ["sm"])]


def test_add_norm_fuses_the_residual_add_and_writes_the_sum_when_it_is_needed() -> None:
    g, x, s = rows_graph()
    total = g.add(x, g.tensor(name="h", dim=[5, 8]), name="residual")
    y = g.rmsnorm("inference", total, s, epsilon=1e-6, name="rms")[0]
    g.relu(y, name="act").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("add_norm", "add_norm_0", ("residual", "rms", "act")),)
    (fused,) = p.nodes
    assert (fused.prologue.name, fused.anchor.name, [n.name for n in fused.epilogue]) == ("residual", "rms", ["act"])
    assert [t.name for t in fused.outputs] == ["act::y"]  # the sum stays in registers
    total.set_output(True)
    p = gd.fuse(g)
    assert [t.name for t in p.nodes[0].outputs] == ["residual::y", "act::y"]  # the residual stream
    assert_runs_like_the_reference(p)


def test_add_layernorm_in_training_writes_its_statistics() -> None:
    g, x, s = rows_graph()
    total = g.add(x, g.tensor(name="h", dim=[5, 8]), name="residual")
    y, mean, inv = g.layernorm("training", total, s, g.tensor(name="bias", dim=[1, 8]), 1e-5, name="ln")
    y.set_output(True)
    mean.set_name("mean").set_output(True)
    inv.set_name("inv").set_output(True)
    p = gd.fuse(g)
    assert members(p) == [("add_norm", "row_norm", ["residual", "ln"])]
    assert [t.name for t in p.nodes[0].outputs] == ["ln::y", "mean", "inv"]
    assert_runs_like_the_reference(p)


# -- training batch norm, pointwise groups ---------------------------------------------------
def test_bn_train_act_keeps_statistics_and_running_averages() -> None:
    g = float_graph()
    x = g.tensor(name="x", dim=[N, K, H, W])
    stats = [per_channel(g, n) for n in ("scale", "bias", "running_mean", "running_var")]
    y, mean, inv, next_mean, next_var = g.batchnorm(x, *stats, epsilon=1e-5, momentum=0.1, name="bn")
    y = g.add(y, g.tensor(name="residual", dim=[N, K, H, W]), name="add")
    g.relu(y, name="relu").set_output(True)
    for t, name in ((mean, "mean"), (inv, "inv"), (next_mean, "next_mean"), (next_var, "next_var")):
        t.set_name(name).set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("bn_train_act", "bn_train_act_0", ("bn", "add", "relu")),)
    assert [t.name for t in p.nodes[0].outputs] == ["mean", "inv", "next_mean", "next_var", "relu::y"]
    assert_runs_like_the_reference(p)


def test_pointwise_group_is_maximal_and_convex() -> None:
    g = float_graph()
    x, b = g.tensor(name="x", dim=[3, 4]), g.tensor(name="b", dim=[1, 4])
    u = g.tanh(g.add(x, b, name="a0"), name="t0")
    v = g.softmax(u, name="sm")  # u -> sm -> m would leave the group and come back
    g.mul(u, v, name="m").set_output(True)
    g.neg(u, name="n0").set_output(True)
    assert members(gd.fuse(g))[1] == ("reduction_epilogue", "reduction", ["sm", "m"])
    p = gd.fuse(g, disable=["reduction_epilogue"])
    assert members(p) == [
        ("pointwise_group", "elementwise", ["a0", "t0", "n0"]),
        ("single", "reduction", ["sm"]),
        ("single", "elementwise", ["m"]),
    ]
    assert [t.name for t in p.nodes[0].outputs] == ["t0::y", "n0::y"]
    assert_runs_like_the_reference(p)


def test_reads_writes_and_the_workspace_of_a_small_dag() -> None:
    """x -> matmul -> bias -> relu -> (layernorm, add) ; the relu output crosses fused nodes."""
    g = float_graph("dag")
    x, w = g.tensor(name="x", dim=[4, 6]), g.tensor(name="w", dim=[6, 8])
    h = g.relu(g.bias(g.matmul(x, w, name="mm"), g.tensor(name="b", dim=[1, 8]), name="mm.bias"), name="mm.relu")
    y = g.layernorm("inference", h, g.tensor(name="s", dim=[1, 8]), g.tensor(name="beta", dim=[1, 8]), 1e-5, name="ln")
    g.add(y[0], h, name="skip").set_name("out").set_output(True)
    p = gd.fuse(g)
    assert members(p) == [
        ("matmul_epilogue", "gemm", ["mm", "mm.bias", "mm.relu"]),
        ("norm_epilogue", "row_norm", ["ln", "skip"]),
    ]
    assert [[t.name for t in f.inputs] for f in p.nodes] == [["x", "w", "b"], ["mm.relu::y", "s", "beta"]]
    assert [[t.name for t in f.outputs] for f in p.nodes] == [["mm.relu::y"], ["out"]]
    assert [t.name for t in p.materialized] == ["mm.relu::y"]
    check_partition(p)
    assert_runs_like_the_reference(p)


# -- the pass manager ------------------------------------------------------------------------
def test_rules_run_in_priority_order() -> None:
    rules = registered_rules()
    assert [r.priority for r in rules] == sorted(r.priority for r in rules)
    assert [r.name for r in rules][:3] == ["conv_bn_act", "add_norm", "norm_epilogue"]


def test_disable_turns_rules_off() -> None:
    g = gd.load(EXAMPLES / "transformer_block.json")
    p = gd.fuse(g, disable=["add_norm"])
    assert members(p)[-2:] == [
        ("matmul_epilogue", "gemm", ["fc2", "fc2.bias", "residual"]),
        ("single", "row_norm", ["rms"]),
    ]
    p = gd.fuse(g, disable=["add_norm", "matmul_epilogue", "norm_epilogue", "pointwise_group"])
    assert p.rewrites == ()
    assert len(p.nodes) == len(p.graph.nodes)


def test_an_unknown_rule_name_is_an_error() -> None:
    g = gd.load(EXAMPLES / "transformer_block.json")
    with pytest.raises(gd.GraphError, match=r"unknown fusion rule\(s\) \['add_rms'\]; rules: conv_bn_act, add_norm"):
        gd.fuse(g, disable=["add_rms"])


@pytest.fixture
def scaled_residual_rule() -> Iterator[Rule]:
    rule = register_rule(
        Rule(
            name="mul_rmsnorm",
            pattern=Pattern(
                (
                    op("mul", bind="scale", where=FUSED_GUARDS),
                    op("rmsnorm", bind="norm", via=["input"], where=FUSED_GUARDS),
                    Epilogue(guards=FUSED_GUARDS),
                )
            ),
            family=Family.ROW_NORM,
            anchor="norm",
            prologue="scale",
            priority=5,
            description="a scaled input (x * alpha) + rmsnorm",
        )
    )
    yield rule
    unregister_rule(rule.name)


def test_a_user_rule_fires(scaled_residual_rule: Rule) -> None:
    g, x, s = rows_graph()
    y = g.rmsnorm("inference", g.mul(x, 0.5, name="alpha"), s, epsilon=1e-6, name="rms")[0]
    g.tanh(y, name="act").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (Rewrite("mul_rmsnorm", "mul_rmsnorm_0", ("alpha", "rms", "act")),)
    assert (p.nodes[0].prologue.name, p.nodes[0].anchor.name) == ("alpha", "rms")
    assert_runs_like_the_reference(p)
    with pytest.raises(gd.GraphError, match="a fusion rule named 'mul_rmsnorm' is already registered"):
        register_rule(scaled_residual_rule)
    assert gd.fuse(g, disable=["mul_rmsnorm"]).rewrites[0].rule == "norm_epilogue"


def test_the_user_rule_is_gone_after_its_test() -> None:
    assert "mul_rmsnorm" not in {r.name for r in registered_rules()}


# -- the example graphs ------------------------------------------------------------------------
def test_resnet_block_is_three_fused_convs_with_the_residual_in_the_last_epilogue() -> None:
    p = gd.fuse(gd.load(EXAMPLES / "resnet50_bottleneck.json"))
    assert members(p) == [
        ("conv_bn_act", "gemm", ["conv1.conv", "conv1.bn", "conv1.relu"]),
        ("conv_bn_act", "gemm", ["conv2.conv", "conv2.bn", "conv2.relu"]),
        ("conv_bn_act", "gemm", ["conv3.conv", "conv3.bn", "residual", "out.relu"]),
    ]
    assert [t.name for t in p.materialized] == ["conv1.relu::y", "conv2.relu::y"]
    assert p.rejections == ()
    check_partition(p)


def test_transformer_block_fuses_ln_gelu_two_matmul_epilogues_and_add_rmsnorm() -> None:
    p = gd.fuse(gd.load(EXAMPLES / "transformer_block.json"))
    assert members(p) == [
        ("norm_epilogue", "row_norm", ["ln", "ln.gelu"]),
        ("matmul_epilogue", "gemm", ["fc1", "fc1.bias", "fc1.gelu"]),
        ("matmul_epilogue", "gemm", ["fc2", "fc2.bias"]),
        ("add_norm", "row_norm", ["residual", "rms"]),
    ]
    assert [t.name for t in p.nodes[-1].outputs] == ["residual", "y"]
    check_partition(p)


def test_training_graph_is_a_conv_then_bn_train_act() -> None:
    p = gd.fuse(gd.load(EXAMPLES / "conv_bn_relu_training.json"))
    assert members(p) == [("single", "gemm", ["conv"]), ("bn_train_act", "batchnorm_train", ["bn", "relu"])]
    assert p.rejections == (
        Rejection(
            "conv_epilogue",
            ("conv", "bn"),
            "conv's output is read only by bn (batchnorm), which cannot join an epilogue (not elementwise)",
        ),
    )
    check_partition(p)


def test_describe_lists_members_reads_writes_and_reasons() -> None:
    g = float_graph("desc")
    y = conv(g).set_name("c").set_output(True)
    g.relu(bn_inference(g, y), name="relu0").set_output(True)
    text = gd.fuse(g).describe()
    assert text.splitlines()[:4] == [
        "partition of 'desc': 3 nodes -> 2 fused nodes",
        "  conv0 [gemm, rule single]: conv0",
        "    reads  x, w",
        "    writes c",
    ]
    assert "  not fused:\n    conv_bn_act: conv0 → bn0 not fused: conv0's output 'c' is a graph output" in text
