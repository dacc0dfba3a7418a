"""graphdnn: a declarative operation-graph compiler for deep-learning GPU primitives."""

from . import reference
from .dtypes import DataType
from .errors import (
    AttributeValueError,
    DataTypeError,
    FeedError,
    FormatError,
    GraphError,
    ShapeError,
    StrideError,
    StructureError,
    UndeclaredDimsError,
    UnknownOpError,
    UnsupportedError,
)
from .fusion import fuse
from .graph import OperationGraphSpec
from .ir import Graph
from .layout import nchw_strides, nhwc_strides, packed_strides
from .serialize import load, save
from .tensor import TensorSpec

__all__ = [
    "AttributeValueError",
    "DataType",
    "DataTypeError",
    "FeedError",
    "FormatError",
    "Graph",
    "GraphError",
    "OperationGraphSpec",
    "ShapeError",
    "StrideError",
    "StructureError",
    "TensorSpec",
    "UndeclaredDimsError",
    "UnknownOpError",
    "UnsupportedError",
    "fuse",
    "load",
    "nchw_strides",
    "nhwc_strides",
    "packed_strides",
    "reference",
    "save",
]
