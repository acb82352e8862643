"""moejit.torch.fused_moe: the fused MoE expert block as a differentiable PyTorch function."""

import torch

from ..errors import InvalidArgumentError, UnsupportedError
from . import ops

try:
    from torch.fx.experimental.symbolic_shapes import guard_or_false as _guard_or_false
except ImportError:  # older torch: no guard at all, which is as good here: dynamo specializes a
    # backed T of 0, so a symbolic T that can be 0 is unbacked, and has no hint to guard on
    from torch.fx.experimental.symbolic_shapes import statically_known_true as _guard_or_false

# Parameters are plain tensors with a flag; any other subclass (DTensor, a quantized weight) may
# hold no storage, or one the kernels would misread, so its own dispatch decides (ops' docstring).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def fused_moe(x, gate_up_proj, down_proj, topk_ids, topk_weights, *, memory_efficient=False,
              check_expert_ids=False):
    """out[t] = sum_k topk_weights[t,k] * (silu(g) * u)(x[t] @ W1[e].T) @ W2[e].T, e = topk_ids[t,k].

    Layouts (HF Transformers v5 / Liger): x [T, H] bf16 or fp16; gate_up_proj W1 [E, 2I, H]
    (rows 0..I-1 gate, I..2I-1 up) and down_proj W2 [E, H, I] in x's dtype, contiguous;
    topk_ids [T, K] any integer dtype (router int64 is converted to int32, an id outside [0, E)
    staying outside); topk_weights [T, K]
    (converted to x's dtype). Returns out [T, H]; autograd gives dx, dW1, dW2 and d topk_weights.

    Runs in inference mode (nothing saved for backward) when no input needs grad. Keywords:
      memory_efficient  backward overwrites the forward's saved state instead of taking more
                        workspace (one backward per forward)
      check_expert_ids  ids outside [0, E) raise instead of being dropped, and so does a token
                        naming one expert twice (synchronises the stream once per forward, so
                        not inside CUDA graphs)
    """
    cast = _autocast_dtype()
    x = _cast(x, cast)
    if not (isinstance(x, torch.Tensor) and x.dim() == 2 and _no_tokens(x)):
        gate_up_proj, down_proj = _cast(gate_up_proj, cast), _cast(down_proj, cast)
        cast = None
    _check(x, gate_up_proj, down_proj, topk_ids, topk_weights, pending_cast=cast)
    x = x.contiguous()
    topk_ids = _ids_int32(topk_ids, gate_up_proj.shape[0])
    topk_weights = topk_weights.to(x.dtype).contiguous()
    if _no_tokens(x):
        # No tokens (an expert-parallel rank may receive none): every gradient is zero. Empty
        # slices keep the weights in the graph without reading them (1.2 GB a layer at Qwen3-30B),
        # nor casting them under autocast.
        return x * 0 + (gate_up_proj[:0].sum() + down_proj[:0].sum() + topk_weights.sum()) * 0
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, gate_up_proj, down_proj, topk_weights))
    if not needs_grad:
        mode = ops.INFER
    else:
        mode = ops.MEMEFF if memory_efficient else ops.TRAIN
    inputs = (x, gate_up_proj, down_proj, topk_ids, topk_weights)
    if _eager(inputs):
        return ops.EagerFusedMoe.apply(*inputs, mode, check_expert_ids)
    if torch._C._are_functorch_transforms_active():
        _check_functorch()
    out, _ = ops.fused_moe_forward(*inputs, mode, check_expert_ids)
    return out


def _no_tokens(x):
    """x has no rows. A data-dependent T under torch.compile (an expert-parallel rank's count
    from .item()) cannot be guarded on: taken as nonzero, and the op answers a T of 0 itself."""
    t = x.shape[0]
    return t == 0 if isinstance(t, int) else _guard_or_false(t == 0)


