"""moejit.torch.MoEExperts: a drop-in for Hugging Face's Qwen3-MoE / Mixtral experts block.

HF Transformers v5 keeps each MoE layer's experts in one module with two 3-D parameters,
gate_up_proj [E, 2I, H] and down_proj [E, H, I], called as experts(hidden_states, top_k_index,
top_k_weights). MoEExperts has the same parameter names and shapes (state dicts and optimizer
state carry over) and runs moejit's fused op.
"""

import sys

import torch
from torch import nn

from ..errors import InvalidArgumentError
from .functional import fused_moe


class MoEExperts(nn.Module):
    def __init__(self, num_experts, hidden_dim, intermediate_dim, *, memory_efficient=False, device=None,
                 dtype=None):
        super().__init__()
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.memory_efficient = memory_efficient
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_dim, hidden_dim, device=device, dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_dim, intermediate_dim, device=device, dtype=dtype))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """hidden_states [..., H]; top_k_index and top_k_weights [..., K] with the same leading dims."""
        if hidden_states.dim() == 0 or hidden_states.shape[-1] != self.hidden_dim:
            _fail(f"hidden_states {tuple(hidden_states.shape)} must end in hidden_dim = {self.hidden_dim}")
        # Checked before flattening: [S, B, K] ids for [B, S, H] states flatten to the same T and
        # would route each token with another token's experts.
        if (top_k_index.dim() == 0 or top_k_index.shape[-1] < 1 or top_k_weights.shape != top_k_index.shape
                or top_k_index.shape[:-1] != hidden_states.shape[:-1]):
            _fail(f"top_k_index {tuple(top_k_index.shape)} and top_k_weights {tuple(top_k_weights.shape)} must both "
                  f"be [..., K] with K >= 1 and the leading dimensions of hidden_states {tuple(hidden_states.shape)}")
        k = top_k_index.shape[-1]
        out = fused_moe(hidden_states.reshape(-1, self.hidden_dim), self.gate_up_proj, self.down_proj,
                        top_k_index.reshape(-1, k), top_k_weights.reshape(-1, k),
                        memory_efficient=self.memory_efficient)
        return out.view(hidden_states.shape)

    def extra_repr(self):
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}, memory_efficient={self.memory_efficient}")

    @classmethod
    def from_experts(cls, experts, *, memory_efficient=False):
        """A MoEExperts sharing `experts`' gate_up_proj and down_proj Parameters (no copy).
        Raises ValueError when `experts` is not a SwiGLU experts block of these layouts."""
        reason = _incompatibility(experts)
        if reason:
            raise ValueError(f"cannot replace {type(experts).__name__}: {reason}")
        e, h, i = experts.down_proj.shape
        new = cls(e, h, i, memory_efficient=memory_efficient, device="meta", dtype=experts.down_proj.dtype)
        new.gate_up_proj = experts.gate_up_proj
        new.down_proj = experts.down_proj
        new.train(experts.training)
        return new


def _fail(message):
    raise InvalidArgumentError(f"moejit.torch.MoEExperts: {message}", status="invalid_argument")


# The flags transformers' @use_experts_implementation sets on each instance, with the values of
# moejit's layout: [gate; up] rows concatenated, W1 [E, 2I, H] and W2 [E, H, I], no bias, gated.
_LAYOUT_FLAGS = {
    "is_concatenated": (True, "its gate_up_proj interleaves gate and up rows (is_concatenated=False); moejit "
                              "takes the I gate rows, then the I up rows"),
    "is_transposed": (False, "its weights are transposed (is_transposed=True); moejit takes [E, 2I, H] and "
                             "[E, H, I]"),
    "has_bias": (False, "it has biases (has_bias=True), which moejit does not apply"),
    "has_gate": (True, "it has no gate (has_gate=False); moejit implements the gated SwiGLU"),
}


_HOOKS = {"_forward_pre_hooks": "forward pre-hooks", "_forward_hooks": "forward hooks",
          "_backward_pre_hooks": "backward pre-hooks", "_backward_hooks": "backward hooks"}


def _incompatibility(module):
    """Why `module` cannot be served by MoEExperts, or None."""
    for flag, (value, reason) in _LAYOUT_FLAGS.items():
        if bool(getattr(module, flag, value)) != value:
            return reason
    w1, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor) or w1.dim() != 3 or w2.dim() != 3:
        return "no 3-D gate_up_proj and down_proj parameters"
    for name, w in (("gate_up_proj", w1), ("down_proj", w2)):
        if not isinstance(w, nn.Parameter):  # MoEExperts shares Parameters, and nn.Module takes no other
            return f"its {name} is a {type(w).__name__}, not an nn.Parameter"
    e, h, i = w2.shape
    if tuple(w1.shape) != (e, 2 * i, h):
        return f"gate_up_proj {tuple(w1.shape)} and down_proj {tuple(w2.shape)} are not [E, 2I, H] and [E, H, I]"
    extra = sorted(name for name, _ in module.named_parameters() if name not in ("gate_up_proj", "down_proj"))
    if extra:
        return f"it has other parameters ({', '.join(extra)}), e.g. biases moejit does not apply"
    gate = getattr(module, "_apply_gate", None)
    if gate is not None and not _is_default_gate(gate):
        name = getattr(gate, "__qualname__", type(gate).__name__)
        return f"its _apply_gate ({name}) is not transformers' default act_fn(gate) * up"
    act = getattr(module, "act_fn", None)
    if act is not None and act is not nn.functional.silu and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        return f"its activation is {getattr(act, '__name__', type(act).__name__)}, moejit implements SwiGLU (SiLU)"
    hooks = [kind for attribute, kind in _HOOKS.items() if getattr(module, attribute, None)]
    if hooks:
        return f"it has {' and '.join(hooks)}, which a new module would drop"
    if "forward" in vars(module):
        return "its forward is replaced on the instance (accelerate's hooks, say), which a new module would drop"
    return None


def _is_default_gate(gate):
    """Whether `gate` is transformers' _default_apply_gate, which @use_experts_implementation gives
    a class that defines no _apply_gate: the function of that name in the transformers module that
    defines it, found loaded (a model using it has loaded it; moejit does not depend on transformers)."""
    func = getattr(gate, "__func__", gate)
    module = getattr(func, "__module__", None) or ""
    return (module.partition(".")[0] == "transformers" and getattr(func, "__name__", None) == "_default_apply_gate"
            and getattr(sys.modules.get(module), "_default_apply_gate", None) is func)


def replace_experts(model, *, memory_efficient=False):
    """Swaps every HF experts block in `model` (modules named `experts` with gate_up_proj
    [E, 2I, H], down_proj [E, H, I] and a SiLU act_fn) for a MoEExperts sharing its parameters.
    Blocks MoEExperts would compute differently, or whose hooks it would drop, are left alone
    (from_experts says why). Every replacement is built before the first is swapped in, so a
    failure leaves the model as it was. Returns the qualified names replaced."""
    swaps = []
    for name, module in model.named_modules():
        if not name.endswith("experts") or isinstance(module, MoEExperts) or _incompatibility(module):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        swaps.append((name, parent, child, MoEExperts.from_experts(module, memory_efficient=memory_efficient)))
    for _, parent, child, new in swaps:
        setattr(parent, child, new)
    return [name for name, *_ in swaps]
