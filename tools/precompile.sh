#!/usr/bin/env bash
# Fills build/kcache with the sm_90a kernels of the shipped-table grid (every config the tuner
# compiles for each E,H,I,K at the token counts `moejit grid` prints, those `moejit tune` takes by
# default), compiled here with build/release's CLI.
# A GPU call that carries build/kcache starts with them: tools/gpu-round.sh and tools/ab-steps.sh
# copy it into their kernel cache first, and the GPU machine's NVRTC is the same 13.0 build. Cache
# keys hash the unit's source, the NVRTC build (version and build id, `moejit info` prints it) and
# the template hash (src/jit/kernel_key.cpp), so a build whose templates differ misses and
# compiles there as before.
#   tools/precompile.sh [SHAPE...]   default: the five models of `tools/gpu-round.sh retune`
set -euo pipefail
cd "$(dirname "$0")/.."
shapes=("$@")
((${#shapes[@]})) || shapes=(128,2048,768,8 32,2880,2880,4 64,2048,1408,6 128,4096,1536,8 8,4096,14336,2)
export MOEJIT_CACHE_DIR=$PWD/build/kcache
mkdir -p "$MOEJIT_CACHE_DIR"
cli=build/release/tools/moejit/moejit
for shape in "${shapes[@]}"; do
  grid=$("$cli" grid --shape "$shape")
  for tokens in ${grid//,/ }; do
    "$cli" compile --arch sm_90a --shape "$shape" --tokens "$tokens" --jobs "$(nproc)" |
      grep " compiled, " | sed "s/^/$shape T=$tokens: /"
  done
done
echo "build/kcache: $(find "$MOEJIT_CACHE_DIR" -type f | wc -l) files, $(du -sh "$MOEJIT_CACHE_DIR" | cut -f1)"
