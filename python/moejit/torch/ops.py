"""The moejit custom ops (torch.library): opaque to torch.compile and CUDA graphs.

  moejit::fused_moe_forward(x, W1, W2, topk_ids, topk_weights, plan_mode, check_expert_ids) -> (out, saved)
  moejit::fused_moe_backward(d_out, x?, W1, W2, topk_weights, saved, ..., weight_grads)
      -> (dx, dW1, dW2, ds); without weight_grads (frozen experts) dW1 and dW2 are empty and not computed,
      and x may be None. No topk_ids: the library reads the routing from `saved`.
  moejit::fused_moe_backward_consuming: the same for the memory-efficient mode, whose backward
      overwrites `saved` (declared as a mutation so the compiler never reuses it).

EagerFusedMoe runs the same bodies without the custom-op dispatch, for eager calls on plain CUDA
tensors. A tensor subclass (DTensor, a quantized weight) takes the custom ops, whose dispatch hands
it the call: it runs the op on its parts or raises its own error naming the op (DTensor: "does not
have a sharding strategy registered"; a mix with plain tensors: "got mixed torch.Tensor and DTensor").

`saved` is the library's forward state for backward, a uint8 tensor of the plan's saved_bytes;
every buffer comes from PyTorch's caching allocator and every launch goes to the current stream.
Inputs must already be checked and converted (functional.fused_moe does that).
"""

import threading
from typing import Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import _layout, _library
from ..errors import StateError
from . import plans

TRAIN, INFER, MEMEFF = (_library.MODES[m] for m in ("train", "infer", "memeff"))
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def problem_of(x, gate_up_proj, topk, plan_mode, check_expert_ids):
    """x: any [T, H] tensor of x's dtype (the backward's d_out); topk: any [T, K] tensor."""
    return _library.make_problem(x.shape[0], gate_up_proj.shape[0], x.shape[1], gate_up_proj.shape[1] // 2,
                                 topk.shape[1], DTYPES[x.dtype], plan_mode, check_expert_ids)


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
    device = x.device
    if x.shape[0] == 0:
        # Only from torch.compile with a data-dependent T (fused_moe answers 0 tokens itself
        # otherwise): the library takes no empty problem, and `saved` has the fake's size.
        saved = _bytes(_layout.saved_bytes(0, gate_up_proj.shape[0], gate_up_proj.shape[1] // 2, topk_ids.shape[1],
                                           plan_mode == INFER), device)
        return torch.empty_like(x), saved
    x = _aligned(x)
    with torch.cuda.device(device):
        plan = plans.plan_for(problem_of(x, gate_up_proj, topk_ids, plan_mode, check_expert_ids), device)
        m = plan.memory
        out = torch.empty_like(x)
        saved = _bytes(m.saved_bytes, device)
        workspace = _bytes(m.forward_workspace_bytes, device)
        plan.forward(x.data_ptr(), gate_up_proj.data_ptr(), down_proj.data_ptr(), topk_ids.data_ptr(),
                     topk_weights.data_ptr(), out.data_ptr(), saved.data_ptr(), m.saved_bytes, workspace.data_ptr(),
                     m.forward_workspace_bytes, _stream(device))
    return out, saved


fused_moe_forward = torch.library.custom_op("moejit::fused_moe_forward", _forward, mutates_args=(),
                                            device_types="cuda")


@fused_moe_forward.register_fake
def _forward_fake(x, gate_up_proj, down_proj, topk_ids, topk_weights, plan_mode, check_expert_ids):
    dims = (x.shape[0], gate_up_proj.shape[0], x.shape[1], gate_up_proj.shape[1], topk_ids.shape[1])
    if all(isinstance(d, int) for d in dims) and dims[0] > 0:
        saved_bytes = _library.problem_memory(problem_of(x, gate_up_proj, topk_ids, plan_mode, check_expert_ids)).saved_bytes
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

# The memory-efficient states a backward has consumed, by storage: the library's record goes by
# address, and every backward adopts its state (below), so the front end keeps this one. A weak
# reference keeps the storage's identity, not its memory: a new storage at a consumed one's
# address is another state, and one brought back from the host (save_on_cpu) is a new storage.
# Autograd runs each device's backward on a thread of its own, and the library calls release the GIL.
_consumed_states = {}
_consumed_lock = threading.Lock()
_consumed_cleanup_at = [1024]  # the size that next drops the entries of freed storages


