# The PyTorch front end on a GPU: forward and all four gradients against a plain-PyTorch fp32
# reference (bf16 and fp16, the kernel tests' shapes; the op's allocations start as NaN, so an
# unwritten element fails), the modes, torch.compile, CUDA graphs and errors from the library.
# Skips without torch or a CUDA device.
import contextlib
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

import moejit  # noqa: E402
import moejit.torch as mt  # noqa: E402
from moejit.torch import ops, plans  # noqa: E402
from reference import errors, make_case, moe_reference, unwritten_as_nan  # noqa: E402
from wrapper_tensor import PassThrough  # noqa: E402

# (max-abs relative, relative L2) error bounds against the fp32 reference.
TOLERANCE = {torch.bfloat16: (2e-2, 1e-2), torch.float16: (1e-2, 5e-3)}

# (T, E, H, I, K, routing): tests/gpu/test_fused_moe.cpp's cases plus H, I multiples of 8 only.
CASES = [
    (7, 4, 64, 32, 2, "random"),
    (512, 8, 256, 128, 2, "random"),
    (512, 8, 97, 47, 2, "random"),  # odd H and I
    (200, 8, 120, 40, 2, "random"),  # multiples of 8, not of 64
    (512, 7, 128, 64, 3, "random"),
    (512, 8, 256, 64, 1, "random"),  # K = 1
    (128, 8, 256, 64, 8, "random"),  # K = E
    (300, 16, 128, 64, 4, "one"),  # every pair on one expert
    (1, 8, 256, 128, 2, "random"),  # T = 1
    (384, 16, 128, 96, 2, "even"),  # half the experts get no tokens
    (1024, 128, 2048, 768, 8, "random"),  # Qwen3-30B-A3B
]


def describe(case):
    return "T{}-E{}-H{}-I{}-K{}-{}".format(*case)


def run(fn, inputs, d_out, leaf_dtype=None):
    """fn's output and the gradients of x, W1, W2 and topk_weights for d_out."""
    x, w1, w2, ids, weights = inputs
    leaves = [t.detach().to(leaf_dtype or t.dtype).requires_grad_() for t in (x, w1, w2, weights)]
    out = fn(leaves[0], leaves[1], leaves[2], ids, leaves[3])
    out.backward(d_out.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def check_against_reference(got, inputs, d_out, dtype):
    want = run(moe_reference, inputs, d_out, leaf_dtype=torch.float32)
    max_tol, l2_tol = TOLERANCE[dtype]
    for name, g, w in zip(("out", "dx", "dW1", "dW2", "d topk_weights"), got, want):
        assert g.shape == w.shape, name
        assert torch.isfinite(g).all(), f"{name} has non-finite values"
        max_err, l2_err = errors(g, w)
        assert max_err <= max_tol and l2_err <= l2_tol, f"{name}: max-abs error {max_err:.2e}, L2 {l2_err:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=describe)
def test_forward_and_gradients_match_the_reference(case, dtype):
    x, w1, w2, ids, weights, d_out = make_case(*case, dtype=dtype)
    with unwritten_as_nan():
        got = run(mt.fused_moe, (x, w1, w2, ids, weights), d_out)
    assert got[4].dtype == dtype
    check_against_reference(got, (x, w1, w2, ids, weights), d_out, dtype)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[9]], ids=describe)
def test_memory_efficient_mode(case):
    x, w1, w2, ids, weights, d_out = make_case(*case, dtype=torch.bfloat16)
    with unwritten_as_nan():
        got = run(lambda *a: mt.fused_moe(*a, memory_efficient=True), (x, w1, w2, ids, weights), d_out)
    check_against_reference(got, (x, w1, w2, ids, weights), d_out, torch.bfloat16)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[10]], ids=describe)
def test_inference_mode_without_grad(case):
    x, w1, w2, ids, weights, _ = make_case(*case, dtype=torch.bfloat16)
    with unwritten_as_nan():
        with torch.no_grad():
            out = mt.fused_moe(x, w1, w2, ids, weights)
        with torch.inference_mode():
            again = mt.fused_moe(x, w1, w2, ids, weights)
    want = moe_reference(x.float(), w1.float(), w2.float(), ids, weights.float())
    assert errors(out, want)[0] <= TOLERANCE[torch.bfloat16][0]
    assert torch.equal(out, again)


