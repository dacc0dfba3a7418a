"""C fragments the reduction-walk kernels and softmax share: parameters, vector loads and stores
of a run of elements, coordinate aliases, the shared-memory buffer, merge lambdas."""

from __future__ import annotations

from collections.abc import Sequence

from graphdnn.ir import Tensor

from ..context import KernelParams
from ..cuda_types import cuda_type, load
from ..pointwise import render

Names = dict[int, str]


def merge_lambda(op: str, c_type: str) -> str:
    """A C lambda combining two partial results with the pointwise op ``op`` (add, mul, min, max)."""
    return f"[](const {c_type} a, const {c_type} b) {{ return {render(op, ['a', 'b'], None, c_type)}; }}"


def load_elements(pointer: str, tensor: Tensor, at: str, vec: int, compute: str, into: str) -> list[str]:
    """Statements loading elements ``at`` .. ``at + vec - 1`` of ``tensor`` into ``into[0..vec)``
    (compute type): one 16-byte access when the launch's pointers are aligned."""
    if vec == 1:
        return [f"{into}[0] = {load(tensor.data_type, f'{pointer}[{at}]', compute)};"]
    t = cuda_type(tensor.data_type)
    return [
        "if (aligned) {",
        f"  const gd::Vec<{t}, {vec}> raw = gd::load_vec<{t}, {vec}>({pointer} + {at});",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {into}[e] = {load(tensor.data_type, 'raw.v[e]', compute)};",
        "} else {",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {into}[e] = {load(tensor.data_type, f'{pointer}[{at} + e]', compute)};",
        "}",
    ]


def store_elements(pointer: str, tensor: Tensor, at: str, vec: int, values: str) -> list[str]:
    """Statements storing the gd::Vec ``values`` at elements ``at`` .. ``at + vec - 1``."""
    if vec == 1:
        return [f"{pointer}[{at}] = {values}.v[0];"]
    t = cuda_type(tensor.data_type)
    return [
        f"if (aligned) gd::store_vec<{t}, {vec}>({pointer} + {at}, {values});",
        "else",
        "#pragma unroll",
        f"  for (int e = 0; e < {vec}; ++e) {pointer}[{at} + e] = {values}.v[e];",
    ]


def aliases(dims: Sequence[int], source: str, target: str, itype: str, moved: dict[int, str]) -> list[str]:
    """Coordinates ``{target}{axis}`` equal to ``{source}{axis}``, except the axes in ``moved``."""
    return [f"const {itype} {target}{axis} = {moved.get(axis, f'{source}{axis}')};" for axis in range(len(dims))]


def shared_buffer(c_type: str) -> str:
    return (
        "extern __shared__ __align__(16) unsigned char gd_shared[];\n"
        f"{c_type}* red = reinterpret_cast<{c_type}*>(gd_shared);"
    )


def declare(params: KernelParams, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Names:
    """Parameters for ``inputs`` then ``outputs`` (each tensor once); their names by tensor id."""
    names: Names = {}
    for t in inputs:
        if t.id not in names:
            names[t.id] = params.tensor(t)
    for t in outputs:
        names[t.id] = params.tensor(t, writable=True)
    return names


def type_bytes(c_type: str) -> int:
    """Bytes of a compute type (float or double)."""
    return 8 if c_type == "double" else 4
