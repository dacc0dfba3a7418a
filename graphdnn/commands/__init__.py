"""Subcommands of the ``graphdnn`` command line, one module each (registered by graphdnn.cli)."""

from __future__ import annotations

import argparse

from ..cache.plan_cache import PlanCache, cache_at, default_cache, default_directory


def add_cache_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="plan cache directory (default: $GRAPHDNN_CACHE_DIR, else $XDG_CACHE_HOME/graphdnn or ~/.cache/graphdnn)",
    )


def chosen_cache(args: argparse.Namespace) -> PlanCache | None:
    """The cache a command works on: --cache-dir, else the default (None if caching is off)."""
    return cache_at(args.cache_dir) if args.cache_dir else default_cache()


def chosen_directory(args: argparse.Namespace) -> PlanCache:
    """The cache a ``cache`` subcommand inspects; always one with a directory."""
    return cache_at(args.cache_dir or default_directory())
