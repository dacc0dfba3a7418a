"""The file format of a cache entry: a one-line JSON header, then named binary sections.

The header names the format version, the entry kind, each section's length and the
SHA-256 of the header fields plus payload. :func:`decode` rejects a file that is
truncated, has a flipped byte anywhere, another format version or another kind, with
an :class:`EntryError` saying which; nothing from a rejected file is ever used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from .key import FORMAT_VERSION

MAGIC = "graphdnn-cache"


class EntryError(Exception):
    """A cache entry cannot be trusted: corrupt, truncated, or of another format version."""


def encode(kind: str, sections: Mapping[str, bytes]) -> bytes:
    lengths = [[name, len(data)] for name, data in sections.items()]
    payload = b"".join(sections.values())
    header = {"magic": MAGIC, "format": FORMAT_VERSION, "kind": kind, "sections": lengths}
    header["sha256"] = _digest(header, payload)
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def decode(data: bytes, kind: str) -> dict[str, bytes]:
    """The sections of an entry of ``kind``; EntryError if it cannot be trusted."""
    line, newline, payload = data.partition(b"\n")
    if not newline:
        raise EntryError("truncated: no header line")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise EntryError("unreadable header") from None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise EntryError("not a graphdnn cache entry")
    if header.get("format") != FORMAT_VERSION:
        raise EntryError(f"format version {header.get('format')!r}, this graphdnn reads {FORMAT_VERSION}")
    if header.get("kind") != kind:
        raise EntryError(f"a {header.get('kind')!r} entry where a {kind!r} entry belongs")
    try:
        lengths = [(name, size) for name, size in header["sections"]]
        stated = header.pop("sha256")
    except (KeyError, TypeError, ValueError):
        raise EntryError("malformed header") from None
    if not isinstance(stated, str) or any(
        not isinstance(name, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0
        for name, size in lengths
    ):
        raise EntryError("malformed header: sections must be [name, non-negative length] pairs")
    if len({name for name, _ in lengths}) != len(lengths):
        raise EntryError("malformed header: a section name appears twice")
    if sum(size for _, size in lengths) != len(payload):
        raise EntryError(f"truncated: {len(payload)} payload bytes, the header says {sum(s for _, s in lengths)}")
    if _digest(header, payload) != stated:
        raise EntryError("checksum mismatch (the file was altered or damaged)")
    sections, start = {}, 0
    for name, size in lengths:
        sections[name] = payload[start : start + size]
        start += size
    return sections


def _digest(header: Mapping[str, object], payload: bytes) -> str:
    fields = json.dumps({k: v for k, v in header.items() if k != "sha256"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(fields.encode() + b"\n" + payload).hexdigest()
