#!/usr/bin/env python3
"""Summarizes a whole-step A/B (tools/ab-steps.sh): for each case (tokens, mode), each side's
per-run medians, the median of them, its change against the first side, whether the two sides'
runs overlap at all, and the dense cuBLAS ceiling's range over all runs. Then the same change
measured against dense cuBLAS: each bench round times the step and dense back to back, so one
round's ratio of their medians cancels the clock state the H200 was in (its SM clock sits in one
of two states for seconds at a time, ~10 % apart, and a median over rounds of both states lands
between them by chance: performance log, session 26). A step whose outputs failed moejit_bench's
check (a wrong kernel's time is no speedup) is named under its case and counted at the end. Runs
here or on the GPU machine (ab-steps.sh prints it after the last run).

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
    """{(tokens, mode): [(ours_ms, dense_ms, [ours / dense per bench round], check), ...]} over the
    runs of one side; check: None where the run did not check (--no-check, a bench before session
    50), else (ok, "RUN.json: why it failed")."""
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
                check = step.get("check")
                if check is not None:
                    check = (check["ok"], f"{path.rsplit('/', 1)[-1]}: {check.get('failure', '')}")
                cases.setdefault((result["tokens"], step["mode"]), []).append(
                    (ours["median_ms"], dense["median_ms"] if dense else None, ratios, check))
    return cases


def report_checks(tags, sides, case):
    """Prints, under a case, each side's runs whose check failed, the first one's reason; returns
    (runs checked, runs failed) of the case over all sides."""
    checked = failed = 0
    for tag in tags:
        checks = [c for *_, c in sides[tag].get(case, []) if c is not None]
        bad = [why for ok, why in checks if not ok]
        checked, failed = checked + len(checks), failed + len(bad)
        if bad:
            print(f"    {tag:<24} check FAILED in {len(bad)} of {len(checks)} runs: {bad[0]}")
    return checked, failed


def compare(tags, values, head, what, digits):
    """Prints each side's median of values[tag] after `head`, its values (`what`: runs or rounds),
    and for the other sides the change against the first side's median, noting whether the two
    sides' values overlap at all."""
    ref = values[tags[0]]
    for tag in tags:
        vals = values[tag]
        if not vals:
            print(f"    {tag:<24} no {what}")
            continue
        med = statistics.median(vals)
        line = f"    {tag:<24} {head}{med:.4f}  {what} {' '.join(f'{v:.{digits}f}' for v in vals)}"
        if tag != tags[0] and ref:
            apart = max(vals) < min(ref) or min(vals) > max(ref)
            line += f"  {100 * (med / statistics.median(ref) - 1):+.1f} %{'' if apart else f', {what} overlap'}"
        print(line)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    folder, tags = sys.argv[1], sys.argv[2:]
    sides = {tag: load(folder, tag) for tag in tags}
    checked = failed = 0
    for case in sorted(sides[tags[0]]):
        dense = [d for tag in tags for _, d, _, _ in sides[tag].get(case, []) if d is not None]
        print(f"{case[0]:>6} {case[1]:<9} dense {min(dense):.3f}-{max(dense):.3f} ms" if dense else f"{case[0]:>6} {case[1]}")
        compare(tags, {tag: [o for o, _, _, _ in sides[tag].get(case, [])] for tag in tags}, "", "runs", 4)
        # Against dense, round by round: each round's step time over the same round's dense time.
        ratios = {tag: [x for _, _, r, _ in sides[tag].get(case, []) for x in r] for tag in tags}
        if ratios[tags[0]]:
            compare(tags, ratios, "x dense ", "rounds", 3)
        case_checked, case_failed = report_checks(tags, sides, case)
        checked, failed = checked + case_checked, failed + case_failed
    if failed:
        print(f"check FAILED in {failed} of {checked} checked steps (above): those times are of wrong outputs")
    elif checked:
        print(f"check: ok in all {checked} checked steps")
    else:
        print("check: none in these JSONs (--no-check, or benches from before session 50)")


if __name__ == "__main__":
    main()
