#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
timeout 250 python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts= tests/test_codegen_gemm_ws.py tests/test_codegen_gemm_splitk.py tests/test_docs.py > $OUT/tests.log 2>&1; tail -4 $OUT/tests.log
timeout 300 python3 scratch_gemm_decode.py 2>&1 | tee $OUT/decode_gemm.log | tail -40