def test_deterministic_algorithms_get_the_same_bits_twice():
    was_on, was_warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        x, w1, w2, ids, weights, d_out = make_case(1024, 128, 2048, 768, 8, dtype=torch.bfloat16)
        first = run(mt.fused_moe, (x, w1, w2, ids, weights), d_out)
        again = run(mt.fused_moe, (x, w1, w2, ids, weights), d_out)
        for name, a, b in zip(("out", "dx", "dW1", "dW2", "d topk_weights"), first, again):
            assert torch.equal(a, b), name
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)


def test_router_dtypes_int64_ids_and_fp32_weights():
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    assert ids.dtype == torch.int64
    with unwritten_as_nan():
        got = run(mt.fused_moe, (x, w1, w2, ids, weights.float()), d_out)
    assert got[4].dtype == torch.float32  # the gradient comes back in the router's dtype
    check_against_reference(got, (x, w1, w2, ids, weights), d_out, torch.bfloat16)


def test_expert_ids_out_of_range_are_dropped_or_rejected():
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    ids = ids.clone()
    ids[0, 0], ids[3, 1] = 8, -1
    with unwritten_as_nan():
        got = run(mt.fused_moe, (x, w1, w2, ids, weights), d_out)
    check_against_reference(got, (x, w1, w2, ids, weights), d_out, torch.bfloat16)
    assert got[4][0, 0] == 0 and got[4][3, 1] == 0
    with pytest.raises(moejit.InvalidArgumentError, match=r"topk_ids: \d+ expert id\(s\) outside \[0, 8\)"):
        mt.fused_moe(x, w1, w2, ids, weights, check_expert_ids=True)


def shifted(t):
    """A copy of t that starts one element past a 16-byte boundary (a view into a larger buffer)."""
    out = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 16 != 0
    return out


def test_misaligned_activations_and_gradients_are_copied():
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    with unwritten_as_nan():
        got = run(mt.fused_moe, (shifted(x), w1, w2, ids, weights), shifted(d_out))
    check_against_reference(got, (x, w1, w2, ids, weights), d_out, torch.bfloat16)


# Run in a process of its own: the allocator's settings hold from a process's first allocation.
EXPANDABLE_SEGMENTS_RUN = """
import sys, torch
sys.path[:0] = sys.argv[1:3]
import moejit.torch as mt
from reference import errors, make_case, moe_reference
x, w1, w2, ids, weights, d_out = make_case(1024, 128, 2048, 768, 8, dtype=torch.bfloat16)
segments = torch.cuda.memory_snapshot()
if not segments or any("is_expandable" not in s for s in segments):
    print("SKIP: this torch's memory snapshot does not say whether its segments are expandable")
    sys.exit(0)
assert all(s["is_expandable"] for s in segments), "expandable segments are off"
leaves = [t.detach().requires_grad_() for t in (x, w1, w2, weights)]
out = mt.fused_moe(leaves[0], leaves[1], leaves[2], ids, leaves[3])
out.backward(d_out)
ref = [t.detach().float().requires_grad_() for t in (x, w1, w2, weights)]
want = moe_reference(ref[0], ref[1], ref[2], ids, ref[3])
want.backward(d_out.float())
for name, g, w in zip(("out", "dx", "dW1", "dW2", "d topk_weights"), [out] + [t.grad for t in leaves],
                      [want] + [t.grad for t in ref]):
    max_err, l2_err = errors(g, w)
    assert max_err <= 2e-2 and l2_err <= 1e-2, f"{name}: max-abs error {max_err:.2e}, L2 {l2_err:.2e}"
"""


