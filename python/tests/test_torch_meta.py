# The PyTorch front end without a GPU: op registration, input checks, fake (meta) shapes through
# autograd and torch.compile tracing, and the HF experts drop-in on the meta device.
import collections
import contextlib
import functools
import re
import sys
import threading
import time
import types
import unittest.mock

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import moejit  # noqa: E402
import moejit.torch as mt  # noqa: E402
from moejit import _library  # noqa: E402
from moejit.torch import functional, ops, plans  # noqa: E402
from wrapper_tensor import RefusesMoejit  # noqa: E402

E, H, I, K = 8, 128, 64, 2


def meta_inputs(t, requires_grad=True, dtype=torch.bfloat16):
    x = torch.empty(t, H, device="meta", dtype=dtype, requires_grad=requires_grad)
    w1 = torch.empty(E, 2 * I, H, device="meta", dtype=dtype, requires_grad=requires_grad)
    w2 = torch.empty(E, H, I, device="meta", dtype=dtype, requires_grad=requires_grad)
    ids = torch.empty(t, K, device="meta", dtype=torch.int64)
    weights = torch.empty(t, K, device="meta", dtype=torch.float32, requires_grad=requires_grad)
    return x, w1, w2, ids, weights


def test_out_of_memory_is_torchs_too():
    # A training loop's `except torch.OutOfMemoryError` (torch.cuda's before 2.5) catches moejit's,
    # from the library's status as from the primary-context calls the front end makes itself.
    from moejit.torch import _context

    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        _library.check(10, "moejit_forward")
    assert isinstance(info.value, moejit.OutOfMemoryError) and info.value.status == "out_of_memory"
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        _context._check(2, "cuDevicePrimaryCtxRetain")  # CUDA_ERROR_OUT_OF_MEMORY
    assert isinstance(info.value, moejit.OutOfMemoryError) and info.value.function == "cuDevicePrimaryCtxRetain"
    with pytest.raises(moejit.CudaError) as info:
        _context._check(1, "cuDeviceGet")
    assert not isinstance(info.value, MemoryError)


def test_ops_are_registered():
    for name in ("fused_moe_forward", "fused_moe_backward", "fused_moe_backward_consuming"):
        assert hasattr(torch.ops.moejit, name)
    schema = str(torch.ops.moejit.fused_moe_backward_consuming.default._schema)
    assert re.search(r"Tensor\(a\d*!\) saved", schema), schema
    # The backward takes no ids (the routing is in the saved state), and x only for the weight
    # gradients.
    for op in (torch.ops.moejit.fused_moe_backward, torch.ops.moejit.fused_moe_backward_consuming):
        schema = str(op.default._schema)
        assert "Tensor? x" in schema and "topk_ids" not in schema, schema


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_meta_forward_and_backward_shapes(memory_efficient):
    x, w1, w2, ids, weights = meta_inputs(64)
    out = mt.fused_moe(x, w1, w2, ids, weights, memory_efficient=memory_efficient)
    assert out.shape == (64, H) and out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and w2.grad.shape == w2.shape
    assert weights.grad.shape == weights.shape and weights.grad.dtype == torch.float32


def test_backward_materializes_no_gradient_for_the_saved_state():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Created(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.uint8 = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and result.dtype == torch.uint8:
                self.uint8.append(str(func))
            return result

    x, w1, w2, ids, weights = meta_inputs(64)
    out = mt.fused_moe(x, w1, w2, ids, weights)
    with Created() as created:
        out.float().sum().backward()
    assert created.uint8 == []  # a zeros tensor the size of the saved state costs HBM time per step
    assert x.grad.shape == x.shape


def test_fake_saved_state_has_the_library_size():
    # T=4000, whose 70 tiles take two 256-byte blocks a tile table, so the size depends on the tile
    # count: tests/unit/test_c_abi.cpp derives the figure.
    x, w1, w2, ids, weights = meta_inputs(4000)
    out, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids.int(), weights.bfloat16(), 0, False)
    assert saved.dtype == torch.uint8
    assert saved.numel() == 3 * 256 + 4 * 256 + 2 * 2 * 256 + 2 * 32000 + 8000 * 128 * 2 + 256
    _, nothing = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids.int(), weights.bfloat16(), 1, False)
    assert nothing.numel() == 0


