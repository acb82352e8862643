#!/usr/bin/env python3
"""Where one moejit step's device time goes, kernel by kernel, in place (not role by role in the
tuner): torch.profiler's CUDA activity trace over a few steps after warm-up.

  python3 bench/profile_step.py [--tokens 32768] [--shape 128,2048,768,8]
                                [--mode full|forward|inference] [--routing uniform|balanced|zipf:S|zipf-shuffled:S]
                                [--steps 5] [--json OUT.json]

Prints, per kernel (moejit's by role, the rest by name), launches per step, mean µs per launch,
its share of the step, then the step's span on the device (first kernel's start to last kernel's
end) against the sum of kernel times: the difference is the idle time between kernels (launch
gaps and waits), which no role's tuning sees, and where that idle time sits: the pairs of
kernels with the most idle time between them. Inputs rotate past L2 as in bench_torch.py.
"""

import argparse
import collections
import json
import pathlib
import re
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from bench_torch import make_sets  # noqa: E402
import moejit.torch as mt  # noqa: E402

ROLE = re.compile(r"moejit::(\w+?)_kernel<")


def kernel_label(name):
    m = ROLE.search(name)
    return m.group(1) if m else name[:60]


def routing_name(text):
    kind, _, exponent = text.partition(":")
    if text in ("uniform", "balanced"):
        return text
    try:
        if kind in ("zipf", "zipf-shuffled") and float(exponent) > 0:
            return text
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected uniform, balanced, zipf:S or zipf-shuffled:S, got {text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--shape", default="128,2048,768,8", help="E,H,I,K")
    # inference: no input needs grad, so the op runs the inference plan (nothing saved).
    ap.add_argument("--mode", choices=("full", "forward", "inference"), default="full")
    # balanced: every expert gets T*K/E pairs; against uniform it shows which kernels pay for the
    # spread of pairs per expert (tiles that spill a few rows). zipf:S and zipf-shuffled:S: skewed
    # routing as moejit_bench draws it.
    ap.add_argument("--routing", type=routing_name, default="uniform")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    e, h, i, k = (int(v) for v in a.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    w1 = ((torch.rand(e, 2 * i, h, device="cuda", generator=gen) * 2 - 1) * h ** -0.5).to(torch.bfloat16)
    w2 = ((torch.rand(e, h, i, device="cuda", generator=gen) * 2 - 1) * i ** -0.5).to(torch.bfloat16)
    w1.requires_grad_()
    w2.requires_grad_()
    per_set = a.tokens * h * 2 * 2
    sets = make_sets(a.tokens, e, h, k, torch.bfloat16, max(2, (120 << 20) // per_set + 1), gen, a.routing)

    def step(s):
        if a.mode == "inference":
            mt.fused_moe(s[0].detach(), w1.detach(), w2.detach(), s[1], s[2].detach())
            return
        out = mt.fused_moe(s[0], w1, w2, s[1], s[2])
        if a.mode == "full":
            torch.autograd.grad(out, (s[0], w1, w2, s[2]), s[3])

    for j in range(3):
        step(sets[j % len(sets)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for j in range(a.steps):
            step(sets[j % len(sets)])
        torch.cuda.synchronize()

    kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
    by_label = collections.defaultdict(list)
    for ev in kernels:
        by_label[kernel_label(ev.name)].append(ev.time_range.end - ev.time_range.start)
    busy = sum(ev.time_range.end - ev.time_range.start for ev in kernels) / a.steps
    span = (kernels[-1].time_range.end - kernels[0].time_range.start) / a.steps
    rows = []
    for label, ds in sorted(by_label.items(), key=lambda kv: -sum(kv[1])):
        rows.append({"kernel": label, "per_step": len(ds) / a.steps, "mean_us": statistics.mean(ds),
                     "share": sum(ds) / a.steps / span})
    print(f"T={a.tokens} shape={a.shape} mode={a.mode} routing={a.routing} steps={a.steps}")
    print(f"{'kernel':<40} {'/step':>6} {'mean us':>9} {'share':>7}")
    for r in rows:
        print(f"{r['kernel']:<40} {r['per_step']:>6.1f} {r['mean_us']:>9.1f} {r['share']:>7.1%}")
    print(f"device span per step {span:.1f} us, kernels busy {busy:.1f} us, idle {span - busy:.1f} us")
    gaps = idle_gaps(kernels, a.steps)
    print(f"{'idle before':<40} {'after':<24} {'/step':>6} {'mean us':>9}")
    for g in gaps[:8]:
        print(f"{g['before']:<40} {g['after']:<24} {g['per_step']:>6.1f} {g['mean_us']:>9.1f}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"tokens": a.tokens, "shape": a.shape, "mode": a.mode,
                                                    "routing": a.routing, "span_us": span, "busy_us": busy,
                                                    "kernels": rows, "gaps": gaps}, indent=1))


def idle_gaps(kernels, steps):
    """The device's idle time between consecutive kernels, by the pair of kernels around it, most
    idle per step first: says whether the span's idle is launch latency spread over every
    boundary or one wait (a host round trip, a step boundary)."""
    by_pair = collections.defaultdict(list)
    for prev, ev in zip(kernels, kernels[1:]):
        by_pair[(kernel_label(ev.name), kernel_label(prev.name))].append(
            max(0.0, ev.time_range.start - prev.time_range.end))
    rows = [{"before": b, "after": f, "per_step": len(ds) / steps, "mean_us": statistics.mean(ds),
             "us_per_step": sum(ds) / steps} for (b, f), ds in by_pair.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


if __name__ == "__main__":
    main()
