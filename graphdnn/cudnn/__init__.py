"""The cuDNN frontend's Python API on graphdnn: ``import graphdnn.cudnn as cudnn``.

Code written for the frontend's ``cudnn.pygraph`` runs unchanged: the same constructor,
tensor calls, op methods (argument names, positional order, return arity, output names
such as ``conv::Y``), enums, build steps and ``execute`` with tensors, uids or names as
keys and framework tensors or raw ``data_ptr()`` ints as buffers. Host buffers (NumPy
arrays, CPU tensors) run the NumPy reference plan; GPU buffers run the compiled plan.
``cudnn.Graph`` is the frontend's high-level wrapper (framework tensors as op
arguments, a callable graph). docs/cudnn-compat.md lists every frontend call and what
graphdnn does with it.
"""

from typing import Any

from ..errors import UnsupportedError
from .enums import (
    build_plan_policy,
    convolution_mode,
    cudnnGraphNotSupportedError,
    data_type,
    diagonal_alignment,
    heur_mode,
    moe_grouped_matmul_mode,
    norm_forward_phase,
    reduction_mode,
    reshape_mode,
    tensor_reordering,
)
from .frontend import pygraph
from .handle import Handle, create_handle, destroy_handle, get_stream, set_stream
from .wrapper import Graph

__all__ = [
    "Graph",
    "Handle",
    "build_plan_policy",
    "convolution_mode",
    "create_handle",
    "cudnnGraphNotSupportedError",
    "data_type",
    "destroy_handle",
    "diagonal_alignment",
    "get_stream",
    "heur_mode",
    "moe_grouped_matmul_mode",
    "norm_forward_phase",
    "pygraph",
    "reduction_mode",
    "reshape_mode",
    "set_stream",
    "tensor_reordering",
]

# Module-level frontend calls graphdnn cannot serve, and why (AttributeError would not say).
NOT_SUPPORTED = {
    "backend_version": "graphdnn is not cuDNN: there is no cuDNN backend version",
    "backend_version_string": "graphdnn is not cuDNN: there is no cuDNN backend version",
    "get_last_error_string": "graphdnn's errors carry their whole message",
    "jit": "the cudnn.jit decorator is not built yet",
    "graph_cache": "the cudnn.graph_cache decorator is not built yet (graphdnn's plan cache caches compiled graphs)",
    "create_kernel_cache": "graphdnn compiles static shapes; its plan cache keeps compiled kernels",
}


def __getattr__(name: str) -> Any:
    if name in NOT_SUPPORTED:
        raise UnsupportedError(f"cudnn.{name} is not supported: {NOT_SUPPORTED[name]}")
    raise AttributeError(f"module 'graphdnn.cudnn' has no attribute '{name}'")
