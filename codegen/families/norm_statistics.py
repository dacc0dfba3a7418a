"""What the layer and group norms share: the statistics outputs, epsilon, y = (x - mean) * rstd *
scale + bias with the epilogue, and the stores of the statistics."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fusion_rules import FusedNode
from graphdnn.ir import Node, Tensor

from .. import epilogue
from ..context import indent, scalar_value
from ..cuda_types import store

STATISTICS = {"mean": "mean", "inv_variance": "rstd"}  # the norm's statistics outputs and their C variables


def epsilon(anchor: Node, names: dict[int, str], compute: str) -> str:
    t = anchor.input("epsilon")
    assert t is not None
    return scalar_value(t, names.get(t.id), compute)


def normalize(fused: FusedNode, values: epilogue.Values) -> None:
    """Define y, then the epilogue, in ``values`` (x is defined; ``mean``, ``rstd`` are C
    variables): y = (x - mean) * rstd * scale + bias (RMS norm: x * rstd * scale (+ bias)),
    and the statistics outputs where the epilogue reads them."""
    anchor = fused.anchor
    assert anchor is not None
    read = {t.id for node in fused.epilogue for t in node.input_tensors()}
    for role, variable in STATISTICS.items():
        t = anchor.output(role)
        if t is not None and t.id in read:
            values.define_rounded(t, variable)
    x, scale, bias, y = anchor.input("input"), anchor.input("scale"), anchor.input("bias"), anchor.output("y")
    assert x is not None and scale is not None and y is not None
    centered = values.get(x) if anchor.op == "rmsnorm" else f"({values.get(x)} - mean)"
    scaled = f"{centered} * rstd * {values.get(scale)}"
    normalized = f"{scaled} + {values.get(bias)}" if bias is not None else scaled
    values.define_rounded(y, normalized)
    epilogue.apply(fused.epilogue, values)


def write_statistics(
    anchor: Node, names: dict[int, str], position: Callable[[Tensor], str], writer: str, coordinates: Sequence[str] = ()
) -> list[str]:
    """Stores of the statistics outputs that are kernel parameters (``mean`` and ``rstd`` are C
    variables) at ``position(t)``, by the thread for which ``writer`` holds, after the statements
    ``coordinates`` (what ``position`` reads)."""
    stored = []
    for role, variable in STATISTICS.items():
        t = anchor.output(role)
        if t is not None and t.id in names:
            stored.append(f"{names[t.id]}[{position(t)}] = {store(t.data_type, variable)};")
    if not stored:
        return []
    return [f"if ({writer}) {{", *indent([*coordinates, *stored], 1).splitlines(), "}"]