def test_no_tokens_gives_empty_output_and_weight_grad_shapes():
    x, w1, w2, ids, weights = meta_inputs(0)
    out = mt.fused_moe(x, w1, w2, ids, weights)
    assert out.shape == (0, H)
    out.float().sum().backward()
    assert w1.grad.shape == w1.shape and w2.grad.shape == w2.shape and weights.grad.shape == weights.shape


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_frozen_experts_ask_for_no_weight_gradients(monkeypatch, memory_efficient):
    asked = []
    for name in ("fused_moe_backward", "fused_moe_backward_consuming"):
        op = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *args, op=op: asked.append(args[-1]) or op(*args))
    for frozen in (False, True):
        x, w1, w2, ids, weights = meta_inputs(16)
        w1.requires_grad_(not frozen)
        w2.requires_grad_(not frozen)
        out = mt.fused_moe(x, w1, w2, ids, weights, memory_efficient=memory_efficient)
        out.float().sum().backward()
        assert x.grad.shape == x.shape and weights.grad.shape == weights.shape
        assert (w1.grad is None) == frozen and (w2.grad is None) == frozen
    assert asked == [True, False]  # the op's weight_grads
    # The fake's weight gradients are empty when not asked for.
    x, w1, w2, ids, weights = meta_inputs(16, requires_grad=False)
    _, saved = torch.ops.moejit.fused_moe_forward(x, w1, w2, ids.int(), weights.bfloat16(), 0, False)
    for given_x in (x, None):  # frozen experts keep no x; dx takes d_out's shape
        grads = torch.ops.moejit.fused_moe_backward(x, given_x, w1, w2, weights.bfloat16(), saved, 0, False, False)
        assert [tuple(g.shape) for g in grads] == [(16, H), (0,), (0,), (16, K)]
        assert grads[0].dtype == x.dtype


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_backward_keeps_no_ids_and_x_only_for_weight_gradients(memory_efficient):
    # The routing comes from the saved state, and only the weight gradients read x: frozen
    # experts (LoRA, adapters) keep no [T, H] activation, and no backward keeps the ids.
    def saved_for_backward(train_experts):
        x, w1, w2, ids, weights = meta_inputs(64)
        w1.requires_grad_(train_experts)
        w2.requires_grad_(train_experts)
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
            out = mt.fused_moe(x, w1, w2, ids.int(), weights, memory_efficient=memory_efficient)
        out.float().sum().backward()
        assert x.grad.shape == x.shape and weights.grad.shape == weights.shape
        assert (w1.grad is not None) == train_experts
        return [(tuple(t.shape), t.dtype) for t in packed]

    frozen, trained = saved_for_backward(False), saved_for_backward(True)
    x_saved, ids_saved = ((64, H), torch.bfloat16), ((64, K), torch.int32)
    assert x_saved not in frozen and ids_saved not in frozen, frozen
    assert x_saved in trained and ids_saved not in trained, trained


@pytest.mark.parametrize("compiled", [False, True], ids=["custom_op", "compiled"])
def test_ids_refilled_in_place_before_backward(compiled):
    # Contiguous int32 ids reach the op as the caller's own tensor. The backward keeps none, so a
    # caller may refill that buffer before backward (the next micro-batch's routing, a
    # preallocated dispatch buffer) without autograd's "modified by an inplace operation".
    fused = mt.fused_moe
    if compiled:
        torch._dynamo.reset()
        from torch._dynamo.backends.common import aot_autograd
        fused = torch.compile(mt.fused_moe, backend=aot_autograd(fw_compiler=_boxed, bw_compiler=_boxed),
                              fullgraph=True)
    for memory_efficient in (False, True):
        x, w1, w2, ids, weights = meta_inputs(64)
        ids = ids.int()
        assert functional._ids_int32(ids, E) is ids
        out = fused(x, w1, w2, ids, weights, memory_efficient=memory_efficient)
        ids.add_(1)
        out.float().sum().backward()
        assert x.grad.shape == x.shape and w1.grad.shape == w1.shape and weights.grad.shape == weights.shape


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_traces_one_opaque_op(dynamic):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=_boxed, bw_compiler=_boxed)(gm, example_inputs)

    @torch.compile(backend=backend, fullgraph=True, dynamic=dynamic)
    def layer(x, w1, w2, ids, weights):
        return mt.fused_moe(x, w1, w2, ids, weights) * 2

    for t in (64, 100):
        x, w1, w2, ids, weights = meta_inputs(t)
        out = layer(x, w1, w2, ids, weights)
        out.float().sum().backward()
        assert out.shape == (t, H) and x.grad.shape == (t, H) and weights.grad.shape == (t, K)
    calls = [n for g in graphs for n in g.graph.nodes if n.op == "call_function" and "moejit" in str(n.target)]
    assert len(calls) == len(graphs) >= 1


def test_symbolic_token_count_keeps_the_saved_size_an_expression():
    # An unbacked size would make inductor run the op outside its CUDA-graph partitions, where
    # cudagraph trees reject the outputs (docs/python.md); the size must instead be an
    # expression of T that evaluates to the library's.
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    forwards = []

    def backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def forward_compiler(gm, example_inputs):
            forwards.extend(n for n in gm.graph.nodes if n.target is torch.ops.moejit.fused_moe_forward.default)
            return _boxed(gm, example_inputs)
        return aot_autograd(fw_compiler=forward_compiler, bw_compiler=_boxed)(gm, example_inputs)

    @torch.compile(backend=backend, fullgraph=True, dynamic=True)
    def layer(x, w1, w2, ids, weights):
        return mt.fused_moe(x, w1, w2, ids, weights)

    for t in (64, 100, 1000):
        layer(*meta_inputs(t)).float().sum().backward()
    assert forwards
    for node in forwards:
        out, saved = node.meta["val"]
        assert not node.meta.get("unbacked_bindings") and not free_unbacked_symbols(saved.shape[0])
        tokens = _hint(out.shape[0])  # the traced call's T
        assert _hint(saved.shape[0]) == _library.problem_memory(
            _library.make_problem(tokens, E, H, I, K)).saved_bytes


