"""Graph JSON files: round trips, and strict answers to malformed and hostile input."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

import graphdnn as gd
from graphdnn import serialize
from tests.graph_strategies import build, pointwise_recipes
from tests.test_signature import small_block

SCHEMA = json.loads((Path(gd.__file__).parent / "schema" / "graph-v1.schema.json").read_text())


def document() -> dict[str, Any]:
    return json.loads(small_block().to_json())


@pytest.mark.compile_sample
@settings(max_examples=60, deadline=None)
@given(recipe=pointwise_recipes())
def test_round_trip_keeps_signature_and_text(recipe) -> None:
    g, _ = build(recipe)
    text = g.to_json()
    again = gd.OperationGraphSpec.from_json(text)
    assert again.signature() == g.signature()
    assert again.to_json() == text


@pytest.mark.compile_sample
@settings(max_examples=20, deadline=None)
@given(recipe=pointwise_recipes())
def test_written_files_match_the_shipped_schema(recipe) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(build(recipe)[0].to_json()), SCHEMA)


def test_save_and_load(tmp_path: Path) -> None:
    g = small_block()
    path = tmp_path / "block.json"
    gd.save(g, path)
    assert gd.load(path).signature() == g.signature()


def test_minimal_hand_written_file_uses_defaults() -> None:
    text = json.dumps(
        {
            "format": "graphdnn.graph",
            "version": 1,
            "io_data_type": "bf16",
            "tensors": [{"id": 7, "dim": [4, 8]}, {"id": 3, "dim": [4, 8]}],
            "nodes": [{"op": "relu", "inputs": {"input": 7}, "outputs": {"y": 3}}],
        }
    )
    ir = gd.OperationGraphSpec.from_json(text).validate()
    assert [t.stride for t in ir.tensors] == [(8, 1), (8, 1)]
    assert ir.outputs[0].data_type is gd.DataType.BFLOAT16
    assert ir.nodes[0].attributes.to_json() == {"negative_slope": 0.0, "lower_clip": 0.0, "upper_clip": None}


def test_load_reports_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.raises(gd.FormatError, match=r"bad\.json: invalid JSON at line 1"):
        gd.load(path)
    with pytest.raises(gd.FormatError, match="cannot read"):
        gd.load(tmp_path / "missing.json")


# -- malformed and hostile input: (description, mutation or raw text, error class, message pattern) --
Mutation = Callable[[dict[str, Any]], Any]


def _set(path: list[Any], value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc

    return mutate


def _delete(path: list[Any]) -> Mutation:
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return doc

    return mutate


def _many_nodes(doc: dict[str, Any]) -> dict[str, Any]:
    doc["nodes"] = [doc["nodes"][1]] * (serialize.MAX_NODES + 1)
    return doc


def _cycle(doc: dict[str, Any]) -> dict[str, Any]:
    doc["nodes"][0]["inputs"]["image"] = doc["nodes"][2]["outputs"]["y"]
    doc["tensors"][0]["is_virtual"] = True
    return doc


def _written_twice(doc: dict[str, Any]) -> dict[str, Any]:
    doc["nodes"][1]["outputs"]["y"] = doc["nodes"][0]["outputs"]["y"]
    return doc


HOSTILE: list[tuple[str, Any, type[gd.GraphError], str]] = [
    ("empty text", "", gd.FormatError, "invalid JSON at line 1"),
    ("truncated", lambda d: json.dumps(d)[:-40], gd.FormatError, "invalid JSON"),
    ("not an object", "[1, 2, 3]", gd.FormatError, r"\$: the document must be a JSON object"),
    ("deep nesting", "[" * 200_000 + "]" * 200_000, gd.FormatError, "nested too deeply|invalid JSON"),
    ("NaN literal", lambda d: json.dumps(d).replace('"dim": [2', '"dim": [NaN', 1), gd.FormatError, "NaN"),
    ("duplicate key", '{"format": "graphdnn.graph", "format": "x"}', gd.FormatError, "duplicate key"),
    ("huge integer literal", '{"version": ' + "9" * 5000 + "}", gd.FormatError, "invalid JSON"),
    ("not UTF-8", b"\xff\xfe{}", gd.FormatError, "not UTF-8"),
    ("wrong format tag", _set(["format"], "onnx"), gd.FormatError, r"format: must be 'graphdnn.graph'"),
    ("unknown version", _set(["version"], 2), gd.FormatError, "version: unsupported version 2"),
    ("version as string", _set(["version"], "1"), gd.FormatError, "version: must be an integer"),
    ("unknown top-level field", _set(["extra"], 1), gd.FormatError, r"^extra: unknown field"),
    ("tensors not a list", _set(["tensors"], {}), gd.FormatError, "tensors: must be a list"),
    ("tensor not an object", _set(["tensors", 0], 5), gd.FormatError, r"tensors\[0\]: must be an object"),
    ("tensor unknown field", _set(["tensors", 1, "shape"], [1]), gd.FormatError, r"tensors\[1\]\.shape: unknown field"),
    ("duplicate tensor id", _set(["tensors", 1, "id"], 0), gd.FormatError, r"tensors\[1\]\.id: id 0 is used twice"),
    ("negative tensor id", _set(["tensors", 0, "id"], -1), gd.FormatError, r"tensors\[0\]\.id: -1 is outside"),
    (
        "dim wrongly typed",
        _set(["tensors", 0, "dim", 2], "56"),
        gd.FormatError,
        r"tensors\[0\]\.dim\[2\]: must be an integer",
    ),
    (
        "dim as float",
        _set(["tensors", 0, "dim", 2], 5.0),
        gd.FormatError,
        r"tensors\[0\]\.dim\[2\]: must be an integer",
    ),
    ("dim zero", _set(["tensors", 0, "dim", 0], 0), gd.ShapeError, r"tensors\[0\].*dim\[0\] = 0 is outside"),
    ("dims overflow", _set(["tensors", 0, "dim"], [2**31 - 1] * 4), gd.ShapeError, r"tensors\[0\].*elements, over"),
    ("rank too big", _set(["tensors", 0, "dim"], [1] * 9), gd.FormatError, r"tensors\[0\]\.dim: must hold 1 to 8"),
    (
        "negative stride",
        _set(["tensors", 0, "stride", 1], -1),
        gd.StrideError,
        r"tensors\[0\].*stride\[1\] = -1 is negative",
    ),
    (
        "overlapping output strides",
        _set(["tensors", 4, "stride"], [1, 1, 1, 1]),
        gd.StrideError,
        r"tensors\[4\].*overlap",
    ),
    ("stride length", _set(["tensors", 0, "stride"], [1, 1]), gd.StrideError, r"tensors\[0\].*2 strides for 4 dims"),
    (
        "bad data type",
        _set(["tensors", 0, "data_type"], "float13"),
        gd.FormatError,
        r"tensors\[0\]\.data_type: unknown data type",
    ),
    (
        "is_virtual not bool",
        _set(["tensors", 0, "is_virtual"], "no"),
        gd.FormatError,
        r"tensors\[0\]\.is_virtual: must be true or false",
    ),
    (
        "value on non-scalar",
        _set(["tensors", 0, "value"], 1.0),
        gd.FormatError,
        r"tensors\[0\]\.value: only pass-by-value",
    ),
    (
        "unknown op",
        _set(["nodes", 0, "op"], "conv_fprpo"),
        gd.UnknownOpError,
        r"nodes\[0\]\.op: unknown op 'conv_fprpo'",
    ),
    ("op not a string", _set(["nodes", 0, "op"], 3), gd.FormatError, r"nodes\[0\]\.op: must be an op name"),
    (
        "dangling tensor id",
        _set(["nodes", 0, "inputs", "image"], 99),
        gd.FormatError,
        r"nodes\[0\]\.inputs\.image: no tensor has id 99",
    ),
    (
        "missing input",
        _delete(["nodes", 0, "inputs", "weight"]),
        gd.StructureError,
        r"nodes\[0\].*missing input 'weight'",
    ),
    ("unknown input role", _set(["nodes", 0, "inputs", "bias"], 1), gd.StructureError, r"nodes\[0\].*no input 'bias'"),
    ("missing output", _set(["nodes", 0, "outputs"], {}), gd.StructureError, r"nodes\[0\].*missing output 'y'"),
    (
        "unknown attribute",
        _set(["nodes", 0, "attributes", "groups"], 2),
        gd.AttributeValueError,
        r"nodes\[0\]\.attributes\.groups, node 'conv': unknown attribute 'groups'",
    ),
    (
        "attribute wrong type",
        _set(["nodes", 0, "attributes", "stride"], "1,1"),
        gd.AttributeValueError,
        r"nodes\[0\]\.attributes\.stride, node 'conv': attribute 'stride' must be a list",
    ),
    (
        "attribute huge list",
        _set(["nodes", 0, "attributes", "stride"], [1] * 10_000),
        gd.AttributeValueError,
        r"nodes\[0\]\.attributes\.stride, .*at most 64",
    ),
    (
        "attribute wrong length",
        _set(["nodes", 0, "attributes", "stride"], [1, 1, 1]),
        gd.AttributeValueError,
        r"nodes\[0\].*stride has 3 values for 2 spatial dims",
    ),
    (
        "enum attribute",
        _set(["nodes", 0, "attributes", "convolution_mode"], "deconv"),
        gd.AttributeValueError,
        r"convolution_mode, node 'conv': .*must be one of",
    ),
    (
        "inferred dims contradicted",
        _set(["tensors", 2, "dim", 2], 4),
        gd.ShapeError,
        r"nodes\[0\].*has dims set to \[2, 8, 4, 5\]",
    ),
    ("written twice", _written_twice, gd.StructureError, r"is written by both node 'conv' and node 'relu'"),
    ("cycle", _cycle, gd.StructureError, r"cycle"),
    ("too many nodes", _many_nodes, gd.FormatError, r"nodes: has 65537 entries, over the limit"),
    ("no output", _set(["tensors", 4, "is_virtual"], True), gd.StructureError, "has no output"),
    (
        "duplicate node name",
        _set(["nodes", 1, "name"], "conv"),
        gd.StructureError,
        r"nodes\[1\].*node name 'conv' is already used",
    ),
]


@pytest.mark.parametrize(
    ("text_or_mutation", "error", "pattern"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_input_gets_a_graph_error(text_or_mutation: Any, error: type[gd.GraphError], pattern: str) -> None:
    if callable(text_or_mutation):
        mutated = text_or_mutation(copy.deepcopy(document()))
        text = mutated if isinstance(mutated, str) else json.dumps(mutated)
    else:
        text = text_or_mutation
    with pytest.raises(error, match=pattern):
        gd.OperationGraphSpec.from_json(text)


def test_there_are_at_least_thirty_hostile_cases() -> None:
    assert len(HOSTILE) >= 30


def test_oversized_input_is_refused_before_parsing() -> None:
    with pytest.raises(gd.FormatError, match="over the"):
        gd.OperationGraphSpec.from_json(b" " * (serialize.MAX_FILE_BYTES + 1))
