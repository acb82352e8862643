"""PyTorch front end of moejit: the fused MoE expert block as a custom op with autograd.

  fused_moe(x, gate_up_proj, down_proj, topk_ids, topk_weights, *, memory_efficient=False)
  MoEExperts(num_experts, hidden_dim, intermediate_dim)    HF Qwen3-MoE / Mixtral experts drop-in
  replace_experts(model)                                   swaps a model's experts blocks in place
  clear_plans()                                            rebuild plans (after changing settings)
  OutOfMemoryError                                         moejit.OutOfMemoryError that is torch's too
"""

from ._errors import OutOfMemoryError
from .functional import fused_moe
from .modules import MoEExperts, replace_experts
from .plans import clear_plans

__all__ = ["MoEExperts", "OutOfMemoryError", "clear_plans", "fused_moe", "replace_experts"]
