"""The moejit custom ops (torch.library): opaque to torch.compile and CUDA graphs.

  moejit::fused_moe_forward(x, W1, W2, topk_ids, topk_weights, plan_mode, check_expert_ids) -> (out, saved)
  moejit::fused_moe_backward(d_out, x?, W1, W2, topk_weights, saved, ..., weight_grads)
      -> (dx, dW1, dW2, ds); without weight_grads (frozen experts) dW1 and dW2 are empty and not computed,
      and x may be None. No topk_ids: the library reads the routing from `saved`.
  moejit::fused_moe_backward_consuming: the same for the memory-efficient mode, whose backward
      overwrites `saved` (declared as a mutation so the compiler never reuses it). Each op refuses
      the other's mode, so that what it declares of `saved` holds.

EagerFusedMoe runs the same bodies without the custom-op dispatch, for eager calls on plain CUDA
tensors. A tensor subclass (DTensor, a quantized weight) takes the custom ops, whose dispatch hands
it the call: it runs the op on its parts or raises its own error naming the op (DTensor: "does not
have a sharding strategy registered"; a mix with plain tensors: "got mixed torch.Tensor and DTensor").

`saved` is the library's forward state for backward, a uint8 tensor of the plan's saved_bytes;
every buffer comes from PyTorch's caching allocator and every launch goes to the current stream.
Inputs must already be converted (functional.fused_moe does that); the op bodies refuse, from
metadata alone, what the library cannot see behind its raw pointers (_checked_problem).
"""

import threading
from typing import Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _layout, _library
from ..errors import InvalidArgumentError, NoDeviceError, StateError
from . import plans

TRAIN, INFER, MEMEFF = (_library.MODES[m] for m in ("train", "infer", "memeff"))
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def problem_of(x, gate_up_proj, topk, plan_mode, check_expert_ids):
    """x: any [T, H] tensor of x's dtype (the backward's d_out); topk: any [T, K] tensor."""
    return _library.make_problem(x.shape[0], gate_up_proj.shape[0], x.shape[1], gate_up_proj.shape[1] // 2,
                                 topk.shape[1], DTYPES[x.dtype], plan_mode, check_expert_ids)


def _refuse(op, message):
    raise InvalidArgumentError(f"{op}: {message}", status="invalid_argument")


