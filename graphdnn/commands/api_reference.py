"""docs/api.md from the public API's signatures and docstrings: ``python -m graphdnn.commands.api_reference``.

The public API is ``graphdnn.__all__``, ``graphdnn.torch.__all__`` and
``graphdnn.cudnn.__all__``; the methods of the classes a program works through
(:data:`CLASSES_WITH_METHODS`) are listed too. Each entry is its signature and the first
paragraph of its docstring, so the reference says what the code says. ``--check`` exits 1
when docs/api.md differs from what would be written (tests/test_docs.py runs it).
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import graphdnn
import graphdnn.cudnn
import graphdnn.torch

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODULES: tuple[tuple[str, ModuleType], ...] = (
    ("gd", graphdnn),
    ("gd.torch", graphdnn.torch),
    ("gd.cudnn", graphdnn.cudnn),
)
CLASSES_WITH_METHODS = (
    graphdnn.OperationGraphSpec,
    graphdnn.TensorSpec,
    graphdnn.Plan,
    graphdnn.ReferencePlan,
    graphdnn.PlanCache,
    graphdnn.cudnn.pygraph,
)


class _Annotation(str):
    """An annotation string shown as written (``int | None``), not quoted as ``repr`` would."""

    def __repr__(self) -> str:
        return str(self)


def signature(obj: Any) -> str:
    """``(a: int, *, b: str = 'x') -> Plan``; empty for what has no inspectable signature (enums)."""
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return ""
    try:
        found = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def shown(annotation: Any) -> Any:
        return _Annotation(annotation) if isinstance(annotation, str) else annotation

    parameters = [p.replace(annotation=shown(p.annotation)) for p in found.parameters.values()]
    return str(found.replace(parameters=parameters, return_annotation=shown(found.return_annotation)))


def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line ("" without one: the accessors say what they are by name)."""
    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _entry(qualified: str, obj: Any) -> list[str]:
    kind = "class " if isinstance(obj, type) else ""
    text = summary(obj)
    return [f"### `{kind}{qualified}{signature(obj)}`", "", *([text, ""] if text else [])]


def _methods(qualified: str, cls: type) -> list[str]:
    lines = []
    for name in sorted(dir(cls)):  # inherited ones too: the builder's op methods come from mixins
        if name.startswith("_"):
            continue
        member = inspect.getattr_static(cls, name)
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            lines += [_item(f"`{qualified}.{name}` (property)", member)]
        elif callable(member):
            lines += [_item(f"`{qualified}.{name}{signature(member)}`", member)]
    return [*lines, ""] if lines else []


def _item(title: str, member: Any) -> str:
    text = summary(member)
    return f"- {title}: {text}" if text else f"- {title}"


def render() -> str:
    """The text of docs/api.md."""
    lines = [
        "# API reference",
        "",
        "Generated from the signatures and docstrings by `python -m graphdnn.commands.api_reference`",
        "(`tests/test_docs.py` checks it is up to date): the first paragraph of each docstring. The guides",
        "([guide.md](guide.md), [execution.md](execution.md), [cudnn-compat.md](cudnn-compat.md)) show how",
        "the pieces are used together.",
        "",
    ]
    for prefix, module in MODULES:
        lines += [f"## `{module.__name__}`", "", summary(module) or f"``{module.__name__}``", ""]
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            if not callable(obj):
                continue  # __version__: a value, printed by graphdnn --version
            lines += _entry(f"{prefix}.{name}", obj)
            if obj in CLASSES_WITH_METHODS:
                lines += _methods(f"{prefix}.{name}", obj)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOCUMENT.is_file() or DOCUMENT.read_text(encoding="utf-8") != text:
            print(f"{DOCUMENT} is out of date: run python -m graphdnn.commands.api_reference", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text, encoding="utf-8")
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