def test_tensors_of_expandable_segments_pass_the_allocation_check():
    # Such a segment maps many physical handles back to back into one reserved address range:
    # W1 (805 MB here) spans about forty of them, which the tensor checks must take as one.
    here = pathlib.Path(__file__).resolve().parent
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    run_it = subprocess.run([sys.executable, "-c", EXPANDABLE_SEGMENTS_RUN, str(here.parent), str(here)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert run_it.returncode == 0, run_it.stdout + run_it.stderr
    if run_it.stdout.startswith("SKIP: "):
        pytest.skip(run_it.stdout[len("SKIP: "):].strip())


def test_library_errors_surface_with_its_message():
    x, w1, w2, ids, weights, _ = make_case(*CASES[1], dtype=torch.bfloat16)
    # Weights are never copied (a layer's can be a gigabyte): the library names the argument.
    with pytest.raises(moejit.InvalidArgumentError, match="^w2: must be 16-byte aligned") as info:
        mt.fused_moe(x, w1, shifted(w2), ids, weights)
    assert info.value.function == "moejit_forward"


def test_a_double_backward_raises_instead_of_dropping_terms():
    x, w1, w2, ids, weights, _ = make_case(*CASES[1], dtype=torch.bfloat16)
    x = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(mt.fused_moe(x, w1, w2, ids, weights).float().sum(), x, create_graph=True)
    # A gradient penalty would otherwise count moejit's part as zero.
    with pytest.raises(RuntimeError, match="no double backward"):
        dx.float().square().sum().backward()


def _green_context(num_sms):
    """A PyTorch green context holding num_sms SMs of device 0, or a skip saying why not."""
    green_contexts = getattr(torch.cuda, "green_contexts", None)
    if green_contexts is None:
        pytest.skip("this PyTorch has no torch.cuda.green_contexts")
    try:
        return green_contexts.GreenContext.create(num_sms=num_sms, device_id=0)
    except RuntimeError as e:
        pytest.skip(f"no green context here: {e}")


def test_green_contexts_run_the_op_bit_for_bit():
    """A green context (half the SMs, for overlapping other work) runs the op as the whole device
    does: on its stream (PyTorch 2.12 on), and made current with its stream (2.10's way)."""
    inputs = make_case(*CASES[1], dtype=torch.bfloat16)
    want = run(mt.fused_moe, inputs[:5], inputs[5])
    green = _green_context(torch.cuda.get_device_properties(0).multi_processor_count // 2)
    tried = []
    if hasattr(green, "Stream"):
        stream = green.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            tried.append(("its stream", run(mt.fused_moe, inputs[:5], inputs[5])))
        torch.cuda.current_stream().wait_stream(stream)
    if hasattr(green, "set_context"):
        green.set_context()
        try:
            tried.append(("made current", run(mt.fused_moe, inputs[:5], inputs[5])))
            torch.cuda.current_stream().synchronize()
        finally:
            green.pop_context()
    assert tried, "this PyTorch's GreenContext has neither Stream() nor set_context()"
    torch.cuda.synchronize()
    for how, got in tried:
        for name, g, w in zip(("out", "dx", "dW1", "dW2", "d topk_weights"), got, want):
            assert torch.equal(g, w), f"{how}: {name}"


class _MemeffStep:
    """A memory-efficient forward of CASES[1] through fused_moe, eager or compiled, and `want`,
    the dx of a fresh forward and backward."""

    def __init__(self, compiled):
        x, w1, w2, ids, weights, self.d_out = make_case(*CASES[1], dtype=torch.bfloat16)
        self.compiled = compiled
        self._forward(mt.fused_moe, x, w1, w2, ids, weights)
        self.out.backward(self.d_out)
        self.want = self.leaf.grad
        torch._dynamo.reset()
        self._forward(torch.compile(mt.fused_moe) if compiled else mt.fused_moe, x, w1, w2, ids, weights)

    def _forward(self, fused, x, w1, w2, ids, weights):
        self.leaf = x.detach().requires_grad_()
        self.out = fused(self.leaf, w1, w2, ids, weights, memory_efficient=True)

    def retained_backward(self):
        try:
            self.out.backward(self.d_out, retain_graph=True)
        except RuntimeError as e:
            # Where AOTAutograd donates the saved buffers it refuses retain_graph itself: nothing
            # could run the consumed state again.
            if self.compiled and "donated buffers" in str(e):
                pytest.skip(f"this torch compiles the backward with donated buffers: {e}")
            raise

    def again_is_refused_or_right(self):
        """A backward that must not run on a consumed state: refused, or, compiled, where
        AOTAutograd hands the op a copy of the state at each backward (so the state itself is
        never consumed; session 47's H200 run took this branch), the right gradient."""
        self.leaf.grad = None
        try:
            self.out.backward(self.d_out)
        except moejit.StateError as e:
            assert "one backward per forward" in str(e)
            return
        assert self.compiled, "an eager backward on a consumed state ran"
        assert torch.equal(self.leaf.grad, self.want), "a backward ran on a consumed state and gave another gradient"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_memory_efficient_state_is_consumed_by_one_backward(compiled):
    step = _MemeffStep(compiled)
    step.retained_backward()
    assert torch.equal(step.leaf.grad, step.want)
    step.again_is_refused_or_right()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_failed_memory_efficient_backward_is_not_run_again(compiled, monkeypatch):
    # The library counts the state consumed from its first launch on, so a retry could run on
    # what a failed backward overwrote; here a failure stands in for a launch's.
    step = _MemeffStep(compiled)

    class Failing:
        def __init__(self, plan):
            self.plan = plan

        def __getattr__(self, name):
            return getattr(self.plan, name)

        def backward(self, *args, **kwargs):
            raise moejit.CudaError("a launch failed (stand-in)", status="cuda")

    real = plans.plan_for
    monkeypatch.setattr(plans, "plan_for", lambda problem, device: Failing(real(problem, device)))
    with pytest.raises(RuntimeError, match="stand-in"):
        step.retained_backward()
    monkeypatch.undo()
    step.again_is_refused_or_right()


def test_the_consuming_op_refuses_a_state_it_consumed():
    # Called directly, the op's own record of consumed storages refuses a second call before the
    # library, whose record of this state (the forward's own, so not adopted) would refuse it too.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    ids, weights = ids.int(), weights.to(x.dtype)
    out, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, ops.MEMEFF, False)
    args = (d_out, x, w1, w2, weights, saved, ops.MEMEFF, False, True)
    torch.ops.moejit.fused_moe_backward_consuming(*args)
    with pytest.raises(moejit.StateError, match="one backward per forward"):
        torch.ops.moejit.fused_moe_backward_consuming(*args)
    # A new forward into a new buffer is a new state.
    _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, ops.MEMEFF, False)
    torch.ops.moejit.fused_moe_backward_consuming(*args[:5], saved, *args[6:])


def test_the_backward_op_takes_x_only_for_weight_gradients():
    # The library reads x only for dW1 and dW2: a frozen backward without it gives the same bits,
    # and one asking for weight gradients without it names x.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    ids, weights = ids.int(), weights.to(x.dtype)
    _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, ops.TRAIN, False)
    with_x = torch.ops.moejit.fused_moe_backward(d_out, x, w1, w2, weights, saved, ops.TRAIN, False, False)
    without = torch.ops.moejit.fused_moe_backward(d_out, None, w1, w2, weights, saved, ops.TRAIN, False, False)
    assert torch.equal(with_x[0], without[0]) and torch.equal(with_x[3], without[3])
    with pytest.raises(moejit.InvalidArgumentError, match="^x: null device pointer"):
        torch.ops.moejit.fused_moe_backward(d_out, None, w1, w2, weights, saved, ops.TRAIN, False, True)


