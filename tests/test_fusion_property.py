"""Fusion never changes results, and every partition is a valid schedule (hypothesis).

``execute_partition`` runs each fused node the way its kernel will (im2col GEMM, folded
batch norm, single-pass row norms, sum / sum-of-squares batch statistics) and only lets
later fused nodes read what earlier ones wrote; it must agree with the op-by-op reference
executor on random graphs built around every fusion anchor, with all rules and with
random subsets disabled.

Tolerances (‖fused − reference‖ / ‖reference‖): 1e-9 for double graphs, which fusion
leaves unfused (the kernels take no double tensors), so they compare each anchor kernel
alone; measured spread up to ~1e-13. 1e-5 for float graphs, where the differences in
float64 (~1e-16) almost never flip a float32 rounding; measured spread 0 over several
thousand outputs.
"""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from fusion_rules import Family, FusedNode, Partition, registered_rules
from fusion_rules.partition_reference import execute_partition
from tests.graph_strategies import build, fusion_recipes, random_feeds

BUILTIN_RULES = sorted(rule.name for rule in registered_rules())
TOLERANCE = {"double": 1e-9, "float": 1e-5}
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ over the finite values; inf/NaN must sit in the same places."""
    a, b = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), "non-finite values differ"
    finite = np.isfinite(b)
    scale = np.linalg.norm(b[finite])
    diff = np.linalg.norm(a[finite] - b[finite])
    return float(diff / scale) if scale else float(diff)


@pytest.mark.compile_sample
@SETTINGS
@given(recipe=fusion_recipes(), disable=st.sets(st.sampled_from(BUILTIN_RULES)), seed=st.integers(0, 2**16))
def test_fused_execution_matches_the_reference(recipe, disable, seed) -> None:
    ir = build(recipe)[0].validate()
    feeds = random_feeds(ir, seed)
    want = gd.reference.execute(ir, feeds)
    for disabled in ((), disable):
        got = execute_partition(gd.fuse(ir, disable=disabled), feeds)
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert got[name].dtype == value.dtype
            error = relative_error(got[name], value)
            assert error <= TOLERANCE[recipe.io_type], f"{name}: relative error {error:.3g} with {disabled=}"


@pytest.mark.compile_sample
@SETTINGS
@given(recipe=fusion_recipes(), disable=st.sets(st.sampled_from(BUILTIN_RULES)))
def test_every_partition_is_a_valid_schedule(recipe, disable) -> None:
    ir = build(recipe)[0].validate()
    check_partition(gd.fuse(ir, disable=disable))


def check_partition(partition: Partition) -> None:
    """Each node in exactly one fused node; each fused node convex, with the right reads and
    writes and its members split into anchor, prologue and epilogue; the order topological."""
    ir = partition.graph
    owner: dict[int, int] = {}
    for index, fused in enumerate(partition.nodes):
        for node in fused.nodes:
            assert node.id not in owner, f"{node.name} is in two fused nodes"
            owner[node.id] = index
        check_members(fused)
        check_bookkeeping(ir, fused)
    assert set(owner) == {node.id for node in ir.nodes}
    dag = nx.DiGraph()
    dag.add_nodes_from(node.id for node in ir.nodes)
    for node in ir.nodes:
        for tensor in node.input_tensors():
            producer = ir.producer(tensor)
            if producer is not None:
                dag.add_edge(producer.id, node.id)
                assert owner[producer.id] <= owner[node.id], f"{node.name} runs before {producer.name}"
    for fused in partition.nodes:
        inside = {node.id for node in fused.nodes}
        leaving = {d for n in inside for d in nx.descendants(dag, n)} - inside
        assert not any(nx.descendants(dag, o) & inside for o in leaving), f"{fused.name} is not convex"


def check_members(fused: FusedNode) -> None:
    if fused.synthesized:  # the anchor computes every member: no prologue, no epilogue
        assert fused.prologue is None and not fused.epilogue
    split = [n for n in (fused.anchor, fused.prologue) if n is not None and not fused.synthesized]
    split += list(fused.nodes if fused.synthesized else fused.epilogue)
    assert sorted(n.id for n in split) == sorted(n.id for n in fused.nodes)
    assert list(fused.nodes) == sorted(fused.nodes, key=lambda n: n.id)
    if fused.family is Family.ELEMENTWISE:
        assert fused.anchor is None


def check_bookkeeping(ir: gd.Graph, fused: FusedNode) -> None:
    members = set(fused.nodes)
    produced = {t.id for n in fused.nodes for t in n.output_tensors()}
    reads = {t.id for n in fused.nodes for t in n.input_tensors() if t.id not in produced and not t.is_constant}
    writes = {
        t.id
        for n in fused.nodes
        for t in n.output_tensors()
        if not t.is_virtual or any(reader not in members for reader in ir.consumers(t))
    }
    assert {t.id for t in fused.inputs} == reads
    assert {t.id for t in fused.outputs} == writes


# -- the fused reference itself ----------------------------------------------------------------
def small_conv_bn_relu(data_type: str = "float") -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name="cbr", io_data_type=data_type, intermediate_data_type=data_type)
    x = g.tensor(name="x", dim=[2, 3, 5, 6], stride=gd.nhwc_strides([2, 3, 5, 6]))
    w = g.tensor(name="w", dim=[4, 3, 3, 3])
    stats = [g.tensor(name=n, dim=[1, 4, 1, 1]) for n in ("mean", "inv_variance", "scale", "bias")]
    y = g.conv_fprop(x, w, padding=[1, 0], stride=[2, 1], dilation=[1, 2], name="conv")
    y = g.batchnorm_inference(y, *stats, name="bn")
    g.relu(y, name="relu").set_name("y").set_output(True)
    return g


def test_the_fused_reference_reports_a_tensor_a_fused_node_did_not_write() -> None:
    ir = small_conv_bn_relu().validate()
    partition = gd.fuse(ir, disable=["conv_bn_act", "conv_epilogue"])
    conv = partition.nodes[0]
    broken = Partition(ir, (replace(conv, outputs=()), *partition.nodes[1:]), partition.rewrites, ())
    with pytest.raises(gd.StructureError, match=r"reads 'conv::y', which no earlier fused node writes to memory"):
        execute_partition(broken, random_feeds(ir, 0))


def test_the_fused_reference_refuses_to_write_what_a_fused_node_does_not_compute() -> None:
    ir = small_conv_bn_relu().validate()
    fused = gd.fuse(ir).nodes[0]
    broken = replace(fused, outputs=(*fused.outputs, ir.tensor("x")))
    with pytest.raises(gd.StructureError, match=r"'conv_bn_act_0' writes 'x', which none of its nodes computes"):
        execute_partition(Partition(ir, (broken,), (), ()), random_feeds(ir, 0))


def test_the_fused_reference_reads_only_a_fused_nodes_inputs() -> None:
    ir = small_conv_bn_relu().validate()
    fused = gd.fuse(ir).nodes[0]
    broken = replace(fused, inputs=tuple(t for t in fused.inputs if t.name != "scale"))
    with pytest.raises(gd.StructureError, match=r"'conv_bn_act_0' reads 'scale', which is neither among its inputs"):
        execute_partition(Partition(ir, (broken,), (), ()), random_feeds(ir, 0))


def test_a_gemm_kernel_with_another_anchor_is_refused() -> None:
    g = gd.OperationGraphSpec(name="ln", io_data_type="float")
    x, s, b = g.tensor(name="x", dim=[3, 4]), g.tensor(name="s", dim=[1, 4]), g.tensor(name="b", dim=[1, 4])
    g.layernorm("inference", x, s, b, 1e-5, name="ln")[0].set_output(True)
    ir = g.validate()
    fused = gd.fuse(ir).nodes[0]
    wrong = Partition(ir, (replace(fused, family=Family.GEMM),), (), ())
    with pytest.raises(
        gd.UnsupportedError,
        match=r"the gemm kernel family computes conv_dgrad, conv_fprop, conv_wgrad, matmul, not layernorm",
    ):
        execute_partition(wrong, random_feeds(ir, 0))


def test_the_fused_conv_is_its_own_computation() -> None:
    """The im2col GEMM and folded batch norm agree with the op-by-op reference to float64
    round-off on a strided, dilated, asymmetrically padded NHWC convolution (double io)."""
    ir = small_conv_bn_relu("double").validate()
    feeds = random_feeds(ir, 3)
    got, want = execute_partition(gd.fuse(ir), feeds)["y"], gd.reference.execute(ir, feeds)["y"]
    assert relative_error(got, want) <= 1e-13
