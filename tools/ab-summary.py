#!/usr/bin/env python3
"""Summarizes a whole-step A/B (tools/ab-steps.sh): for each case (tokens, mode), each side's
per-round medians, the median of them, its change against the first side, whether the two sides'
rounds overlap at all, and the dense cuBLAS ceiling's range over all runs. Runs here or on the GPU
machine (ab-steps.sh prints it after the last round).

  tools/ab-summary.py DIR TAG...      DIR holds ab-steps-TAG-ROUND.json, as $OUT after a call
  tools/ab-summary.py /work/.device/3 mainv release
"""
import glob
import json
import re
import statistics
import sys


def load(folder, tag):
    """{(tokens, mode): [(ours_ms, dense_ms), ...]} over the rounds of one side."""
    cases = {}
    # The round number must follow the tag directly: tag "release" is not "release-oldtable".
    own = re.compile(rf"ab-steps-{re.escape(tag)}-[0-9]+\.json$")
    for path in sorted(p for p in glob.glob(f"{folder}/ab-steps-{glob.escape(tag)}-*.json") if own.search(p)):
        with open(path) as f:
            for result in json.load(f)["results"]:
                for step in result["steps"]:
                    ours, dense = step.get("ours"), step.get("dense")
                    if ours:
                        cases.setdefault((result["tokens"], step["mode"]), []).append(
                            (ours["median_ms"], dense["median_ms"] if dense else None))
    return cases


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    folder, tags = sys.argv[1], sys.argv[2:]
    sides = {tag: load(folder, tag) for tag in tags}
    base = sides[tags[0]]
    for case in sorted(base):
        dense = [d for tag in tags for _, d in sides[tag].get(case, []) if d is not None]
        print(f"{case[0]:>6} {case[1]:<9} dense {min(dense):.3f}-{max(dense):.3f} ms" if dense else f"{case[0]:>6} {case[1]}")
        ref = [o for o, _ in base[case]]
        for tag in tags:
            runs = [o for o, _ in sides[tag].get(case, [])]
            if not runs:
                print(f"    {tag:<24} no runs")
                continue
            med = statistics.median(runs)
            line = f"    {tag:<24} {med:8.4f}  rounds {' '.join(f'{o:.4f}' for o in runs)}"
            if tag != tags[0]:
                apart = max(runs) < min(ref) or min(runs) > max(ref)
                line += f"  {100 * (med / statistics.median(ref) - 1):+.1f} %{'' if apart else ', rounds overlap'}"
            print(line)


if __name__ == "__main__":
    main()