def _is_consumed(saved):
    try:
        key = StorageWeakRef(saved.untyped_storage()).cdata
    except Exception:  # a tensor without a storage of its own (tracing): take it as consumed
        return True
    with _consumed_lock:
        held = _consumed_states.get(key)
        return held is not None and not held.expired()


def _consume(saved):
    ref = StorageWeakRef(saved.untyped_storage())
    with _consumed_lock:
        held = _consumed_states.get(ref.cdata)
        if held is not None and not held.expired():
            raise StateError(_ONE_BACKWARD, status="state")
        if len(_consumed_states) >= _consumed_cleanup_at[0]:
            for key in [k for k, r in _consumed_states.items() if r.expired()]:
                del _consumed_states[key]
            _consumed_cleanup_at[0] = max(1024, 2 * len(_consumed_states))
        _consumed_states[ref.cdata] = ref


def _weight_grad_buffers(gate_up_proj, down_proj, weight_grads):
    if weight_grads:
        return torch.empty_like(gate_up_proj), torch.empty_like(down_proj)
    return gate_up_proj.new_empty(0), down_proj.new_empty(0)


def _backward(d_out: torch.Tensor, x: Optional[torch.Tensor], gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
              topk_weights: torch.Tensor, saved: torch.Tensor, plan_mode: int, check_expert_ids: bool,
              weight_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    device = d_out.device
    if d_out.shape[0] == 0:  # see _forward: no library call, and zero weight gradients
        if plan_mode == MEMEFF:
            _consume(saved)
        dw1, dw2 = (torch.zeros_like(gate_up_proj), torch.zeros_like(down_proj)) if weight_grads else \
            _weight_grad_buffers(gate_up_proj, down_proj, False)
        return d_out.new_empty(d_out.shape), dw1, dw2, torch.empty_like(topk_weights)
    d_out = _aligned(d_out)
    x = None if x is None else _aligned(x)
    with torch.cuda.device(device):
        plan = plans.plan_for(problem_of(d_out, gate_up_proj, topk_weights, plan_mode, check_expert_ids), device)
        m = plan.memory
        dx, d_topk_weights = d_out.new_empty(d_out.shape), torch.empty_like(topk_weights)
        dw1, dw2 = _weight_grad_buffers(gate_up_proj, down_proj, weight_grads)
        workspace = _bytes(m.backward_workspace_bytes, device)
        # Consumed from here on, even if the call fails part-way (as the library counts it).
        if plan_mode == MEMEFF:
            _consume(saved)
        # Null weight-gradient pointers: the library skips dW1 and dW2 and what only they need,
        # x included (None without weight_grads). Null ids: it reads the routing from `saved`.
        # Autograd hands each backward its own forward's state, which saved-tensor hooks may have
        # moved (save_on_cpu brings it back at an address another state last held): adopted, so
        # the library does not judge it by that address's past.
        plan.backward(d_out.data_ptr(), None if x is None else x.data_ptr(), gate_up_proj.data_ptr(),
                      down_proj.data_ptr(), None, topk_weights.data_ptr(), saved.data_ptr(), saved.numel(),
                      dx.data_ptr(), dw1.data_ptr() if weight_grads else None, dw2.data_ptr() if weight_grads else None,
                      d_topk_weights.data_ptr(), workspace.data_ptr(), m.backward_workspace_bytes, _stream(device),
                      adopt_saved=True)
    return dx, dw1, dw2, d_topk_weights


def _backward_fake(d_out, x, gate_up_proj, down_proj, topk_weights, saved, plan_mode, check_expert_ids, weight_grads):
    dw1, dw2 = _weight_grad_buffers(gate_up_proj, down_proj, weight_grads)
    return d_out.new_empty(d_out.shape), dw1, dw2, torch.empty_like(topk_weights)


fused_moe_backward = torch.library.custom_op("moejit::fused_moe_backward", _backward, mutates_args=(),
                                             device_types="cuda")
fused_moe_backward.register_fake(_backward_fake)
fused_moe_backward_consuming = torch.library.custom_op("moejit::fused_moe_backward_consuming", _backward,
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
        # (out of memory for its buffers, say) left it whole.
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