def _unbacked_inputs(requires_grad=False):
    """Fake inputs whose T is unbacked (a data-dependent size, as an expert-parallel rank's count
    from .item()), in a FakeTensorMode to enter, and that T."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        t = mode.shape_env.create_unbacked_symint()
        inputs = meta_inputs(t, requires_grad=requires_grad)
    return mode, t, inputs


def test_unbacked_token_count_keeps_the_saved_size_an_expression():
    # Any guard on an unbacked T raises GuardOnDataDependentSymNode: the saved size must be
    # computed without one, and be the library's at every T.
    mode, t, (x, w1, w2, ids, weights) = _unbacked_inputs()
    with mode:
        torch._check(t >= 1)
        sizes = {plan_mode: torch.ops.moejit.fused_moe_forward(x, w1, w2, ids.int(), weights.bfloat16(), plan_mode,
                                                               False)[1].shape[0]
                 for plan_mode in (ops.TRAIN, ops.INFER, ops.MEMEFF)}
    assert sizes[ops.INFER] == 0
    for tokens in (1, 3, 4, 5, 11, 12, 24, 25, 64, 100, 255, 256, 257, 1000, 4096, 33000):
        want = _library.problem_memory(_library.make_problem(tokens, E, H, I, K)).saved_bytes
        for plan_mode in (ops.TRAIN, ops.MEMEFF):
            assert int(sizes[plan_mode].node.expr.xreplace({t.node.expr: tokens})) == want, (tokens, plan_mode)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_fused_moe_takes_an_unbacked_token_count_that_may_be_zero(requires_grad):
    # No torch._check(T >= 1) here: whether T is 0 is unknown while tracing, so fused_moe takes it
    # as nonzero and the op answers a T of 0 itself (test_the_op_bodies_answer_zero_tokens).
    mode, t, (x, w1, w2, ids, weights) = _unbacked_inputs(requires_grad)
    with mode:
        assert mt.fused_moe(x, w1, w2, ids, weights).shape == x.shape


def test_a_data_dependent_token_count_compiles_and_runs_every_count():
    # torch's own stride rules guard on T >= 1 (a second graph for T = 0); nothing of moejit's does.
    def backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=_boxed, bw_compiler=_boxed)(gm, example_inputs)

    @torch.compile(backend=backend, fullgraph=True)
    def layer(count, x0, w1, w2, weights):
        t = count.item()  # the rows an expert-parallel exchange delivered
        x = torch.zeros(t, H, device="meta", dtype=torch.bfloat16) + x0
        ids = torch.zeros(t, K, device="meta", dtype=torch.int64)
        return mt.fused_moe(x, w1, w2, ids, weights.expand(t, K))

    _, w1, w2, _, _ = meta_inputs(1)
    x0 = torch.empty(1, H, device="meta", dtype=torch.bfloat16, requires_grad=True)
    weights = torch.empty(1, K, device="meta", requires_grad=True)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for t in (37, 0, 1000):
            out = layer(torch.tensor(t), x0, w1, w2, weights)
            out.float().sum().backward()
            assert out.shape == (t, H) and w1.grad.shape == w1.shape


def test_the_op_bodies_answer_zero_tokens(monkeypatch):
    # Reached only from torch.compile with a data-dependent T: the library takes no empty problem.
    # The bodies allocate and fill without touching CUDA, so CPU tensors show the values.
    def no_plan(*args):
        raise AssertionError("a plan was asked for zero tokens")

    monkeypatch.setattr(plans, "plan_for", no_plan)
    x, w1, w2, ids, weights = (torch.ones(t.shape, dtype=t.dtype) for t in meta_inputs(0, requires_grad=False))
    ids, weights = ids.int(), weights.bfloat16()
    for plan_mode in (ops.TRAIN, ops.INFER, ops.MEMEFF):
        out, saved = ops._forward(x, w1, w2, ids, weights, plan_mode, False)
        fake = torch.ops.moejit.fused_moe_forward(*(t.to("meta") for t in (x, w1, w2, ids, weights)), plan_mode, False)
        assert out.shape == (0, H) and saved.numel() == fake[1].numel()  # the size the fake promised
        grads = ops._backward(out, x, w1, w2, weights, saved, plan_mode, False, True)
        assert [tuple(g.shape) for g in grads] == [(0, H), tuple(w1.shape), tuple(w2.shape), (0, K)]
        assert not grads[1].any() and not grads[2].any()
        frozen = ops._backward(out, None, w1, w2, weights, saved, ops.TRAIN, False, False)
        assert [g.numel() for g in frozen[1:3]] == [0, 0]
    with pytest.raises(moejit.StateError, match="one backward per forward"):  # MEMEFF consumed its state
        ops._backward(out, x, w1, w2, weights, saved, ops.MEMEFF, False, True)


def test_each_backward_op_refuses_the_other_ops_mode():
    # fused_moe_backward declares saved unchanged, so the compiler may reuse it: a memory-efficient
    # backward, which overwrites it, is the consuming op's. Refused before anything else is read.
    args = (None,) * 6
    with pytest.raises(moejit.InvalidArgumentError, match="^moejit::fused_moe_backward: a memory-efficient state"):
        ops._backward_reading(*args, ops.MEMEFF, False, True)
    for plan_mode in (ops.TRAIN, ops.INFER):
        with pytest.raises(moejit.InvalidArgumentError, match="^moejit::fused_moe_backward_consuming: only a"):
            ops._backward_consuming(*args, plan_mode, False, True)


def _cpu_inputs(t, requires_grad=False):
    """CPU tensors as fused_moe hands them to the op bodies: int32 ids, weights in x's dtype."""
    x, w1, w2, weights = (torch.rand(shape).bfloat16().requires_grad_(requires_grad)
                          for shape in ((t, H), (E, 2 * I, H), (E, H, I), (t, K)))
    return x, w1, w2, torch.zeros(t, K, dtype=torch.int32), weights


