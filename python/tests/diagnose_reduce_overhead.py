#!/usr/bin/env python3
"""Where moejit's buffers live under torch.compile(mode="reduce-overhead"), in one GPU run.

  python3 python/tests/diagnose_reduce_overhead.py [--verbose]

Replays test_torch_gpu.py::test_torch_compile_of_a_moe_layer (TinyMoE; T = 256 three times, then
384 three times; an eager and a compiled step each time) in four scenarios: default compile;
reduce-overhead right after it without a dynamo reset, as pytest runs them (the default run's
T = 384 leaves TinyMoE.forward symbolic in T); reduce-overhead after a reset (static T, then
symbolic at 384); reduce-overhead with dynamic=True. It prints
  - for each compiled graph, where inductor put the moejit ops: in a CUDA-graph partition, or in
    `call` between partitions (they then run outside CUDA graphs);
  - for each library call under torch.compile (all calls with --verbose): the thread, whether it
    runs on the cudagraph trees' stream and captures, and for each buffer the op gives the
    library its address, the allocator pool whose segment holds it (trees: the cudagraph trees'
    pool), whether it starts an allocated block and whether it overlaps another buffer of the call;
  - the cudagraph trees' live outputs that are not allocations of their pool (what their
    check_memory_pool rejects), named after the op buffer they are, if one.
Exits 0 when every compiled step matches eager and nothing above is wrong, else 1 (2: no GPU).
Not a test: pytest collects test_*.py only.
"""

import argparse
import importlib
import re
import sys
import threading
import traceback

import torch

importlib.import_module("conftest")  # this checkout's package, no self-tuning, a throw-away tuning database
from moejit import _library  # noqa: E402
from reference import errors  # noqa: E402

SIZES = (256, 256, 256, 384, 384, 384)
SCENARIOS = (  # name, torch.compile keywords, whether dynamo is reset first
    ("default", {}, True),
    ("reduce-overhead after default", {"mode": "reduce-overhead"}, False),
    ("reduce-overhead", {"mode": "reduce-overhead"}, True),
    ("reduce-overhead dynamic", {"mode": "reduce-overhead", "dynamic": True}, True),
)
INPUTS = {"forward": ("x", "W1", "W2", "topk_ids", "topk_weights"),
          "backward": ("d_out", "x", "W1", "W2", "topk_ids", "topk_weights", "saved")}


def tree_manager():
    from torch._inductor import cudagraph_trees
    try:
        return cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    except (AssertionError, KeyError):  # no cudagraph trees state in this thread
        return None


def locate(address, segments):
    """(pool id, block state, whether the address starts the block) of the allocator block holding it."""
    for segment in segments:
        at = segment["address"]
        if not at <= address < at + segment["total_size"]:
            continue
        for block in segment["blocks"]:
            if at <= address < at + block["size"]:
                return tuple(segment["segment_pool_id"]), block["state"], address == at
            at += block["size"]
    return None, "not from the caching allocator", False


def snapshot():
    return [s for s in torch.cuda.memory_snapshot() if s["device"] == torch.cuda.current_device()]


class Call:
    def __init__(self, label, kind, problem, buffers, stream):
        self.label, self.kind, self.problem, self.buffers = label, kind, problem, buffers  # name -> (address, bytes)
        self.thread = threading.current_thread().name
        self.stream_mismatch = stream != torch.cuda.current_stream().cuda_stream
        self.capturing = torch.cuda.is_current_stream_capturing()
        manager = tree_manager()
        self.pool = manager.cuda_graphs_thread_pool if manager else None
        self.phase = manager.path_state.name if manager else "no trees"
        self.on_tree_stream = bool(manager) and torch.cuda.current_stream().cuda_stream == manager.stream.cuda_stream
        self.report = None

    def classify(self, segments, compiled_with_trees):
        """This call's line and its problems; under a capture only after the step (no allocator queries)."""
        parts, problems = [], []
        for name, (address, size) in self.buffers.items():
            if name in INPUTS[self.kind]:
                continue
            if size == 0:
                parts.append(f"{name} empty")
                continue
            pool, state, starts = locate(address, segments)
            pool_name = "trees" if pool == self.pool and pool is not None else f"pool {pool}"
            overlap = [n for n, (a, s) in self.buffers.items()
                       if n != name and s > 0 and a < address + size and address < a + s]
            parts.append(f"{name} {address:#x} {pool_name} {state}{'' if starts else ' MID-BLOCK'}"
                         + (f" OVERLAPS {','.join(overlap)}" if overlap else ""))
            if self.on_tree_stream and pool != self.pool:
                problems.append(f"{self.kind}.{name} made on the trees' stream outside their pool ({pool_name})")
            if overlap or not starts:
                problems.append(f"{self.kind}.{name} overlaps another buffer or is not an allocation of its own")
        if compiled_with_trees and not self.on_tree_stream:
            problems.append(f"{self.kind} ran outside the cudagraph trees' functions (not in a CUDA graph)")
        if self.stream_mismatch:
            problems.append(f"{self.kind} launched on a stream other than the current one")
        self.report = (f"[{self.label}] {self.kind} T={self.problem.tokens} mode={self.problem.mode} "
                       f"thread={self.thread} phase={self.phase} tree-stream={self.on_tree_stream} "
                       f"capturing={self.capturing} | " + " | ".join(parts), problems)

    def owns(self, address):
        for name, (a, size) in self.buffers.items():
            if a <= address < a + max(size, 1):
                return f"{self.label} {self.kind}.{name}" + ("" if a == address else f" (+{address - a})")
        return None


