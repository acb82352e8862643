# The plain-PyTorch fp32 MoE block the GPU tests compare against (a per-expert loop, autograd
# for the gradients), the random cases they run, and NaN for memory the kernels leave unwritten.
import contextlib

import torch
import torch.nn.functional as F
import torch.utils.deterministic


def moe_reference(x, gate_up_proj, down_proj, topk_ids, topk_weights):
    t, k = topk_ids.shape
    i = gate_up_proj.shape[1] // 2
    flat_ids = topk_ids.reshape(-1).long()
    token = torch.arange(t, device=x.device).repeat_interleave(k)
    weight = topk_weights.reshape(-1)
    out = torch.zeros_like(x)
    for e in range(gate_up_proj.shape[0]):
        pairs = (flat_ids == e).nonzero().squeeze(1)
        if pairs.numel() == 0:
            continue
        h = x[token[pairs]] @ gate_up_proj[e].T
        y = (F.silu(h[:, :i]) * h[:, i:]) @ down_proj[e].T
        out = out.index_add(0, token[pairs], y * weight[pairs, None])
    return out


def make_case(tokens, experts, hidden, intermediate, topk, routing="random", *, dtype, seed=0, device="cuda"):
    """Inputs like tests/support/moe_case.cpp: uniform data scaled per layer, distinct experts per
    token ("random"), every slot on one expert ("one"), or only even-numbered experts ("even")."""
    g = torch.Generator().manual_seed(seed)

    def uniform(shape, lo, hi):
        return (torch.rand(shape, generator=g) * (hi - lo) + lo).to(dtype).to(device)

    x = uniform((tokens, hidden), -1, 1)
    w1 = uniform((experts, 2 * intermediate, hidden), -2 / hidden ** 0.5, 2 / hidden ** 0.5)
    w2 = uniform((experts, hidden, intermediate), -2 / intermediate ** 0.5, 2 / intermediate ** 0.5)
    weights = uniform((tokens, topk), 0.05, 1)
    d_out = uniform((tokens, hidden), -1, 1)
    ids = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :topk]
    if routing == "one":
        ids = torch.full_like(ids, experts // 2)
    elif routing == "even":
        ids = ids // 2 * 2
    return x, w1, w2, ids.to(device), weights, d_out


def errors(got, want):
    """(max |got - want| / max |want|, relative L2), in fp64."""
    got, want = got.double(), want.double()
    scale = want.abs().max().clamp_min(1e-30)
    return ((got - want).abs().max() / scale).item(), ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


@contextlib.contextmanager
def unwritten_as_nan():
    """Within, every CUDA tensor from torch.empty* (the op's outputs, saved state and workspaces)
    starts as NaN, integers as their maximum: an element the kernels never write then fails the
    comparison instead of passing on what the caching allocator's reused block held (the same
    result from an earlier identical run, say). PyTorch fills only in deterministic mode; warn_only
    lets ops without a deterministic kernel still run. The mode is global, so autograd's backward
    thread allocates under it too."""
    fill = torch.utils.deterministic
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              fill.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    fill.fill_uninitialized_memory = True
    try:
        # The fill must really happen: a block that held zeros when freed must come back as NaN.
        # Which free block the allocator hands out is its choice (one poisoned by an earlier test
        # would prove nothing), so every block seen is zeroed before it is freed, until one
        # comes back.
        zeroed = set()
        for _ in range(16):
            probe = torch.empty(1024, dtype=torch.bfloat16, device="cuda")
            if probe.data_ptr() in zeroed:
                assert probe.isnan().all(), "torch.empty did not fill with NaN: outputs would not be poisoned"
                break
            probe.zero_()
            zeroed.add(probe.data_ptr())
            del probe
        else:
            raise AssertionError("the allocator never handed a zeroed block back: the NaN fill is unchecked")
        del probe
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        fill.fill_uninitialized_memory = before[2]
