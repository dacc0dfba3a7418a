"""Op definitions. Importing this package registers every op kind.

Each module declares one family: its ops (roles, attributes, shape inference,
reference semantics) and the builder methods that add them to a graph.
"""

from .attention import AttentionMethods
from .attention_backward import AttentionBackwardMethods
from .base import Category, Inferred, Op, Role, get_op, op_kinds
from .conv import ConvMethods
from .ctc import CtcMethods
from .index import IndexMethods
from .lrn import LrnMethods
from .matmul import MatmulMethods
from .moe import MoeMethods
from .norm_backward import NormBackwardMethods
from .norms import NormMethods
from .pointwise import PointwiseMethods
from .pooling import PoolingMethods
from .quantize import QuantizeMethods
from .random import RandomMethods
from .reduction import ReductionMethods
from .rnn import RnnMethods
from .rnn_backward import RnnBackwardMethods
from .shape import ShapeMethods
from .spatial_transformer import SpatialTransformerMethods
from .topk import TopkMethods


class OpMethods(
    AttentionMethods,
    AttentionBackwardMethods,
    ConvMethods,
    CtcMethods,
    IndexMethods,
    LrnMethods,
    MatmulMethods,
    MoeMethods,
    NormMethods,
    NormBackwardMethods,
    PointwiseMethods,
    PoolingMethods,
    QuantizeMethods,
    RandomMethods,
    ReductionMethods,
    RnnMethods,
    RnnBackwardMethods,
    ShapeMethods,
    SpatialTransformerMethods,
    TopkMethods,
):
    """Every op method of :class:`~graphdnn.OperationGraphSpec`."""


__all__ = ["Category", "Inferred", "Op", "OpMethods", "Role", "get_op", "op_kinds"]
