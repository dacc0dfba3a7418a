"""The execution API on the reference backend: variant packs, in-place outputs, allocation, bind,
and an error naming the tensor for every bad buffer (the GPU plan applies the same rules)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphdnn as gd
from graphdnn.reference_plan import host_array
from tests import plan_graphs


@pytest.fixture
def plan() -> gd.ReferencePlan:
    built = gd.compile(plan_graphs.add_relu(dtype="float"), backend="reference")
    assert isinstance(built, gd.ReferencePlan)
    return built


def arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((8, 33)).astype(np.float32),
        "b": rng.standard_normal((1, 33)).astype(np.float32),
    }


def test_outputs_are_written_in_place(plan: gd.ReferencePlan, rng: np.random.Generator) -> None:
    feeds = arrays(rng)
    y = np.full((8, 33), np.nan, dtype=np.float32)
    outputs = plan.execute({**feeds, "y": y})
    assert outputs["y"] is y
    np.testing.assert_array_equal(y, np.maximum(feeds["x"] + feeds["b"], 0))


def test_missing_outputs_are_allocated_with_the_graphs_strides(rng: np.random.Generator) -> None:
    graph = plan_graphs.scaled()
    ir = graph.validate()
    x = host_array(ir.tensor("x"), rng.standard_normal((2, 3, 4, 5)))
    outputs = graph.build(backend="reference").execute({"x": x, "alpha": 0.5})
    y = outputs["y"]
    assert y.strides == tuple(s * 4 for s in gd.nhwc_strides([2, 3, 4, 5]))
    np.testing.assert_allclose(y, x * 0.5 + 1, rtol=1e-6)


def test_keys_may_be_specs_tensors_names_or_uids(rng: np.random.Generator) -> None:
    graph = plan_graphs.add_relu(dtype="float")
    x, b = graph.tensor_named("x"), graph.tensor_named("b")
    b.set_uid(7)
    ir = graph.validate()
    feeds = arrays(rng)
    plan = gd.compile(graph, backend="reference")
    by_spec = plan.execute({x: feeds["x"], 7: feeds["b"]})["y"]
    by_ir = plan.execute({ir.tensor("x"): feeds["x"], "b": feeds["b"]})["y"]
    np.testing.assert_array_equal(by_spec, by_ir)


def test_a_bound_plan_rereads_its_inputs_each_call(plan: gd.ReferencePlan, rng: np.random.Generator) -> None:
    feeds = arrays(rng)
    bound = plan.bind(feeds)
    bound()
    first = bound.outputs["y"].copy()
    feeds["x"] += 10.0  # same buffer, new contents
    bound()
    np.testing.assert_array_equal(bound.outputs["y"], np.maximum(feeds["x"] + feeds["b"], 0))
    assert not np.array_equal(first, bound.outputs["y"])


def test_runtime_scalars_take_numbers_or_one_element_arrays(rng: np.random.Generator) -> None:
    graph = plan_graphs.scaled()
    x = host_array(graph.validate().tensor("x"), rng.standard_normal((2, 3, 4, 5)))
    plan = gd.compile(graph, backend="reference")
    from_number = plan.execute({"x": x, "alpha": 2})["y"]
    from_array = plan.execute({"x": x, "alpha": np.array([2.0], dtype=np.float32)})["y"]
    np.testing.assert_array_equal(from_number, from_array)


def _bad(feeds: dict[str, Any], **changes: Any) -> dict[Any, Any]:
    return {**feeds, **changes}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: _bad(f, x=f["x"].astype(np.float16)), "tensor 'x': has data type float16, the graph declares float"),
        (lambda f: _bad(f, x=f["x"][:, :32]), r"tensor 'x': has dims \[8, 32\], the graph declares \[8, 33\]"),
        (
            lambda f: _bad(f, x=np.asfortranarray(f["x"])),
            r"tensor 'x': has strides \[1, 8\], the graph declares \[33, 1\]",
        ),
        (lambda f: _bad(f, b=f["b"].tolist()), "tensor 'b': is a list; the reference backend takes NumPy arrays"),
        (lambda f: _bad(f, y=np.zeros((8, 33), np.float64)), "tensor 'y': has data type float64"),
        (lambda f: {"x": f["x"]}, "^graph input 'b' missing from the variant pack"),
        (lambda f: _bad(f, nope=f["x"]), "graph 'add_relu' has no tensor named 'nope'"),
        (
            lambda f: _bad(f, **{"add_relu.add::y": f["x"]}),
            "tensor 'add_relu.add::y': is virtual: it lives only inside the plan",
        ),
        (lambda f: {**f, 42: f["x"]}, "no tensor of graph 'add_relu' has uid 42"),
    ],
)
def test_every_bad_buffer_is_named(plan: gd.ReferencePlan, rng: np.random.Generator, change, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(gd.FeedError, match=message):
        plan.execute(change(arrays(rng)))


def test_constants_and_duplicates_are_refused(rng: np.random.Generator) -> None:
    graph = plan_graphs.scaled()
    ir = graph.validate()
    x = host_array(ir.tensor("x"), rng.standard_normal((2, 3, 4, 5)))
    plan = gd.compile(graph, backend="reference")
    constant = next(t for t in ir.tensors if t.is_constant)
    with pytest.raises(gd.FeedError, match=f"tensor '{constant.name}': is a constant \\(1.0\\) compiled into the plan"):
        plan.execute({"x": x, "alpha": 1.0, constant.name: 1.0})
    with pytest.raises(gd.FeedError, match="tensor 'x': is given twice"):
        plan.execute({"x": x, graph.tensor_named("x"): x, "alpha": 1.0})
    with pytest.raises(gd.FeedError, match="tensor 'alpha': is a pass-by-value scalar: give a Python number"):
        plan.execute({"x": x, "alpha": np.zeros(3)})


def test_the_reference_plan_has_the_plan_interface(plan: gd.ReferencePlan) -> None:
    assert plan.backend == "reference"
    assert (plan.kernels, plan.workspace_size) == ((), 0)
    assert [t.name for t in plan.inputs] == ["x", "b"]
    assert [t.name for t in plan.outputs] == ["y"]


def test_unknown_backend() -> None:
    with pytest.raises(gd.GraphError, match="unknown backend 'tpu'; expected one of gpu, reference"):
        gd.compile(plan_graphs.add_relu(), backend="tpu")
