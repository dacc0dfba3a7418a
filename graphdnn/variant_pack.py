"""The variant pack: which value a caller gives for each tensor of a plan, as in cuDNN.

Every non-virtual tensor of the graph may appear, keyed by TensorSpec, IR Tensor, name
or uid: inputs must, outputs may (a missing output is allocated by the backend).
Pass-by-value runtime scalars take Python numbers or one-element host arrays. Virtual
tensors live inside the plan and constants are baked into it: neither may be given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import round_to
from .errors import FeedError
from .ir import Graph, Tensor, resolve_tensor


@dataclass(frozen=True)
class VariantPack:
    buffers: dict[int, Any]  # tensor id -> the caller's array, for inputs and the outputs given
    scalars: dict[int, float]  # runtime pass-by-value tensor id -> value, rounded to its data type
    missing_outputs: tuple[Tensor, ...]  # outputs the backend allocates


def resolve(ir: Graph, pack: Mapping[Any, Any]) -> VariantPack:
    """Check the pack's keys against the graph; FeedError names the tensor at fault."""
    if not isinstance(pack, Mapping):
        raise FeedError(f"the variant pack must be a dict {{tensor: array}}, got a {type(pack).__name__}")
    given: dict[int, Any] = {}
    for key, value in pack.items():
        t = resolve_tensor(ir, key)
        if t.id in given:
            raise FeedError("is given twice in the variant pack", tensor=t.name)
        if t.is_virtual:
            raise FeedError(
                "is virtual: it lives only inside the plan; mark it set_output(True) to read it", tensor=t.name
            )
        if t.is_constant:
            raise FeedError(f"is a constant ({t.value}) compiled into the plan; leave it out", tensor=t.name)
        given[t.id] = value
    missing = [t.name for t in ir.inputs if t.id not in given]
    if missing:
        raise FeedError(
            f"graph input{'s' if len(missing) > 1 else ''} {', '.join(repr(n) for n in missing)} "
            "missing from the variant pack",
            tensor=missing[0],
        )
    scalars = {
        tid: scalar_value(ir.tensors[tid], given.pop(tid)) for tid in list(given) if ir.tensors[tid].is_pass_by_value
    }
    return VariantPack(given, scalars, tuple(t for t in ir.outputs if t.id not in given))


def scalar_value(t: Tensor, value: Any) -> float:
    """A runtime scalar's value as its data type holds it (the reference rounds it too)."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return float(round_to(t.data_type, float(value)))
    raise FeedError(
        f"is a pass-by-value scalar: give a Python number or a one-element host array, not a {type(value).__name__}",
        tensor=t.name,
    )
