"""Large graphs come out of every host-side stage right (not timed: benchmarks/graph_scale.py times them)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import graphdnn as gd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from graph_scale import chain, residual, wide


def test_a_long_pointwise_chain_fuses_into_one_group() -> None:
    ir = chain(3000).validate()
    partition = gd.fuse(ir)
    assert [(f.rule, f.nodes) for f in partition.nodes] == [("pointwise_group", ir.nodes)]
    assert [t.name for t in partition.nodes[0].outputs] == [ir.outputs[0].name]


def test_residual_blocks_fuse_block_by_block() -> None:
    """Per block: add + layernorm, matmul + relu, and the second matmul (with the final add in the last)."""
    blocks = 400
    ir = residual(5 * blocks).validate()
    partition = gd.fuse(ir)
    assert Counter(f.rule for f in partition.nodes) == {
        "add_norm": blocks - 1,
        "matmul_epilogue": blocks + 1,
        "single": blocks,
    }
    assert sorted(n.id for f in partition.nodes for n in f.nodes) == [n.id for n in ir.nodes]
    position = {n.id: i for i, f in enumerate(partition.nodes) for n in f.nodes}
    for node in ir.nodes:  # fused nodes come in an order that runs every producer first
        for t in node.input_tensors():
            producer = ir.producer(t)
            assert producer is None or position[producer.id] <= position[node.id]


def test_many_parallel_branches_fuse_into_one_group() -> None:
    ir = wide(3000).validate()
    partition = gd.fuse(ir)
    assert len(partition.nodes) == 1
    assert partition.nodes[0].nodes == ir.nodes


def test_a_large_file_loads_back_to_the_same_graph() -> None:
    spec = residual(5000)
    again = gd.OperationGraphSpec.from_json(spec.to_json())
    assert again.signature() == spec.signature()
    assert [n.name for n in again.validate().nodes] == [n.name for n in spec.validate().nodes]
