#!/usr/bin/env bash
# Builds a git revision in its own worktree and copies what a GPU A/B needs (the library, the
# moejit CLI and moejit_bench, found through their runpaths $ORIGIN/../../src and $ORIGIN/../src)
# into build/NAME of this checkout, small enough (~7 MiB) that several variants travel together
# under the device's carry limit. Each variant keeps its own bench binary: the public headers
# (Options) may differ between revisions.
#   tools/variant-build.sh REV NAME     e.g. tools/variant-build.sh main main
# The worktree stays at /tmp/moejit-variant-NAME, so a rebuild after new commits is incremental.
# Then, on the GPU machine: tools/ab-roles.sh SHAPE TOKENS ROLES build/NAME ... (role by role in
# the tuner) or tools/ab-steps.sh ROUNDS build/NAME ... -- BENCH_ARGS (whole steps)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$1 name=$2
tree=/tmp/moejit-variant-$name
if [[ -d $tree ]]; then
  git -C "$tree" checkout -q --detach "$rev"
else
  git worktree add -q --detach "$tree" "$rev"
fi
(cd "$tree" && cmake --preset release > /dev/null && cmake --build --preset release -j"$(nproc)" --target moejit_cli moejit_bench > /dev/null)
rm -rf "build/$name"
mkdir -p "build/$name/tools/moejit" "build/$name/bench"
cp -a "$tree/build/release/src" "build/$name/"
cp -a "$tree/build/release/tools/moejit/moejit" "build/$name/tools/moejit/"
cp -a "$tree/build/release/bench/moejit_bench" "build/$name/bench/"
echo "build/$name: $(git -C "$tree" log --oneline -1) ($(du -sh "build/$name" | cut -f1))"
