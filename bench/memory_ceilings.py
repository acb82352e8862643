#!/usr/bin/env python3
"""What this GPU's memory streams reach, as ceilings for the memory-bound steps (small T, where
every kernel streams an expert weight or writes a weight gradient once): a read-only stream
(sum), a write-only stream (fill) and a copy, each over buffers far larger than L2, timed with
CUDA events after warm-up, median of the repeats.

  python3 bench/memory_ceilings.py [--gib 2] [--reps 20] [--json OUT.json]
"""

import argparse
import json
import statistics

import torch


def time_ms(fn, reps):
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="bytes per buffer, GiB")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = int(args.gib * (1 << 30)) // 2
    # Random bf16, never zeros. The fill writes a constant: cudaMalloc'd memory (torch's allocator)
    # is not compressible, so that does not flatter it.
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    acc = torch.empty((), device="cuda", dtype=torch.float32)
    nbytes = n * 2
    streams = {
        "read (sum)": (lambda: torch.sum(src, dim=0, dtype=torch.float32, out=acc), nbytes),
        "write (fill)": (lambda: dst.fill_(1.5), nbytes),
        "copy (read + write)": (lambda: dst.copy_(src), 2 * nbytes),
    }
    out = {"device": torch.cuda.get_device_name(), "bytes_per_buffer": nbytes, "streams": {}}
    for name, (fn, moved) in streams.items():
        ms = time_ms(fn, args.reps)
        tbps = moved / ms / 1e9
        out["streams"][name] = {"median_ms": ms, "tb_per_s": tbps}
        print(f"{name:<22} {ms:8.3f} ms  {tbps:6.2f} TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
