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

from .enums import (
    build_plan_policy,
    convolution_mode,
    cudnnGraphNotSupportedError,
    data_type,
    diagonal_alignment,
    heur_mode,
    norm_forward_phase,
    reduction_mode,
    reshape_mode,
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
    "norm_forward_phase",
    "pygraph",
    "reduction_mode",
    "reshape_mode",
    "set_stream",
]
