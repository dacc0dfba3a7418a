"""What a remote plan-cache backend is: a few key-value calls that fail with RemoteError.

Kept apart from :mod:`.remote` (the tier that uses a backend) so that backends import
only this: ``redis_backend`` is one, and S3 or HTTP stores can be added the same way
(``remote.register_scheme``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class RemoteError(Exception):
    """The remote cache cannot be reached or did not answer (connection, timeout, protocol)."""


class RemoteBackend(Protocol):
    """A key-value store that the remote cache can use. Every method raises RemoteError when
    the store cannot be reached; none may block for longer than its timeout."""

    url: str  # where it is, for messages (no password)

    def get(self, name: str, limit: int) -> bytes | None:
        """The value of ``name`` (at most ``limit`` + 1 bytes of it), None when absent."""
        ...

    def put_if_absent(self, name: str, data: bytes, ttl: int | None) -> bool:
        """Store ``data`` under ``name`` unless something is there already (expiring after
        ``ttl`` seconds, if given); True when it was stored."""
        ...

    def remove_if(self, name: str, data: bytes) -> bool:
        """Delete ``name`` if it still holds exactly ``data`` (a damaged entry, once found)."""
        ...

    def names(self, prefix: str) -> Iterator[str]:
        """Every name starting with ``prefix``."""
        ...
