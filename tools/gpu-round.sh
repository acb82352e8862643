#!/usr/bin/env bash
# What a session runs on the GPU machine (build here, carry build/release, run this there).
#   tools/gpu-round.sh tests [SECONDS [FIRST [BUDGET]]]
#                                       every [gpu] test case in its own process, one line each,
#                                       each stopped after SECONDS (default 500), from the
#                                       FIRST-th case on (default 1: a second call resumes), from
#                                       $BUILD (default build/release; build/asan-slim from
#                                       tools/asan-slim.sh runs them under the sanitizers); no
#                                       case starts once BUDGET seconds have passed (default 450,
#                                       so a call ends inside the device's 600 s even when the
#                                       slowest case, about 140 s, starts last): the last line
#                                       then says which call resumes. CASES, a Catch test spec,
#                                       picks the cases: CASES='~[configs]' leaves out the config
#                                       sweeps (about 380 of the round's 600 s), enough where no
#                                       template changed
#   tools/gpu-round.sh tune ARGS...     moejit tune ARGS (into $MOEJIT_DB)
#   tools/gpu-round.sh bench ARGS...    moejit_bench ARGS
#   tools/gpu-round.sh python           the Python tests (python/tests/run_tests.py) on this build
#   tools/gpu-round.sh torch ARGS...    bench/bench_torch.py $OUT/torch.json --markdown $OUT/torch.md ARGS,
#                                       with Liger-Kernel importable when the call carries build/wheels
#                                       (tools/liger-wheel.sh)
#   tools/gpu-round.sh sass GLOB        matrix instructions of cached kernels (tools/sass-check.py)
#   tools/gpu-round.sh retune [--timing sustained] SHAPE...
#                                       tune the shipped-table grid (moejit tune's default token counts x train, infer,
#                                       memeff) for each E,H,I,K into /tmp/h200.sqlite, after
#                                       importing build/release/retune-part.json if present, with
#                                       db/'s winners as incumbents (kept on ties), and export
#                                       $OUT/NVIDIA_H200.json after each (db/README.md)
#   tools/gpu-round.sh power BENCH_ARGS...
#                                       moejit_bench BENCH_ARGS with nvidia-smi sampling clocks and
#                                       power every 10 ms beside it; prints them per step and side
#                                       (tools/power-phases.py); $OUT/power-smi.csv, $OUT/power-bench.json
#   tools/gpu-round.sh ncu KERNEL BENCH_ARGS...
#                                       ncu on KERNEL's second launch in moejit_bench BENCH_ARGS:
#                                       $OUT/ncu-TAG.txt (throughputs, stalls) and the SASS
#                                       samples $OUT/ncu-TAG.csv.gz (tools/ncu-regions.py); the
#                                       bench of $BUILD (default build/release: a variant from
#                                       tools/variant-build.sh works too: one whose template
#                                       hash differs from db/'s runs heuristic configs, so pass
#                                       --override ROLE=CONFIG), TAG = $TAG or KERNEL; $SECTIONS
#                                       adds ncu sections (e.g. "MemoryWorkloadAnalysis_Tables")
# Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEJIT_CACHE_DIR=${MOEJIT_CACHE_DIR:-/tmp/moejit-kernels}
# Kernels compiled ahead here (tools/precompile.sh), when the call carries them.
# -u, not -n (which coreutils 9.4 warns about): a cache file's name hashes all its kernel is
# compiled from, so replacing one changes nothing.
[[ -d build/kcache ]] && mkdir -p "$MOEJIT_CACHE_DIR" && cp -ru build/kcache/. "$MOEJIT_CACHE_DIR"/
out=${OUT:-/tmp}
# The bench modes run this checkout's shipped tables (the db/ path the build was configured with
# need not exist on the GPU machine's copy) and never tune, unless told otherwise.
bench_env=(MOEJIT_SHIPPED_DB_DIR="${MOEJIT_SHIPPED_DB_DIR:-$PWD/db}" MOEJIT_AUTOTUNE="${MOEJIT_AUTOTUNE:-0}")
case "${1:-}" in
  tests)
    bin=${BUILD:-build/release}/tests/moejit_gpu_tests
    # A sanitizer build: the driver maps memory where AddressSanitizer's shadow gap would be.
    [[ $bin == *asan* ]] && export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0} \
      UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    limit=${2:-500}
    first=${3:-1}
    budget=${4:-450}
    fails=0
    index=0
    resume=
    while read -r name; do
      index=$((index + 1))
      ((index < first)) && continue
      [[ -z "$name" || "$name" == *"test cases"* ]] && continue
      if ((SECONDS >= budget)); then
        resume="resume with: ${BUILD:+BUILD=$BUILD }${CASES:+CASES='$CASES' }tools/gpu-round.sh tests $limit $index $budget"
        break
      fi
      start=$SECONDS
      n=${name//,/\\,}; n=${n//[/\\[}
      timeout "$limit" "$bin" "$n" > /tmp/one.log 2>&1
      rc=$?
      echo "rc=$rc $((SECONDS - start))s #$index $name"
      cat /tmp/one.log >> "$out/gpu-tests.log"
      if ((rc != 0)); then
        fails=$((fails + 1))
        # A barrier watchdog's trap (templates/common/pipeline_sm90.cuh) shows as a launch failure.
        grep -a -m3 "launch failure\|illegal instruction\|CUDA_ERROR\|Sanitizer\|runtime error" /tmp/one.log
        grep -a -B2 -A12 "FAILED" /tmp/one.log | cut -c1-160 | head -30
      fi
    done < <("$bin" --list-test-names-only ${CASES:+"$CASES"})
    echo "gpu test cases failed: $fails${resume:+ (stopped after ${SECONDS}s; $resume)}"
    ;;
  tune) shift; build/release/tools/moejit/moejit tune "$@" 2>&1 | tee -a "$out/tune.log" ;;
  bench) shift; env "${bench_env[@]}" build/release/bench/moejit_bench "$@" 2>&1 | tee -a "$out/bench.log" | tail -40 ;;
  # The tests' own settings (python/tests/conftest.py): no tuning, no shipped or user tables.
  python) env MOEJIT_LIBRARY=$PWD/build/release/src/libmoejit.so python3 python/tests/run_tests.py \
      > "$out/python-tests.log" 2>&1
    rc=$?
    grep -E "^FAILED|passed," "$out/python-tests.log"
    exit $rc ;;
  torch)
    shift
    if ls build/wheels/liger_kernel-*.whl > /dev/null 2>&1; then
      tools/liger-wheel.sh install /tmp/liger-kernel && export PYTHONPATH=/tmp/liger-kernel${PYTHONPATH:+:$PYTHONPATH}
    fi
    env "${bench_env[@]}" MOEJIT_LIBRARY=$PWD/build/release/src/libmoejit.so python3 bench/bench_torch.py \
      "$out/torch.json" --markdown "$out/torch.md" "$@" 2>&1 | grep -v Warning | tail -40 ;;
  sass) shift; PATH=/usr/local/cuda/bin:$PATH tools/sass-check.py "$MOEJIT_CACHE_DIR"/*/$1 | tee -a "$out/sass.log" ;;
  retune)
    shift
    timing=burst
    if [[ "${1:-}" == "--timing" ]]; then timing=$2; shift 2; fi
    cli=build/release/tools/moejit/moejit
    db=/tmp/h200.sqlite
    [[ -f build/release/retune-part.json ]] && "$cli" db import build/release/retune-part.json --db "$db"
    mkdir -p /tmp/no-shipped-tables  # tune against nothing shipped: every key is measured
    incumbents=()
    [[ -f db/NVIDIA_H200.json ]] && incumbents=(--incumbents db/NVIDIA_H200.json)
    start=$SECONDS
    for shape in "$@"; do
      MOEJIT_SHIPPED_DB_DIR=/tmp/no-shipped-tables "$cli" tune --shape "$shape" --modes train,infer,memeff \
        --budget 30 --timing "$timing" --db "$db" "${incumbents[@]}" >> "$out/tune.log" 2>&1
      # Exported after every model, so a call cut short by the time limit still returns its rows.
      "$cli" db export --db "$db" --out "$out/NVIDIA_H200.json" > /dev/null
      echo "$shape tuned at $((SECONDS - start)) s: $(tail -1 "$out/tune.log")"
    done
    ;;
  power)
    shift
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader \
      -lms 10 > "$out/power-smi.csv" &
    smi=$!
    env "${bench_env[@]}" build/release/bench/moejit_bench "$@" --json "$out/power-bench.json" 2>&1 | tail -20
    kill "$smi"
    wait "$smi" 2> /dev/null
    tools/power-phases.py "$out/power-bench.json" "$out/power-smi.csv"
    ;;
  ncu)
    kernel=$2
    shift 2
    tag=${TAG:-$kernel}
    ncu=/usr/local/cuda/bin/ncu
    extra=()
    for section in ${SECTIONS:-}; do extra+=(--section "$section"); done
    env "${bench_env[@]}" timeout 300 "$ncu" --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 --section SpeedOfLight \
      --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis "${extra[@]}" -f -o "/tmp/ncu-$tag" \
      "${BUILD:-build/release}/bench/moejit_bench" "$@" > "/tmp/ncu-$tag.log" 2>&1
    tail -2 "/tmp/ncu-$tag.log"
    "$ncu" -i "/tmp/ncu-$tag.ncu-rep" --page details > "$out/ncu-$tag.txt" 2>&1
    "$ncu" -i "/tmp/ncu-$tag.ncu-rep" --page source --csv --print-source sass | gzip > "$out/ncu-$tag.csv.gz"
    grep -E "_kernel<|Duration|SM Frequency" "$out/ncu-$tag.txt" | head -3
    ;;
  *) sed -n '2,/^# Logs go to/p' "$0"; exit 2 ;;
esac
