"""The Redis backend of the remote plan cache (``pip install "graphdnn[redis]"``).

One string value per entry. Reads are bounded (GETRANGE, in a script that tells an empty
value, which is a damaged entry, from an absent one), writes are ``SET NX`` (with
``EX`` for a TTL), and a damaged entry is removed only while it still holds the bytes
found damaged (a server-side compare-and-delete), so a good entry written meanwhile
stays. Every call has a short timeout and no retry: the remote cache turns itself off at
the first failure instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import GraphError
from .backend import RemoteError

# KEYS[1]: the entry; ARGV[1]: the last byte offset to read (nil: absent).
_GET = """local v = redis.call('GETRANGE', KEYS[1], 0, ARGV[1])
if v == '' and redis.call('EXISTS', KEYS[1]) == 0 then return false end
return v"""
# KEYS[1]: the entry; ARGV[1]: the bytes found damaged.
_REMOVE_IF = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class RedisBackend:
    """A Redis server at ``url`` (redis://[[user]:password@]host[:port][/db], rediss://... for
    TLS, unix:///path/to/socket[?db=N]); ``timeout`` seconds for a connect or a reply."""

    def __init__(self, url: str, timeout: float) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise GraphError(
                f"the remote cache {_redacted(url)} needs the redis package: pip install 'graphdnn[redis]'"
            ) from None
        self.url = _redacted(url)
        self._errors = redis.RedisError
        no_retry = Retry(NoBackoff(), 0)
        try:
            self._client: Any = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=no_retry
            )
        except ValueError as error:
            raise GraphError(f"remote cache URL {self.url!r}: {error}") from None
        self._get = self._client.register_script(_GET)
        self._remove_if = self._client.register_script(_REMOVE_IF)

    def get(self, name: str, limit: int) -> bytes | None:
        value = self._do(self._get, keys=[name], args=[limit])
        return None if value is None else bytes(value)

    def put_if_absent(self, name: str, data: bytes, ttl: int | None) -> bool:
        return bool(self._do(self._client.set, name, data, nx=True, ex=ttl))

    def remove_if(self, name: str, data: bytes) -> bool:
        return bool(self._do(self._remove_if, keys=[name], args=[data]))

    def names(self, prefix: str) -> Iterator[str]:
        found = self._do(lambda: list(self._client.scan_iter(match=_glob_escape(prefix) + "*", count=1000)))
        return (name.decode() if isinstance(name, bytes) else str(name) for name in found)

    def _do(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except self._errors as error:
            raise RemoteError(f"{type(error).__name__}: {error}") from None


def _redacted(url: str) -> str:
    """``url`` without its password (it appears in messages and listings)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