def test_the_backward_ops_refuse_another_problems_state():
    # Every state used to be adopted: a T=256 forward's state passed with T=64 tensors had the
    # kernels read a T=256 routing table with a T=64 layout, out of bounds. A state of another
    # size is now refused before the library, a copy too; a forward's own state is checked by the
    # library; and a refusal before it reaches the state consumes nothing.
    x, w1, w2, ids, weights, d_out = make_case(256, 8, 256, 128, 2, dtype=torch.bfloat16)
    ids, weights = ids.int(), weights.to(x.dtype)
    small_x, _, _, small_ids, small_weights, small_d_out = make_case(64, 8, 256, 128, 2, dtype=torch.bfloat16, seed=1)
    small_ids, small_weights = small_ids.int(), small_weights.to(x.dtype)
    _, small_saved = torch.ops.moejit.fused_moe_forward(small_x, w1, w2, small_ids, small_weights, ops.TRAIN, False)
    for mode, op in ((ops.TRAIN, torch.ops.moejit.fused_moe_backward),
                     (ops.MEMEFF, torch.ops.moejit.fused_moe_backward_consuming)):
        _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, mode, False)
        with pytest.raises(moejit.InvalidArgumentError, match="saved holds .* bytes, this problem's state"):
            op(small_d_out, small_x, w1, w2, small_weights, saved, mode, False, True)
        with pytest.raises(moejit.InvalidArgumentError, match="saved holds .* bytes, this problem's state"):
            op(small_d_out, small_x, w1, w2, small_weights, saved.clone(), mode, False, True)
        with pytest.raises(moejit.InvalidArgumentError, match="saved holds .* bytes, this problem's state"):
            op(d_out, x, w1, w2, weights, small_saved, mode, False, True)
        got = op(d_out, x, w1, w2, weights, saved, mode, False, True)
        _, fresh = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, mode, False)
        want = op(d_out, x, w1, w2, weights, fresh, mode, False, True)
        for name, g, w in zip(("dx", "dW1", "dW2", "d topk_weights"), got, want):
            assert torch.equal(g, w), (mode, name)


