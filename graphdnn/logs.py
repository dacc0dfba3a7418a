"""graphdnn's log: the ``graphdnn`` logger hierarchy, and the one switch that shows it.

Modules log through ``logging.getLogger("graphdnn.<area>")``: ``graphdnn.fusion`` (each
rewrite and rejected candidate), ``graphdnn.cache`` (plan-cache hits, misses, rejected
and remote entries), ``graphdnn.compile`` (NVRTC time per kernel, build time per plan).
As a library graphdnn adds no handler of its own unless asked: ``GRAPHDNN_LOG=debug``
(or ``info``, ``warning``, ``error``; read when graphdnn is imported) or the CLI's
``-v`` / ``-vv`` attach one that writes to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from .errors import GraphError

LOGGER = logging.getLogger("graphdnn")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_FORMAT = "graphdnn %(levelname)s %(name)s: %(message)s"


def level_from_env() -> int | None:
    """The level GRAPHDNN_LOG names (None when it is unset or empty); a GraphError for any other word."""
    value = os.environ.get("GRAPHDNN_LOG", "")
    word = value.strip().lower()
    if not word:
        return None
    if word not in LEVELS:
        raise GraphError(f"environment variable GRAPHDNN_LOG={value!r} is not a log level; use {', '.join(LEVELS)}")
    return LEVELS[word]


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a redirected or captured one too)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # handle() holds the handler's lock around emit
        super().emit(record)


def configure(level: int) -> None:
    """Show graphdnn's records of ``level`` and above on stderr (one handler: calling again sets the level)."""
    LOGGER.setLevel(level)
    if not any(isinstance(handler, _Stderr) for handler in LOGGER.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(_FORMAT))
        LOGGER.addHandler(handler)


def configure_from_env() -> None:
    """Apply GRAPHDNN_LOG, if set."""
    level = level_from_env()
    if level is not None:
        configure(level)


@contextlib.contextmanager
def verbose(level: int) -> Iterator[None]:
    """Show records of ``level`` and above on stderr for the block (the CLI's ``-v``), then
    put the logger back as it was (``graphdnn.cli.main`` may be called many times in a process)."""
    before, handlers = LOGGER.level, list(LOGGER.handlers)
    configure(level)
    try:
        yield
    finally:
        LOGGER.setLevel(before)
        LOGGER.handlers[:] = handlers
