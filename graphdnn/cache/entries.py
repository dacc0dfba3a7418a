"""The two kinds of cache entry: a plan (launch metadata) and a compiled kernel (cubin + source).

A plan entry names its kernels by kernel key; a kernel is stored once however many
plans use it. Both are checked on decode: checksum and format by the container, then
that the entry is the one its file name promises.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..program import LaunchProgram
from . import container
from .container import EntryError
from .key import KeyFields

# What a malformed but checksum-valid section can raise while being decoded.
_MALFORMED = (LookupError, TypeError, ValueError, OverflowError, AttributeError, RecursionError)


@dataclass(frozen=True, repr=False)
class KernelBinary:
    """A kernel compiled for one target: what the runtime loads."""

    kernel_key: str
    name: str  # entry point
    content_hash: str
    arch: str
    cubin: bytes
    source: str  # as first compiled; its header comment names the graph it was compiled for

    def encode(self) -> bytes:
        meta = {"kernel_key": self.kernel_key, "name": self.name, "content_hash": self.content_hash, "arch": self.arch}
        return container.encode(
            "kernel", {"meta": json.dumps(meta).encode(), "cubin": self.cubin, "source": self.source.encode()}
        )

    @classmethod
    def decode(cls, data: bytes, kernel_key: str) -> KernelBinary:
        """The kernel entry ``data`` as written; EntryError if it cannot be read. Unchecked:
        read entries through ``trust.trusted_kernel``."""
        sections = container.decode(data, "kernel")
        meta = _json(sections, "meta")
        if meta.get("kernel_key") != kernel_key:
            raise EntryError(f"holds kernel {str(meta.get('kernel_key'))[:16]}…, not {kernel_key[:16]}…")
        try:
            binary = cls(
                kernel_key=kernel_key,
                name=_text(meta["name"]),
                content_hash=_text(meta["content_hash"]),
                arch=_text(meta["arch"]),
                cubin=sections["cubin"],
                source=sections["source"].decode(),
            )
        except _MALFORMED as error:
            raise EntryError(f"malformed kernel entry: {type(error).__name__} {error}") from None
        return binary

    def __repr__(self) -> str:
        return f"KernelBinary({self.name} {self.arch}, {len(self.cubin)} bytes)"


@dataclass(frozen=True)
class PlanEntry:
    """A plan as stored: its key fields and its program with tensors named by canonical position."""

    fields: KeyFields
    program: LaunchProgram
    graph_name: str  # the graph it was first built from (for listings; never part of the key)
    created: float
    tuned_on: str | None = None  # the GPU the tuning was timed on; None: the families' heuristic choices

    @property
    def key(self) -> str:
        """The key it is stored under: its fields' key, or, for a plan autotuned on a GPU model,
        the key of that model's tuned plan (so a plan tuned on one model never answers another)."""
        return self.fields.key if self.tuned_on is None else self.fields.tuned_key(self.tuned_on)

    def encode(self) -> bytes:
        document = {
            "key": self.key,
            "fields": asdict(self.fields),
            "graph_name": self.graph_name,
            "created": self.created,
            "tuned_on": self.tuned_on,
            "program": self.program.to_json(),
        }
        return container.encode("plan", {"plan": json.dumps(document, separators=(",", ":")).encode()})

    @classmethod
    def decode(cls, data: bytes, key: str) -> PlanEntry:
        """The plan entry ``data`` as written; EntryError if it cannot be read. Unchecked:
        read entries through ``trust.trusted_plan``."""
        document = _json(container.decode(data, "plan"), "plan")
        try:
            missing = [f.name for f in dataclasses.fields(KeyFields) if f.name not in document["fields"]]
            if missing:  # an entry of a graphdnn whose key had fewer fields: its key is never looked up again
                raise EntryError(f"written by an older graphdnn: no key field {', '.join(missing)}")
            entry = cls(
                fields=KeyFields(**{name: _scalar(value) for name, value in document["fields"].items()}),
                program=LaunchProgram.from_json(document["program"]),
                graph_name=_text(document["graph_name"]),
                created=float(document["created"]),
                tuned_on=None if document["tuned_on"] is None else _text(document["tuned_on"]),
            )
            if entry.key != key:
                raise EntryError(f"holds plan {entry.key[:16]}…, not {key[:16]}…")
        except _MALFORMED as error:
            raise EntryError(f"malformed plan: {type(error).__name__} {error}") from None
        return entry

    @classmethod
    def new(cls, fields: KeyFields, program: LaunchProgram, graph_name: str, tuned_on: str | None = None) -> PlanEntry:
        return cls(fields, program, graph_name, time.time(), tuned_on)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _scalar(value: object) -> Any:
    if not isinstance(value, (str, int)):
        raise TypeError(f"expected a string or an integer, got {type(value).__name__}")
    return value


def _json(sections: dict[str, bytes], name: str) -> dict[str, Any]:
    try:
        value = json.loads(sections[name])
    except (KeyError, ValueError, RecursionError):
        raise EntryError(f"section '{name}' missing or unreadable") from None
    if not isinstance(value, dict):
        raise EntryError(f"section '{name}' is not an object")
    return value