def _no_plan(*args):
    raise AssertionError("a plan was asked for")


def test_the_op_bodies_refuse_what_the_library_cannot_see(monkeypatch):
    # The custom ops can be called directly, with tensors fused_moe never saw: the library reads
    # raw pointers, so a dtype, stride or shape it would misread is refused before any plan.
    monkeypatch.setattr(plans, "plan_for", _no_plan)
    x, w1, w2, ids, weights = _cpu_inputs(64)
    forward = dict(x=x, gate_up_proj=w1, down_proj=w2, topk_ids=ids, topk_weights=weights)
    need = _library.problem_memory(ops.problem_of(x, w1, ids, ops.TRAIN, False)).saved_bytes
    backward = dict(d_out=x, x=x, gate_up_proj=w1, down_proj=w2, topk_weights=weights,
                    saved=torch.empty(need, dtype=torch.uint8))

    def refused(match, body, args, **changed):
        with pytest.raises(moejit.InvalidArgumentError, match=match):
            body(**dict(args, **changed), plan_mode=ops.TRAIN, check_expert_ids=False,
                 **({} if body is ops._forward else {"weight_grads": True}))

    fwd = functools.partial(refused, body=ops._forward, args=forward)
    bwd = functools.partial(refused, body=ops._backward, args=backward)
    fwd("^moejit::fused_moe_forward: x must be bfloat16 or float16, got torch.float32", x=x.float())
    fwd(r"down_proj is torch.float16, expected torch.bfloat16 \(x's dtype\)", down_proj=w2.half())
    fwd("topk_weights is torch.float32", topk_weights=weights.float())
    fwd("topk_ids is torch.int64, expected torch.int32", topk_ids=ids.long())
    fwd("topk_ids must be contiguous", topk_ids=ids.t().contiguous().t())
    fwd("x must be contiguous", x=torch.cat([x, x], 1)[:, ::2])
    fwd(r"gate_up_proj \(8, 128, 128\) and down_proj \(8, 64, 128\) must be \[E, 2I, H\] and \[E, H, I\]",
        down_proj=w2.transpose(1, 2).contiguous())
    fwd(r"topk_weights \(64, 2\) and topk_ids \(32, 2\) must be \[T, K\]", topk_ids=ids[:32])
    fwd("gate_up_proj is on meta, x on cpu", gate_up_proj=w1.to("meta"))
    bwd("^moejit::fused_moe_backward: d_out must be bfloat16 or float16", d_out=x.float())
    bwd("saved is torch.float32, expected torch.uint8", saved=backward["saved"].view(torch.float32))
    bwd("saved must be contiguous", saved=torch.empty(2 * need, dtype=torch.uint8)[::2])
    bwd(f"saved holds {need - 256} bytes, this problem's state {need}", saved=backward["saved"][256:])
    bwd("saved is on meta", saved=backward["saved"].to("meta"))
    bwd(r"x \(32, 128\) must have d_out's shape \(64, 128\)", x=x[:32])
    # The fake says the same where its shapes are known (it met a bare KeyError for the dtype).
    with pytest.raises(moejit.InvalidArgumentError, match="x must be bfloat16 or float16"):
        torch.ops.moejit.fused_moe_forward(*(t.to("meta") for t in (x.float(), w1, w2, ids, weights)), ops.TRAIN,
                                           False)


class _StubPlan:
    """Stands in for plans.plan_for's plan: no kernels, the library's sizes, and the adopt_saved
    flag of each backward; a backward raises the next of `failures`, as the library would."""

    def __init__(self):
        self.adopted, self.failures = [], []

    def __call__(self, problem, device):
        self.memory = _library.problem_memory(problem)
        return self

    def forward(self, *args):
        pass

    def backward(self, *args, adopt_saved):
        self.adopted.append(adopt_saved)
        if self.failures:
            raise self.failures.pop(0)


def _stub_plan(monkeypatch):
    """The op bodies on CPU tensors, with a plan that runs nothing."""
    stub = _StubPlan()
    monkeypatch.setattr(plans, "plan_for", stub)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(ops, "_stream", lambda device: 0)
    return stub


def test_a_backward_adopts_only_a_state_no_forward_wrote_there(monkeypatch):
    # A forward's own state, its storage alive, is what the library recorded at that address:
    # the library checks it (problem, completeness, consumption). Adopted, a T=256 forward's state
    # passed with T=64 tensors ran the kernels out of bounds. Only a copy is adopted (save_on_cpu's,
    # AOTAutograd's, a cudagraph replay's output): no forward here wrote into its storage.
    stub_plan = _stub_plan(monkeypatch)
    x, w1, w2, ids, weights = _cpu_inputs(64)
    for mode in (ops.TRAIN, ops.MEMEFF):
        _, saved = ops._forward(x, w1, w2, ids, weights, mode, False)
        for state in (saved.clone(), saved):
            ops._backward(x, x, w1, w2, weights, state, mode, False, True)
    assert stub_plan.adopted == [True, False, True, False]
    # A storage that kept its identity but moved (an offloader's resize_(0), then resize_(n) and a
    # refill): the library's record of the new address is not that forward's, so it is adopted.
    _, saved = ops._forward(x, w1, w2, ids, weights, ops.TRAIN, False)
    storage, before = saved.untyped_storage(), saved.data_ptr()
    nbytes, keep = storage.nbytes(), []
    # Each freed block is taken by a tensor held here, so the storage's next one comes from
    # elsewhere: within a few rounds it has left the address its forward wrote.
    for _ in range(8):
        storage.resize_(0)
        keep.append(torch.empty(nbytes, dtype=torch.uint8))
        storage.resize_(nbytes)
        if saved.data_ptr() != before:
            break
    assert saved.data_ptr() != before
    ops._backward(x, x, w1, w2, weights, saved, ops.TRAIN, False, True)
    assert stub_plan.adopted[-1] is True


