"""Bound plans of recent variant packs, so that ``Plan.execute`` checks and packs a pack once.

Everything ``bind`` checks and packs (devices, data types, dims, strides, alignment,
overlaps, launch order, parameter slots) follows from the buffers' addresses, dims,
strides and data types, the workspace, the stream and the scalar values. ``execute``
reads just these (a few attribute reads per torch tensor) and, when they equal those of
a pack bound before, launches that bound plan again: every check holds for the same
reason it held then. The keys hold no object identities, so a freed tensor whose id is
reused, or a torch tensor whose storage was swapped, can only match a binding made for
exactly its memory and layout; the entries hold none of the caller's buffers.

Torch tensors, graphdnn DeviceArrays, ``__cuda_array_interface__`` arrays (CuPy...) and
Python-number scalars are read this way; a pack holding anything else (DLPack-only
objects, host arrays as scalars), an interface array exported on another stream than the
plan's (binding makes the plan's stream wait for that one: :mod:`.strided`), or leaving
outputs out (they are allocated per call), is bound anew on every call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from . import driver
from .buffers import is_torch
from .device_array import DeviceArray
from .launch import BoundPlan
from .strided import consumer_stream

SIZE = 8  # bound plans kept per plan (least recently used dropped first)
# A dynamic plan's: one per size a server sees (a batch of 1..256 binds each size once); an entry
# is a few kilobytes of packed parameters, no buffers.
DYNAMIC_SIZE = 256


@dataclass(frozen=True)
class Entry:
    bound: BoundPlan  # without the caller's buffers (BoundPlan.detached)
    outputs: tuple[tuple[str, Any], ...]  # output name -> the variant-pack key giving its array


class BindCache:
    """Up to ``size`` bound plans of one plan, by the layout of their variant packs."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._newest: Entry | None = None  # the most recently used entry (the end of _entries)
        self._lock = threading.Lock()

    def lookup(
        self, variant_pack: Mapping[Any, Any], workspace: Any, stream: Any
    ) -> tuple[Hashable | None, Entry | None]:
        """The key of these arguments (None: not cacheable) and the entry bound for it, if any."""
        key = pack_key(variant_pack, workspace, stream)
        return key, self.get(key) if key is not None else None

    def get(self, key: Hashable) -> Entry | None:
        entry = self._entries.get(key)  # one atomic read: a hit on the newest entry takes no lock
        if entry is not None and entry is not self._newest:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    self._newest = entry
        return entry

    def put(self, key: Hashable, bound: BoundPlan, variant_pack: Mapping[Any, Any]) -> None:
        """Remember ``bound`` unless it allocated outputs (a new array each call)."""
        by_identity = {id(value): pack_key for pack_key, value in variant_pack.items()}
        outputs = tuple((name, by_identity.get(id(value))) for name, value in bound.outputs.items())
        if any(pack_key is None for _, pack_key in outputs):
            return
        with self._lock:
            self._entries[key] = self._newest = Entry(bound.detached(), outputs)
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def pack_key(variant_pack: Mapping[Any, Any], workspace: Any, stream: Any) -> Hashable | None:
    """What a binding of these arguments depends on; None when some value cannot be read cheaply."""
    if not isinstance(variant_pack, Mapping):
        return None
    handle = 0 if stream is None else driver.stream_handle(stream)
    parts: list[Hashable] = [handle]
    consumer = consumer_stream(handle)
    if workspace is None or (type(workspace) is int):
        parts.append(workspace)
    else:
        layout = _layout(workspace, consumer)
        if layout is None:
            return None
        parts.append(layout)
    for key, value in variant_pack.items():
        if type(key) is str or type(key) is int:
            name: Hashable = key
        else:
            name = getattr(key, "name", None)  # a TensorSpec or IR Tensor is looked up by its name
            if not isinstance(name, str):
                return None
        if type(value) in _TORCH_TYPES:  # the common case, inline (the same key as _layout's)
            parts.append((name, (value.data_ptr(), value.is_cuda, value.shape, value.stride(), value.dtype)))
            continue
        layout = _layout(value, consumer)
        if layout is None:
            return None
        parts.append((name, layout))
    return tuple(parts)


_TORCH_TYPES: set[type] = set()  # the torch tensor classes seen so far (torch is never imported here)


def _layout(value: Any, consumer: int) -> Hashable | None:
    """The key of one value; ``consumer`` is the plan's stream as the exchange protocols name it."""
    if is_torch(value):
        _TORCH_TYPES.add(type(value))
        return (value.data_ptr(), value.is_cuda, value.shape, value.stride(), value.dtype)
    if isinstance(value, DeviceArray):
        return (value.pointer, value.shape, value.strides, value.data_type.value)  # a str hashes in C
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (type(value), value)
    interface = getattr(value, "__cuda_array_interface__", None)  # CuPy, Numba...
    if isinstance(interface, dict) and interface.get("stream") in (None, consumer):
        strides = interface.get("strides")
        pointer, readonly = interface["data"]
        return (pointer, readonly, tuple(interface["shape"]), strides and tuple(strides), interface["typestr"])
    return None