def test_the_backward_ops_refuse_a_copy_of_another_problems_state_of_the_same_size():
    # The size check cannot see it: E=16 and E=2 make states of one size here. Adopted as a copy,
    # the E=16 state's routing tables would send the E=2 backward's dW writes past its buffers;
    # the library checks the stamp the forward wrote, and refuses before anything runs.
    x, w1, w2, ids, weights, d_out = make_case(256, 16, 256, 128, 2, dtype=torch.bfloat16)
    _, small_w1, small_w2, small_ids, _, _ = make_case(256, 2, 256, 128, 2, dtype=torch.bfloat16, seed=1)
    ids, weights = ids.int(), weights.to(x.dtype)
    assert ops._layout.saved_bytes(256, 16, 128, 2, False) == ops._layout.saved_bytes(256, 2, 128, 2, False)
    _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, ops.TRAIN, False)
    with pytest.raises(moejit.StateError, match="another problem's forward"):
        torch.ops.moejit.fused_moe_backward(d_out, x, small_w1, small_w2, weights, saved, ops.TRAIN, False, True)
    with pytest.raises(moejit.StateError, match="its stamp is another's"):
        torch.ops.moejit.fused_moe_backward(d_out, x, small_w1, small_w2, weights, saved.clone(), ops.TRAIN, False,
                                            True)
    # The copy of its own problem's state is taken, and gives the forward's own gradients.
    got = torch.ops.moejit.fused_moe_backward(d_out, x, w1, w2, weights, saved.clone(), ops.TRAIN, False, True)
    want = torch.ops.moejit.fused_moe_backward(d_out, x, w1, w2, weights, saved, ops.TRAIN, False, True)
    for name, g, w in zip(("dx", "dW1", "dW2", "d topk_weights"), got, want):
        assert torch.equal(g, w), name
    # A copy of a consumed memory-efficient state holds none: its stamp was cleared.
    _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids, weights, ops.MEMEFF, False)
    torch.ops.moejit.fused_moe_backward_consuming(d_out, x, w1, w2, weights, saved, ops.MEMEFF, False, True)
    with pytest.raises(moejit.StateError, match="or none"):
        torch.ops.moejit.fused_moe_backward_consuming(d_out, x, w1, w2, weights, saved.clone(), ops.MEMEFF, False,
                                                      True)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["train", "memeff"])
