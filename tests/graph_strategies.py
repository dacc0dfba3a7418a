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


STRIDES = {  # a recipe input's layout -> its strides
    "nchw": gd.packed_strides,
    "nhwc": gd.nhwc_strides,
    "bshd": lambda dim: gd.packed_strides(dim, (0, 2, 1, 3)),  # attention's [B, S, H, D] memory order
}


@dataclass
class Step:
    op: str
    args: tuple[int, ...]  # indices of earlier values (inputs are values 0..n_inputs-1)
    kwargs: dict[str, Any] = field(default_factory=dict)
    roles: tuple[str, ...] = ()  # when given, the keyword each arg is passed as (else positional)
    extra_outputs: tuple[int, ...] = ()  # positions of a multi-output op's other outputs marked as outputs


@dataclass
class Recipe:
    io_type: str
    intermediate_type: str
    input_dims: list[tuple[int, ...]]
    input_layouts: list[str]
    steps: list[Step]
    outputs: set[int]  # value indices marked as outputs (all sinks plus some others)
    input_types: dict[int, str] = field(default_factory=dict)  # inputs not of io_type (sequence lengths)

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
        values[i] = g.tensor(
            name=f"{prefix}in{i}", dim=dim, stride=STRIDES[layout](dim), data_type=recipe.input_types.get(i)
        )
    n_in = len(recipe.input_dims)
    for s in order if order is not None else range(len(recipe.steps)):
        step = recipe.steps[s]
        method = getattr(g, step.op)
        operands = [values[a] for a in step.args]
        if step.roles:
            out = method(name=f"{prefix}n{s}", **dict(zip(step.roles, operands)), **step.kwargs)
        else:
            out = method(*operands, name=f"{prefix}n{s}", **step.kwargs)
        values[n_in + s] = out[0] if isinstance(out, (list, tuple)) else out
        for position in step.extra_outputs:
            out[position].set_output(True)
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


# -- recipes for the fusion tests ------------------------------------------------------------
# Graphs built around the fusion anchors (conv, matmul, the norms, reductions) with the chains
# the rules look for, and the near misses they must refuse: per-element instead of
# per-channel operands, extra readers of intermediates, intermediates marked as outputs,
# statistics of a value fed back into its own epilogue. No exp/log: every value stays finite.
ACTIVATIONS = [
    "relu",
    "gelu",
    "gelu_approx_tanh",
    "sigmoid",
    "tanh",
    "swish",
    "softplus",
    "elu",
    "leaky_relu",
    "abs",
    "neg",
    "identity",
]
REDUCTION_MODES = ["add", "max", "min", "avg", "amax", "norm2"]
Handle = tuple[str, int]  # ("in", k): the k-th input; ("step", k): the k-th step's first output


