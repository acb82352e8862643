#!/usr/bin/env python3
"""What the check of adopted saved states costs a training step whose states are copies.

  python3 bench/adopted_check.py [--shape 128,2048,768,8] [--tokens 1024,8192] [--layers 8] [--rounds 9]

A stack of `layers` MoE layers (each its own weights, the default shape) runs forward and backward
under torch.autograd.graph.save_on_cpu(pin_memory=True), so every backward gets its saved state
back as a copy, which the front end declares with adopt_saved: the library then checks the
state's routing tables (the routing kernel's check phase) and reads its stamp back on the stream
before the backward (one synchronisation per layer), unless MOEJIT_CHECK_ADOPTED=0. Rounds alternate the two settings; each round times 5 steps with CUDA
events after 2 untimed ones. Prints the median step time of each setting and their ratio.
Inputs are fresh random data (never zeros); each layer's weights are its own (1.2 GB a layer at
the default shape), far more than the L2 holds.
"""

import argparse
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import moejit  # noqa: E402
import moejit.torch as mt  # noqa: E402


def make_layers(layers, e, h, i, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(layers):
        w1 = (torch.rand(e, 2 * i, h, device="cuda", generator=g) * 2 - 1) * (2 / h ** 0.5)
        w2 = (torch.rand(e, h, i, device="cuda", generator=g) * 2 - 1) * (2 / i ** 0.5)
        out.append((w1.bfloat16().requires_grad_(), w2.bfloat16().requires_grad_()))
    return out


def step(x, layers, ids, weights, d_out):
    with torch.autograd.graph.save_on_cpu(pin_memory=True):
        h = x
        for w1, w2 in layers:
            h = mt.fused_moe(h, w1, w2, ids, weights)
    h.backward(d_out)


def timed_round(fn, steps=5, warm=2):
    for _ in range(warm):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="128,2048,768,8", help="E,H,I,K")
    parser.add_argument("--tokens", default="1024,8192")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("adopted_check.py: no CUDA device")
    e, h, i, k = (int(v) for v in args.shape.split(","))
    layers = make_layers(args.layers, e, h, i, seed=1)
    print(f"{torch.cuda.get_device_name()}: E={e} H={h} I={i} K={k}, {args.layers} layers under save_on_cpu, "
          f"{args.rounds} rounds of 5 steps per setting, medians")
    for t in (int(v) for v in args.tokens.split(",")):
        g = torch.Generator(device="cuda").manual_seed(t)
        x = (torch.rand(t, h, device="cuda", generator=g) * 2 - 1).bfloat16().requires_grad_()
        d_out = (torch.rand(t, h, device="cuda", generator=g) * 2 - 1).bfloat16()
        weights, ids = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=-1)
        weights = weights.bfloat16()
        times = {"1": [], "0": []}
        for r in range(args.rounds):
            for setting in (("1", "0") if r % 2 == 0 else ("0", "1")):
                moejit.set_option("CHECK_ADOPTED", setting)
                times[setting].append(timed_round(lambda: step(x, layers, ids, weights, d_out)))
        moejit.clear_option("CHECK_ADOPTED")
        checked, trusted = statistics.median(times["1"]), statistics.median(times["0"])
        print(f"T={t}: checked {checked:.3f} ms, trusted {trusted:.3f} ms, checked / trusted {checked / trusted:.4f}")


if __name__ == "__main__":
    main()
