"""graphdnn: a declarative operation-graph compiler for deep-learning GPU primitives."""

from . import reference
from . import torch as torch  # gd.torch (PyTorch integration); kept out of __all__: a * import must not hide PyTorch
from .cache.plan_cache import PlanCache
from .cache.store import CacheWarning
from .cache.warmup import WarmupReport, warmup
from .compiler import compile
from .dtypes import DataType
from .errors import (
    AttributeValueError,
    CacheMissError,
    DataTypeError,
    FeedError,
    FormatError,
    GraphError,
    ShapeError,
    StrideError,
    StructureError,
    SymbolicDimError,
    UndeclaredDimsError,
    UnknownOpError,
    UnsupportedError,
)
from .files import load, save
from .fusion import fuse
from .graph import OperationGraphSpec
from .ir import Graph
from .layout import nchw_strides, nhwc_strides, packed_strides
from .logs import configure_from_env
from .plan import Plan
from .reference_plan import ReferencePlan
from .runtime.device_array import DeviceArray
from .runtime.driver import CudaError
from .symbolic import Sym, Symbol
from .tensor import TensorSpec
from .torch_import import from_torch
from .version import __version__

configure_from_env()  # GRAPHDNN_LOG: a handler on the graphdnn logger, only when asked for

__all__ = [
    "AttributeValueError",
    "CacheMissError",
    "CacheWarning",
    "CudaError",
    "DataType",
    "DataTypeError",
    "DeviceArray",
    "FeedError",
    "FormatError",
    "Graph",
    "GraphError",
    "OperationGraphSpec",
    "Plan",
    "PlanCache",
    "ReferencePlan",
    "ShapeError",
    "StrideError",
    "StructureError",
    "Sym",
    "Symbol",
    "SymbolicDimError",
    "TensorSpec",
    "UndeclaredDimsError",
    "UnknownOpError",
    "UnsupportedError",
    "WarmupReport",
    "__version__",
    "compile",
    "from_torch",
    "fuse",
    "load",
    "nchw_strides",
    "nhwc_strides",
    "packed_strides",
    "reference",
    "save",
    "warmup",
]
