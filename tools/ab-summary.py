#!/usr/bin/env python3
"""Summarizes a whole-step A/B (tools/ab-steps.sh): for each case (tokens, mode), each side's
per-run medians, the median of them, its change against the first side, whether the two sides'
runs overlap at all, and the dense cuBLAS ceiling's range over all runs. Then the same change
measured against dense cuBLAS: each bench round times the step and dense back to back, so one
round's ratio of their medians cancels the clock state the H200 was in (its SM clock sits in one
of two states for seconds at a time, ~10 % apart, and a median over rounds of both states lands
between them by chance: performance log, session 26). Runs here or on the GPU machine
(ab-steps.sh prints it after the last run).

  tools/ab-summary.py DIR TAG...      DIR holds ab-steps-TAG-ROUND.json, as $OUT after a call
  tools/ab-summary.py /work/.device/3 mainv release
"""
import glob
import json
import re
import statistics
import sys


def bench_rounds(samples, rounds):
    """Splits a step's samples into its bench rounds (moejit_bench: the first iters % rounds
    rounds take one more)."""
    base, extra = divmod(len(samples), rounds)
    out, at = [], 0
    for r in range(rounds):
        n = base + (1 if r < extra else 0)
        out.append(samples[at:at + n])
        at += n
    return out


def load(folder, tag):
    """{(tokens, mode): [(ours_ms, dense_ms, [ours / dense per bench round]), ...]} over the runs
    of one side."""
    cases = {}
    # The run number must follow the tag directly: tag "release" is not "release-oldtable".
    own = re.compile(rf"ab-steps-{re.escape(tag)}-[0-9]+\.json$")
    for path in sorted(p for p in glob.glob(f"{folder}/ab-steps-{glob.escape(tag)}-*.json") if own.search(p)):
        with open(path) as f:
            run = json.load(f)
        for result in run["results"]:
            for step in result["steps"]:
                ours, dense = step.get("ours"), step.get("dense")
                if not ours:
                    continue
                ratios = []
                if dense and ours.get("samples_ms") and dense.get("samples_ms"):
                    pairs = zip(bench_rounds(ours["samples_ms"], run["rounds"]),
                                bench_rounds(dense["samples_ms"], run["rounds"]))
                    ratios = [statistics.median(o) / statistics.median(d) for o, d in pairs if o and d]
                cases.setdefault((result["tokens"], step["mode"]), []).append(
                    (ours["median_ms"], dense["median_ms"] if dense else None, ratios))
    return cases


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    folder, tags = sys.argv[1], sys.argv[2:]
    sides = {tag: load(folder, tag) for tag in tags}
    base = sides[tags[0]]
    for case in sorted(base):
        dense = [d for tag in tags for _, d, _ in sides[tag].get(case, []) if d is not None]
        print(f"{case[0]:>6} {case[1]:<9} dense {min(dense):.3f}-{max(dense):.3f} ms" if dense else f"{case[0]:>6} {case[1]}")
        ref = [o for o, _, _ in base[case]]
        ref_ratios = [x for _, _, r in base[case] for x in r]
        for tag in tags:
            runs = [o for o, _, _ in sides[tag].get(case, [])]
            if not runs:
                print(f"    {tag:<24} no runs")
                continue
            med = statistics.median(runs)
            line = f"    {tag:<24} {med:8.4f}  runs {' '.join(f'{o:.4f}' for o in runs)}"
            if tag != tags[0]:
                apart = max(runs) < min(ref) or min(runs) > max(ref)
                line += f"  {100 * (med / statistics.median(ref) - 1):+.1f} %{'' if apart else ', runs overlap'}"
            print(line)
        # Against dense, round by round: the side's median of ours / dense, the change against the
        # first side's, and whether the two sides' rounds overlap.
        for tag in tags:
            ratios = [x for _, _, r in sides[tag].get(case, []) for x in r]
            if not ratios or not ref_ratios:
                continue
            med = statistics.median(ratios)
            line = f"    {tag:<24} x dense {med:.4f}  rounds {' '.join(f'{x:.3f}' for x in ratios)}"
            if tag != tags[0]:
                apart = max(ratios) < min(ref_ratios) or min(ratios) > max(ref_ratios)
                line += f"  {100 * (med / statistics.median(ref_ratios) - 1):+.1f} %{'' if apart else ', rounds overlap'}"
            print(line)


if __name__ == "__main__":
    main()