def _checked_problem(op, x, gate_up_proj, down_proj, topk_weights, plan_mode, check_expert_ids, topk_ids=None,
                     x_in=None, saved=None):
    """The call's problem, once what the library cannot see behind its raw pointers is refused: a
    dtype, stride, device or shape it would misread, or read or write past a buffer by. fused_moe
    checks its own calls, but the custom ops can be called directly. Metadata only: this runs on
    every call. x is the forward's x or the backward's d_out; topk_ids come with a forward,
    x_in (the backward's x, if any) and saved with a backward."""
    rows = "x" if saved is None else "d_out"
    dtype, device = x.dtype, x.device
    if dtype not in DTYPES:
        _refuse(op, f"{rows} must be bfloat16 or float16, got {dtype}")
    for name, t, dims, want in ((rows, x, 2, dtype), ("gate_up_proj", gate_up_proj, 3, dtype),
                                ("down_proj", down_proj, 3, dtype), ("topk_weights", topk_weights, 2, dtype),
                                ("topk_ids", topk_ids, 2, torch.int32), ("x", x_in, 2, dtype),
                                ("saved", saved, None, torch.uint8)):
        if t is None:
            continue
        if t.dtype != want:
            _refuse(op, f"{name} is {t.dtype}, expected {want}" + (f" ({rows}'s dtype)" if want == dtype else ""))
        if dims is not None and t.dim() != dims:
            _refuse(op, f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            _refuse(op, f"{name} must be contiguous")
        if t.device != device:
            _refuse(op, f"{name} is on {t.device}, {rows} on {device}: all tensors must be on one device")
    tokens, hidden = x.shape
    experts, two_i, w1_hidden = gate_up_proj.shape
    if two_i % 2 or w1_hidden != hidden or tuple(down_proj.shape) != (experts, hidden, two_i // 2):
        _refuse(op, f"gate_up_proj {tuple(gate_up_proj.shape)} and down_proj {tuple(down_proj.shape)} must be "
                    f"[E, 2I, H] and [E, H, I] with H = {hidden} ({rows}.shape[1])")
    if topk_weights.shape[0] != tokens or (topk_ids is not None and topk_ids.shape != topk_weights.shape):
        ids = "" if topk_ids is None else f" and topk_ids {tuple(topk_ids.shape)}"
        _refuse(op, f"topk_weights {tuple(topk_weights.shape)}{ids} must be [T, K] with T = {tokens} "
                    f"({rows}.shape[0])")
    if x_in is not None and x_in.shape != x.shape:
        _refuse(op, f"x {tuple(x_in.shape)} must have d_out's shape {tuple(x.shape)}")
    problem = problem_of(x, gate_up_proj, topk_weights, plan_mode, check_expert_ids)
    # A T of 0 reaches no library call (see _forward), and the library sizes no empty problem.
    if saved is not None and tokens:
        need = _library.problem_memory(problem).saved_bytes
        # Exactly: every state (a forward's, save_on_cpu's copy, AOTAutograd's) has its problem's
        # size, and a larger one adopted as a copy would be read with this problem's layout.
        if saved.numel() != need:
            _refuse(op, f"saved holds {saved.numel()} bytes, this problem's state {need}: it is not this "
                        "problem's forward state")
    return problem


def _aligned(t):
    """t, or a copy where its data is not 16-byte aligned (a view into a larger buffer): the
    library's vector paths need it, and an activation or gradient can arrive offset. Inside the
    op bodies only, where tensors are real: torch.compile cannot trace data_ptr()."""
    return t.clone() if t.data_ptr() % 16 else t


def _bytes(n, device):
    return torch.empty(n, dtype=torch.uint8, device=device)


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def _forward(x: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, topk_ids: torch.Tensor,
             topk_weights: torch.Tensor, plan_mode: int, check_expert_ids: bool) -> tuple[torch.Tensor, torch.Tensor]:
    problem = _checked_problem("moejit::fused_moe_forward", x, gate_up_proj, down_proj, topk_weights, plan_mode,
                               check_expert_ids, topk_ids=topk_ids)
    device = x.device
    if x.shape[0] == 0:
        # Only from torch.compile with a data-dependent T (fused_moe answers 0 tokens itself
        # otherwise): the library takes no empty problem, and `saved` has the fake's size.
        saved = _bytes(_layout.saved_bytes(0, gate_up_proj.shape[0], gate_up_proj.shape[1] // 2, topk_ids.shape[1],
                                           plan_mode == INFER), device)
        return torch.empty_like(x), saved
    x = _aligned(x)
    with torch.cuda.device(device):
        plan = plans.plan_for(problem, device)
        m = plan.memory
        out = torch.empty_like(x)
        saved = _bytes(m.saved_bytes, device)
        workspace = _bytes(m.forward_workspace_bytes, device)
        plan.forward(x.data_ptr(), gate_up_proj.data_ptr(), down_proj.data_ptr(), topk_ids.data_ptr(),
                     topk_weights.data_ptr(), out.data_ptr(), saved.data_ptr(), m.saved_bytes, workspace.data_ptr(),
                     m.forward_workspace_bytes, _stream(device))
    if plan_mode != INFER:  # inference writes no state
        _wrote(saved)
    return out, saved


fused_moe_forward = torch.library.custom_op("moejit::fused_moe_forward", _forward, mutates_args=(),
                                            device_types="cuda")


@fused_moe_forward.register_fake
def _forward_fake(x, gate_up_proj, down_proj, topk_ids, topk_weights, plan_mode, check_expert_ids):
    dims = (x.shape[0], gate_up_proj.shape[0], x.shape[1], gate_up_proj.shape[1], topk_ids.shape[1])
    if all(isinstance(d, int) for d in dims) and dims[0] > 0:
        problem = _checked_problem("moejit::fused_moe_forward", x, gate_up_proj, down_proj, topk_weights, plan_mode,
                                   check_expert_ids, topk_ids=topk_ids)
        saved_bytes = _library.problem_memory(problem).saved_bytes
    else:
        # Symbolic dimensions (dynamic shapes), or a T of 0 (see _forward): the library's layout as
        # arithmetic on SymInts, so the size stays an expression of T, also an unbacked T. An
        # unbacked size (ctx.new_dynamic_size) would make inductor run the op between its
        # CUDA-graph partitions, and cudagraph trees then reject its outputs ("storage data ptrs
        # are not allocated in pool"; docs/python.md, Tests).
        saved_bytes = _layout.saved_bytes(x.shape[0], gate_up_proj.shape[0], gate_up_proj.shape[1] // 2,
                                          topk_ids.shape[1], plan_mode == INFER)
    return torch.empty_like(x), x.new_empty(saved_bytes, dtype=torch.uint8)


_ONE_BACKWARD = ("moejit: memory_efficient=True allows one backward per forward (it consumes the saved state); run the "
                 "forward again, or use memory_efficient=False to backward twice")

# The saved states this front end knows of, by storage: those its forwards wrote, which the
# library recorded at their address, and those a memory-efficient backward consumed. A weak
# reference keeps the storage's identity, not its memory: a new storage at a known one's address
# is another state, and one brought back from the host (save_on_cpu) is a new storage. Autograd
# runs each device's backward on a thread of its own, and the library calls release the GIL.
_states = {}
_states_lock = threading.Lock()
_states_cleanup_at = [1024]  # the size that next drops the entries of freed storages


class _State:
    # written: the data address a forward wrote the state at (None: none did). A storage keeps its
    # identity when resized (an offloader's resize_(0), then resize_(n) and a refill), not its
    # address, and the library's record goes by address.
    __slots__ = ("ref", "written", "consumed")

    def __init__(self, ref):
        self.ref, self.written, self.consumed = ref, None, False


def _state_locked(ref):
    """The entry of ref's storage, made where it has none; under _states_lock."""
    state = _states.get(ref.cdata)
    if state is None or state.ref.expired():
        if len(_states) >= _states_cleanup_at[0]:
            for key in [k for k, s in _states.items() if s.ref.expired()]:
                del _states[key]
            _states_cleanup_at[0] = max(1024, 2 * len(_states))
        state = _states[ref.cdata] = _State(ref)
    return state


def _wrote(saved):
    """A forward wrote its state into saved, and the library recorded it at saved's address."""
    ref = StorageWeakRef(saved.untyped_storage())
    with _states_lock:
        _state_locked(ref).written = saved.data_ptr()


def _claim(saved, consume):
    """Whether a backward adopts saved (moejit_plan_adopt_saved). Not a state a forward wrote into
    this storage at this address, still alive: the library's record of its address is that forward's, and the
    library checks it (problem, completeness, consumption). Any other is a copy (save_on_cpu's,
    AOTAutograd's, a storage resized and so moved), which the library would judge by
    its address's past. consume: marks the state consumed first, refusing one already consumed,
    so that of two backwards given one state one runs."""
    ref = StorageWeakRef(saved.untyped_storage())
    with _states_lock:
        if consume:
            state = _state_locked(ref)
            if state.consumed:
                raise StateError(_ONE_BACKWARD, status="state")
            state.consumed = True
        else:
            state = _states.get(ref.cdata)
            if state is not None and state.ref.expired():
                state = None
        return state is None or state.written != saved.data_ptr()


def _unclaim(saved):
    """Undoes _claim's consumption, for a call the library refused before reaching the state."""
    with _states_lock:
        state = _states.get(StorageWeakRef(saved.untyped_storage()).cdata)
        if state is not None:
            state.consumed = False


def _is_consumed(saved):
    try:
        key = StorageWeakRef(saved.untyped_storage()).cdata
    except Exception:  # a tensor without a storage of its own (tracing): take it as consumed
        return True
    with _states_lock:
        state = _states.get(key)
        return state is not None and state.consumed and not state.ref.expired()


# What the library raises only before its backward reaches the saved state
# (src/moe/fused_moe.cpp, FusedMoe::backward: validation, context and stream checks, then
# SavedStates::use, which refuses before it consumes). From there on a launch fails with a
# CudaError or OutOfMemoryError, the state already overwritten; a CudaError from a driver query
# before it counts as consumed too, the safe side.
_REFUSED_BEFORE_THE_STATE = (InvalidArgumentError, StateError, NoDeviceError)


def _weight_grad_buffers(gate_up_proj, down_proj, weight_grads):
    if weight_grads:
        return torch.empty_like(gate_up_proj), torch.empty_like(down_proj)
    return gate_up_proj.new_empty(0), down_proj.new_empty(0)


def _backward(d_out: torch.Tensor, x: Optional[torch.Tensor], gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
              topk_weights: torch.Tensor, saved: torch.Tensor, plan_mode: int, check_expert_ids: bool,
              weight_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    problem = _checked_problem("moejit::fused_moe_backward", d_out, gate_up_proj, down_proj, topk_weights, plan_mode,
                               check_expert_ids, x_in=x, saved=saved)
    device = d_out.device
    if d_out.shape[0] == 0:  # see _forward: no library call, and zero weight gradients
        if plan_mode == MEMEFF:
            _claim(saved, consume=True)
        dw1, dw2 = (torch.zeros_like(gate_up_proj), torch.zeros_like(down_proj)) if weight_grads else \
            _weight_grad_buffers(gate_up_proj, down_proj, False)
        return d_out.new_empty(d_out.shape), dw1, dw2, torch.empty_like(topk_weights)
    d_out = _aligned(d_out)
    x = None if x is None else _aligned(x)
    with torch.cuda.device(device):
        plan = plans.plan_for(problem, device)
        m = plan.memory
        dx, d_topk_weights = d_out.new_empty(d_out.shape), torch.empty_like(topk_weights)
        dw1, dw2 = _weight_grad_buffers(gate_up_proj, down_proj, weight_grads)
        workspace = _bytes(m.backward_workspace_bytes, device)
        # Consumed from here on, even if the call fails part-way (as the library counts it),
        # unless the library refuses it before reaching the state.
        adopt = _claim(saved, consume=plan_mode == MEMEFF)
        # Null weight-gradient pointers: the library skips dW1 and dW2 and what only they need,
        # x included (None without weight_grads). Null ids: it reads the routing from `saved`.
        try:
            plan.backward(d_out.data_ptr(), None if x is None else x.data_ptr(), gate_up_proj.data_ptr(),
                          down_proj.data_ptr(), None, topk_weights.data_ptr(), saved.data_ptr(), saved.numel(),
                          dx.data_ptr(), dw1.data_ptr() if weight_grads else None,
                          dw2.data_ptr() if weight_grads else None, d_topk_weights.data_ptr(), workspace.data_ptr(),
                          m.backward_workspace_bytes, _stream(device), adopt_saved=adopt)
        except _REFUSED_BEFORE_THE_STATE:
            if plan_mode == MEMEFF:
                _unclaim(saved)
            raise
    return dx, dw1, dw2, d_topk_weights


def _backward_fake(d_out, x, gate_up_proj, down_proj, topk_weights, saved, plan_mode, check_expert_ids, weight_grads):
    dw1, dw2 = _weight_grad_buffers(gate_up_proj, down_proj, weight_grads)
    return d_out.new_empty(d_out.shape), dw1, dw2, torch.empty_like(topk_weights)


def _backward_reading(d_out: torch.Tensor, x: Optional[torch.Tensor], gate_up_proj: torch.Tensor,
                      down_proj: torch.Tensor, topk_weights: torch.Tensor, saved: torch.Tensor, plan_mode: int,
                      check_expert_ids: bool,
                      weight_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_moe_backward's body: it declares `saved` unchanged, so the compiler may reuse it; a
    memory-efficient backward overwrites it."""
    if plan_mode == MEMEFF:
        _refuse("moejit::fused_moe_backward", "a memory-efficient state is overwritten by its backward: call "
                                              "moejit::fused_moe_backward_consuming, which declares it")
    return _backward(d_out, x, gate_up_proj, down_proj, topk_weights, saved, plan_mode, check_expert_ids,
                     weight_grads)


def _backward_consuming(d_out: torch.Tensor, x: Optional[torch.Tensor], gate_up_proj: torch.Tensor,
                        down_proj: torch.Tensor, topk_weights: torch.Tensor, saved: torch.Tensor, plan_mode: int,
                        check_expert_ids: bool,
                        weight_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_moe_backward_consuming's body: it declares `saved` consumed, which only the
    memory-efficient mode's backward does."""
    if plan_mode != MEMEFF:
        _refuse("moejit::fused_moe_backward_consuming", "only a memory-efficient state is consumed by its backward: "
                                                        "call moejit::fused_moe_backward")
    return _backward(d_out, x, gate_up_proj, down_proj, topk_weights, saved, plan_mode, check_expert_ids,
                     weight_grads)


fused_moe_backward = torch.library.custom_op("moejit::fused_moe_backward", _backward_reading, mutates_args=(),
                                             device_types="cuda")
fused_moe_backward.register_fake(_backward_fake)
fused_moe_backward_consuming = torch.library.custom_op("moejit::fused_moe_backward_consuming", _backward_consuming,
                                                       mutates_args=("saved",), device_types="cuda")
fused_moe_backward_consuming.register_fake(_backward_fake)


def _setup_context(ctx, inputs, output):
    x, gate_up_proj, down_proj, topk_ids, topk_weights, plan_mode, check_expert_ids = inputs
    ctx.mode, ctx.check_expert_ids = plan_mode, check_expert_ids
    # The saved state (uint8) has no gradient; materialized, it would be a zeros tensor of its
    # size per backward (~0.24 ms at T=32768 on the H200).
    ctx.set_materialize_grads(False)
    # Kept no longer than backward reads them: not topk_ids (the routing is in the saved state),
    # so the caller may refill its ids buffer before backward; x only for the weight gradients,
    # so frozen experts keep no T x H activation. One weight needing its gradient computes both
    # (the library takes both or neither).
    ctx.weight_grads = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    ctx.save_for_backward(x if ctx.weight_grads else None, gate_up_proj, down_proj, topk_weights, output[1])


def _autograd_backward(ctx, d_out, _d_saved, eager=False):
    if ctx.mode == INFER:
        raise StateError("moejit: this forward ran in inference mode (no input required grad), it has no backward",
                         status="state")
    # Asked before ctx.saved_tensors, whose version check would otherwise answer a second
    # backward with autograd's generic in-place error.
    if ctx.mode == MEMEFF and getattr(ctx, "consumed", False):
        raise StateError(_ONE_BACKWARD, status="state")
    x, gate_up_proj, down_proj, topk_weights, saved = ctx.saved_tensors
    if d_out is None:  # out took no part in what is differentiated
        return None, None, None, None, None, None, None
    op = _backward if eager else fused_moe_backward_consuming if ctx.mode == MEMEFF else fused_moe_backward
    needs = ctx.needs_input_grad
    # Frozen experts skip the weight-gradient GEMMs.
    try:
        dx, dw1, dw2, ds = op(d_out.contiguous(), x, gate_up_proj, down_proj, topk_weights, saved, ctx.mode,
                              ctx.check_expert_ids, ctx.weight_grads)
    except BaseException:
        # A call that failed part-way consumed the state too (_backward marks it before the
        # library runs), and a retry must not run on what it overwrote; one that failed before
        # (out of memory for its buffers, or refused by the library's checks) left it whole.
        ctx.consumed = ctx.mode == MEMEFF and _is_consumed(saved)
        raise
    ctx.consumed = True
    return (dx if needs[0] else None, dw1 if needs[1] else None, dw2 if needs[2] else None, None,
            ds if needs[4] else None, None, None)


fused_moe_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


class EagerFusedMoe(torch.autograd.Function):
    """The op bodies under a plain autograd.Function, for eager calls on CUDA tensors: the custom
    ops' dispatch and autograd registration cost the host about 0.28 ms more per forward +
    backward on the H200 machine (0.99 ms against 0.71, bench/host_overhead.py; performance log,
    session 31). torch.compile, meta and fake tensors take the custom ops: the compiler cannot
    trace into this (it reads data pointers)."""

    @staticmethod
    def forward(ctx, x, gate_up_proj, down_proj, topk_ids, topk_weights, plan_mode, check_expert_ids):
        inputs = (x, gate_up_proj, down_proj, topk_ids, topk_weights, plan_mode, check_expert_ids)
        out, saved = _forward(*inputs)
        _setup_context(ctx, inputs, (out, saved))
        return out

    @staticmethod
    def backward(ctx, d_out):
        grads = _autograd_backward(ctx, d_out, None, eager=True)
        if not torch.is_grad_enabled():  # create_graph=False: nothing differentiates them again
            return grads
        return tuple(None if g is None else _NoSecondOrder.apply(g.detach().requires_grad_()) for g in grads)


class _NoSecondOrder(torch.autograd.Function):
    """A first-order gradient of the fused op, as is; differentiating it again raises. The op has
    no second-order formula, and a plain tensor there would count its part of a gradient penalty
    as zero (once_differentiable only guards where the incoming gradient requires grad)."""

    @staticmethod
    def forward(ctx, grad):
        return grad.view_as(grad)

    @staticmethod
    def backward(ctx, _):
        raise RuntimeError("moejit.torch.fused_moe has no double backward (no second-order formula)")
