#!/usr/bin/env python3
"""The tuner's own A/B of persistent grids: from an exported table (moejit db export), for every
tuned key, each persistent config against its one-tile-per-block twin, both timed in the same
tuning run. Prints one line per key: the best of each kind among the eligible tiles, the median
twin ratio, and whether the winner is persistent.
    tools/persistent-ab.py db/NVIDIA_H200.json [--role fwd_down]
"""
import argparse
import json
import statistics


def config_id(config):
    return json.dumps({k: v for k, v in config.items() if k != "persistent"}, sort_keys=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("table")
    ap.add_argument("--role")
    args = ap.parse_args()
    rows = json.load(open(args.table))["rows"]
    print(f"{'role':<9} {'E,H,I,K':<16} {'tpe':>6} {'mode':<7} {'one-tile ms':>11} {'persistent ms':>13} "
          f"{'twins':>5} {'median p/1':>10}  winner")
    for row in sorted(rows, key=lambda r: (r["key"]["role"], r["key"]["hidden"], r["key"]["tpe_bucket"], r["key"]["mode"])):
        key = row["key"]
        if args.role and key["role"] != args.role:
            continue
        timed = [c for c in row["candidates"] if not c["rejected"] and c["median_ms"] == c["median_ms"]]
        one = {config_id(c["config"]): c["median_ms"] for c in timed if not c["config"].get("persistent")}
        persistent = {config_id(c["config"]): c["median_ms"] for c in timed if c["config"].get("persistent")}
        twins = [persistent[k] / one[k] for k in persistent if k in one]
        if not twins:
            continue
        eligible_one = min(one[k] for k in persistent if k in one)
        shape = f"{key['experts']},{key['hidden']},{key['intermediate']},{key['topk']}"
        winner = "persistent" if row["winner"].get("persistent") else "one tile"
        print(f"{key['role']:<9} {shape:<16} {key['tpe_bucket']:>6} {key['mode']:<7} {eligible_one:>11.4f} "
              f"{min(persistent.values()):>13.4f} {len(twins):>5} {statistics.median(twins):>10.3f}  {winner}")


if __name__ == "__main__":
    main()
