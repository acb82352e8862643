"""The per-process cache of moejit plans, one per (problem, device).

Building a plan compiles or loads kernels and may self-tune (seconds), so it happens once per
(T, E, H, I, K, dtype, mode, check_expert_ids, device); later calls cost only the launches.
Builds on different GPUs run at once (a thread per GPU tunes its own); on one GPU they take
turns, since two self-tunes there would skew each other's timings and share its memory. A plan
holds no device memory (the library's compiled kernels are shared by all plans; only the CUDA
graphs its eager calls launch, a few per stream, stay with the driver), so the cache keeps every
plan it built.
"""

import threading

import torch

from .._library import Plan
from ..errors import StateError
from . import _context

_lock = threading.Lock()  # guards _device_locks and _generation
_plans = {}
_device_locks = {}  # device index -> the lock held while a plan is built there
_generation = 0  # clear_plans() count: a build that began before a clear is not cached


def plan_for(problem, device):
    """The plan of `problem` on CUDA `device`, built on first use; makes its context current."""
    _context.make_current(device.index)
    key = problem.key() + (device.index,)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    with _lock:
        building = _device_locks.setdefault(device.index, threading.Lock())
    with building:
        plan = _plans.get(key)
        if plan is not None:
            return plan
        if torch.cuda.is_current_stream_capturing():
            # Building compiles, loads modules and may tune: none of it belongs in a graph.
            raise StateError(
                "moejit: no plan yet for this problem "
                f"(T={problem.tokens} E={problem.experts} H={problem.hidden} I={problem.intermediate} "
                f"K={problem.topk}) and the stream is capturing a CUDA graph; run the op once before "
                "capturing (the usual warm-up)",
                status="state",
            )
        generation = _generation
        plan = Plan(problem)
        with _lock:
            if generation == _generation:
                _plans[key] = plan
    return plan


def clear_plans():
    """Drops every cached plan, so changed MOEJIT_* settings apply to the next calls (a build
    under way keeps its plan for its own call only)."""
    global _generation
    with _lock:
        _generation += 1
        _plans.clear()