class Recorder:
    """Wraps Plan.forward / Plan.backward (the op's library calls) to see every buffer address."""

    def __init__(self, verbose):
        self.verbose, self.calls, self.pending, self.problems = verbose, [], [], []
        self.label, self.compiled, self.trees = "", False, False
        forward, backward = _library.Plan.forward, _library.Plan.backward

        def hooked_forward(plan, x, w1, w2, ids, weights, out, saved, saved_bytes, workspace, workspace_bytes,
                           stream):
            t, e, h, i, k = (plan.problem.tokens, plan.problem.experts, plan.problem.hidden,
                             plan.problem.intermediate, plan.problem.topk)
            self.record(plan, "forward", {
                "x": (x, t * h * 2), "W1": (w1, e * 2 * i * h * 2), "W2": (w2, e * h * i * 2),
                "topk_ids": (ids, t * k * 4), "topk_weights": (weights, t * k * 2), "out": (out, t * h * 2),
                "saved": (saved, saved_bytes), "workspace": (workspace, workspace_bytes)}, stream)
            forward(plan, x, w1, w2, ids, weights, out, saved, saved_bytes, workspace, workspace_bytes, stream)

        def hooked_backward(plan, d_out, x, w1, w2, ids, weights, saved, saved_bytes, dx, dw1, dw2, ds, workspace,
                            workspace_bytes, stream, adopt_saved=False):
            t, e, h, i, k = (plan.problem.tokens, plan.problem.experts, plan.problem.hidden,
                             plan.problem.intermediate, plan.problem.topk)
            buffers = {
                "d_out": (d_out, t * h * 2), "x": (x, t * h * 2), "W1": (w1, e * 2 * i * h * 2),
                "W2": (w2, e * h * i * 2), "topk_ids": (ids, t * k * 4), "topk_weights": (weights, t * k * 2),
                "saved": (saved, saved_bytes), "dx": (dx, t * h * 2), "dW1": (dw1, e * 2 * i * h * 2),
                "dW2": (dw2, e * h * i * 2), "d_topk_weights": (ds, t * k * 2),
                "workspace": (workspace, workspace_bytes)}
            # Null pointers: no ids ever, nor weight gradients and x for frozen experts.
            self.record(plan, "backward", {n: b for n, b in buffers.items() if b[0] is not None}, stream)
            backward(plan, d_out, x, w1, w2, ids, weights, saved, saved_bytes, dx, dw1, dw2, ds, workspace,
                     workspace_bytes, stream, adopt_saved=adopt_saved)

        _library.Plan.forward, _library.Plan.backward = hooked_forward, hooked_backward

    def record(self, plan, kind, buffers, stream):
        call = Call(self.label, kind, plan.problem, buffers, stream)
        self.calls.append(call)
        if call.capturing:
            self.pending.append(call)
        else:
            self.finish(call, snapshot())

    def finish(self, call, segments):
        call.classify(segments, self.compiled and self.trees)
        line, problems = call.report
        if self.verbose or self.compiled or problems:
            print(line)
        for p in problems:
            self.problem(f"[{call.label}] {p}")

    def flush(self):
        segments = snapshot()
        for call in self.pending:
            self.finish(call, segments)
        self.pending.clear()

    def problem(self, text):
        print("  PROBLEM:", text)
        self.problems.append(text)

    def name_of(self, address):
        for call in reversed(self.calls):
            if (owner := call.owns(address)) is not None:
                return owner
        return "not a buffer of a moejit call"


