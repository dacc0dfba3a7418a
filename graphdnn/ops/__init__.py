"""Op definitions. Importing this package registers every op kind.

Each module declares one family: its ops (roles, attributes, shape inference,
reference semantics) and the builder methods that add them to a graph.
"""

from .base import Category, Inferred, Op, Role, get_op, op_kinds
from .conv import ConvMethods
from .pointwise import PointwiseMethods


class OpMethods(ConvMethods, PointwiseMethods):
    """Every op method of :class:`~graphdnn.OperationGraphSpec`."""


__all__ = ["Category", "Inferred", "Op", "OpMethods", "Role", "get_op", "op_kinds"]
