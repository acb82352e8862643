#!/usr/bin/env python3
"""Host time of one moejit.torch.fused_moe call: what a training loop pays on the CPU per layer,
hidden behind the GPU only while the host keeps ahead of it.

  python3 bench/host_overhead.py [--shape 8,256,128,2] [--tokens 64] [--calls 2000] [--profile 15]

A small shape keeps the GPU's work per call below the host's, so the launch queue never fills and
the wall time per call is the host's alone. Prints µs per call for an inference forward, a
training forward, and a training forward + backward (torch.autograd.grad), next to a bare
torch.matmul of the same x for scale; then, with --profile N, cProfile's N costliest functions
(by own time) over the training forward + backward.
"""

import argparse
import cProfile
import pathlib
import pstats
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import moejit.torch as mt  # noqa: E402


def per_call_us(fn, calls):
    for _ in range(20):  # plans, the caching allocator's pools
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - began
    torch.cuda.synchronize()
    return host / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="8,256,128,2", help="E,H,I,K")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", type=int, default=15, help="cProfile rows (0: none)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_overhead.py: no CUDA device")
    e, h, i, k = (int(v) for v in args.shape.split(","))
    t = args.tokens
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5).requires_grad_()
    w2 = (torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) / i ** 0.5).requires_grad_()
    weights, ids = torch.rand(t, e, device="cuda").topk(k, dim=-1)
    weights = weights.to(torch.bfloat16).requires_grad_()
    d_out = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)

    def inference():
        with torch.no_grad():
            mt.fused_moe(x, w1, w2, ids, weights)

    def forward():
        mt.fused_moe(x, w1, w2, ids, weights)

    def full():
        out = mt.fused_moe(x, w1, w2, ids, weights)
        torch.autograd.grad(out, (x, w1, w2, weights), d_out)

    def matmul():
        torch.matmul(x.detach(), w2[0].detach())

    print(f"T={t} E={e} H={h} I={i} K={k}: host us per call ({args.calls} calls)")
    for name, fn in (("inference forward", inference), ("training forward", forward),
                     ("training forward + backward", full), ("torch.matmul (for scale)", matmul)):
        print(f"  {name:<28} {per_call_us(fn, args.calls):8.1f}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls // 4):
            full()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
