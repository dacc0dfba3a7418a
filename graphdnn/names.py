"""The one rule for graph, tensor and node names, which the builder and the JSON reader share.

Names are labels: they appear in messages, listings and generated comments, never in
keys or code. Characters that change how text is read rather than what it says are
refused, so a name cannot cut a generated source short (NUL), start a new line in it,
drive a terminal (ANSI escapes) or reorder what a reviewer sees (Trojan Source):

- C0 controls U+0000-U+001F, DEL U+007F and C1 controls U+0080-U+009F (category Cc);
- line and paragraph separators U+2028, U+2029 (Zl, Zp), which also end lines;
- surrogates (Cs), which are not characters and cannot be written as UTF-8;
- the bidirectional formatting characters: U+061C, U+200E, U+200F, U+202A-U+202E,
  U+2066-U+2069 (refused rather than escaped: no legitimate name needs them, and a name
  that displays differently from what it is defeats reading a graph file).

Other non-ASCII text is allowed (names in any script); it is escaped where a name
reaches generated code (:func:`codegen.kernel.comment_safe`).
"""

from __future__ import annotations

import unicodedata

from .errors import GraphError

BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_REFUSED_CATEGORIES = {"Cc": "control character", "Zl": "line separator", "Zp": "paragraph separator"}


def check_name(name: object, what: str) -> str:
    """``name`` if it is a valid ``what`` name (e.g. "tensor"); GraphError saying what is wrong otherwise."""
    if not isinstance(name, str) or not name:
        raise GraphError(f"{what} name must be a non-empty string, got {name!r}")
    if name.isprintable():  # every refused character is unprintable: skip the per-character scan
        return name
    for position, char in enumerate(name):
        problem = refused(char)
        if problem is not None:
            raise GraphError(
                f"{what} name {name!r} holds a {problem} (U+{ord(char):04X}) at position {position}; "
                "names may not contain control, line-breaking or bidirectional formatting characters"
            )
    return name


def refused(char: str) -> str | None:
    """What is wrong with ``char`` in a name, or None when it is allowed."""
    if char in BIDI_CONTROLS:
        return "bidirectional formatting character"
    category = unicodedata.category(char)
    if category == "Cs":
        return "surrogate"
    return _REFUSED_CATEGORIES.get(category)


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` for a terminal: every refused character (as a name would refuse it) escaped as
    ``\\xNN``/``\\uNNNN``, so stored or foreign strings (cache listings, error messages)
    cannot drive the terminal or reorder the line. ``lines``: keep its line breaks (a
    multi-line message such as a compiler log)."""
    if lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    if text.isprintable() or not any(refused(char) for char in text):
        return text
    return "".join(char if refused(char) is None else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
