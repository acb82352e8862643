#!/usr/bin/env python3
"""Swap a Hugging Face Qwen3-MoE model's experts blocks for moejit's, then train a step.

  python3 python/examples/qwen3_moe_experts.py

Needs a CUDA GPU and transformers >= 5 (whose Qwen3MoeExperts keeps gate_up_proj [E, 2I, H]
and down_proj [E, H, I]); builds a small random model, so nothing is downloaded. The replaced
blocks share the original Parameters: checkpoints, optimizer state and the rest of the model
are untouched.
"""

import sys

import torch

import moejit.torch as mt

try:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
except ImportError:
    sys.exit("this example needs transformers >= 5 (pip install transformers)")

config = Qwen3MoeConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, num_experts=16,
                        num_experts_per_tok=4)
model = Qwen3MoeForCausalLM(config).to("cuda", torch.bfloat16)
tokens = torch.randint(0, config.vocab_size, (4, 256), device="cuda")

with torch.no_grad():
    before = model(tokens).logits.float()
replaced = mt.replace_experts(model)
if not replaced:
    sys.exit("no experts block of the v5 layout found (transformers < 5 keeps one nn.Linear per expert)")
print("replaced:", ", ".join(replaced))
with torch.no_grad():
    after = model(tokens).logits.float()
print(f"logits differ by {((after - before).norm() / before.norm()).item():.2e} (relative L2, bf16 rounding)")

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss = model(tokens, labels=tokens).loss
loss.backward()
optimizer.step()
print(f"trained one step, loss {loss.item():.3f}")
