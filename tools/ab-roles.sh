#!/usr/bin/env bash
# A/B of builds that differ in templates, role by role, on the GPU machine: each build's
# `moejit tune` times every config of the roles at one shape and token count (nothing shipped,
# L2 flushed), builds alternating per role so clock drift hits both alike; then a table of each
# role's best config per build (the tuner's winner), the configs both timed, and with several
# roles the sum of their bests per build.
#   tools/ab-roles.sh SHAPE TOKENS ROLES BUILD...
#   tools/ab-roles.sh 128,2048,768,8 32768 fwd_up,fwd_down build/base build/release
# A BUILD is a build directory holding tools/moejit/moejit (with src/ beside it for its
# runpath): carry only those two folders of a variant build to stay under the carry limit.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
shape=$1 tokens=$2 roles=$3
shift 3
out=${OUT:-/tmp}
mkdir -p "$out"
json=/tmp/ab-json  # the tuner's exports stay on the machine (a call returns few files); the table goes to $OUT
mkdir -p /tmp/ab-no-shipped "$json"
for role in ${roles//,/ }; do
  for build in "$@"; do
    tag=$(basename "$build")
    db=/tmp/ab-$tag-$role.sqlite
    rm -f "$db"
    MOEJIT_CACHE_DIR=/tmp/ab-cache-$tag MOEJIT_SHIPPED_DB_DIR=/tmp/ab-no-shipped "$build/tools/moejit/moejit" tune \
      --shape "$shape" --tokens "$tokens" --modes train --roles "$role" --db "$db" >> "$out/ab-tune.log" 2>&1
    "$build/tools/moejit/moejit" db export --db "$db" --out "$json/$tag-$role.json" > /dev/null
  done
done
python3 - "$json" "$roles" "$@" <<'EOF' | tee -a "$out/ab-roles.txt"
import json, sys
out, roles, builds = sys.argv[1], sys.argv[2].split(","), [b.rstrip("/").rsplit("/", 1)[-1] for b in sys.argv[3:]]
def name(c):
    s = f"bm{c['block_m']}_bn{c['block_n']}_bk{c['block_k']}_s{c['stages']}_w{c['warps']}"
    return (s + ("_c2" if c.get("cluster", 1) == 2 else "") + ("_tma" if c["use_tma"] else "")
            + ("_ws" if c["warp_specialized"] else "") + ("_persistent" if c.get("persistent") else ""))
total = {b: 0.0 for b in builds}
for role in roles:
    times, best = {}, {}
    for b in builds:
        rows = json.load(open(f"{out}/{b}-{role}.json"))["rows"]
        times[b] = {name(c["config"]): c["median_ms"] for r in rows for c in r["candidates"] if c["median_ms"] is not None}
        # The tuner's winner, timed in turns with the other finalists (tuner/winner.hpp).
        best[b] = (name(rows[0]["winner"]), rows[0]["median_ms"])
        total[b] += best[b][1]
    print(f"{role}: " + "  ".join(f"{b} best {best[b][1]:.3f} ms ({best[b][0]})" for b in builds))
    common = sorted(set.intersection(*(set(t) for t in times.values())), key=lambda c: times[builds[0]][c])
    common = common[:8] + [c for c in common[8:] if "_c2" in c]
    for c in common:
        print(f"  {c:<40}" + "".join(f" {times[b][c]:8.3f}" for b in builds))
if len(roles) > 1:
    print("sum of the roles' best: " + "  ".join(f"{b} {total[b]:.3f} ms" for b in builds))
EOF