def test_a_memory_efficient_backward_refused_before_the_state_may_run_again(monkeypatch):
    # The library checks arguments, context and stream, then consumes the state, then launches:
    # a refusal by its checks leaves the state whole, a launch's failure leaves it overwritten.
    stub_plan = _stub_plan(monkeypatch)
    x, w1, w2, ids, weights = _cpu_inputs(64, requires_grad=True)
    out = ops.EagerFusedMoe.apply(x, w1, w2, ids, weights, ops.MEMEFF, False)
    stub_plan.failures = [moejit.InvalidArgumentError("stream: another context's (stand-in)"),
                          moejit.StateError("saved: another problem's (stand-in)")]
    for _ in range(2):
        with pytest.raises(moejit.MoejitError, match="stand-in"):
            out.backward(torch.ones_like(out), retain_graph=True)
    out.backward(torch.ones_like(out), retain_graph=True)
    with pytest.raises(moejit.StateError, match="one backward per forward"):
        out.backward(torch.ones_like(out))
    out = ops.EagerFusedMoe.apply(x, w1, w2, ids, weights, ops.MEMEFF, False)
    stub_plan.failures = [moejit.CudaError("a launch failed (stand-in)")]
    with pytest.raises(moejit.CudaError, match="stand-in"):
        out.backward(torch.ones_like(out), retain_graph=True)
    with pytest.raises(moejit.StateError, match="one backward per forward"):
        out.backward(torch.ones_like(out))
    assert stub_plan.adopted == [False] * 4


def test_only_plain_tensors_outside_torch_func_take_the_eager_path(monkeypatch):
    x, w1, w2, ids, weights = meta_inputs(16)
    # A subclass reaches the custom op, whose dispatch hands it the call: its own error, naming the op.
    with pytest.raises(NotImplementedError, match="does not run moejit.fused_moe_forward"):
        mt.fused_moe(x, RefusesMoejit(w1), w2, ids, weights)
    taken = []
    monkeypatch.setattr(ops.EagerFusedMoe, "apply", lambda *args: taken.append("eager") or args[0])
    monkeypatch.setattr(ops, "fused_moe_forward", lambda *args: taken.append("op") or (args[0], None))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # what else the eager path asks
    mt.fused_moe(x, torch.nn.Parameter(w1), w2, ids, weights)  # a Parameter is a plain tensor
    mt.fused_moe(x, RefusesMoejit(w1), w2, ids, weights)  # the eager path would read its data_ptr()
    torch.func.vmap(lambda x: mt.fused_moe(x, w1, w2, ids, weights))(x.detach()[None])  # looks plain
    assert taken == ["eager", "op", "op"]


def test_torch_func_grad_is_refused_by_name_and_vmap_runs():
    x, w1, w2, ids, weights = meta_inputs(16, requires_grad=False)
    for transform in (torch.func.grad, torch.func.jacrev):
        with pytest.raises(moejit.UnsupportedError, match="torch.func's grad"):
            transform(lambda w1: mt.fused_moe(x, w1, w2, ids, weights).float().sum())(w1)
    out = torch.func.vmap(lambda x: mt.fused_moe(x, w1, w2, ids, weights))(x[None].expand(3, 16, H))
    assert out.shape == (3, 16, H)


def _hint(size):
    """The concrete value behind a traced size (SymNode.require_hint before torch 2.15)."""
    from torch.fx.experimental import symbolic_shapes
    if hasattr(symbolic_shapes, "guarding_hint_or_throw"):
        return symbolic_shapes.guarding_hint_or_throw(size)
    return size.node.require_hint()


def _boxed(gm, example_inputs):
    from functorch.compile import make_boxed_func
    return make_boxed_func(gm.forward)


def _expect_invalid(match, *args, **kwargs):
    with pytest.raises(moejit.InvalidArgumentError, match=match):
        mt.fused_moe(*args, **kwargs)


def test_a_second_memory_efficient_backward_names_the_rule():
    x, w1, w2, ids, weights = meta_inputs(64)
    loss = mt.fused_moe(x, w1, w2, ids, weights, memory_efficient=True).float().sum()
    loss.backward(retain_graph=True)
    with pytest.raises(moejit.StateError, match="one backward per forward"):
        loss.backward()
    # The default mode keeps its saved state: a second backward runs.
    loss = mt.fused_moe(x, w1, w2, ids, weights).float().sum()
    loss.backward(retain_graph=True)
    loss.backward()


