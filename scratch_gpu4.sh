#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
timeout 300 python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts= --timeout 200 tests/test_torch_op.py tests/test_gpu_paged_attention.py tests/test_docs.py tests/test_gpu_attention.py > $OUT/tests.log 2>&1; tail -15 $OUT/tests.log
timeout 200 python3 benchmarks/attention.py --decode 2>&1 | tee $OUT/decode.log | tail -12
