#!/bin/bash
# Session 43, call 1: the frozen-experts GPU case, the Python tests, then full vs frozen steps.
set -u
cd "$(dirname "$0")/.."
export MOEJIT_CACHE_DIR=/tmp/moejit-kernels LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
start=$SECONDS
build/release/tests/moejit_gpu_tests "frozen experts*" > "$OUT/gpu-frozen.log" 2>&1
echo "gpu frozen case rc=$? at $((SECONDS - start)) s"; tail -3 "$OUT/gpu-frozen.log"
tools/gpu-round.sh python; echo "python rc=$? at $((SECONDS - start)) s"
tools/gpu-round.sh bench --tokens 1024,8192,32768 --modes full,frozen --rounds 4 --iters 20 --json "$OUT/bench-frozen.json"
echo "bench done at $((SECONDS - start)) s"
