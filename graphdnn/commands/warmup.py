"""``graphdnn warmup FILES... --arch sm_90 [--jobs N]``: fill a plan cache ahead of time (no GPU needed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cache.plan_cache import PlanCache
from ..cache.warmup import warmup
from ..errors import GraphError
from ..names import printable
from . import add_cache_dir, add_remote, chosen_cache, chosen_remote, positive, target


def add(commands: Any) -> None:
    parser = commands.add_parser("warmup", help="compile many graphs into the plan cache (no GPU needed)")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument(
        "--arch", type=target, default=None, help="target, e.g. sm_90 (default: the current GPU's, else sm_90)"
    )
    parser.add_argument(
        "--jobs", type=positive, default=None, metavar="N", help="compiler processes (default: one per CPU)"
    )
    parser.add_argument("--disable", action="append", default=[], metavar="RULE", help="fusion rule turned off")
    parser.add_argument(
        "--autotune", action="store_true", help="time launch candidates on this machine's GPU and keep the fastest"
    )
    add_cache_dir(parser)
    add_remote(parser)
    parser.set_defaults(run=_warmup)


def _warmup(args: argparse.Namespace) -> int:
    cache = chosen_cache(args)
    if cache is None:
        raise GraphError("caching is off (GRAPHDNN_DISABLE_CACHE): nothing to warm; pass --cache-dir")
    if args.remote:  # plans found there are copied here; plans built here are added there
        cache = PlanCache(cache.directory, remote=chosen_remote(args))
    report = warmup(
        args.files,
        arch=args.arch,
        jobs=args.jobs,
        cache=cache,
        disable=args.disable,
        progress=sys.stderr,
        autotune=args.autotune,
    )
    for graph, reason in report.failures:
        print(f"graphdnn: error: {printable(graph)}: {printable(reason, lines=True)}", file=sys.stderr)
    print(report.summary())
    if cache.remote is not None:
        print(cache.remote.describe())
    return 1 if report.failures or (cache.remote is not None and cache.remote.off) else 0
