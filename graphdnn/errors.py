"""The errors graphdnn raises for bad graphs, files and inputs.

Every error names where the problem is (a node, a tensor, a JSON path, a feed) and what
is wrong, so that a user can fix the graph without reading graphdnn's source. All are
subclasses of :class:`GraphError`, which is a ``ValueError`` so that code written
against the cuDNN frontend (which raises ``ValueError`` for bad graphs) keeps working.
"""

from __future__ import annotations


class GraphError(ValueError):
    """A graph, a graph file or an execution request is invalid.

    ``node``, ``tensor`` and ``path`` hold the location when one is known, so that tools
    can point at it; the message already contains them.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        tensor: str | None = None,
        path: str | None = None,
    ) -> None:
        where = []
        if path is not None:
            where.append(path)
        if node is not None:
            where.append(f"node '{node}'")
        if tensor is not None and (node is None or f"'{tensor}'" not in message):
            where.append(f"tensor '{tensor}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
        self.node = node
        self.tensor = tensor
        self.path = path
        self.reason = message


class UnknownOpError(GraphError):
    """A node names an op kind graphdnn does not define."""


class AttributeValueError(GraphError):
    """An op attribute is missing, of the wrong type, or out of range."""


class ShapeError(GraphError):
    """Dims do not agree: a mismatch, a broadcast that fails, a bad rank."""


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
