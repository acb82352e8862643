#!/usr/bin/env bash
# Builds the `asan` preset (AddressSanitizer + UBSan) and copies what the GPU cases need into
# build/asan-slim, stripped of debug info so that it fits the device's carry with the tree
# (~41 MiB; symbols stay, so reports still name functions). Then, on the GPU machine:
#   BUILD=build/asan-slim tools/gpu-round.sh tests 500
# Under the sanitizers the cases whose fp64 reference is large run 3-6x longer (the Qwen3 case at
# T=1024: 296 s against 48, session 36): pass a per-case limit above 300 s and split the round
# over calls with its FIRST argument.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset asan > /dev/null
cmake --build --preset asan -j"$(nproc)" --target moejit_gpu_tests moejit_cli > /dev/null
out=build/asan-slim
rm -rf "$out"
mkdir -p "$out/src" "$out/tests" "$out/tools/moejit"
cp -a build/asan/src/libmoejit.so* "$out/src/"
cp build/asan/tests/moejit_gpu_tests "$out/tests/"
cp build/asan/tools/moejit/moejit "$out/tools/moejit/"
strip --strip-debug "$out/src/libmoejit.so."*.*.* "$out/tests/moejit_gpu_tests" "$out/tools/moejit/moejit"
echo "$out: $(du -sh "$out" | cut -f1)"
