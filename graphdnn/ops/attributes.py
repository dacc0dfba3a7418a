"""Op attributes: frozen dataclasses, checked by one coercer for Python and JSON input.

Each op declares its attributes as a frozen dataclass deriving from :class:`Attributes`.
Field annotations are the schema: ``int``, ``float``, ``bool``, ``str``, an ``Enum``,
``tuple[int, ...]`` / ``tuple[float, ...]``, and ``X | None``. The builder and the
JSON reader both go through :meth:`Attributes.build`, so a bad value gets the same
clear error (naming the attribute and its JSON path) whichever way it came in.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, Self, Union

from ..errors import AttributeValueError

MAX_SEQUENCE = 64  # no attribute list is longer (ranks are <= 8); bounds hostile input
MAX_INT = 2**62


@dataclasses.dataclass(frozen=True)
class Attributes:
    """Base of every op's attribute dataclass."""

    @classmethod
    def build(cls, raw: Mapping[str, Any], *, node: str | None = None, path: str | None = None) -> Self:
        """Check and convert ``raw`` values; unknown or missing names are errors."""
        schema = _schema(typing.cast(type, cls))
        if not raw and schema.default is not None:
            return typing.cast(Self, schema.default)
        if not raw.keys() <= schema.types.keys():
            unknown = sorted(set(raw) - set(schema.types))
            expected = ", ".join(schema.types) or "none"
            raise AttributeValueError(
                f"unknown attribute '{unknown[0]}' (expected: {expected})", node=node, path=_join(path, unknown[0])
            )
        values = {}
        for name, annotation, required in schema.fields:
            if name in raw:
                values[name] = coerce(annotation, raw[name], name, node, _join(path, name))
            elif required:
                raise AttributeValueError(f"missing attribute '{name}'", node=node, path=_join(path, name))
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values: enums by value, tuples as lists."""
        return {f.name: _to_json(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class NoAttributes(Attributes):
    """For ops that take no attributes."""


@dataclasses.dataclass(frozen=True)
class _Schema:
    """What :meth:`Attributes.build` needs of a class, worked out once per class."""

    types: dict[str, Any]  # field name -> annotation, in declaration order
    fields: tuple[tuple[str, Any, bool], ...]  # (name, annotation, required)
    default: Attributes | None  # the instance with every default, shared; None if a field is required


@cache
def _schema(cls: type) -> _Schema:
    types = typing.get_type_hints(cls)
    fields = tuple(
        (f.name, types[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )
    return _Schema(types, fields, None if any(required for _, _, required in fields) else cls())


def _join(path: str | None, name: str) -> str | None:
    return None if path is None else f"{path}.{name}"


def _to_json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_to_json(item) for item in value]
    return value


def coerce(annotation: Any, value: Any, name: str, node: str | None, path: str | None) -> Any:
    """Convert ``value`` to ``annotation``'s type or raise AttributeValueError."""

    def fail(expected: str) -> typing.NoReturn:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise AttributeValueError(f"attribute '{name}' must be {expected}, got {shown}", node=node, path=path)

    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return coerce(options[0], value, name, node, path)
    if origin is tuple:
        element = typing.get_args(annotation)[0]
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            fail("a list")
        if len(value) > MAX_SEQUENCE:
            fail(f"a list of at most {MAX_SEQUENCE} items")
        return tuple(
            coerce(element, item, f"{name}[{i}]", node, None if path is None else f"{path}[{i}]")
            for i, item in enumerate(value)
        )
    if annotation is bool:
        if not isinstance(value, bool) and type(value).__name__ != "bool_":
            fail("true or false")
        return bool(value)
    if annotation is int:
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            fail("an integer")
        if abs(int(value)) > MAX_INT:
            fail("an integer of magnitude at most 2**62")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or (not isinstance(value, (int, float)) and not hasattr(value, "__float__")):
            fail("a number")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            fail("a finite number")
        if not math.isfinite(number):
            fail("a finite number")
        return number
    if annotation is str:
        if not isinstance(value, str):
            fail("a string")
        return value
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        if isinstance(value, str):
            for member in annotation:
                if value.lower() in (str(member.value).lower(), member.name.lower()):
                    return member
        fail("one of " + ", ".join(repr(m.value) for m in annotation))
    raise TypeError(f"attribute '{name}': unsupported annotation {annotation!r}")  # a bug in an op
