"""Deployment warmup: compile a set of graphs into a plan-cache directory, then prove it is warm.

Step 1 needs no GPU (NVRTC compiles for the named architecture). Step 2 starts a fresh
Python process with GRAPHDNN_REQUIRE_CACHED=1, where any cache miss is an error, loads
every graph from the directory and checks that nothing was compiled. Optionally the
cache is exported to one archive file to ship (``graphdnn cache import`` unpacks it).

    python examples/warmup.py /srv/graphdnn-cache --arch sm_90 examples/graphs/*.json
    python examples/warmup.py /tmp/cache --arch sm_80 model.json --archive cache-sm80.tar.gz

On the serving machine: GRAPHDNN_CACHE_DIR=/srv/graphdnn-cache GRAPHDNN_REQUIRE_CACHED=1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import graphdnn as gd

# Runs in the fresh process: every graph must come from the cache, with zero compiles.
VERIFY = """
import sys
import graphdnn as gd

directory, arch, *files = sys.argv[1:]
cache = gd.PlanCache(directory)
for path in files:
    plan = gd.compile(gd.load(path), arch=arch, cache=cache)  # raises CacheMissError on a miss
    assert plan.origin == "disk cache", (path, plan.origin)
counters = cache.counters
print(f"verified in a fresh process: {counters.loads} graphs loaded from the cache, {counters.compiles} kernels compiled")
sys.exit(0 if counters.compiles == 0 and counters.misses == 0 else 1)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache_dir", help="the plan-cache directory to fill")
    parser.add_argument("files", nargs="+", help="graph JSON files")
    parser.add_argument("--arch", required=True, help="target GPU architecture, e.g. sm_90")
    parser.add_argument("--jobs", type=int, default=None, help="compiler processes (default: one per CPU)")
    parser.add_argument("--archive", help="also export the cache to this archive (.tar or .tar.gz)")
    args = parser.parse_args()

    cache = gd.PlanCache(args.cache_dir)
    report = gd.warmup(args.files, arch=args.arch, jobs=args.jobs, cache=cache, progress=sys.stderr)
    print(report.summary())
    for graph, reason in report.failures:
        print(f"failed: {graph}: {reason}", file=sys.stderr)
    if report.failures:
        return 1

    environment = {**os.environ, "GRAPHDNN_REQUIRE_CACHED": "1"}
    check = subprocess.run(
        [sys.executable, "-c", VERIFY, args.cache_dir, args.arch, *args.files], env=environment, check=False
    )
    if check.returncode != 0:
        print("the cache is not warm: see the error above", file=sys.stderr)
        return 1
    if args.archive:
        print(f"exported {cache.export_archive(args.archive)} to {args.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