class Draft:
    """A recipe being drawn: values are handles with known dims, numbered when it is done."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.inputs: list[tuple[tuple[int, ...], str]] = []
        self.input_types: dict[int, str] = {}
        self.steps: list[tuple[str, dict[str, Handle], dict[str, Any], tuple[int, ...]]] = []
        self.dims: dict[Handle, tuple[int, ...]] = {}

    def input(
        self, dims: tuple[int, ...], layouts: tuple[str, ...] = ("nchw", "nhwc"), data_type: str | None = None
    ) -> Handle:
        layout = self.draw(st.sampled_from(list(layouts))) if len(dims) == 4 else "nchw"
        handle = ("in", len(self.inputs))
        if data_type is not None:
            self.input_types[len(self.inputs)] = data_type
        self.inputs.append((dims, layout))
        self.dims[handle] = dims
        return handle

    def op(
        self,
        kind: str,
        dims: tuple[int, ...],
        inputs: dict[str, Handle],
        extra_outputs: tuple[int, ...] = (),
        **kw: Any,
    ) -> Handle:
        handle = ("step", len(self.steps))
        self.steps.append((kind, inputs, kw, extra_outputs))
        self.dims[handle] = dims
        return handle

    def computed(self) -> list[Handle]:
        return [("step", k) for k in range(len(self.steps))]

    def same_dims(self, dims: tuple[int, ...]) -> list[Handle]:
        return [h for h, d in self.dims.items() if d == dims]

    def recipe(self, io_type: str) -> Recipe:
        n_in = len(self.inputs)

        def index(handle: Handle) -> int:
            return handle[1] if handle[0] == "in" else n_in + handle[1]

        steps = [
            Step(kind, tuple(index(h) for h in inputs.values()), kw, tuple(inputs), extra)
            for kind, inputs, kw, extra in self.steps
        ]
        return Recipe(
            io_type=io_type,
            intermediate_type=io_type,
            input_dims=[dims for dims, _ in self.inputs],
            input_layouts=[layout for _, layout in self.inputs],
            steps=steps,
            outputs=_outputs(self.draw, n_in, steps),
            input_types=self.input_types,
        )


def _broadcast_operand(d: Draft, dims: tuple[int, ...], channel_axis: int) -> tuple[int, ...]:
    """Dims of a second operand: per channel, per element, or one size-1 stretch pattern."""
    kind = d.draw(st.sampled_from(["channel", "channel", "element", "stretch"]))
    if kind == "channel":
        return tuple(e if axis == channel_axis else 1 for axis, e in enumerate(dims))
    if kind == "element":
        return dims
    mask = d.draw(st.lists(st.booleans(), min_size=len(dims), max_size=len(dims)))
    return tuple(1 if m else e for e, m in zip(dims, mask))


def _tail(d: Draft, v: Handle, channel_axis: int, max_ops: int = 3) -> Handle:
    """A chain of pointwise ops after ``v``: activations, scale/bias, residual adds, constants."""
    dims = d.dims[v]
    for _ in range(d.draw(st.integers(0, max_ops))):
        choice = d.draw(st.sampled_from(["act", "act", "operand", "residual", "constant"]))
        if choice == "act":
            v = d.op(d.draw(st.sampled_from(ACTIVATIONS)), dims, {"input": v})
        elif choice == "operand":
            kind = d.draw(st.sampled_from(["bias", "scale", "add", "mul", "sub", "max"]))
            operand = d.input(_broadcast_operand(d, dims, channel_axis))
            roles = {"bias": ("input", "bias"), "scale": ("input", "scale")}.get(kind, ("a", "b"))
            v = d.op(kind, dims, dict(zip(roles, (v, operand))))
        elif choice == "residual":
            other = d.draw(st.sampled_from(d.same_dims(dims)))
            v = d.op("add", dims, {"a": v, "b": other} if d.draw(st.booleans()) else {"a": other, "b": v})
        else:
            v = d.op("mul", dims, {"a": v}, b=d.draw(st.sampled_from([0.5, -1.25, 2.0])))
    return v


def _per_channel(d: Draft, dims: tuple[int, ...]) -> Handle:
    return d.input((1, dims[1], *[1] * (len(dims) - 2)))


def _conv_block(d: Draft, v: Handle) -> Handle:
    """conv_fprop [+ bias (per channel or, as a near miss, per element)] [+ batchnorm_inference] + a tail."""
    n, c, h, w = d.dims[v]
    groups = d.draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
    k = groups * d.draw(st.integers(1, 3))
    r, s = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 3))
    pad, stride, dilation = d.draw(st.integers(0, 1)), d.draw(st.integers(1, 2)), d.draw(st.integers(1, 2))
    out = [(e + 2 * pad - dilation * (f - 1) - 1) // stride + 1 for e, f in ((h, r), (w, s))]
    if min(out) < 1:
        r = s = stride = dilation = 1
        pad, out = 0, [h, w]
    weight = d.input((k, c // groups, r, s))
    dims = (n, k, *out)
    y = d.op(
        "conv_fprop",
        dims,
        {"image": v, "weight": weight},
        padding=[pad, pad],
        stride=[stride] * 2,
        dilation=[dilation] * 2,
    )
    if d.draw(st.booleans()):
        bias = _per_channel(d, dims) if d.draw(st.integers(0, 3)) else d.input(dims)
        y = d.op("bias", dims, {"input": y, "bias": bias})
    if d.draw(st.booleans()):
        stats = {role: _per_channel(d, dims) for role in ("mean", "inv_variance", "scale", "bias")}
        y = d.op("batchnorm_inference", dims, {"input": y, **stats})
    return _tail(d, y, 1)


def _batchnorm_block(d: Draft, v: Handle) -> Handle:
    """Training batchnorm (statistics, maybe running averages, some marked as outputs) [+ add] [+ relu]."""
    dims = d.dims[v]
    inputs = {"input": v, "scale": _per_channel(d, dims), "bias": _per_channel(d, dims)}
    kw: dict[str, Any] = {"epsilon": 1e-5}
    present = [1, 2]
    if d.draw(st.booleans()):
        inputs |= {"in_running_mean": _per_channel(d, dims), "in_running_var": _per_channel(d, dims)}
        kw["momentum"] = 0.1
        present += [3, 4]
    marked = tuple(sorted(d.draw(st.sets(st.sampled_from(present), max_size=2))))
    y = d.op("batchnorm", dims, inputs, marked, **kw)
    if d.draw(st.booleans()):
        y = d.op("add", dims, {"a": y, "b": d.draw(st.sampled_from(d.same_dims(dims)))})
    if d.draw(st.booleans()):
        y = d.op("relu", dims, {"input": y})
    return y


def _group_norm_block(d: Draft, v: Handle) -> Handle:
    dims = d.dims[v]
    inputs = {"input": v, "scale": _per_channel(d, dims), "bias": _per_channel(d, dims)}
    if d.draw(st.booleans()):
        groups = d.draw(st.sampled_from([g for g in range(1, dims[1] + 1) if dims[1] % g == 0]))
        y = d.op("groupnorm", dims, inputs, epsilon=1e-5, groups=groups)
    else:
        y = d.op("instancenorm", dims, inputs, norm_forward_phase="inference", epsilon=1e-5)
    return _tail(d, y, 1)


def _row_norm_block(d: Draft, v: Handle) -> Handle:
    """[residual add +] layernorm or rmsnorm (training statistics maybe marked) + a tail."""
    dims = d.dims[v]
    if d.draw(st.booleans()):
        other = d.draw(st.sampled_from(d.same_dims(dims))) if d.draw(st.booleans()) else d.input(dims)
        v = d.op("add", dims, {"a": v, "b": other})
    affine = (*[1] * (len(dims) - 1), dims[-1])
    kind = d.draw(st.sampled_from(["layernorm", "rmsnorm"]))
    phase = d.draw(st.sampled_from(["inference", "training"]))
    inputs = {"input": v, "scale": d.input(affine)}
    if kind == "layernorm" or d.draw(st.booleans()):
        inputs["bias"] = d.input(affine)
    stats = (1, 2) if kind == "layernorm" else (1,)
    marked = tuple(d.draw(st.sets(st.sampled_from(stats)))) if phase == "training" else ()
    y = d.op(kind, dims, inputs, marked, norm_forward_phase=phase, epsilon=1e-5)
    return _tail(d, y, len(dims) - 1)


def _matmul_block(d: Draft, v: Handle) -> Handle:
    """matmul (batched, maybe broadcast) [+ bias per column or per element] + a tail."""
    dims = d.dims[v]
    cols = d.draw(st.integers(1, 5))
    batch = dims[:-2]
    b_batch = d.draw(st.sampled_from([(), batch, tuple(1 for _ in batch)]))
    weight = d.input((*b_batch, dims[-1], cols))
    out = (*batch, dims[-2], cols)
    y = d.op("matmul", out, {"A": v, "B": weight})
    if d.draw(st.booleans()):
        bias = d.input((*[1] * (len(out) - 1), cols) if d.draw(st.integers(0, 3)) else out)
        y = d.op("bias", out, {"input": y, "bias": bias})
    return _tail(d, y, len(out) - 1)


def _reduction_block(d: Draft, v: Handle) -> Handle:
    """softmax + a tail, or a reduction + a tail, whose result may be added back onto ``v``
    (the statistics of a value fed into its own epilogue: a cycle if fused)."""
    dims = d.dims[v]
    if d.draw(st.booleans()):
        y = d.op("softmax", dims, {"input": v}, axis=d.draw(st.integers(-len(dims), len(dims) - 1)))
        return _tail(d, y, 1)
    axes = sorted(d.draw(st.sets(st.integers(0, len(dims) - 1), min_size=1)))
    reduced = tuple(1 if axis in axes else e for axis, e in enumerate(dims))
    r = d.op("reduction", reduced, {"input": v}, mode=d.draw(st.sampled_from(REDUCTION_MODES)), axes=axes)
    r = _tail(d, r, 1, max_ops=2)
    if d.draw(st.booleans()):
        return d.op("add", dims, {"a": r, "b": v} if d.draw(st.booleans()) else {"a": v, "b": r})
    return v


def _extra_reader(d: Draft) -> None:
    """A second reader of an earlier intermediate: elementwise, or not (softmax)."""
    value = d.draw(st.sampled_from(d.computed()))
    kind = d.draw(st.sampled_from(["relu", "neg", "softmax"]))
    d.op(kind, d.dims[value], {"input": value}, **({"axis": 1} if kind == "softmax" else {}))


@st.composite
def fusion_recipes(draw: st.DrawFn, max_blocks: int = 3) -> Recipe:
    """Image graphs (conv, batch/group/instance norm, reductions) or row graphs (matmul,
    layer/RMS norm, reductions): chains of blocks on small awkward shapes, float or double."""
    d = Draft(draw)
    if draw(st.booleans()):
        v = d.input(
            (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 5)))
        )
        blocks = [_conv_block, _conv_block, _batchnorm_block, _group_norm_block, _reduction_block]
    else:
        batch = draw(st.sampled_from([(), (2,), (1,)]))
        v = d.input((*batch, draw(st.integers(1, 5)), draw(st.integers(1, 6))))
        blocks = [_matmul_block, _matmul_block, _row_norm_block, _reduction_block]
    for _ in range(draw(st.integers(1, max_blocks))):
        v = draw(st.sampled_from(blocks))(d, v)
        if draw(st.integers(0, 3)) == 0:
            _extra_reader(d)
    if not d.steps:
        v = d.op("relu", d.dims[v], {"input": v})
    return d.recipe(draw(st.sampled_from(["float", "float", "double"])))


@st.composite
def attention_recipes(draw: st.DrawFn) -> Recipe:
    """One sdpa on small awkward shapes (GQA and MQA, Sq != Skv, D != Dv, BHSD or BSHD) with
    any valid mix of scale, bias and masks, STATS maybe marked, and a pointwise tail on O."""
    d = Draft(draw)
    batch, kv_heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    heads = kv_heads * draw(st.sampled_from([1, 2, 3]))
    sq, skv, dqk, dv = (draw(st.integers(1, 7)) for _ in range(4))
    layouts = ("nchw", "bshd")
    inputs = {
        "q": d.input((batch, heads, sq, dqk), layouts),
        "k": d.input((batch, kv_heads, skv, dqk), layouts),
        "v": d.input((batch, kv_heads, skv, dv), layouts),
    }
    causal = draw(st.sampled_from(["none", "top_left", "bottom_right"]))
    kw: dict[str, Any] = {
        "use_causal_mask": causal == "top_left",
        "use_causal_mask_bottom_right": causal == "bottom_right",
        "sliding_window_length": draw(st.sampled_from([None, 1, 3])),
        "use_alibi_mask": causal != "none" and draw(st.booleans()),
        "generate_stats": draw(st.booleans()),
    }
    if draw(st.booleans()):
        kw["attn_scale"] = draw(st.sampled_from([0.125, 0.5, 1.0]))
    if draw(st.booleans()):
        scores = (batch, heads, sq, skv)
        mask = draw(st.lists(st.booleans(), min_size=4, max_size=4))
        inputs["bias"] = d.input(tuple(1 if m else e for e, m in zip(scores, mask)))
    if draw(st.booleans()):
        kw["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            inputs[role] = d.input((batch, 1, 1, 1), data_type="int32")
    stats = (1,) if kw["generate_stats"] and draw(st.booleans()) else ()
    o = d.op("sdpa", (batch, heads, sq, dv), inputs, stats, **kw)
    _tail(d, o, 1, max_ops=2)
    return d.recipe(draw(st.sampled_from(["float", "half", "bfloat16"])))
