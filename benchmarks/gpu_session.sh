#!/usr/bin/env bash
# One batched session on the GPU machine (see ../shared/DEVICE.md): GPU tests, the example
# graphs checked against the reference, then the benchmarks. Logs go to $OUT (or ./gpu-out).
#   bash benchmarks/gpu_session.sh [tests|bench|sanitize|all] [pytest -k expression]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/graphdnn-cache
if [ -d .whl ]; then  # the cuDNN frontend, carried as a wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
what=${1:-all}; filter=${2:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 420 python3 -m pytest -m gpu -q -rf -p no:cacheprovider --timeout 120 ${filter:+-k "$filter"} tests 2>&1 | tee "$OUT/gpu-tests.log" | tail -60
  for f in examples/graphs/*.json; do timeout 120 python3 -m graphdnn.cli run "$f" --check 2>&1 | tail -8; done | tee "$OUT/examples.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout 540 python3 benchmarks/run.py ${BENCH_ARGS:-} ${filter:+--only "$filter"} --out "$OUT/RESULTS.md" --json "$OUT/results.json" 2>&1 | tee "$OUT/bench.log" | tail -40
fi
if [ "$what" = sanitize ]; then
  timeout 500 compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -m gpu -q -x -p no:cacheprovider ${filter:+-k "$filter"} tests 2>&1 | tail -30 | tee "$OUT/memcheck.log"
fi
