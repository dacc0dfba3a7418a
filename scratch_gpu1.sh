#!/usr/bin/env bash
# scratch: full GPU suite in 4 groups, sanitizer subset, warm-load extras
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
P="python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts= --timeout 200"
G2="tests/test_codegen_norm_backward.py tests/test_codegen_batchnorm_backward.py tests/test_ops_random.py tests/test_ops_index.py tests/test_ops_argmax.py"
G3="tests/test_codegen_reductions.py tests/test_codegen_direct.py tests/test_gpu_attention.py tests/test_compile_every_graph.py tests/test_codegen_norms.py"
IGN=""; for f in tests/test_pointwise_types.py $G2 $G3; do IGN="$IGN --ignore=$f"; done
start=$(date +%s)
timeout 380 $P tests/test_pointwise_types.py > $OUT/g1.log 2>&1 &
timeout 380 $P $G2 > $OUT/g2.log 2>&1 &
timeout 380 $P $G3 > $OUT/g3.log 2>&1 &
timeout 380 $P tests $IGN > $OUT/g4.log 2>&1 &
wait
echo "suite took $(( $(date +%s) - start )) s" > $OUT/times.txt
for g in 1 2 3 4; do tail -3 $OUT/g$g.log; done
timeout 100 python3 benchmarks/run.py --only layernorm_gelu --skip-compile --out $OUT/warm.md --json $OUT/warm.json > $OUT/bench.log 2>&1
grep -i "warm load\|cold build" $OUT/warm.md | head
left=$(( 570 - ($(date +%s) - start) ))
timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m pytest -m gpu -q -x -p no:cacheprovider -o addopts= tests/test_codegen_gemm_ws.py tests/test_gpu_attention.py -k "ws or wgmma or engine" > $OUT/memcheck.log 2>&1
echo "memcheck rc=$?" >> $OUT/times.txt; tail -5 $OUT/memcheck.log
cat $OUT/times.txt