def test_ids_refilled_in_place_before_backward_give_the_same_gradients(memory_efficient, compiled):
    # Contiguous int32 ids reach the op as the caller's own tensor, and the backward keeps none
    # (its routing is in the saved state): a pipeline may refill that buffer with the next
    # micro-batch's ids before this one's backward.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    ids = ids.int()
    torch._dynamo.reset()
    fused = torch.compile(mt.fused_moe) if compiled else mt.fused_moe
    want = run(lambda *a: fused(*a, memory_efficient=memory_efficient), (x, w1, w2, ids.clone(), weights), d_out)
    buffer = ids.clone()

    def refilled(*args):
        out = fused(*args, memory_efficient=memory_efficient)
        assert args[3] is buffer
        buffer.copy_((buffer + 1) % 8)  # other valid ids, still distinct per token
        return out

    got = run(refilled, (x, w1, w2, buffer, weights), d_out)
    assert not torch.equal(buffer, ids)
    for name, g, w in zip(("out", "dx", "dW1", "dW2", "d topk_weights"), got, want):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["train", "memeff"])
def test_states_offloaded_to_the_host_and_back_give_the_same_gradients(memory_efficient):
    # Under save_on_cpu each backward gets its state back at a new address, often one a state of
    # another layer (or another problem: two I) held before, which the library's record of that
    # address would refuse (consumed, or another problem's): the front end adopts every state no
    # forward wrote into its storage.
    layers = [make_case(512, 8, 256, i, 2, dtype=torch.bfloat16, seed=s) for s, i in enumerate((128, 128, 64, 64))]
    x, d_out = layers[0][0], layers[0][5]

    def step(offload):
        leaves = [x.detach().requires_grad_()]
        for _, w1, w2, _, weights, _ in layers:
            leaves += [t.detach().requires_grad_() for t in (w1, w2, weights)]
        with torch.autograd.graph.save_on_cpu() if offload else contextlib.nullcontext():
            h = leaves[0]
            for n, (_, _, _, ids, _, _) in enumerate(layers):
                w1, w2, weights = leaves[1 + 3 * n:4 + 3 * n]
                h = mt.fused_moe(h, w1, w2, ids, weights, memory_efficient=memory_efficient)
        h.backward(d_out)
        return [h.detach()] + [t.grad for t in leaves]

    want = step(False)
    got = step(True)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["train", "memeff"])
def test_frozen_experts_skip_the_weight_gradients(memory_efficient, compiled):
    # Qwen3-30B-A3B at T=1024: dW1 and dW2 are 1.2 GB the frozen backward never allocates.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[-1], dtype=torch.bfloat16)
    torch._dynamo.reset()
    fused = torch.compile(mt.fused_moe) if compiled else mt.fused_moe

    def step(train_experts):
        leaves = [x.detach().requires_grad_(), w1.detach().requires_grad_(train_experts),
                  w2.detach().requires_grad_(train_experts), weights.detach().requires_grad_()]
        out = fused(leaves[0], leaves[1], leaves[2], ids, leaves[3], memory_efficient=memory_efficient)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out.backward(d_out)
        torch.cuda.synchronize()
        return out.detach(), leaves, torch.cuda.max_memory_allocated() - before

    out_all, trained, peak_all = step(True)
    out_frozen, frozen, peak_frozen = step(False)
    assert torch.equal(out_frozen, out_all)
    assert frozen[1].grad is None and frozen[2].grad is None
    assert torch.equal(frozen[0].grad, trained[0].grad)
    assert torch.equal(frozen[3].grad, trained[3].grad)
    # Not all of the two gradients' bytes: the compiled memory-efficient full backward peaked
    # 1158 MB above the frozen one's, 50 MB short of them. Either gradient allocated would fail it.
    weight_bytes = w1.numel() * w1.element_size() + w2.numel() * w2.element_size()
    assert peak_all - peak_frozen >= 0.9 * weight_bytes, (peak_all, peak_frozen, weight_bytes)


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["train", "memeff"])
def test_frozen_experts_keep_no_x_for_backward(memory_efficient):
    # LoRA or adapter training: the backward reads x only for the weight gradients, so frozen
    # experts keep none (T·H·2 bytes a layer, 128 MB at T=32768, H=2048); no backward keeps the ids.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)
    ids = ids.int()

    def step(train_experts):
        leaves = [x.detach().requires_grad_(), w1.detach().requires_grad_(train_experts),
                  w2.detach().requires_grad_(train_experts), weights.detach().requires_grad_()]
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            out = mt.fused_moe(leaves[0], leaves[1], leaves[2], ids, leaves[3], memory_efficient=memory_efficient)
        out.backward(d_out)
        return leaves, [(tuple(t.shape), t.dtype) for t in packed]

    frozen, saved_frozen = step(False)
    trained, saved_trained = step(True)
    x_saved, ids_saved = (tuple(x.shape), x.dtype), (tuple(ids.shape), torch.int32)
    assert x_saved not in saved_frozen and ids_saved not in saved_frozen, saved_frozen
    assert x_saved in saved_trained and ids_saved not in saved_trained, saved_trained
    assert frozen[1].grad is None and frozen[2].grad is None
    assert torch.equal(frozen[0].grad, trained[0].grad)
    assert torch.equal(frozen[3].grad, trained[3].grad)


