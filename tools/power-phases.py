#!/usr/bin/env python3
"""Clocks and power while each step ran: attributes nvidia-smi samples taken beside a moejit_bench
run to the step (ours or the dense ceiling) whose timed iterations were on the GPU then, by the
wall-clock spans the bench writes (spans_unix_s in its --json). Says whether our step holds the
card at lower clocks than dense cuBLAS under the same power cap (performance log, session 15).

  tools/power-phases.py BENCH_JSON SMI_CSV

SMI_CSV: nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active
         --format=csv,noheader -lms 10  (what tools/gpu-round.sh power records)
"""
import csv
import datetime
import json
import statistics
import sys

SW_POWER_CAP = 0x4  # nvidia-smi clocks_event_reasons: software power cap


def number(text):
    return float(text.strip().split()[0])


def read_samples(path):
    """(unix seconds, SM MHz, watts, event reasons) per sample; nvidia-smi prints local time."""
    out = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 4:
                continue
            try:
                t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                out.append((t, number(row[1]), number(row[2]), int(row[3].strip(), 16)))
            except ValueError:
                continue  # a header or a truncated last line
    return out


def phases(bench):
    """(tokens, mode, side, [[start, end], ...]) for every timed step of the run."""
    for result in bench["results"]:
        for step in result.get("steps", []):
            for side in ("ours", "dense"):
                spans = (step.get(side) or {}).get("spans_unix_s", [])
                if spans:
                    yield result["tokens"], step["mode"], side, spans


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    bench = json.load(open(sys.argv[1]))
    samples = read_samples(sys.argv[2])
    print(f"{'T':>6} {'mode':<10} {'side':<6} {'samples':>7} {'SM MHz':>7} {'(min-max)':>11} {'W':>6} {'power cap':>9}")
    for tokens, mode, side, spans in phases(bench):
        inside = [s for s in samples if any(a <= s[0] <= b for a, b in spans)]
        if not inside:
            print(f"{tokens:>6} {mode:<10} {side:<6} {0:>7}  (no sample inside its spans: sample faster)")
            continue
        mhz = [s[1] for s in inside]
        watts = [s[2] for s in inside]
        capped = sum(1 for s in inside if s[3] & SW_POWER_CAP) / len(inside)
        print(f"{tokens:>6} {mode:<10} {side:<6} {len(inside):>7} {statistics.median(mhz):>7.0f} "
              f"{min(mhz):>5.0f}-{max(mhz):<5.0f} {statistics.median(watts):>6.0f} {capped:>9.0%}")


if __name__ == "__main__":
    main()
