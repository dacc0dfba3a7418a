"""The errors graphdnn raises for bad graphs, files and inputs.

Every error names where the problem is (a node, a tensor, a JSON path, a feed) and what
is wrong, so that a user can fix the graph without reading graphdnn's source. All are
subclasses of :class:`GraphError`, which is a ``ValueError`` so that code written
against the cuDNN frontend (which raises ``ValueError`` for bad graphs) keeps working.
"""

from __future__ import annotations


class GraphError(ValueError):
    """A graph, a graph file or an execution request is invalid.

    ``file``, ``path`` (a JSON path), ``node`` and ``tensor`` hold the location when one
    is known, so that tools can point at it; the message already contains them.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        tensor: str | None = None,
        path: str | None = None,
        file: str | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(path)
        if node is not None:
            where.append(f"node '{node}'")
        if tensor is not None and f"'{tensor}'" not in message:
            where.append(f"tensor '{tensor}'")
        located = f"{', '.join(where)}: {message}" if where else message
        super().__init__(f"{file}: {located}" if file is not None else located)
        self.node = node
        self.tensor = tensor
        self.path = path
        self.file = file
        self.reason = message

    def located(self, **where: str | None) -> GraphError:
        """The same error with more of its location filled in."""
        fields = {"node": self.node, "tensor": self.tensor, "path": self.path, "file": self.file}
        fields.update({key: value for key, value in where.items() if value is not None})
        return type(self)(self.reason, **fields)


class UnknownOpError(GraphError):
    """A node names an op kind graphdnn does not define."""


class AttributeValueError(GraphError):
    """An op attribute is missing, of the wrong type, or out of range."""


class ShapeError(GraphError):
    """Dims do not agree: a mismatch, a broadcast that fails, a bad rank."""


class UndeclaredDimsError(ShapeError):
    """An op output's dims cannot be inferred and the user has not declared them yet."""


class SymbolicDimError(ShapeError):
    """A symbolic dim is used where its value is needed (a sum, an order, a concrete size).

    ``extent`` is the symbolic value at fault, when known, so that validation can name
    the role and dim that hold it.
    """

    def __init__(self, message: str, extent: object = None, **where: str | None) -> None:
        super().__init__(message, **where)
        self.extent = extent


class StrideError(GraphError):
    """Strides do not describe a valid, non-overlapping layout for the dims."""


class DataTypeError(GraphError):
    """A data type is unknown, unset, or not allowed where it is used."""


class StructureError(GraphError):
    """The graph's wiring is wrong: cycles, tensors produced twice, dangling tensors."""


class FormatError(GraphError):
    """A serialized graph is malformed; ``path`` is the JSON path of the problem."""


class FeedError(GraphError):
    """A value given for execution does not match the tensor it is bound to."""


class UnsupportedError(GraphError):
    """The graph is valid but this backend or target cannot run it; says why."""


class CacheMissError(GraphError):
    """A plan is not in the plan cache and the caller required it to be (require_cached)."""
