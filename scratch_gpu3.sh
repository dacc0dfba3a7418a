#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
timeout 240 python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts= tests/test_gpu_attention.py tests/test_gpu_cudnn.py tests/test_pointwise_types.py -k "attention or hopper or flash or int64 or sdpa or choice" > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
timeout 200 python3 benchmarks/attention.py 2>&1 | tee $OUT/att.log | tail -7
timeout 120 ncu --clock-control none --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" -k regex:wgmma python3 scratch_att_one.py > $OUT/ncu.log 2>&1; grep -E "ratio|pct|duration" $OUT/ncu.log | awk '$NF+0 > 0.05' | head -40
