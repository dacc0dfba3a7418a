"""Subcommands of the ``graphdnn`` command line, one module each (registered by graphdnn.cli)."""

from __future__ import annotations

import argparse

from ..arch import parse_target
from ..cache.plan_cache import PlanCache, cache_at, default_cache, default_directory
from ..cache.remote import RemoteCache, remote_from_env
from ..errors import GraphError


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="plan cache directory (default: $GRAPHDNN_CACHE_DIR, else $XDG_CACHE_HOME/graphdnn or ~/.cache/graphdnn)",
    )


def add_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="remote plan cache, redis://host:6379/0, rediss://... or unix:///path (default: $GRAPHDNN_REMOTE_CACHE)",
    )


def chosen_remote(args: argparse.Namespace) -> RemoteCache | None:
    """The remote cache a command works with: --remote, else $GRAPHDNN_REMOTE_CACHE, else None."""
    return remote_from_env(args.remote)


def needed_remote(args: argparse.Namespace) -> RemoteCache:
    """The remote cache of a command that needs one (push, pull)."""
    remote = chosen_remote(args)
    if remote is None:
        raise GraphError("no remote cache: pass --remote URL or set GRAPHDNN_REMOTE_CACHE")
    return remote


def chosen_cache(args: argparse.Namespace) -> PlanCache | None:
    """The cache a command works on: --cache-dir, else the default (None if caching is off)."""
    return cache_at(args.cache_dir) if args.cache_dir else default_cache()


def chosen_directory(args: argparse.Namespace) -> PlanCache:
    """The cache a ``cache`` subcommand inspects; always one with a directory."""
    return cache_at(args.cache_dir or default_directory())


def target(text: str) -> str:
    """argparse type of ``--arch``: a known target such as sm_90 or sm_90a, else a usage error."""
    try:
        parse_target(text)
    except GraphError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def positive(text: str) -> int:
    """argparse type of counts (``--jobs``, ``--repeat``): an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