class TinyMoE(torch.nn.Module):
    """Router, top-k softmax and experts: the MoE block of a Qwen3-MoE layer."""

    def __init__(self, experts, hidden, intermediate, topk):
        super().__init__()
        self.topk = topk
        self.router = torch.nn.Linear(hidden, experts, bias=False, device="cuda", dtype=torch.bfloat16)
        self.experts = mt.MoEExperts(experts, hidden, intermediate, device="cuda", dtype=torch.bfloat16)
        g = torch.Generator(device="cuda").manual_seed(5)
        with torch.no_grad():
            self.experts.gate_up_proj.uniform_(-2 / hidden ** 0.5, 2 / hidden ** 0.5, generator=g)
            self.experts.down_proj.uniform_(-2 / intermediate ** 0.5, 2 / intermediate ** 0.5, generator=g)

    def forward(self, x):
        probs = self.router(x).float().softmax(dim=-1)
        weights, ids = probs.topk(self.topk, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return x + self.experts(x, ids, weights.to(x.dtype))


def step(layer, x):
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = layer(x)
    out.float().square().mean().backward()
    return [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_of_a_moe_layer(mode):
    torch._dynamo.reset()  # else TinyMoE.forward starts with a symbolic T left by the other mode
    torch.manual_seed(0)
    layer = TinyMoE(8, 256, 128, 2)
    compiled = torch.compile(layer, fullgraph=True, mode=mode)
    # Each size three times (cudagraph warm-up, record, replay); 384 recompiles with T symbolic.
    for t in (256, 256, 256, 384, 384, 384):
        x = torch.randn(t, 256, device="cuda", dtype=torch.bfloat16)
        want, got = step(layer, x), step(compiled, x)
        for name, g, w in zip(["out", "dx", "router", "W1", "W2"], got, want):
            # The compiled router may break near-ties of top-k differently: compare in L2.
            assert errors(g, w)[1] <= 2e-2, name


def capture_warm(fn):
    """Runs fn once on a side stream (plans get built there), as PyTorch asks before capturing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def test_cuda_graph_capture_and_replay_of_inference():
    case = CASES[1]
    x, w1, w2, ids, weights, _ = make_case(*case, dtype=torch.bfloat16)
    static = [x.clone(), ids.clone(), weights.clone()]
    with torch.no_grad():
        capture_warm(lambda: mt.fused_moe(static[0], w1, w2, static[1], static[2]))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = mt.fused_moe(static[0], w1, w2, static[1], static[2])
        for seed in (1, 2):
            x2, _, _, ids2, weights2, _ = make_case(*case, dtype=torch.bfloat16, seed=seed)
            for dst, src in zip(static, (x2, ids2, weights2)):
                dst.copy_(src)
            graph.replay()
            want = mt.fused_moe(x2, w1, w2, ids2, weights2)
            assert errors(static_out, want)[0] <= 1e-3


def test_cuda_graph_of_forward_and_backward():
    case = CASES[1]
    x, w1, w2, ids, weights, d_out = make_case(*case, dtype=torch.bfloat16)
    experts = mt.MoEExperts(8, 256, 128, device="cuda", dtype=torch.bfloat16)
    eager = mt.MoEExperts(8, 256, 128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for m in (experts, eager):
            m.gate_up_proj.copy_(w1)
            m.down_proj.copy_(w2)
    sample = (x.clone().requires_grad_(), ids.clone(), weights.clone().requires_grad_())
    graphed = torch.cuda.make_graphed_callables(experts, sample)
    for seed in (3, 4):
        x2, _, _, ids2, weights2, d2 = make_case(*case, dtype=torch.bfloat16, seed=seed)
        results = []
        for module in (graphed, eager):
            module.zero_grad(set_to_none=True)
            xs, ws = x2.clone().requires_grad_(), weights2.clone().requires_grad_()
            out = module(xs, ids2, ws)
            out.backward(d2)
            results.append([out.detach(), xs.grad, ws.grad, module.gate_up_proj.grad, module.down_proj.grad])
        for name, g, w in zip(["out", "dx", "d topk_weights", "dW1", "dW2"], *results):
            assert errors(g, w)[0] <= 1e-2, name


def test_capturing_before_a_plan_exists_asks_for_a_warm_up():
    x, w1, w2, ids, weights, _ = make_case(33, 8, 256, 128, 2, dtype=torch.bfloat16)  # a problem not yet planned
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(moejit.StateError, match="run the op once before capturing"):
        with torch.no_grad(), torch.cuda.graph(graph):
            mt.fused_moe(x, w1, w2, ids, weights)


def test_a_subclass_weight_takes_the_custom_op():
    # The eager path called data_ptr() on it, which a wrapper without storage refuses; the custom
    # op hands the subclass the call, and this one runs it on its inner tensor: the same bits.
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)

    def step(wrap):
        xs, ws = x.detach().requires_grad_(), weights.detach().requires_grad_()
        out = mt.fused_moe(xs, wrap(w1), w2, ids, ws)
        out.backward(d_out)
        return out.detach(), xs.grad, ws.grad

    for name, got, want in zip(("out", "dx", "d topk_weights"), step(PassThrough), step(lambda t: t)):
        assert torch.equal(got, want), name


def test_torch_func_vmap_runs_and_grad_is_refused_by_name():
    # Both met the eager path's autograd.Function, which functorch refuses for want of setup_context.
    x, w1, w2, ids, weights, _ = make_case(*CASES[1], dtype=torch.bfloat16)
    batch = torch.stack([x, x.flip(0)])
    with torch.no_grad():
        got = torch.func.vmap(lambda x: mt.fused_moe(x, w1, w2, ids, weights))(batch)
        want = torch.stack([mt.fused_moe(b, w1, w2, ids, weights) for b in batch])
    assert torch.equal(got, want)
    with pytest.raises(moejit.UnsupportedError, match="torch.func's grad"):
        torch.func.grad(lambda w1: mt.fused_moe(x, w1, w2, ids, weights).float().sum())(w1)


def test_torch_compile_with_a_data_dependent_token_count():
    # An expert-parallel rank's token count comes from .item(): T is unbacked, and may be 0, when
    # the op itself answers (no library call; `saved` of the size the fake gave, which inductor checks).
    x, w1, w2, ids, weights, d_out = make_case(*CASES[1], dtype=torch.bfloat16)

    def layer(count, x, w1, w2, ids, weights):
        t = count.item()
        torch._check(t >= 0)
        torch._check(t <= x.shape[0])
        return mt.fused_moe(x[:t], w1, w2, ids[:t], weights[:t])

    def step(fn, t):
        leaves = [w.detach().requires_grad_() for w in (w1, w2)]
        out = fn(torch.tensor(t), x, leaves[0], leaves[1], ids, weights)
        out.backward(d_out[:t])
        return [out.detach()] + [w.grad for w in leaves]

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for t in (37, 0, 512):
            for name, got, want in zip(("out", "dW1", "dW2"), step(compiled, t), step(layer, t)):
                assert torch.equal(got, want) or errors(got, want)[1] <= 1e-3, (t, name)
