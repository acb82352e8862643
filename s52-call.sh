#!/usr/bin/env bash
# Session 52's device round (untracked; removed at the session's end).
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cli=build/release/tools/moejit/moejit
echo "== tune tests"; CASES='[tune]' tools/gpu-round.sh tests 300 1 250
cp $OUT/gpu-tests.log $OUT/gpu-tests-tune.log 2>/dev/null; rm -f $OUT/gpu-tests.log
echo "== cold plans"
mkdir -p /tmp/noship
for T in 8192 32768; do
  rm -rf /tmp/cold-cache /tmp/cold.sqlite*
  MOEJIT_CACHE_DIR=/tmp/cold-cache MOEJIT_DB=/tmp/cold.sqlite MOEJIT_SHIPPED_DB_DIR=/tmp/noship MOEJIT_LOG=info \
    $cli plan --mode train --tokens $T 2>&1 | grep -E "tuned|moejit" | head -12
done | tee $OUT/cold-plans.txt
echo "== budget shares (first-call space, kernels cached at T=32768)"
for B in 1 2 4; do
  rm -f /tmp/b$B.sqlite*
  /usr/bin/time -f "%e s wall" env MOEJIT_CACHE_DIR=/tmp/cold-cache MOEJIT_DB=/tmp/b$B.sqlite MOEJIT_SHIPPED_DB_DIR=/tmp/noship \
    MOEJIT_TUNE_BUDGET_S=$B MOEJIT_LOG=info $cli plan --mode train --tokens 32768 2>&1 | grep -E "tuned|wall"
  $cli db export --db /tmp/b$B.sqlite --out $OUT/budget-$B.json > /dev/null
done
