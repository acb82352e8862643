#!/usr/bin/env python3
"""Writes build/release/retune-part.json for a partial retune: the shipped table without the rows
of the roles (and modes) whose kernels changed, every other row's template hash rewritten to the
build's, so `tools/gpu-round.sh retune` imports them first and measures only what was left out.

  tools/retune-part.py ROLE[:MODE],... [--below-block-m N] [--build build/release] [--table db/NVIDIA_H200.json]
  tools/retune-part.py bwd_down                     # bwd_down's rows retuned, all modes
  tools/retune-part.py fwd_up:infer                 # fwd_up's inference rows only
  tools/retune-part.py fwd_up,fwd_down --below-block-m 64   # only their keys of 16- and 32-row token tiles

Only for changes that leave every other role's kernels as they were (db/README.md): the rows
kept are claimed for the new hash without being measured again.
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys


def build_hash(build):
    # No check: `moejit info` exits 2 over an invalid MOEJIT_ setting after printing the hash.
    info = subprocess.run([str(build / "tools" / "moejit" / "moejit"), "info"], capture_output=True,
                          text=True).stdout
    m = re.search(r"templates.*hash ([0-9a-f]+)", info)
    if not m:
        sys.exit(f"{build}: moejit info printed no template hash")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drop", help="ROLE[:MODE],... whose rows are left out, to be tuned again")
    ap.add_argument("--below-block-m", type=int, default=None,
                    help="leave out only the rows whose key's token tile is lower than this (a config space change)")
    ap.add_argument("--build", type=pathlib.Path, default=pathlib.Path("build/release"))
    ap.add_argument("--table", type=pathlib.Path, default=pathlib.Path("db/NVIDIA_H200.json"))
    args = ap.parse_args()
    drop = [tuple(item.split(":", 1)) if ":" in item else (item, None) for item in args.drop.split(",")]
    new_hash = build_hash(args.build)
    table = json.loads(args.table.read_text())

    def dropped(row, role, mode):
        key = row["key"]
        return (key["role"] == role and mode in (None, key["mode"])
                and (args.below_block_m is None or key["block_m"] < args.below_block_m))

    for role, mode in drop:
        if not any(dropped(r, role, mode) for r in table["rows"]):
            sys.exit(f"{args.table}: no rows of {role}{':' + mode if mode else ''} to leave out")
    kept = [r for r in table["rows"] if not any(dropped(r, role, mode) for role, mode in drop)]
    for row in kept:
        row["provenance"]["template_hash"] = new_hash
    left_out = len(table["rows"]) - len(kept)
    table["rows"] = kept
    out = args.build / "retune-part.json"
    out.write_text(json.dumps(table, indent=1))
    print(f"{out}: {len(kept)} rows at hash {new_hash}; {left_out} left out to be tuned again")


if __name__ == "__main__":
    main()
