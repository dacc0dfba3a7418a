"""The graph JSON format: writing the IR, and strict, safe reading into a builder.

The format (``"format": "graphdnn.graph"``, ``"version": 1``) is specified in
docs/json-format.md and by the JSON Schema in ``graphdnn/schema/graph-v1.schema.json``.
Tensors are referenced by graph-local integer ids, never by name. A dynamic graph lists
its symbols (``"symbols": {"batch": {"min": 1, "max": 256}}``) and writes a symbolic dim
or stride as a string: a symbol's name or a product (``"64*batch*seq"``).

Reading never trusts the file: sizes are bounded before anything is built from them,
every field is type-checked, and every problem is a :class:`FormatError` (or another
:class:`GraphError`) whose ``path`` is the JSON path of the offending value, e.g.
``nodes[3].attributes.stride``. The reader builds into the graph class it is given (an
``OperationGraphSpec``, whose ``from_json`` calls it), so this module sits below the
builder; files on disk are :mod:`graphdnn.files`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .dtypes import as_data_type
from .errors import DataTypeError, FormatError, GraphError
from .gc_pause import gc_paused
from .ir import Graph
from .layout import MAX_RANK
from .node_spec import NodeSpec
from .ops.base import get_op
from .symbolic import Extent, Sym, Symbol
from .tensor import TensorSpec

FORMAT = "graphdnn.graph"
VERSION = 1

# Bounds on what a file may ask for; far above any real network, far below harm.
MAX_FILE_BYTES = 64 * 2**20
MAX_NODES = 65_536
MAX_TENSORS = 4 * MAX_NODES
MAX_NAME = 256
MAX_ID = 2**31 - 1
MAX_SYMBOLS = 64
MAX_EXPRESSION = 1024  # characters of a symbolic dim or stride

_GRAPH_KEYS = {
    "format",
    "version",
    "name",
    "io_data_type",
    "intermediate_data_type",
    "compute_data_type",
    "symbols",
    "tensors",
    "nodes",
}
_TENSOR_KEYS = {"id", "name", "dim", "stride", "data_type", "is_virtual", "is_pass_by_value", "value", "uid"}
_NODE_KEYS = {"name", "op", "compute_data_type", "inputs", "outputs", "attributes"}


class Builder(Protocol):
    """What the reader needs of a graph under construction (an OperationGraphSpec)."""

    _nodes: list[NodeSpec]

    def dim(self, name: str, min: int = ..., max: int = ...) -> Sym: ...

    def _new_tensor(self, name: str | None, **fields: Any) -> TensorSpec: ...

    def _add_node(
        self,
        kind: str,
        inputs: Mapping[str, Any],
        attributes: Any = None,
        *,
        name: str | None = None,
        compute_data_type: Any = None,
        declared: Mapping[str, Any] | None = None,
        outputs: Mapping[str, TensorSpec] | None = None,
        infer: bool = True,
    ) -> list[TensorSpec | None]: ...

    def validate(self) -> Graph: ...


B = TypeVar("B", bound=Builder)


# -- writing ----------------------------------------------------------------------------------
def graph_to_dict(ir: Graph) -> dict[str, Any]:
    """The JSON document of a validated graph, every field explicit."""
    tensors = []
    for t in ir.tensors:
        entry: dict[str, Any] = {
            "id": t.id,
            "name": t.name,
            "dim": [_extent_json(d) for d in t.dim],
            "stride": [_extent_json(s) for s in t.stride],
            "data_type": t.data_type.value,
            "is_virtual": t.is_virtual,
        }
        if t.is_pass_by_value:
            entry["is_pass_by_value"] = True
        if t.value is not None:
            entry["value"] = t.value
        if t.uid is not None:
            entry["uid"] = t.uid
        tensors.append(entry)
    nodes = []
    for node in ir.nodes:
        inputs: dict[str, Any] = {
            role: [t.id for t in bound] if isinstance(bound, tuple) else bound.id for role, bound in node.inputs
        }
        nodes.append(
            {
                "name": node.name,
                "op": node.op,
                "compute_data_type": node.compute_data_type.value,
                "inputs": inputs,
                "outputs": {role: t.id for role, t in node.outputs},
                "attributes": node.attributes.to_json(),
            }
        )
    document: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "name": ir.name,
        "io_data_type": ir.io_data_type.value,
        "intermediate_data_type": ir.intermediate_data_type.value,
        "compute_data_type": ir.compute_data_type.value,
    }
    if ir.symbols:  # static graphs are written as before the format knew symbols
        document["symbols"] = {s.name: {"min": s.min, "max": s.max} for s in ir.symbols}
    document["tensors"] = tensors
    document["nodes"] = nodes
    return document


def _extent_json(value: Extent) -> int | str:
    return str(value) if isinstance(value, Sym) else value


def graph_to_json(ir: Graph, *, indent: int | None = 2) -> str:
    """JSON text; with ``indent``, one tensor or node per line, for readable diffs."""
    document = graph_to_dict(ir)
    if indent is None:
        return json.dumps(document, separators=(",", ":"))
    pad = " " * indent
    lines = ["{"]
    for key, value in document.items():
        if isinstance(value, list):
            items = [f"{pad * 2}{json.dumps(item)}" for item in value]
            body = ",\n".join(items)
            lines.append(f'{pad}"{key}": [\n{body}\n{pad}],' if items else f'{pad}"{key}": [],')
        else:
            lines.append(f"{pad}{json.dumps(key)}: {json.dumps(value)},")
    lines[-1] = lines[-1].rstrip(",")
    lines.append("}")
    return "\n".join(lines)


# -- reading ----------------------------------------------------------------------------------
@gc_paused()
def read_graph(text: str | bytes, new_graph: Callable[..., B]) -> tuple[B, Graph]:
    """Build the graph a JSON text describes with ``new_graph`` (a graph class), and its
    validated IR (reading validates: callers wanting the IR need not validate again)."""
    return _Reader().read(_parse(text), new_graph)


def _parse(text: str | bytes) -> Any:
    if isinstance(text, bytes):
        if len(text) > MAX_FILE_BYTES:
            raise FormatError(f"input is {len(text)} bytes, over the {MAX_FILE_BYTES}-byte limit")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FormatError(f"not UTF-8 text (byte {error.start})") from None
    if not isinstance(text, str):
        raise FormatError(f"expected JSON text, got {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise FormatError(f"input is {len(text)} characters, over the {MAX_FILE_BYTES} limit")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        raise FormatError(f"invalid JSON at line {error.lineno} column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise FormatError("JSON nested too deeply") from None
    except ValueError as error:  # duplicate keys, NaN, integers with too many digits
        raise FormatError(f"invalid JSON: {error}") from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) < len(pairs):  # rare: find the first key given twice, for the message
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _Reader:
    """Turns a parsed document into a validated graph under construction and its IR, checking as it goes."""

    def __init__(self) -> None:
        self.symbols: dict[str, Symbol] = {}  # declared in the document's "symbols"
        self.used: set[str] = set()  # named by some dim or stride

    def read(self, doc: Any, new_graph: Callable[..., B]) -> tuple[B, Graph]:
        _expect(isinstance(doc, dict), "$", "the document must be a JSON object")
        _no_unknown_keys(doc, _GRAPH_KEYS, "$")
        fmt = doc.get("format")
        _expect(fmt == FORMAT, "format", f"must be {FORMAT!r}, got {_short(fmt)}")
        version = doc.get("version")
        _expect(
            isinstance(version, int) and not isinstance(version, bool),
            "version",
            f"must be an integer, got {_short(version)}",
        )
        _expect(version == VERSION, "version", f"unsupported version {version}; this graphdnn reads version {VERSION}")
        name = doc.get("name") or "graph"
        _expect(isinstance(name, str) and 0 < len(name) <= MAX_NAME, "name", "must be a non-empty string")
        graph = new_graph(
            name=name,
            io_data_type=_data_type(doc.get("io_data_type"), "io_data_type"),
            intermediate_data_type=_data_type(doc.get("intermediate_data_type"), "intermediate_data_type") or "float",
            compute_data_type=_data_type(doc.get("compute_data_type"), "compute_data_type") or "float",
        )
        self.symbols = self._symbols(graph, doc.get("symbols", {}))
        tensors = self._tensors(graph, doc.get("tensors"))
        unused = sorted(set(self.symbols) - self.used)
        if unused:
            raise FormatError("declared but no tensor's dims or strides use it", path=f"symbols.{unused[0]}")
        node_paths = self._nodes(graph, doc.get("nodes"), tensors)
        tensor_paths = {spec.name: path for path, spec in tensors.values()}
        try:
            ir = graph.validate()
        except GraphError as error:
            if error.path is not None:
                raise
            path = node_paths.get(error.node or "") or tensor_paths.get(error.tensor or "")
            raise error.located(path=path) from None
        return graph, ir

    def _symbols(self, graph: Builder, entries: Any) -> dict[str, Symbol]:
        _expect(isinstance(entries, dict), "symbols", "must be an object mapping symbol names to {min, max}")
        _expect(len(entries) <= MAX_SYMBOLS, "symbols", f"has {len(entries)} entries, over the limit of {MAX_SYMBOLS}")
        symbols = {}
        for name, entry in entries.items():
            path = f"symbols.{name[:64]}"
            _expect(isinstance(entry, dict), path, "must be an object {min, max}")
            _no_unknown_keys(entry, {"min", "max"}, path)
            low = _integer(entry.get("min"), f"{path}.min", 1, 2**62)
            high = _integer(entry.get("max"), f"{path}.max", 1, 2**62)
            try:
                symbols[name] = graph.dim(name, low, high).factors[0]
            except GraphError as error:
                raise error.located(path=path) from None
        return symbols

    def _extents(self, value: Any, path: str) -> Sequence[Extent]:
        """A dim or stride list: integers, and strings naming a symbol or a product of symbols and integers."""
        if isinstance(value, list) and any(isinstance(v, str) for v in value):
            _expect(1 <= len(value) <= MAX_RANK, path, f"must hold 1 to {MAX_RANK} extents, has {len(value)}")
            return [
                self._expression(v, f"{path}[{i}]")
                if isinstance(v, str)
                else _integer(v, f"{path}[{i}]", -(2**62), 2**62)
                for i, v in enumerate(value)
            ]
        return _int_list(value, path)

    def _expression(self, text: str, path: str) -> Extent:
        _expect(len(text) <= MAX_EXPRESSION, path, f"is over {MAX_EXPRESSION} characters")
        value: Extent = 1
        has_symbol = False
        for factor in text.split("*"):
            if factor.isascii() and factor.isdecimal():
                _expect(len(factor) <= 19, path, f"factor {_short(factor)} is over 2^62")
                value = value * _integer(int(factor), path, 1, 2**62)
                continue
            symbol = self.symbols.get(factor)
            if symbol is None:
                raise FormatError(
                    f"{_short(factor)} is not a declared symbol (symbols: {', '.join(self.symbols) or 'none'}); "
                    'a symbolic extent is a symbol or a product like "64*batch"',
                    path=path,
                )
            self.used.add(factor)
            has_symbol = True
            value = value * Sym.of(symbol)
        _expect(has_symbol, path, f"must be an integer, got {_short(text)}")  # a string extent names a symbol
        return value

    def _tensors(self, graph: Builder, entries: Any) -> dict[int, tuple[str, TensorSpec]]:
        _expect(isinstance(entries, list), "tensors", "must be a list")
        _expect(len(entries) <= MAX_TENSORS, "tensors", f"has {len(entries)} entries, over the limit of {MAX_TENSORS}")
        by_id: dict[int, tuple[str, TensorSpec]] = {}
        for index, entry in enumerate(entries):
            path = f"tensors[{index}]"
            _expect(isinstance(entry, dict), path, "must be an object")
            _no_unknown_keys(entry, _TENSOR_KEYS, path)
            tensor_id = _integer(entry.get("id"), f"{path}.id", 0, MAX_ID)
            if tensor_id in by_id:  # checks on every entry raise directly: _expect's arguments cost even when met
                raise FormatError(f"id {tensor_id} is used twice", path=f"{path}.id")
            name = entry.get("name")
            if not (name is None or (isinstance(name, str) and 0 < len(name) <= MAX_NAME)):
                raise FormatError(f"must be a string of 1 to {MAX_NAME} characters", path=f"{path}.name")
            dim = self._extents(entry.get("dim"), f"{path}.dim")
            stride = None if entry.get("stride") is None else self._extents(entry["stride"], f"{path}.stride")
            is_virtual = _boolean(entry.get("is_virtual", False), f"{path}.is_virtual")
            by_value = _boolean(entry.get("is_pass_by_value", False), f"{path}.is_pass_by_value")
            value = entry.get("value")
            if value is not None:
                _expect(by_value, f"{path}.value", "only pass-by-value tensors carry a value")
                _expect(
                    isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                    f"{path}.value",
                    f"must be a finite number, got {_short(value)}",
                )
            uid = entry.get("uid")
            if uid is not None:
                uid = _integer(uid, f"{path}.uid", 0, 2**63 - 1)
            data_type = _data_type(entry.get("data_type"), f"{path}.data_type")
            try:
                spec = graph._new_tensor(
                    name,
                    dim=dim,
                    stride=stride,
                    data_type=data_type,
                    is_virtual=is_virtual,
                    is_pass_by_value=by_value,
                    value=value,
                    uid=uid,
                )
            except GraphError as error:
                raise error.located(path=path) from None
            by_id[tensor_id] = (path, spec)
        return by_id

    def _nodes(self, graph: Builder, entries: Any, tensors: dict[int, tuple[str, TensorSpec]]) -> dict[str, str]:
        _expect(isinstance(entries, list), "nodes", "must be a list")
        _expect(len(entries) <= MAX_NODES, "nodes", f"has {len(entries)} entries, over the limit of {MAX_NODES}")
        paths: dict[str, str] = {}
        for index, entry in enumerate(entries):
            path = f"nodes[{index}]"
            _expect(isinstance(entry, dict), path, "must be an object")
            _no_unknown_keys(entry, _NODE_KEYS, path)
            kind = entry.get("op")
            if not isinstance(kind, str):
                raise FormatError(f"must be an op name, got {_short(kind)}", path=f"{path}.op")
            op = get_op(kind, path=f"{path}.op")
            name = entry.get("name")
            if not (name is None or (isinstance(name, str) and 0 < len(name) <= MAX_NAME)):
                raise FormatError(f"must be a string of 1 to {MAX_NAME} characters", path=f"{path}.name")
            attributes = entry.get("attributes", {})
            _expect(isinstance(attributes, dict), f"{path}.attributes", "must be an object")
            inputs = self._bindings(
                entry.get("inputs"), f"{path}.inputs", tensors, variadic={r.name for r in op.inputs if r.variadic}
            )
            outputs = self._bindings(entry.get("outputs"), f"{path}.outputs", tensors, variadic=set())
            compute_data_type = _data_type(entry.get("compute_data_type"), f"{path}.compute_data_type")
            try:
                attrs = op.attributes.build(attributes, node=name, path=f"{path}.attributes")
                graph._add_node(
                    kind,
                    inputs,
                    attrs,
                    name=name,
                    compute_data_type=compute_data_type,
                    outputs=outputs,
                    infer=False,
                )
            except GraphError as error:
                raise error.located(path=error.path or path) from None
            paths[graph._nodes[-1].name] = path  # not graph.nodes: a copy per node is quadratic
        return paths

    @staticmethod
    def _bindings(
        entry: Any, path: str, tensors: dict[int, tuple[str, TensorSpec]], variadic: set[str]
    ) -> dict[str, Any]:
        _expect(isinstance(entry, dict), path, "must be an object mapping roles to tensor ids")

        def tensor(value: Any, where: str) -> TensorSpec:
            tensor_id = _integer(value, where, 0, MAX_ID)
            if tensor_id not in tensors:
                raise FormatError(f"no tensor has id {tensor_id}", path=where)
            return tensors[tensor_id][1]

        bound: dict[str, Any] = {}
        for role, value in entry.items():
            if role in variadic:
                where = f"{path}.{role}"
                _expect(isinstance(value, list) and len(value) > 0, where, "must be a non-empty list of tensor ids")
                _expect(len(value) <= MAX_NODES, where, "lists too many tensors")
                bound[role] = [tensor(v, f"{where}[{i}]") for i, v in enumerate(value)]
            elif type(value) is int and value in tensors:  # the usual case, without building a path
                bound[role] = tensors[value][1]
            else:
                bound[role] = tensor(value, f"{path}.{role}")
        return bound


# -- field checks -------------------------------------------------------------------------------
def _expect(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise FormatError(message, path=path)


def _short(value: Any) -> str:
    shown = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _no_unknown_keys(entry: dict[str, Any], allowed: set[str], path: str) -> None:
    if entry.keys() <= allowed:
        return
    unknown = sorted(set(entry) - allowed)
    if unknown:
        where = unknown[0] if path == "$" else f"{path}.{unknown[0]}"
        raise FormatError(f"unknown field (allowed: {', '.join(sorted(allowed))})", path=where)


def _integer(value: Any, path: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):  # not _expect: its message would cost on every value
        raise FormatError(f"must be an integer, got {_short(value)}", path=path)
    if not low <= value <= high:
        raise FormatError(f"{value} is outside {low}..{high}", path=path)
    return int(value)


def _int_list(value: Any, path: str) -> list[int]:
    if not isinstance(value, list):
        raise FormatError(f"must be a list of integers, got {_short(value)}", path=path)
    if not 1 <= len(value) <= MAX_RANK:
        raise FormatError(f"must hold 1 to {MAX_RANK} integers, has {len(value)}", path=path)
    for i, v in enumerate(value):
        if type(v) is not int or not -(2**62) <= v <= 2**62:  # the path is built only for a bad value
            _integer(v, f"{path}[{i}]", -(2**62), 2**62)
    return value


def _boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise FormatError(f"must be true or false, got {_short(value)}", path=path)
    return bool(value)


def _data_type(value: Any, path: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise FormatError(f"must be a data type name, got {_short(value)}", path=path)
    try:
        return as_data_type(value)
    except DataTypeError as error:
        raise FormatError(error.reason, path=path) from None