def test_autocast_casts_float32_inputs_and_returns_float32_gradients(monkeypatch):
    # CUDA autocast needs a CUDA build; what fused_moe asks of it is stood in for here.
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.bfloat16)
    x, w1, w2, ids, weights = meta_inputs(64, dtype=torch.float32)
    out = mt.fused_moe(x, w1, w2, ids, weights)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert w1.grad.dtype == torch.float32 and w2.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    # A non-tensor is named by the usual check, not met by the cast.
    with pytest.raises(moejit.InvalidArgumentError, match="x must be a torch.Tensor"):
        mt.fused_moe(None, w1, w2, ids, weights)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: False)
    with pytest.raises(moejit.InvalidArgumentError, match="bfloat16 or float16"):
        mt.fused_moe(*meta_inputs(64, dtype=torch.float32))


def test_no_tokens_under_autocast_leaves_the_weights_uncast(monkeypatch):
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.bfloat16)
    casts = []
    to = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        casts.append(tuple(self.shape))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    x, w1, w2, ids, weights = meta_inputs(0, dtype=torch.float32)
    out = mt.fused_moe(x, w1, w2, ids, weights)
    assert out.dtype == torch.bfloat16 and out.shape == (0, H)
    assert w1.shape not in casts and w2.shape not in casts, casts
    out.float().sum().backward()
    assert w1.grad.dtype == torch.float32 and w1.grad.shape == w1.shape and w2.grad.dtype == torch.float32
    # The weights are still checked: autocast leaves an integer weight as it is.
    with pytest.raises(moejit.InvalidArgumentError, match="gate_up_proj is torch.int32"):
        mt.fused_moe(x, w1.int(), w2, ids, weights)
    # With tokens they are cast, as F.linear casts them.
    x, w1, w2, ids, weights = meta_inputs(4, dtype=torch.float32)
    mt.fused_moe(x, w1, w2, ids, weights)
    assert w1.shape in casts and w2.shape in casts


def test_bad_inputs_raise_before_the_library():
    x, w1, w2, ids, weights = meta_inputs(16, requires_grad=False)
    _expect_invalid("x must have 2 dimensions", x[None], w1, w2, ids, weights)
    _expect_invalid("must be bfloat16 or float16", x.float(), w1, w2, ids, weights)
    _expect_invalid("gate_up_proj is torch.float16", x, w1.half(), w2, ids, weights)
    _expect_invalid("down_proj is", x, w1, w2[:, :, :32].contiguous(), ids, weights)
    _expect_invalid("gate_up_proj is", x, w1[:, :, :64].contiguous(), w2, ids, weights)
    _expect_invalid("even second dimension", x, w1[:, :127].contiguous(), w2, ids, weights)
    _expect_invalid("topk_ids must be an integer", x, w1, w2, ids.float(), weights)
    _expect_invalid("topk_weights must be a floating-point", x, w1, w2, ids, ids)
    _expect_invalid("must both be", x, w1, w2, ids[:8], weights[:8])
    _expect_invalid("must both be", x, w1, w2, ids, weights[:, :1])
    _expect_invalid("must be contiguous", x, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, ids, weights)
    _expect_invalid(r"top-k must be in \[1, E = 8\]", x, w1, w2, torch.empty(16, 9, device="meta", dtype=torch.int64),
                    torch.empty(16, 9, device="meta"))
    _expect_invalid("must be a torch.Tensor", None, w1, w2, ids, weights)
    cpu = [torch.zeros(t.shape, dtype=t.dtype) for t in (x, w1, w2, ids, weights)]
    _expect_invalid("must be on a CUDA device", *cpu)
    _expect_invalid("all tensors must be on one device", x, w1, w2, cpu[3], weights)


def test_wide_expert_ids_stay_out_of_range_as_int32():
    # A bare cast keeps the low 32 bits (2**32 + 1 would be routed to expert 1): wider ids are
    # clamped into [-1, E] first, on the tensor's device. In-range ids keep their value.
    wide = torch.tensor([[0, E - 1], [E, -1], [2**32 + 1, -2**32 + 2], [2**62, -2**63], [2**31, 2**32 + E]])
    assert wide.to(torch.int32)[2].tolist() == [1, 2]  # the defect the clamp is for
    ids = functional._ids_int32(wide, E)
    assert ids.dtype == torch.int32 and ids.is_contiguous()
    assert ids.tolist() == [[0, E - 1], [E, -1], [E, -1], [E, -1], [E, E]]
    assert functional._ids_int32(wide.t(), E).tolist() == ids.t().tolist()
    assert functional._ids_int32(torch.tensor([[3, 2**32 + 1]], dtype=torch.uint64), E).tolist() == [[3, E]]
    assert functional._ids_int32(torch.tensor([[3, 200]], dtype=torch.uint8), E).tolist() == [[3, 200]]
    narrow = torch.tensor([[3, 2**31 - 1], [-7, 9]], dtype=torch.int32)
    assert functional._ids_int32(narrow, E) is narrow  # int32 input: no copy, no kernel


class FakeHFExperts(torch.nn.Module):
    """The shape of transformers v5's Qwen3MoeExperts / MixtralExperts."""

    def __init__(self, num_experts, hidden_dim, intermediate_dim, act=torch.nn.SiLU):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.empty(num_experts, 2 * intermediate_dim, hidden_dim,
                                                           device="meta", dtype=torch.bfloat16))
        self.down_proj = torch.nn.Parameter(torch.empty(num_experts, hidden_dim, intermediate_dim, device="meta",
                                                        dtype=torch.bfloat16))
        self.act_fn = act()


class FakeBlock(torch.nn.Module):
    def __init__(self, act=torch.nn.SiLU):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False, device="meta")
        self.experts = FakeHFExperts(E, H, I, act)


