"""Running a graph on the GPU and comparing it with the reference backend, for `gpu` tests.

Inputs are fresh random values (random_inputs), placed in torch tensors with exactly the
graph's strides; outputs are poisoned (NaN, or a sentinel for integers) before the run, so
an element the kernels never write fails the comparison. The error measure is
‖out − ref‖ / ‖ref‖ per output, against a per-dtype tolerance; NaN never passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import graphdnn as gd
from graphdnn import reference
from graphdnn.compare import TOLERANCE, relative_error
from graphdnn.compare import tolerance as data_type_tolerance
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.frameworks import empty_torch
from graphdnn.runtime.frameworks import to_torch as to_device

__all__ = [
    "TOLERANCE",
    "check_across_the_range",
    "check_on_gpu",
    "check_one_plan_across_the_range",
    "poisoned",
    "relative_error",
    "to_device",
    "to_numpy",
]


def poisoned(tensor: Tensor) -> Any:
    out = empty_torch(tensor)
    if tensor.data_type.is_floating:
        out.fill_(float("nan"))
    elif tensor.data_type is DataType.BOOLEAN:
        out.fill_(True)
    else:
        out.fill_(-77 if tensor.data_type is not DataType.UINT8 else 77)
    return out


def to_numpy(value: Any) -> np.ndarray:
    return value.detach().to("cpu", dtype=__import__("torch").float64).numpy()


def check_on_gpu(
    graph: Any,
    *,
    seed: int = 0,
    tolerance: float | None = None,
    feeds: dict[str, np.ndarray] | None = None,
    **compile_options: Any,
) -> Any:
    """Build ``graph`` for the GPU, run it on random inputs (or on ``feeds``, where a test needs
    values of its own: full-range int8, small scales), assert every output matches.

    Returns the plan, for tests that look further (kernels, workspace).
    """
    import torch

    ir = graph if isinstance(graph, gd.Graph) else graph.validate()
    feeds = random_inputs(ir, seed) if feeds is None else feeds
    expected = reference.execute(ir, feeds)
    plan = gd.compile(graph, **compile_options)
    # Pass-by-value scalars stay on the host (a one-element array); tensors go to the GPU.
    pack = {t.name: feeds[t.name] if t.is_pass_by_value else to_device(feeds[t.name], t) for t in ir.inputs}
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    plan.execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        got = to_numpy(outputs[t.name])
        want = expected[t.name].astype(np.float64)
        limit = tolerance if tolerance is not None else data_type_tolerance(t.data_type)
        error = relative_error(got, want)
        assert error <= limit, f"output '{t.name}' ({t.data_type.value}): relative error {error:.3g} > {limit:.3g}"
    return plan


def check_across_the_range(plan: Any, ir: gd.Graph, values_list: list[dict[str, int]]) -> None:
    """Run a dynamic graph's ``plan`` at each symbol ``values`` (fresh random inputs of the
    static graph of those values, poisoned outputs) and assert every output matches the
    reference of the dynamic graph ``ir``."""
    import torch

    from graphdnn.specialize import specialize

    for values in values_list:
        static = specialize(ir, values)
        feeds = random_inputs(static, sum(values.values()))
        expected = reference.execute(ir, feeds)
        pack = {t.name: to_device(feeds[t.name], t) for t in static.inputs}
        outputs = {t.name: poisoned(t) for t in static.outputs}
        plan.execute({**pack, **outputs})
        torch.cuda.synchronize()
        for t in static.outputs:
            error = relative_error(to_numpy(outputs[t.name]), expected[t.name].astype(np.float64))
            assert error <= data_type_tolerance(t.data_type), f"{t.name} at {values}: {error:.3g}"


def check_one_plan_across_the_range(graph: Any, kernel: str, values_list: list[dict[str, int]], cache_dir: Any) -> None:
    """One plan of the dynamic ``graph`` (its first launch's name holding ``_{kernel}_``) matches the
    reference at each symbol ``values`` (:func:`check_across_the_range`), and compiling the graph
    again compiles nothing: the plan covers the range."""
    cache = gd.PlanCache(cache_dir)
    plan = gd.compile(graph, cache=cache)
    assert f"_{kernel}_" in plan.program.launches[0].name
    compiles = cache.counters.compiles
    check_across_the_range(plan, plan.graph, values_list)
    assert gd.compile(graph, cache=cache).program == plan.program
    assert cache.counters.compiles == compiles  # no compile inside the range
