#!/usr/bin/env bash
# The session's GPU checks: the gpu suite in three parallel groups (NVRTC is CPU-bound; one GPU).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GRAPHDNN_CACHE_DIR=/tmp/gdc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
P="python3 -m pytest -m gpu -q -rf -p no:cacheprovider -o addopts="
G1="tests/test_pointwise_types.py"
G2="tests/test_codegen_moe.py tests/test_ops_random.py tests/test_ops_argmax.py tests/test_ops_activation_backward.py tests/test_gpu_cudnn.py tests/test_codegen_norm_backward.py tests/test_codegen_batchnorm_backward.py tests/test_codegen_reductions.py tests/test_codegen_gemm_ws.py tests/test_gpu_attention.py"
timeout 520 $P $G1 > $OUT/g1.log 2>&1 &
timeout 520 $P $G2 > $OUT/g2.log 2>&1 &
IGN=""; for f in $G1 $G2; do IGN="$IGN --ignore=$f"; done
timeout 520 $P tests $IGN > $OUT/g3.log 2>&1 &
wait
for g in 1 2 3; do echo "== group $g"; tail -25 $OUT/g$g.log; done
