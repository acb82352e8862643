#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by code region, from ncu's SASS source page.

  ncu -i REPORT --page source --csv --print-source sass | gzip > SRC.csv.gz
  tools/ncu-regions.py SRC.csv.gz [INSTRUCTIONS_PER_REGION] [FIRST LAST] [--top N]

Prints, per run of INSTRUCTIONS_PER_REGION instructions (default 256): its share of the warp
stall samples, its two main stall reasons, its most-executed instruction's count and the notable
opcodes in it (HGMMA, MUFU, global and shared memory, barriers, TMA), which tell the main loop,
the epilogue and the producer apart. A barrier wait shows as a branch back to a TRYWAIT with
long_sb samples; the executed count tells whose it is (once per k tile, per tile, per row).
With FIRST LAST (instruction indices), also that range's stall reasons and its executed opcode
mix, e.g. an epilogue's instructions per output element. --top N lists the N instructions with
the most samples and their main stall reasons.
"""
import argparse
import collections
import csv
import gzip

NOTABLE = ["HGMMA", "MUFU", "STG", "LDG", "LDS", "STS", "SHFL", "BAR", "SYNCS", "UTMA", "RED", "ATOM", "CALL", "EXIT"]


def number(x):
    return float(x.replace(",", "") or 0)


def opcode(row):
    return next((t for t in row[1].split() if not t.startswith("@")), "")


class Source:
    def __init__(self, path):
        opener = gzip.open if path.endswith(".gz") else open
        rows = list(csv.reader(opener(path, "rt", errors="replace")))
        header_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
        header = rows[header_at]
        self.body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
        self.samples = header.index("Warp Stall Sampling (All Samples)")
        self.executed = header.index("Instructions Executed")
        # Per-reason sample columns ("stall_long_sb", ...), not their "(Not Issued)" twins.
        self.reasons = [(i, c[len("stall_"):]) for i, c in enumerate(header)
                        if c.startswith("stall_") and "Not Issued" not in c]
        self.total = sum(number(r[self.samples]) for r in self.body) or 1.0

    def share(self, rows):
        return sum(number(r[self.samples]) for r in rows) / self.total * 100

    def main_reasons(self, rows, count):
        mix = collections.Counter()
        for r in rows:
            for i, name in self.reasons:
                mix[name] += number(r[i])
        whole = sum(mix.values()) or 1.0
        return " ".join(f"{name}:{v / whole * 100:.0f}%" for name, v in mix.most_common(count))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("chunk", nargs="?", type=int, default=256)
    ap.add_argument("range", nargs="*", type=int, help="FIRST LAST")
    ap.add_argument("--top", type=int, default=0)
    args = ap.parse_args()
    src = Source(args.source)
    body = src.body
    print(f"{len(body)} instructions, {src.total:.0f} samples")
    for start in range(0, len(body), args.chunk):
        block = body[start:start + args.chunk]
        ops = collections.Counter(k for r in block for k in NOTABLE if opcode(r).startswith(k))
        most = max(number(r[src.executed]) for r in block)
        print(f"{start:6d} {src.share(block):5.1f}% executed<= {most:10.0f}  {src.main_reasons(block, 2):28s} "
              + " ".join(f"{k}{v}" for k, v in ops.items()))
    if len(args.range) == 2:
        first, last = args.range
        block = body[first:last]
        print(f"[{first}, {last}): {src.share(block):.1f}% of the samples; {src.main_reasons(block, 6)}")
        mix = collections.Counter(opcode(r).split(".")[0] for r in block if number(r[src.executed]) > 0)
        print(f"executed opcodes in [{first}, {last}): {sum(mix.values())}")
        for op, n in mix.most_common(20):
            print(f"  {op:10s} {n:6d}")
    if args.top:
        print(f"the {args.top} instructions with the most samples:")
        ranked = sorted(range(len(body)), key=lambda i: -number(body[i][src.samples]))[:args.top]
        for i in sorted(ranked):
            r = body[i]
            print(f"{i:6d} {src.share([r]):5.1f}% executed {number(r[src.executed]):10.0f}  {r[1][:60]:60s} "
                  + src.main_reasons([r], 3))


if __name__ == "__main__":
    main()
