"""Hypothesis strategies for random valid graphs, as recipes that can be built many ways.

A recipe is a list of steps, each naming an op and the earlier values it reads. Building
a recipe with different names or a different (valid) insertion order gives the same graph,
which is what the signature and JSON tests need; the fusion tests use the same recipes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

import graphdnn as gd

UNARY = [
    "relu",
    "gelu",
    "gelu_approx_tanh",
    "sigmoid",
    "tanh",
    "swish",
    "exp",
    "neg",
    "abs",
    "identity",
    "softplus",
    "elu",
    "leaky_relu",
]
BINARY = ["add", "sub", "mul", "max", "min"]


@dataclass
class Step:
    op: str
    args: tuple[int, ...]  # indices of earlier values (inputs are values 0..n_inputs-1)
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recipe:
    io_type: str
    intermediate_type: str
    input_dims: list[tuple[int, ...]]
    input_layouts: list[str]
    steps: list[Step]
    outputs: set[int]  # value indices marked as outputs (all sinks plus some others)

    @property
    def n_values(self) -> int:
        return len(self.input_dims) + len(self.steps)

    def dependencies(self, step_index: int) -> set[int]:
        """Steps that must be added before step ``step_index``."""
        n_in = len(self.input_dims)
        return {a - n_in for a in self.steps[step_index].args if a >= n_in}


def build(
    recipe: Recipe, *, prefix: str = "", order: list[int] | None = None, graph_name: str = "g"
) -> tuple[gd.OperationGraphSpec, dict[int, gd.TensorSpec]]:
    """Build the recipe; ``order`` is a topological order of steps (default: as listed)."""
    g = gd.OperationGraphSpec(
        name=graph_name, io_data_type=recipe.io_type, intermediate_data_type=recipe.intermediate_type
    )
    values: dict[int, gd.TensorSpec] = {}
    for i, (dim, layout) in enumerate(zip(recipe.input_dims, recipe.input_layouts)):
        stride = gd.nhwc_strides(dim) if layout == "nhwc" else gd.packed_strides(dim)
        values[i] = g.tensor(name=f"{prefix}in{i}", dim=dim, stride=stride)
    n_in = len(recipe.input_dims)
    for s in order if order is not None else range(len(recipe.steps)):
        step = recipe.steps[s]
        method = getattr(g, step.op)
        out = method(*(values[a] for a in step.args), name=f"{prefix}n{s}", **step.kwargs)
        values[n_in + s] = out[0] if isinstance(out, list) else out
    for v in recipe.outputs:
        values[v].set_output(True)
    return g, values


def random_topological_order(recipe: Recipe, seed: int) -> list[int]:
    rng = random.Random(seed)
    placed: list[int] = []
    remaining = set(range(len(recipe.steps)))
    while remaining:
        ready = sorted(s for s in remaining if recipe.dependencies(s) <= set(placed))
        pick = rng.choice(ready)
        placed.append(pick)
        remaining.remove(pick)
    return placed


@st.composite
def pointwise_recipes(draw: st.DrawFn, max_steps: int = 8) -> Recipe:
    """DAGs of pointwise ops over broadcast-compatible inputs."""
    rank = draw(st.integers(2, 4))
    base = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    n_inputs = draw(st.integers(1, 3))
    input_dims = [base]
    for _ in range(n_inputs - 1):
        mask = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        input_dims.append(tuple(1 if m else d for d, m in zip(base, mask)))
    layouts = [draw(st.sampled_from(["nchw", "nhwc"])) if len(d) >= 3 else "nchw" for d in input_dims]
    steps: list[Step] = []
    full = [0]  # values with the full base dims (so every result broadcasts back to base)
    for _ in range(draw(st.integers(1, max_steps))):
        n_values = n_inputs + len(steps)
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            steps.append(Step(op, (draw(st.sampled_from(full)),)))
        else:
            op = draw(st.sampled_from(BINARY))
            a = draw(st.sampled_from(full))
            b = draw(st.integers(0, n_values - 1))
            steps.append(Step(op, (a, b)))
        full.append(n_values)
    for unread in sorted(set(range(n_inputs)) - {a for step in steps for a in step.args}):
        steps.append(Step("add", (full[-1], unread)))
        full.append(n_inputs + len(steps) - 1)
    return Recipe(
        io_type=draw(st.sampled_from(["float", "half", "bfloat16"])),
        intermediate_type=draw(st.sampled_from(["float", "float", "half"])),
        input_dims=input_dims,
        input_layouts=layouts,
        steps=steps,
        outputs=_outputs(draw, n_inputs, steps),
    )


def _outputs(draw: st.DrawFn, n_inputs: int, steps: list[Step]) -> set[int]:
    """Every sink (so no node is dead) plus a random choice of other results."""
    read = {a for step in steps for a in step.args}
    values = range(n_inputs, n_inputs + len(steps))
    sinks = {v for v in values if v not in read}
    extra = draw(st.sets(st.sampled_from(list(values)), max_size=2))
    return sinks | extra


def random_feeds(ir: gd.Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.dim).astype(t.data_type.numpy) for t in ir.inputs}
