#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
timeout 200 python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts= tests/test_gpu_attention.py tests/test_pointwise_types.py -k "attention or hopper or flash or int64" > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
timeout 200 python3 benchmarks/attention.py 2>&1 | tee $OUT/att.log | tail -8
timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy -k regex:wgmma python3 scratch_att_one.py > $OUT/ncu.log 2>&1; grep -E "Throughput|Stall|Issued|Eligible|Active Warps|Duration|choice|block_n" $OUT/ncu.log | head -60
