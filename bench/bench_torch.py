#!/usr/bin/env python3
"""moejit from PyTorch next to other MoE expert blocks, in one process on one GPU.

  python3 bench/bench_torch.py OUT.json [--markdown OUT.md] [--tokens 1024,8192,32768]
                               [--shape 128,2048,768,8] [--dtype bf16] [--impls ...] [--modes ...]
                               [--rounds 3]

Implementations (same math and layouts, DESIGN.md):
  moejit         moejit.torch.fused_moe (training mode when timing forward: it saves for backward)
  moejit_memeff  the same with memory_efficient=True
  liger          Liger-Kernel's Triton fused MoE (LigerFusedMoEFunction), where liger_kernel
                 imports (tools/liger-wheel.sh fetches it for the GPU machine); its Triton
                 autotuning runs in its first step at each T (liger_forget_tuning)
  grouped_mm     sort pairs by expert, torch._grouped_mm for W1 and W2, SwiGLU, weighted index_add
  loop           a per-expert loop of matmuls (one host sync for the counts), weighted index_add
Modes: forward, backward (an untimed forward before each), full (forward + backward), inference
(forward under torch.no_grad). The gradients are dx, dW1, dW2 and d topk_weights, taken with
torch.autograd.grad.

Per T, each implementation's first full step is timed alone (first_call_s: plans, compiles,
autotuning). Then --rounds rounds each time every (impl, mode) in turn, the order rotated by one
per round so none always follows a hotter one; each timing is CUDA events around every
iteration after warm-up, on input sets rotated so their total outgrows the L2 cache, with random
non-zero data and uniform random routing. Reported: the median ms over all rounds' samples,
TFLOP/s (FLOP model: forward and inference 6·T·K·H·I, backward 12·, full 18·), the peak of
torch.cuda.max_memory_allocated over the memory allocated before the iteration (the weights,
inputs and rotation sets are resident and not counted), and x_first: the median over rounds of
this row's ms over the first implementation's in the same round and mode (how many times the
first is faster). Host time between launches counts: each iteration is synchronised before the
next, so an implementation that syncs inside (Liger's routing metadata, the loop baseline's
counts) or whose Python outruns its kernels is timed with its host time; --kernel-time adds
kernel_ms, the profiled sum of its GPU kernels' durations alone.
"""

import argparse
import json
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import moejit  # noqa: E402
import moejit.torch as mt  # noqa: E402

L2_BYTES = 60 << 20  # the H200's; rotation sets total at least twice this
MAX_SETS = 128  # at T=128 a set is about 1 MiB
FLOPS_PER_PAIR = {"forward": 6, "inference": 6, "backward": 12, "full": 18}  # times H·I


def grouped_mm_moe(x, w1, w2, topk_ids, topk_weights):
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    offsets = torch.bincount(flat, minlength=w1.shape[0]).cumsum(0).to(torch.int32)
    token = order // k
    h = torch._grouped_mm(x[token], w1.transpose(1, 2), offs=offsets)  # [TK, 2I]
    i = w1.shape[1] // 2
    a = F.silu(h[:, :i]) * h[:, i:]
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offsets)  # [TK, H]
    y = y * topk_weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add(0, token, y)


def loop_moe(x, w1, w2, topk_ids, topk_weights):
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w1.shape[0]).tolist()
    token = order // k
    xs = x[token]
    i = w1.shape[1] // 2
    ys, start = [], 0
    for e, n in enumerate(counts):
        if n:
            h = xs[start:start + n] @ w1[e].T
            ys.append((F.silu(h[:, :i]) * h[:, i:]) @ w2[e].T)
            start += n
    y = torch.cat(ys) * topk_weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add(0, token, y)


def liger_moe(x, w1, w2, topk_ids, topk_weights):
    # Imported at the first call, so the other implementations run where Liger is not installed.
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    return LigerFusedMoEFunction.apply(x, w1, w2, topk_ids.to(torch.int32), topk_weights)


