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
from graphdnn.dtypes import DataType
from graphdnn.ir import Tensor
from graphdnn.random_inputs import random_inputs

# Relative-error tolerances by output type: storage rounding dominates for narrow types.
TOLERANCE = {
    DataType.DOUBLE: 1e-12,
    DataType.FLOAT: 2e-5,
    DataType.HALF: 3e-3,
    DataType.BFLOAT16: 1.5e-2,
    DataType.FP8_E4M3: 0.1,
    DataType.FP8_E5M2: 0.2,
}

_TORCH_DTYPE_NAMES = {
    DataType.FLOAT: "float32",
    DataType.HALF: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.DOUBLE: "float64",
    DataType.INT8: "int8",
    DataType.UINT8: "uint8",
    DataType.INT32: "int32",
    DataType.INT64: "int64",
    DataType.BOOLEAN: "bool",
    DataType.FP8_E4M3: "float8_e4m3fn",
    DataType.FP8_E5M2: "float8_e5m2",
}


def torch_dtype(data_type: DataType) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPE_NAMES[data_type])


def to_device(array: np.ndarray, tensor: Tensor) -> Any:
    """A CUDA torch tensor with the graph tensor's dims and strides, holding ``array``."""
    import torch

    if array.dtype.itemsize == 1 and tensor.data_type.is_floating:
        host = torch.from_numpy(array.view(np.uint8)).view(torch_dtype(tensor.data_type))
    elif tensor.data_type is DataType.BFLOAT16:
        host = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    else:
        host = torch.from_numpy(np.ascontiguousarray(array))
    device = torch.empty_strided(tensor.dim, tensor.stride, dtype=torch_dtype(tensor.data_type), device="cuda")
    device.copy_(host.reshape(tensor.dim))
    return device


def poisoned(tensor: Tensor) -> Any:
    import torch

    out = torch.empty_strided(tensor.dim, tensor.stride, dtype=torch_dtype(tensor.data_type), device="cuda")
    if tensor.data_type.is_floating:
        out.fill_(float("nan"))
    elif tensor.data_type is DataType.BOOLEAN:
        out.fill_(True)
    else:
        out.fill_(-77 if tensor.data_type is not DataType.UINT8 else 77)
    return out


def to_numpy(value: Any) -> np.ndarray:
    return value.detach().to("cpu", dtype=__import__("torch").float64).numpy()


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ over the finite reference values; inf when out has a NaN the reference lacks."""
    finite = np.isfinite(ref)
    if np.isnan(out[finite]).any() or not np.array_equal(np.isnan(out[~finite]), np.isnan(ref[~finite])):
        return float("inf")
    diff = np.linalg.norm((out - ref)[finite])
    scale = np.linalg.norm(ref[finite])
    return float(diff / scale) if scale > 0 else float(diff)


def check_on_gpu(graph: Any, *, seed: int = 0, tolerance: float | None = None, **compile_options: Any) -> Any:
    """Build ``graph`` for the GPU, run it on random inputs, assert every output matches.

    Returns the plan, for tests that look further (kernels, workspace).
    """
    import torch

    ir = graph if isinstance(graph, gd.Graph) else graph.validate()
    feeds = random_inputs(ir, seed)
    expected = reference.execute(ir, feeds)
    plan = gd.compile(graph, **compile_options)
    pack = {t.name: to_device(feeds[t.name], t) for t in ir.inputs}
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    plan.execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        got = to_numpy(outputs[t.name])
        want = expected[t.name].astype(np.float64)
        limit = tolerance if tolerance is not None else TOLERANCE.get(t.data_type, 0.0)
        error = relative_error(got, want)
        assert error <= limit, f"output '{t.name}' ({t.data_type.value}): relative error {error:.3g} > {limit:.3g}"
    return plan