def test_replace_experts_keeps_parameters_and_state_dict_keys():
    model = torch.nn.ModuleDict({"layer0": FakeBlock(), "layer1": FakeBlock(act=torch.nn.GELU)})
    before = dict(model.state_dict())
    params = {id(p) for p in model.parameters()}
    assert mt.replace_experts(model, memory_efficient=True) == ["layer0.experts"]
    assert isinstance(model["layer0"].experts, mt.MoEExperts)
    assert not isinstance(model["layer1"].experts, mt.MoEExperts)  # GELU experts are left alone
    assert model["layer0"].experts.memory_efficient
    assert list(model.state_dict()) == list(before)
    assert {id(p) for p in model.parameters()} == params
    hidden = torch.empty(2, 5, H, device="meta", dtype=torch.bfloat16)
    out = model["layer0"].experts(hidden, torch.empty(2, 5, K, device="meta", dtype=torch.int64),
                                  torch.empty(2, 5, K, device="meta", dtype=torch.bfloat16))
    assert out.shape == hidden.shape


def test_from_experts_says_why_not():
    with pytest.raises(ValueError, match="activation is GELU"):
        mt.MoEExperts.from_experts(FakeHFExperts(E, H, I, act=torch.nn.GELU))
    biased = FakeHFExperts(E, H, I)
    biased.gate_up_proj_bias = torch.nn.Parameter(torch.empty(E, 2 * I, device="meta"))
    with pytest.raises(ValueError, match="gate_up_proj_bias"):
        mt.MoEExperts.from_experts(biased)


def _default_apply_gate(self, gate_up_out):
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up


_default_apply_gate.__module__ = "transformers.integrations.moe"  # where transformers v5 defines it


class DecoratedHFExperts(FakeHFExperts):
    """What transformers v5's @use_experts_implementation makes of an experts class: flags on
    each instance, and its module's _default_apply_gate where the class defines no _apply_gate."""

    _apply_gate = _default_apply_gate

    def __init__(self, *args, **flags):
        super().__init__(*args)
        for name, value in {"is_concatenated": True, "is_transposed": False, "has_bias": False, "has_gate": True,
                            **flags}.items():
            setattr(self, name, value)


def _transformers_moe():
    """transformers.integrations.moe as a model using it has loaded it, with its default gate."""
    module = types.ModuleType(_default_apply_gate.__module__)
    module._default_apply_gate = _default_apply_gate
    return unittest.mock.patch.dict(sys.modules, {module.__name__: module})


class ClampedGateExperts(DecoratedHFExperts):
    def _apply_gate(self, gate_up_out):  # as gpt-oss clamps and scales its SwiGLU
        gate, up = gate_up_out.chunk(2, dim=-1)
        return torch.sigmoid(1.7 * gate.clamp(max=7)) * gate * (up.clamp(-7, 7) + 1)


def _refusal(experts):
    """from_experts' reason for refusing `experts` (None if it takes it), and whether
    replace_experts leaves a model holding it as it was."""
    model = torch.nn.ModuleDict({"layer": torch.nn.ModuleDict({"experts": experts})})
    left_alone = mt.replace_experts(model) == [] and model["layer"]["experts"] is experts
    try:
        mt.MoEExperts.from_experts(experts)
    except ValueError as e:
        return str(e), left_alone
    return None, left_alone


def test_experts_of_other_numerics_or_with_hooks_are_refused():
    hooked = [DecoratedHFExperts(E, H, I) for _ in range(5)]
    hooked[0].register_forward_hook(lambda module, args, out: out)
    hooked[1].register_forward_pre_hook(lambda module, args: None)
    hooked[2].register_full_backward_hook(lambda module, grad_in, grad_out: None)
    hooked[3].forward = lambda *args: None  # as accelerate's add_hook_to_module wraps it
    del hooked[4].gate_up_proj  # a buffer instead: from_experts raised TypeError on it, mid-replace_experts
    hooked[4].register_buffer("gate_up_proj", torch.empty(E, 2 * I, H, device="meta", dtype=torch.bfloat16))
    refused = {
        "is_concatenated=False": DecoratedHFExperts(E, H, I, is_concatenated=False),
        "is_transposed=True": DecoratedHFExperts(E, H, I, is_transposed=True),
        "has_bias=True": DecoratedHFExperts(E, H, I, has_bias=True),
        "has_gate=False": DecoratedHFExperts(E, H, I, has_gate=False),
        "_apply_gate .*ClampedGateExperts": ClampedGateExperts(E, H, I),
        "activation is gelu": DecoratedHFExperts(E, H, I, lambda: torch.nn.functional.gelu),
        "forward hooks": hooked[0],
        "forward pre-hooks": hooked[1],
        "backward hooks": hooked[2],
        "forward is replaced on the instance": hooked[3],
        "gate_up_proj is a Tensor, not an nn.Parameter": hooked[4],
    }
    with _transformers_moe():
        for why, experts in refused.items():
            reason, left_alone = _refusal(experts)
            assert reason is not None and re.search(why, reason), (why, reason)
            assert left_alone, why
        assert _refusal(DecoratedHFExperts(E, H, I)) == (None, False)  # the default gate and layout: taken
        # act_fn as a function, not a module
        assert _refusal(DecoratedHFExperts(E, H, I, lambda: torch.nn.functional.silu)) == (None, False)


