"""``gd.load`` and ``gd.save``: graph JSON files on disk (the format is :mod:`.serialize`)."""

from __future__ import annotations

import os
from pathlib import Path

from .bounded_read import read_bounded
from .errors import GraphError
from .graph import OperationGraphSpec
from .ir import Graph
from .serialize import MAX_FILE_BYTES, graph_to_json, read_graph


def save(graph: OperationGraphSpec | Graph, path: str | os.PathLike[str]) -> None:
    """Validate ``graph`` and write it to ``path`` as a graph JSON file."""
    ir = graph if isinstance(graph, Graph) else graph.validate()
    Path(path).write_text(graph_to_json(ir) + "\n", encoding="utf-8")


def load(path: str | os.PathLike[str]) -> OperationGraphSpec:
    """Read and validate a graph file. Errors name the file and the JSON path."""
    return _read_file(path)[0]


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """A graph file's validated IR (``load(path).validate()`` would validate twice)."""
    return _read_file(path)[1]


def _read_file(path: str | os.PathLike[str]) -> tuple[OperationGraphSpec, Graph]:
    file = Path(path)
    data = read_bounded(file, MAX_FILE_BYTES)  # /dev/zero or a FIFO cannot make it read without end
    try:
        return read_graph(data, OperationGraphSpec)
    except GraphError as error:
        raise error.located(file=str(file)) from None
