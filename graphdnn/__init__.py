"""graphdnn: a declarative operation-graph compiler for deep-learning GPU primitives."""

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
    UnknownOpError,
    UnsupportedError,
)
from .graph import OperationGraphSpec
from .layout import nchw_strides, nhwc_strides, packed_strides
from .tensor import TensorSpec

__all__ = [
    "AttributeValueError",
    "DataType",
    "DataTypeError",
    "FeedError",
    "FormatError",
    "GraphError",
    "OperationGraphSpec",
    "ShapeError",
    "StrideError",
    "StructureError",
    "TensorSpec",
    "UnknownOpError",
    "UnsupportedError",
    "nchw_strides",
    "nhwc_strides",
    "packed_strides",
]