def liger_forget_tuning():
    """Liger's Triton autotuners key on H and I, not T: in one process every T after the first
    would run the configs tuned for the first. Clearing their caches before each T's first step
    tunes each T for itself (its compiled kernels stay), as a user who tuned at their own T
    would run it."""
    import triton
    from liger_kernel.ops import fused_moe_kernels
    for value in vars(fused_moe_kernels).values():
        if isinstance(value, triton.runtime.Autotuner):
            value.cache.clear()


# Runs before an implementation's first step at each T.
BEFORE_FIRST_STEP = {"liger": liger_forget_tuning}

IMPLS = {
    "moejit": mt.fused_moe,
    "moejit_memeff": lambda *a: mt.fused_moe(*a, memory_efficient=True),
    "liger": liger_moe,
    "grouped_mm": grouped_mm_moe,
    "loop": loop_moe,
}


def balanced_ids(t, e, k, generator):
    """[t, k] expert ids dealt round-robin over a shuffled token order: every expert gets t*k/e
    pairs to within one, as moejit_bench --routing balanced (bench/inputs.cpp)."""
    deal = (torch.arange(t * k, device="cuda") % e).view(t, k)
    ids = torch.empty_like(deal)
    ids[torch.randperm(t, device="cuda", generator=generator)] = deal
    return ids


def zipf_log_weights(routing, e, generator):
    """Per-expert log weights of "zipf:S" (expert 0 the most popular) or "zipf-shuffled:S" (the
    popularity ranks on the experts in a random order), as moejit_bench draws them."""
    kind, exponent = routing.split(":")
    rank = torch.arange(e, device="cuda", dtype=torch.float32)
    if kind == "zipf-shuffled":
        rank = rank[torch.randperm(e, device="cuda", generator=generator)]
    return -float(exponent) * torch.log(rank + 1)


def make_sets(t, e, h, k, dtype, count, generator, routing="uniform"):
    """`count` input sets; routing "uniform" (top-k of uniform scores), "balanced", or Zipf
    ("zipf:S", "zipf-shuffled:S": K experts without replacement, Gumbel top-k)."""
    log_w = zipf_log_weights(routing, e, generator) if routing.startswith("zipf") else None
    sets = []
    for _ in range(count):
        x = (torch.rand(t, h, device="cuda", generator=generator, dtype=torch.float32) * 2 - 1).add_(1e-3).to(dtype)
        scores = torch.rand(t, e, device="cuda", generator=generator)
        if routing == "balanced":
            ids = balanced_ids(t, e, k, generator)
            weights = scores.gather(1, ids)
        elif log_w is not None:
            uniform = torch.rand(t, e, device="cuda", generator=generator).clamp_(min=1e-12)
            ids = (log_w - torch.log(-torch.log(uniform))).topk(k, dim=-1).indices
            weights = scores.gather(1, ids)
        else:
            weights, ids = scores.topk(k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(dtype)
        d_out = (torch.rand(t, h, device="cuda", generator=generator) * 2 - 1).add_(1e-3).to(dtype)
        sets.append((x.requires_grad_(), ids, weights.requires_grad_(), d_out))
    return sets


def time_mode(fn, mode, w1, w2, sets, min_iters, min_seconds, with_peak):
    """The ms of each timed iteration of one (impl, mode), and its peak extra MiB (None unless
    with_peak)."""

    def forward(s):
        return fn(s[0], w1, w2, s[1], s[2])

    def backward(s, out):
        torch.autograd.grad(out, (s[0], w1, w2, s[2]), s[3])

    def iteration(i, start, end):
        s = sets[i % len(sets)]
        if mode == "backward":
            out = forward(s)
            start.record()
            backward(s, out)
        elif mode == "inference":
            with torch.no_grad():
                start.record()
                forward(s)
        else:
            start.record()
            out = forward(s)
            if mode == "full":
                backward(s, out)
        end.record()

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]
    for i in range(3):  # warm-up: plans, cuBLAS heuristics, the caching allocator's pools
        iteration(i, *events[0])
    torch.cuda.synchronize()
    peak_mib = None
    if with_peak:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        iteration(0, *events[0])
        torch.cuda.synchronize()
        peak_mib = (torch.cuda.max_memory_allocated() - base) / 2 ** 20

    samples, began = [], time.perf_counter()
    while len(samples) < min_iters or time.perf_counter() - began < min_seconds:
        start, end = events[len(samples) % 2]
        iteration(len(samples), start, end)
        end.synchronize()
        samples.append(start.elapsed_time(end))
        if len(samples) >= 1000:
            break
    return samples, peak_mib


