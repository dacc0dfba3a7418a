"""Fused nodes, each convex, must not need each other: the partition's quotient graph is a DAG.

Two fused nodes A and B can each be convex in the graph while A reads what B writes and
B reads what A writes; no order runs them (this crashed with "fused nodes form a cycle").
Hand-built graphs pin the two ways it happened, and random DAGs mixing every kind of
anchor check that partitions stay schedulable and compute what the graph computes.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from fusion_rules import Rejection, Rewrite, registered_rules
from tests.test_fusion_property import check_partition
from tests.test_fusion_rules import assert_runs_like_the_reference, float_graph, members

ROWS, COLS = 8, 16
BUILTIN_RULES = sorted(rule.name for rule in registered_rules())


def test_a_pointwise_group_does_not_cross_a_fused_node() -> None:
    """matmul_epilogue_0 = {mm, e2, e3} reads pa (through r) and is read by pb (through s):
    {pa, pb} is convex in the graph, but fused it would run both before and after it."""
    g = float_graph("crossing")
    x = g.tensor(name="x", dim=[ROWS, COLS])
    pa = g.relu(x, name="pa")
    mm = g.matmul(g.tensor(name="a", dim=[ROWS, COLS]), g.tensor(name="w", dim=[COLS, COLS]), name="mm")
    g.add(mm, g.reduction(pa, mode="add", axes=[1], name="r"), name="e2").set_output(True)
    s = g.reduction(g.relu(mm, name="e3"), mode="add", axes=[1], name="s")
    g.add(pa, s, name="pb").set_output(True)
    p = gd.fuse(g)
    assert members(p) == [
        ("single", "elementwise", ["pa"]),
        ("single", "reduction", ["r"]),
        ("matmul_epilogue", "gemm", ["mm", "e2", "e3"]),
        ("single", "reduction", ["s"]),
        ("single", "elementwise", ["pb"]),
    ]
    check_partition(p)
    assert_runs_like_the_reference(p)


def test_an_epilogue_that_would_cross_a_fused_node_is_refused() -> None:
    """rowsum's epilogue {rowsum.relu, rowsum.add} feeds matmul_epilogue_0 and reads from it
    (through mm.sum); the manager refuses it and says which fused node is in the way."""
    g = float_graph("crossing")
    rowsum = g.reduction(g.tensor(name="b", dim=[ROWS, COLS]), mode="add", axes=[1], name="rowsum")
    relu = g.relu(rowsum, name="rowsum.relu")
    mm = g.matmul(g.tensor(name="a", dim=[ROWS, COLS]), g.tensor(name="w", dim=[COLS, COLS]), name="mm")
    g.add(mm, relu, name="mm.add").set_output(True)
    total = g.reduction(g.relu(mm, name="mm.relu"), mode="add", axes=[1], name="mm.sum")
    g.add(rowsum, total, name="rowsum.add").set_output(True)
    p = gd.fuse(g)
    assert p.rewrites == (
        Rewrite("matmul_epilogue", "matmul_epilogue_0", ("mm", "mm.add", "mm.relu")),
        Rewrite("reduction_epilogue", "reduction_epilogue_0", ("mm.sum", "rowsum.add")),
    )
    assert p.rejections == (
        Rejection(
            "reduction_epilogue",
            ("rowsum", "rowsum.relu", "rowsum.add"),
            "fusing them would form a cycle with fused node matmul_epilogue_0",
        ),
    )
    check_partition(p)
    assert_runs_like_the_reference(p)


def random_dag(seed: int) -> gd.OperationGraphSpec:
    """40-120 nodes of pointwise ops, matmuls, layer norms, softmaxes and row sums, each
    reading recent values more often than old ones (so paths cross), with extra outputs."""
    rng = random.Random(seed)
    g = gd.OperationGraphSpec(f"dag{seed}", io_data_type="float")
    full = [g.tensor(name=f"x{i}", dim=[ROWS, COLS]) for i in range(rng.randint(1, 3))]
    rows: list[gd.TensorSpec] = []
    unread = set(range(len(full)))

    def pick(values: list[gd.TensorSpec]) -> gd.TensorSpec:
        index = (
            max(0, len(values) - 1 - int(rng.expovariate(0.3))) if rng.random() < 0.8 else rng.randrange(len(values))
        )
        if values is full:
            unread.discard(index)
        return values[index]

    def any_value() -> gd.TensorSpec:
        return pick(rows) if rows and rng.random() < 0.3 else pick(full)

    for _ in range(rng.randint(40, 120)):
        kind = rng.random()
        if kind < 0.5:  # pointwise: full unless every operand is a row value
            a = any_value()
            if kind < 0.2:
                v = g.relu(a)
            else:
                v = (g.add if kind < 0.4 else g.mul)(a, any_value() if rng.random() < 0.8 else 2.0)
            (full if v.dim == (ROWS, COLS) else rows).append(v)
        elif kind < 0.65:
            full.append(g.matmul(pick(full), g.tensor(dim=[COLS, COLS])))
        elif kind < 0.75:
            norm = g.layernorm("inference", pick(full), g.tensor(dim=[1, COLS]), g.tensor(dim=[1, COLS]), 1e-5)[0]
            assert norm is not None
            full.append(norm)
        elif kind < 0.85:
            full.append(g.softmax(pick(full)))
        else:
            rows.append(g.reduction(pick(full), mode="add", axes=[1]))
        if rng.random() < 0.05:
            (full + rows)[-1].set_output(True)
    for index in unread:
        g.relu(full[index]).set_output(True)
    read = {t for node in g.nodes for t in node.input_tensors()}
    for v in full + rows:
        if v.producer is not None and v not in read:
            v.set_output(True)
    return g


@pytest.mark.compile_sample
@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), disable=st.sets(st.sampled_from(BUILTIN_RULES)))
def test_partitions_of_random_dags_are_acyclic_and_exact(seed: int, disable: set[str]) -> None:
    ir = random_dag(seed).validate()
    p = gd.fuse(ir, disable=disable)
    check_partition(p)  # among other things: every edge goes forward in the partition's order
    assert_runs_like_the_reference(p)


@pytest.mark.parametrize("seed", [44, 60, 67])
def test_random_dags_that_used_to_form_a_cycle(seed: int) -> None:
    """Seeds of random_dag whose partitions formed a cycle before the quotient check."""
    p = gd.fuse(random_dag(seed).validate(), disable=["add_norm", "conv_bn_act", "norm_epilogue"])
    check_partition(p)
    assert_runs_like_the_reference(p)
