"""Reading a file whose size the reader bounds, whatever the file claims.

``stat`` is not enough: /dev/zero, a FIFO or a symlink to one reports size 0 and then
never ends. Reading at most ``limit + 1`` bytes bounds the work and tells an oversized
file from one of exactly ``limit`` bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import FormatError


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of ``path``; a FormatError naming the file if it holds more than ``limit``
    bytes or cannot be read."""
    file = Path(path)
    try:
        with file.open("rb") as stream:
            data = stream.read(limit + 1)
    except OSError as error:
        raise FormatError(f"cannot read: {error.strerror or error}", file=str(file)) from None
    if len(data) > limit:
        raise FormatError(f"file is over the {limit}-byte limit", file=str(file))
    return data
