"""execute_partition given the plain reference's values: members computed as the op's
reference computes them, from bit-identical inputs, take the plain values; nothing else does."""

from __future__ import annotations

import numpy as np

import graphdnn as gd
from fusion_rules.partition_reference import execute_partition
from graphdnn import reference
from graphdnn.ir import Graph
from graphdnn.random_inputs import random_inputs


def mlp() -> Graph:
    """layernorm -> gelu, then matmul -> bias -> gelu: a row-norm and a GEMM fused node."""
    g = gd.OperationGraphSpec(name="mlp", io_data_type="bf16", intermediate_data_type="bf16")
    x = g.tensor([16, 32], name="x")
    h = g.layernorm("inference", x, g.tensor([1, 32], name="s"), g.tensor([1, 32], name="b"), 1e-5, name="ln")[0]
    h = g.gelu_approx_tanh(h, name="act0").set_output(True)
    h = g.matmul(h, g.tensor([32, 24], name="w"), name="fc")
    h = g.bias(h, g.tensor([1, 24], name="fc_b"), name="fc_bias")
    g.gelu_approx_tanh(h, name="act1").set_name("y").set_output(True)
    return g.validate()


def test_sharing_gives_the_unshared_results_bit_for_bit() -> None:
    ir = mlp()
    partition = gd.fuse(ir)
    feeds = random_inputs(ir, 3)
    alone = execute_partition(partition, feeds)
    shared = execute_partition(partition, feeds, reference.evaluate(ir, feeds))
    assert alone.keys() == shared.keys() == {"act0::y", "y"}
    for name in alone:
        assert np.array_equal(alone[name].view(np.uint16), shared[name].view(np.uint16)), name


def test_members_computed_by_the_op_reference_take_the_plain_values() -> None:
    ir = mlp()
    feeds = random_inputs(ir, 3)
    plain = reference.evaluate(ir, feeds)
    y = ir.tensor("y").id
    plain[y] = np.full_like(plain[y], 7.0)  # act1's inputs match the plain ones: its output is taken as is
    assert (execute_partition(gd.fuse(ir), feeds, plain)["y"] == 7.0).all()


def test_anchors_with_kernels_of_their_own_and_changed_inputs_are_computed() -> None:
    ir = mlp()
    partition = gd.fuse(ir)
    feeds = random_inputs(ir, 3)
    alone = execute_partition(partition, feeds)
    # plain values of another weight: fc's input differs, so fc and all after it are recomputed
    plain = reference.evaluate(ir, {**feeds, "w": -feeds["w"]})
    ln = ir.tensor("ln::y").id
    plain[ln] = np.zeros_like(plain[ln])  # the layernorm kernel computes its rows itself, never shared
    shared = execute_partition(partition, feeds, plain)
    for name in alone:
        assert np.array_equal(alone[name].view(np.uint16), shared[name].view(np.uint16)), name
