#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by code region, from ncu's SASS source page.

  ncu -i REPORT --page source --csv --print-source sass | gzip > SRC.csv.gz
  tools/ncu-regions.py SRC.csv.gz [INSTRUCTIONS_PER_REGION] [FIRST LAST]

Prints, per run of INSTRUCTIONS_PER_REGION instructions (default 256): its share of the warp
stall samples, its most-executed instruction's count and the notable opcodes in it (HGMMA,
MUFU, global and shared memory, barriers, TMA), which tell the main loop, the epilogue and the
producer apart. With FIRST LAST (instruction indices), also the executed opcode mix of that
range per element, e.g. an epilogue's instructions per output element.
"""
import collections
import csv
import gzip
import sys

NOTABLE = ["HGMMA", "MUFU", "STG", "LDG", "LDS", "STS", "SHFL", "BAR", "SYNCS", "UTMA", "RED", "ATOM", "CALL", "EXIT"]


def main():
    path = sys.argv[1]
    chunk = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    opener = gzip.open if path.endswith(".gz") else open
    rows = list(csv.reader(opener(path, "rt", errors="replace")))
    header_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    header = rows[header_at]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    number = lambda x: float(x.replace(",", "") or 0)
    opcode = lambda r: next((t for t in r[1].split() if not t.startswith("@")), "")
    total = sum(number(r[samples]) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples")
    for start in range(0, len(body), chunk):
        block = body[start:start + chunk]
        ops = collections.Counter(k for r in block for k in NOTABLE if opcode(r).startswith(k))
        share = sum(number(r[samples]) for r in block) / total * 100
        most = max(number(r[executed]) for r in block)
        print(f"{start:6d} {share:5.1f}% executed<= {most:10.0f}  " + " ".join(f"{k}{v}" for k, v in ops.items()))
    if len(sys.argv) > 4:
        first, last = int(sys.argv[3]), int(sys.argv[4])
        mix = collections.Counter(opcode(r).split(".")[0] for r in body[first:last] if number(r[executed]) > 0)
        print(f"executed opcodes in [{first}, {last}): {sum(mix.values())}")
        for op, n in mix.most_common(20):
            print(f"  {op:10s} {n:6d}")


if __name__ == "__main__":
    main()
