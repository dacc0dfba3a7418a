"""Handles: ``create_handle``, ``set_stream``, ``get_stream``, ``destroy_handle``.

A cuDNN handle carries the stream that work is queued on. graphdnn needs no library
context, so a handle here is only that: the stream a graph's ``execute`` launches on
(None, the default stream, until ``set_stream``).
"""

from __future__ import annotations

from typing import Any

from ..errors import GraphError


class Handle:
    """What ``create_handle`` returns; pass it to ``pygraph(handle=)`` or ``execute(handle=)``."""

    def __init__(self) -> None:
        self._stream: Any = None
        self._destroyed = False

    @property
    def stream(self) -> Any:
        """The stream work is launched on: None (the default stream), an int handle or a stream object."""
        if self._destroyed:
            raise GraphError("this cudnn handle was destroyed (destroy_handle); create a new one")
        return self._stream

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else f"stream {self._stream!r}"
        return f"cudnn handle ({state})"


def create_handle() -> Handle:
    return Handle()


def destroy_handle(handle: Handle) -> None:
    _checked(handle)._destroyed = True


def set_stream(handle: Handle, stream: Any) -> None:
    """Queue the work of graphs executed with ``handle`` on ``stream`` (an int handle, as
    ``torch.cuda.current_stream().cuda_stream`` gives, or a stream object)."""
    _checked(handle)
    handle._stream = stream


def get_stream(handle: Handle) -> Any:
    return _checked(handle).stream


def _checked(handle: Any) -> Handle:
    if not isinstance(handle, Handle):
        raise GraphError(f"expected a handle from cudnn.create_handle(), got {type(handle).__name__} {handle!r}")
    return handle
