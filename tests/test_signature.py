"""The signature: invariant to names, uids and declaration order; sensitive to everything else."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphdnn as gd
from graphdnn.signature import canonical_form
from tests.graph_strategies import build, pointwise_recipes, random_topological_order


def small_block(
    *,
    names: str = "",
    dim: tuple[int, ...] = (2, 8, 5, 5),
    data_type: str = "bf16",
    mode: str = "cross_correlation",
    upper_clip: float | None = None,
    extra_output: bool = False,
    nhwc: bool = True,
    swap_add: bool = False,
) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"block{names}", io_data_type=data_type)
    layout = gd.nhwc_strides if nhwc else gd.nchw_strides
    x = g.tensor(name=f"x{names}", dim=dim, stride=layout(dim))
    w = g.tensor(name=f"w{names}", dim=(dim[1], dim[1], 3, 3), stride=layout((dim[1], dim[1], 3, 3)))
    y = g.conv_fprop(x, w, padding=[1, 1], convolution_mode=mode, name=f"conv{names}")
    r = g.relu(y, upper_clip=upper_clip, name=f"relu{names}")
    s = g.add(x, r, name=f"add{names}") if swap_add else g.add(r, x, name=f"add{names}")
    s.set_output(True)
    if extra_output:
        r.set_output(True)
    return g


def test_names_uids_and_graph_name_do_not_matter() -> None:
    a = small_block(names="_a")
    b = small_block(names="_b")
    b.tensor_named("x_b").set_uid(77)
    assert a.signature() == b.signature()


@pytest.mark.parametrize(
    "change",
    [
        {"dim": (3, 8, 5, 5)},
        {"data_type": "half"},
        {"mode": "convolution"},
        {"upper_clip": 6.0},
        {"extra_output": True},
        {"nhwc": False},
        {"swap_add": True},
    ],
    ids=lambda c: next(iter(c)),
)
def test_every_property_changes_the_signature(change: dict) -> None:
    assert small_block().signature() != small_block(**change).signature()


def test_constant_values_and_stride_gaps_change_the_signature() -> None:
    def graph(value: float, stride: tuple[int, ...]) -> str:
        g = gd.OperationGraphSpec(io_data_type="float")
        x = g.tensor(dim=[4, 6], stride=stride)
        g.add(x, value).set_output(True)
        return g.signature()

    assert graph(1.0, (6, 1)) != graph(2.0, (6, 1))
    assert graph(1.0, (6, 1)) != graph(1.0, (8, 1))


def test_json_key_order_does_not_matter() -> None:
    g = small_block()
    document = json.loads(g.to_json())
    reordered = {key: document[key] for key in reversed(list(document))}
    reordered["tensors"] = [dict(reversed(list(t.items()))) for t in document["tensors"]]
    reordered["nodes"] = [dict(reversed(list(n.items()))) for n in document["nodes"]]
    assert gd.OperationGraphSpec.from_json(json.dumps(reordered)).signature() == g.signature()


def test_symmetric_branches_get_one_signature_in_any_order() -> None:
    """Identical parallel chains are ties that the canonical order must break consistently."""

    def graph(interleave: bool) -> str:
        g = gd.OperationGraphSpec(io_data_type="float")
        x = g.tensor(dim=[4, 4])
        if interleave:
            a, b = g.exp(x), g.exp(x)
            ends = [g.relu(a), g.relu(b)]
        else:
            ends = [g.relu(g.exp(x)), g.relu(g.exp(x))]
        for end in ends:
            end.set_output(True)
        return g.signature()

    assert graph(True) == graph(False)


@pytest.mark.compile_sample
@settings(max_examples=60, deadline=None)
@given(recipe=pointwise_recipes(), seed=st.integers(0, 2**16))
def test_insertion_order_and_names_do_not_matter(recipe, seed) -> None:
    first, _ = build(recipe, prefix="a_")
    second, _ = build(recipe, prefix="b_", order=random_topological_order(recipe, seed), graph_name="other")
    assert first.signature() == second.signature()


@pytest.mark.compile_sample
@settings(max_examples=40, deadline=None)
@given(recipe=pointwise_recipes())
def test_canonical_form_describes_the_whole_graph(recipe) -> None:
    ir = build(recipe)[0].validate()
    form = canonical_form(ir)
    assert len(form["tensors"]) == len(ir.tensors)
    assert len(form["nodes"]) == len(ir.nodes)
    assert sum(1 for t in form["tensors"] if not t[3]) == len([t for t in ir.tensors if not t.is_virtual])


def test_stable_across_processes_and_hash_seeds() -> None:
    code = "from tests.test_signature import small_block; print(small_block().signature())"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True
        )
        results.add(out.stdout.strip())
    results.add(small_block().signature())
    assert len(results) == 1


def test_golden_value() -> None:
    """Pins the canonical form: if this changes, bump signature.FORM_VERSION (caches depend on it)."""
    assert small_block().signature() == GOLDEN


GOLDEN = "94ea068bf5d0ae875774d963dcf308f285599ced49fdd1169a24b1462935be3b"


def _shuffled_copy(g: gd.OperationGraphSpec, seed: int) -> gd.OperationGraphSpec:
    """The same graph from a file with tensors, ids, names and node entries in another order."""
    rng = random.Random(seed)
    document = json.loads(g.to_json())
    ids = [t["id"] for t in document["tensors"]]
    new_ids = dict(zip(ids, rng.sample(range(10 * len(ids)), len(ids)), strict=True))
    for t in document["tensors"]:
        t["id"] = new_ids[t["id"]]
        t["name"] = f"t{t['id']}"
        t.pop("uid", None)
    for n in document["nodes"]:
        n["name"] = f"n{rng.getrandbits(64)}"
        for bindings in (n["inputs"], n["outputs"]):
            for role, bound in bindings.items():
                bindings[role] = [new_ids[i] for i in bound] if isinstance(bound, list) else new_ids[bound]
    rng.shuffle(document["tensors"])
    rng.shuffle(document["nodes"])
    return gd.OperationGraphSpec.from_json(json.dumps(document))


def test_large_graph_with_symmetric_branches_signs_the_same_in_any_order() -> None:
    """5,000 nodes: a long chain, then 100 identical branches (ties broken by singling out)."""
    g = gd.OperationGraphSpec(io_data_type="float")
    scale = g.tensor(dim=[1, 16])
    t = g.tensor(dim=[4, 16])
    for i in range(3000):
        t = g.relu(t) if i % 2 else g.mul(t, scale)
    for _ in range(100):
        b = t
        for i in range(20):
            b = g.exp(b) if i % 2 else g.mul(b, scale)
        b.set_output(True)
    assert len(g.nodes) == 5000
    assert _shuffled_copy(g, seed=1).signature() == g.signature() == _shuffled_copy(g, seed=2).signature()


def test_negative_zero_constants_are_told_apart_whatever_the_order() -> None:
    """0.0 == -0.0 in Python: labels of constants are keyed by repr, so neither the sign nor
    the declaration order is lost."""

    def signed(second: float, positive_first: bool) -> str:
        g = gd.OperationGraphSpec("zeros", io_data_type="float")
        x = g.tensor(name="x", dim=[4, 4])
        if positive_first:
            a, b = g.add(x, 0.0), g.add(x, second)
        else:
            b, a = g.add(x, second), g.add(x, 0.0)
        g.sub(a, b).set_output(True)
        return g.signature()

    assert signed(-0.0, True) == signed(-0.0, False)
    assert signed(-0.0, True) != signed(0.0, True)