def test_an_apply_gate_is_refused_where_the_default_is_unknown():
    # Without the module that defines it loaded, a function of that name is not transformers' default.
    reason, left_alone = _refusal(DecoratedHFExperts(E, H, I))
    assert "_apply_gate" in reason and left_alone


def test_replace_experts_swaps_all_blocks_or_none(monkeypatch):
    model = torch.nn.ModuleDict({"layer0": FakeBlock(), "layer1": FakeBlock()})
    before = [model["layer0"].experts, model["layer1"].experts]
    real = mt.MoEExperts.from_experts.__func__
    calls = []

    def second_fails(cls, experts, **kwargs):
        calls.append(experts)
        if len(calls) == 2:
            raise RuntimeError("stand-in failure")
        return real(cls, experts, **kwargs)

    monkeypatch.setattr(mt.MoEExperts, "from_experts", classmethod(second_fails))
    with pytest.raises(RuntimeError, match="stand-in"):
        mt.replace_experts(model)
    assert [model["layer0"].experts, model["layer1"].experts] == before


def test_experts_module_names_a_wrong_hidden_size():
    experts = mt.MoEExperts(E, H, I, device="meta", dtype=torch.bfloat16)
    states = torch.empty(2, 8, 2 * H, device="meta", dtype=torch.bfloat16)
    ids = torch.zeros(2, 8, K, device="meta", dtype=torch.int64)
    with pytest.raises(moejit.InvalidArgumentError, match="hidden_states .* must end in hidden_dim = 128"):
        experts(states, ids, torch.empty(2, 8, K, device="meta", dtype=torch.bfloat16))


def test_experts_module_refuses_routing_of_another_shape():
    # Flattened first, [S, B, K] ids for [B, S, H] states gave the same T and routed each token
    # with another token's experts; K = 0 met torch's reshape error.
    experts = mt.MoEExperts(E, H, I, device="meta", dtype=torch.bfloat16)
    states = torch.empty(2, 8, H, device="meta", dtype=torch.bfloat16)

    def routed(ids_shape, weights_shape=None):
        ids = torch.zeros(ids_shape, device="meta", dtype=torch.int64)
        return experts(states, ids, torch.empty(weights_shape or ids_shape, device="meta", dtype=torch.bfloat16))

    assert routed((2, 8, K)).shape == states.shape
    for ids_shape, weights_shape in (((8, 2, K), None), ((2, 8, 0), None), ((), None), ((16, K), None),
                                     ((2, 8, K), (2, 8, K + 1)), ((2, 8, K), (8, 2, K))):
        with pytest.raises(moejit.InvalidArgumentError, match=r"^moejit.torch.MoEExperts: top_k_index .* must both "
                                                               r"be \[..., K\] with K >= 1"):
            routed(ids_shape, weights_shape)


def test_plans_build_at_once_on_different_gpus_and_in_turn_on_one(monkeypatch):
    # GPUs 0-2 each get two threads asking for T=16, and GPU 0 a third asking for T=32. The three
    # GPUs' T=16 builds must meet at the barrier (a build on one GPU holding back another's would
    # break it); GPU 0's two builds, each held 0.3 s, must never overlap; each is built once.
    meeting = threading.Barrier(3, timeout=10)
    guard = threading.Lock()
    here = threading.local()
    built, active, overlapped = [], collections.Counter(), []

    class FakePlan:
        def __init__(self, problem):
            with guard:
                built.append((problem.tokens, here.gpu))
                active[here.gpu] += 1
                overlapped.append(active[here.gpu] > 1)
            if problem.tokens == 16:
                meeting.wait()
            time.sleep(0.3)
            with guard:
                active[here.gpu] -= 1

    monkeypatch.setattr(plans, "Plan", FakePlan)
    monkeypatch.setattr(plans, "_plans", {})
    monkeypatch.setattr(plans, "_device_locks", {})
    monkeypatch.setattr(plans._context, "make_current", lambda ordinal: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    asks = [(16, gpu) for gpu in (0, 1, 2) for _ in range(2)] + [(32, 0)]
    results = [None] * len(asks)

    def build(i):
        here.gpu = asks[i][1]
        try:
            results[i] = plans.plan_for(_library.make_problem(asks[i][0], E, H, I, K), torch.device("cuda", here.gpu))
        except Exception as e:  # reported below
            results[i] = e

    threads = [threading.Thread(target=build, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(r, FakePlan) for r in results), results
    assert sorted(built) == sorted(set(asks))
    assert not any(overlapped)
    assert results[0] is results[1] and results[2] is results[3] and results[4] is results[5]


def test_a_build_under_way_during_clear_plans_is_not_cached(monkeypatch):
    started, cleared = threading.Event(), threading.Event()

    class FakePlan:
        def __init__(self, problem):
            started.set()
            cleared.wait(10)

    monkeypatch.setattr(plans, "Plan", FakePlan)
    monkeypatch.setattr(plans, "_plans", {})
    monkeypatch.setattr(plans._context, "make_current", lambda ordinal: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    problem, device = _library.make_problem(16, E, H, I, K), torch.device("cuda", 0)
    result = []
    builder = threading.Thread(target=lambda: result.append(plans.plan_for(problem, device)))
    builder.start()
    assert started.wait(10)
    plans.clear_plans()
    cleared.set()
    builder.join(10)
    assert isinstance(result[0], FakePlan)  # the caller still gets its plan
    assert plans._plans == {}  # built under the old settings: the next call builds again