def kernel_ms(fn, mode, w1, w2, sets, steps=5):
    """The GPU kernels' time per iteration of one (impl, mode), from torch.profiler: the sum of
    every kernel's duration (copies and memsets included), without the gaps between them. Event
    timing around each iteration counts the host time a launch waits on (a host sync inside an
    implementation, Python between launches); this does not, so the two together say how much of
    a step is the GPU's."""
    from torch.profiler import ProfilerActivity, profile

    def step(s):
        if mode == "inference":
            with torch.no_grad():
                fn(s[0], w1, w2, s[1], s[2])
            return
        out = fn(s[0], w1, w2, s[1], s[2])
        if mode in ("full", "backward"):
            torch.autograd.grad(out, (s[0], w1, w2, s[2]), s[3])

    step(sets[0])  # untimed: the profiler's own start-up is not the step's
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(sets[i % len(sets)])
        torch.cuda.synchronize()
    total_us = sum(e.time_range.end - e.time_range.start for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / steps / 1e3


def first_step_seconds(fn, w1, w2, s):
    """Wall time of the first full step: whatever the implementation compiles, tunes or plans."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    out = fn(s[0], w1, w2, s[1], s[2])
    torch.autograd.grad(out, (s[0], w1, w2, s[2]), s[3])
    torch.cuda.synchronize()
    return time.perf_counter() - began


def run_tokens(t, impls, modes, w1, w2, sets, args):
    """The result rows of one token count: every (impl, mode) timed in each of args.rounds rounds."""
    k, h, i = sets[0][1].shape[1], w2.shape[1], w2.shape[2]
    rows, failed = {}, {}
    for impl in impls:
        try:
            BEFORE_FIRST_STEP.get(impl, lambda: None)()
            rows[impl] = {"impl": impl, "tokens": t, "first_call_s": first_step_seconds(IMPLS[impl], w1, w2, sets[0])}
        except Exception as error:  # one failing baseline should not lose the others' numbers
            failed[impl] = f"{type(error).__name__}: {error}".splitlines()[0]
    items = [(impl, mode) for impl in impls if impl in rows for mode in modes]
    samples = {item: [] for item in items}
    round_ms = {item: [] for item in items}
    peaks = {}
    for r in range(args.rounds):
        for index in range(len(items)):
            impl, mode = items[(index + r) % len(items)]
            if impl in failed:
                continue
            try:
                got, peak = time_mode(IMPLS[impl], mode, w1, w2, sets, max(1, args.min_iters // args.rounds),
                                      args.min_seconds / args.rounds, with_peak=(r == 0))
            except Exception as error:
                failed[impl] = f"{type(error).__name__}: {error}".splitlines()[0]
                continue
            samples[(impl, mode)] += got
            round_ms[(impl, mode)].append(statistics.median(got))
            if peak is not None:
                peaks[(impl, mode)] = peak
    results = []
    for impl in impls:
        if impl in failed:
            results.append({"impl": impl, "tokens": t, "error": failed[impl]})
            print(f"T={t:<6} {impl:<14} FAILED {failed[impl]}", flush=True)
            continue
        for mode in modes:
            ms = statistics.median(samples[(impl, mode)])
            tflops = FLOPS_PER_PAIR[mode] * t * k * h * i / (ms * 1e-3) / 1e12
            first = round_ms[(impls[0], mode)] if impls[0] not in failed else []
            x_first = statistics.median(a / b for a, b in zip(round_ms[(impl, mode)], first)) if first else None
            row = dict(rows[impl], mode=mode, ms=ms, tflops=tflops, peak_mib=peaks[(impl, mode)],
                       iters=len(samples[(impl, mode)]), round_ms=round_ms[(impl, mode)], x_first=x_first)
            if args.kernel_time and mode != "backward":
                row["kernel_ms"] = kernel_ms(IMPLS[impl], mode, w1, w2, sets)
            results.append(row)
            kernels = f"  kernels {row['kernel_ms']:.3f} ms" if "kernel_ms" in row else ""
            print(f"T={t:<6} {impl:<14} {mode:<9} {ms:9.3f} ms {tflops:7.1f} TFLOP/s peak +{row['peak_mib']:8.1f} MiB"
                  f" first step {row['first_call_s']:7.2f} s" + (f"  x{x_first:.3f}" if x_first else "") + kernels,
                  flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=pathlib.Path, help="where the results go (JSON)")
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table as Markdown")
    parser.add_argument("--shape", default="128,2048,768,8", help="E,H,I,K (default Qwen3-30B-A3B)")
    parser.add_argument("--tokens", default="1024,8192,32768")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--modes", default="forward,backward,full,inference")
    parser.add_argument("--min-iters", type=int, default=10)
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="timed seconds per (impl, mode), over all rounds (so is --min-iters)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel-time", action="store_true",
                        help="also profile 5 iterations per (impl, mode) and report the GPU kernels' time alone "
                             "(kernel_ms), without the host time event timing counts")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("bench_torch.py: no CUDA device")
    e, h, i, k = (int(v) for v in args.shape.split(","))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    impls = args.impls.split(",")
    modes = args.modes.split(",")
    generator = torch.Generator(device="cuda").manual_seed(0)
    w1 = ((torch.rand(e, 2 * i, h, device="cuda", generator=generator) * 2 - 1) / h ** 0.5).add_(1e-4).to(dtype)
    w2 = ((torch.rand(e, h, i, device="cuda", generator=generator) * 2 - 1) / i ** 0.5).add_(1e-4).to(dtype)
    w1.requires_grad_()
    w2.requires_grad_()

    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "moejit": moejit.version(),
        "date": time.strftime("%Y-%m-%d"),
        "shape": {"E": e, "H": h, "I": i, "K": k, "dtype": args.dtype},
        "settings": {name: value for name, value in moejit.options().items() if value is not None},
        "results": [],
    }
    for t in (int(v) for v in args.tokens.split(",")):
        set_bytes = 2 * t * h * dtype.itemsize + t * k * (8 + dtype.itemsize)
        sets = make_sets(t, e, h, k, dtype, max(2, min(MAX_SETS, math.ceil(2 * L2_BYTES / set_bytes))), generator)
        report["results"] += run_tokens(t, impls, modes, w1, w2, sets, args)
        del sets
        torch.cuda.empty_cache()
        # Written after every token count, so a run stopped by a time limit keeps what it measured.
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        if args.markdown:
            args.markdown.write_text(markdown(report))
    return 1 if any("error" in r for r in report["results"]) else 0


def markdown(report):
    s = report["shape"]
    lines = [f"{report['device']}, torch {report['torch']}, moejit {report['moejit']}, {report['date']}: "
             f"E={s['E']} H={s['H']} I={s['I']} K={s['K']} {s['dtype']}. Median ms (TFLOP/s), peak MiB over resident.",
             "", "| T | impl | mode | ms | kernels ms | TFLOP/s | peak MiB | first step s | x first |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['tokens']} | {r['impl']} | — | failed: {r['error']} | | | | | |")
        else:
            x_first = f"{r['x_first']:.3f}" if r["x_first"] else "—"
            kernels = f"{r['kernel_ms']:.3f}" if "kernel_ms" in r else "—"
            lines.append(f"| {r['tokens']} | {r['impl']} | {r['mode']} | {r['ms']:.3f} | {kernels} | {r['tflops']:.0f} | "
                         f"{r['peak_mib']:.0f} | {r['first_call_s']:.2f} | {x_first} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