def check_trees(recorder):
    """The trees' live outputs that check_memory_pool would reject (checked where it checks)."""
    manager = tree_manager()
    if manager is None or manager.current_node is None or manager.path_state.name not in ("WARMUP", "RECORDING"):
        return
    segments = snapshot()
    for ref in manager.current_node.path_live_weakrefs():
        pool, state, starts = locate(ref.data_ptr(), segments)
        if pool != manager.cuda_graphs_thread_pool or state != "active_allocated" or not starts:
            recorder.problem(f"trees' live output {ref.data_ptr():#x} is in pool {pool}, {state}"
                             f"{'' if starts else ', mid-block'}: {recorder.name_of(ref.data_ptr())}")


def placement(code):
    """(CUDA-graph partitions, [(moejit op, enclosing function)]) of inductor's output code."""
    found, function = [], None
    for line in code.splitlines():
        if m := re.match(r"\s*def (\w+)\(", line):
            function = m.group(1)
        elif m := re.search(r"torch\.ops\.moejit\.(\w+)", line):
            found.append((m.group(1), function))
    return len(re.findall(r"^\s*def partition_\d+\(", code, re.M)), found


def run_scenario(name, options, reset, recorder, codes):
    from test_torch_gpu import TinyMoE, step

    print(f"\n=== {name}: torch.compile({options}){', after torch._dynamo.reset()' if reset else ''}")
    if reset:
        torch._dynamo.reset()
    torch.manual_seed(0)
    layer = TinyMoE(8, 256, 128, 2)
    compiled = torch.compile(layer, fullgraph=True, **options)
    recorder.trees = options.get("mode") == "reduce-overhead"
    failures = len(recorder.problems)
    for n, t in enumerate(SIZES):
        label = f"{name} #{n} T={t}"
        x = torch.randn(t, 256, device="cuda", dtype=torch.bfloat16)
        seen = len(codes)
        try:
            recorder.label, recorder.compiled = label + " eager", False
            want = step(layer, x)
            recorder.label, recorder.compiled = label + " compiled", True
            got = step(compiled, x)
        except Exception as error:  # cudagraph trees' checks raise RuntimeError
            recorder.flush()
            message = str(error)
            recorder.problem(f"[{label}] {type(error).__name__}: {message.splitlines()[0][:400]}")
            if m := re.search(r"not allocated in pool .*? \{([\d, ]+)\}", message):
                for address in (int(a) for a in m.group(1).split(",")):
                    recorder.problem(f"  rejected {address:#x}: {recorder.name_of(address)}")
            check_trees(recorder)
            traceback.print_exc(limit=-6)
            break
        finally:
            recorder.compiled = False
            for code in codes[seen:]:
                partitions, found = placement(code)
                print(f"  compiled graph: {partitions} CUDA-graph partition(s); "
                      + (", ".join(f"{op} in {fn}" for op, fn in found) or "no moejit op"))
                for op, fn in found:
                    if recorder.trees and partitions and not (fn or "").startswith("partition_"):
                        recorder.problem(f"[{label}] inductor runs {op} outside its CUDA-graph partitions")
        recorder.flush()
        check_trees(recorder)
        for what, g, w in zip(["out", "dx", "router", "W1", "W2"], got, want):
            if (l2 := errors(g, w)[1]) > 2e-2:
                recorder.problem(f"[{label}] {what} differs from eager: relative L2 {l2:.2e}")
    ok = len(recorder.problems) == failures
    print(f"=== {name}: {'OK' if ok else 'FAILED'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="also print the eager steps' library calls")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # what was printed survives a crash in the library
    if not torch.cuda.is_available():
        print("diagnose_reduce_overhead.py: no CUDA device")
        return 2
    import torch._inductor.config as inductor_config
    from torch._inductor.graph import GraphLowering

    inductor_config.force_disable_caches = True  # every compile goes through codegen, so its code is seen
    codes = []
    GraphLowering.save_output_code = codes.append
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, Python {sys.version.split()[0]}, "
          f"moejit {_library.version()} ({_library.library_path()}); inductor graph_partition="
          f"{inductor_config.graph_partition}, cudagraph_trees={inductor_config.triton.cudagraph_trees}, "
          f"slow_path_cudagraph_asserts={inductor_config.triton.slow_path_cudagraph_asserts}")
    recorder = Recorder(args.verbose)
    results = [(name, run_scenario(name, options, reset, recorder, codes)) for name, options, reset in SCENARIOS]
    print("\nSummary:")
    for name, ok in results:
        print(f"  {'OK    ' if ok else 'FAILED'} {name}")
    for text in recorder.problems[:30]:  # the first ones: later ones often follow from them
        print("  ", text[:300])
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