def _eager(inputs):
    """Whether the op bodies may run under ops.EagerFusedMoe: plain CUDA tensors, outside
    torch.compile and torch.func (functorch's wrapped tensors look plain, and an autograd.Function
    without setup_context fails there; vmap runs the custom op through torch's per-sample fallback)."""
    return (inputs[0].is_cuda and all(type(t) in _PLAIN for t in inputs) and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


def _check_functorch():
    """torch.func's grad and jvp take only an autograd.Function with setup_context, which the one
    behind torch's custom ops lacks (pytorch/pytorch#168393): said here, rather than by torch's
    message about a method the caller never wrote. vmap alone runs (torch's per-sample fallback)."""
    from torch._C._functorch import TransformType, get_interpreter_stack
    if any(i.key() in (TransformType.Grad, TransformType.Jvp) for i in get_interpreter_stack() or ()):
        raise UnsupportedError("moejit.torch.fused_moe: torch.func's grad, vjp, jvp and jacrev are not supported "
                               "(torch's custom ops have no functorch autograd); use torch.autograd.grad or "
                               ".backward()", status="unsupported")


def _autocast_dtype():
    """The dtype torch.autocast (CUDA) casts floating inputs to, as F.linear casts them, or None
    when it is off or its dtype is not one the kernels take (then _check names the inputs): under
    it float32 master weights train through the bf16 kernels, and autograd returns float32
    gradients. The weights are cast on every call; pass them in bf16 or fp16 to skip that copy."""
    if not torch.is_autocast_enabled("cuda"):
        return None
    dtype = torch.get_autocast_dtype("cuda")
    return dtype if dtype in ops.DTYPES else None


def _cast(t, dtype):
    """t in dtype when dtype is set and t is a floating tensor; anything else is left for _check."""
    if dtype is None or not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return t
    return t.to(dtype)


def _ids_int32(topk_ids, experts):
    """topk_ids as the library's contiguous int32. Wider ids are first clamped into [-1, E] on the
    device (no host sync), since the cast keeps the low 32 bits: 2**32 + 1 would become expert 1
    and be routed instead of dropped (or rejected with check_expert_ids)."""
    if topk_ids.dtype.itemsize > 4:
        # uint64 is read as int64 (torch has no clamp for it): ids past 2**63 turn negative, and
        # so stay out of range.
        wide = topk_ids if topk_ids.dtype.is_signed else topk_ids.view(torch.int64)
        topk_ids = wide.clamp(-1, experts)
    return topk_ids.to(torch.int32).contiguous()


def _fail(message):
    raise InvalidArgumentError(f"moejit.torch.fused_moe: {message}", status="invalid_argument")


def _check(x, w1, w2, topk_ids, topk_weights, pending_cast=None):
    """Names the first bad input. pending_cast: autocast's dtype when the floating weights were
    left uncast because there are no tokens; it stands for their dtype, and their layout does
    not matter, since nothing reads them."""
    names = ("x", "gate_up_proj", "down_proj", "topk_ids", "topk_weights")
    tensors = (x, w1, w2, topk_ids, topk_weights)
    for name, t, dims in zip(names, tensors, (2, 3, 3, 2, 2)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            _fail(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if x.device.type not in ("cuda", "meta"):  # meta: shape propagation only
        _fail(f"tensors must be on a CUDA device, x is on {x.device}")
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != x.device:
            _fail(f"{name} is on {t.device}, x on {x.device}: all tensors must be on one device")
    if x.dtype not in ops.DTYPES:
        _fail(f"x must be bfloat16 or float16, got {x.dtype}")
    for name, t in (("gate_up_proj", w1), ("down_proj", w2)):
        pending = pending_cast is not None and t.is_floating_point()
        if (pending_cast if pending else t.dtype) != x.dtype:
            _fail(f"{name} is {t.dtype}, x is {x.dtype}: the weights must have x's dtype")
        if not pending and not t.is_contiguous():
            _fail(f"{name} must be contiguous (copying the weights each call would be silent and slow)")
    if topk_ids.is_floating_point() or topk_ids.is_complex() or topk_ids.dtype == torch.bool:
        _fail(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        _fail(f"topk_weights must be a floating-point tensor, got {topk_weights.dtype}")

    t, h = x.shape
    e, two_i, h1 = w1.shape
    if two_i % 2 != 0:
        _fail(f"gate_up_proj must be [E, 2I, H] with an even second dimension, got {tuple(w1.shape)}")
    i = two_i // 2
    if h1 != h:
        _fail(f"gate_up_proj is {tuple(w1.shape)}, expected [E, 2I, H] with H = x.shape[1] = {h}")
    if tuple(w2.shape) != (e, h, i):
        _fail(f"down_proj is {tuple(w2.shape)}, expected [E, H, I] = {(e, h, i)} from gate_up_proj {tuple(w1.shape)}")
    if topk_ids.shape[0] != t or topk_weights.shape != topk_ids.shape:
        _fail(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be [T, K] "
              f"with T = x.shape[0] = {t}")
    if not 1 <= topk_ids.shape[1] <= e:
        _fail(f"top-k must be in [1, E = {e}], got {topk_ids.shape[1]}")
