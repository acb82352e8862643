#!/usr/bin/env bash
# Whole-step A/B of builds on the GPU machine: each build's own moejit_bench runs BENCH_ARGS in
# turn, ROUNDS times, the order reversed every other round (A B, B A, A B ...), so clock drift
# hits all alike and no side always follows another's heat; each run's table lines are
# printed and its JSON lands in $OUT/ab-steps-NAME-ROUND.json, which tools/ab-summary.py sums up
# at the end. A side whose outputs fail moejit_bench's check prints why; the summary says so too.
# Every build runs on the shipped tables of db/ and never tunes (MOEJIT_AUTOTUNE=0). A build
# whose template hash differs from a table's (its rows would be stale there) runs a copy with the
# hash rewritten to its own: both sides then run the same configs and only the kernels differ.
#   tools/ab-steps.sh ROUNDS BUILD[:TABLES][+ROLE=CONFIG]... -- BENCH_ARGS...
#   tools/ab-steps.sh 2 build/main build/release -- --tokens 1024,8192,32768 --modes forward,full --rounds 3
#   tools/ab-steps.sh 2 build/release build/release:build/new-tables -- --tokens 32768 --modes full
#   tools/ab-steps.sh 2 build/release build/release+bwd_down=bm128_bn256_bk64_s4_w8_g8_tma_ws -- --tokens 32768
# A BUILD holds bench/moejit_bench, tools/moejit/moejit and src/ (tools/variant-build.sh, or a
# whole build tree such as build/release). :TABLES runs that side on the tables of another folder
# instead of db/ (a table A/B: the same build twice, on two tables), hash rewritten likewise.
# +ROLE=CONFIG (repeatable) forces that side's config of a role (moejit_bench --override).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEJIT_CACHE_DIR=${MOEJIT_CACHE_DIR:-/tmp/moejit-kernels}
# Kernels compiled ahead here (tools/precompile.sh), when the call carries them.
# -u, not -n (which coreutils 9.4 warns about): a cache file's name hashes all its kernel is
# compiled from, so replacing one changes nothing.
[[ -d build/kcache ]] && mkdir -p "$MOEJIT_CACHE_DIR" && cp -ru build/kcache/. "$MOEJIT_CACHE_DIR"/
rounds=$1
shift
builds=()
while (($#)) && [[ $1 != "--" ]]; do builds+=("$1"); shift; done
[[ ${1:-} == "--" ]] && shift
out=${OUT:-/tmp}
mkdir -p "$out"
declare -A tables bins overrides
tags=()
for side in "${builds[@]}"; do
  forced=()
  IFS=+ read -r -a parts <<< "$side"
  side=${parts[0]}
  for o in "${parts[@]:1}"; do forced+=(--override "$o"); done
  build=${side%%:*}
  source=db
  [[ $side == *:* ]] && source=${side#*:}
  tag=$(basename "$build")
  [[ $source != db ]] && tag=$tag-$(basename "$source")
  ((${#forced[@]})) && tag=$tag-override$((${#tags[@]} + 1))
  # Two sides of one name (an A/A run, or a/release against b/release) would share their tables,
  # binaries and JSON files: the later one is numbered.
  [[ " ${tags[*]} " == *" $tag "* ]] && tag=$tag-side$((${#tags[@]} + 1))
  hash=$("$build/tools/moejit/moejit" info | sed -n 's/.*templates.*hash \([0-9a-f]*\).*/\1/p')
  [[ -n $hash ]] || { echo "$build: moejit info printed no template hash" >&2; exit 1; }
  dir=/tmp/ab-steps-tables/$tag
  rm -rf "$dir" && mkdir -p "$dir"
  for table in "$source"/*.json; do
    sed -E "s/(\"template_hash\": *\")[0-9a-f]+\"/\1$hash\"/" "$table" > "$dir/$(basename "$table")"
  done
  tables[$tag]=$dir
  bins[$tag]=$build/bench/moejit_bench
  overrides[$tag]="${forced[*]}"
  tags+=("$tag")
  echo "$tag: template hash $hash, tables of $source${forced:+, ${forced[*]}}"
done
for ((r = 1; r <= rounds; r++)); do
  order=("${tags[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#tags[@]} - 1; i >= 0; i--)); do order+=("${tags[$i]}"); done
  fi
  for tag in "${order[@]}"; do
    echo "-- $tag, round $r"
    log=/tmp/ab-steps-$tag-$r.txt
    # Word-split on purpose: "--override ROLE=CONFIG" pairs, none holding spaces.
    # shellcheck disable=SC2086
    MOEJIT_AUTOTUNE=0 MOEJIT_SHIPPED_DB_DIR=${tables[$tag]} "${bins[$tag]}" "$@" ${overrides[$tag]} \
      --json "$out/ab-steps-$tag-$r.json" > "$log" 2>&1
    status=$?
    # The table's rows (the last column: whether the step's outputs checked out) and why a check
    # failed, which exits 1 after a whole table; a run that ended without one, its last lines.
    grep -E "^ *[0-9]+ +(forward|backward|full|inference|memeff|frozen) | check: FAILED" "$log" || tail -3 "$log"
    ((status == 0)) || echo "exit status $status (log: $log)"
  done
done
echo "-- summary (tools/ab-summary.py)"
python3 tools/ab-summary.py "$out" "${tags[@]}"
