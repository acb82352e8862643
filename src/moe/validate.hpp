// Host-side checks of a problem and of the arguments of each call. Each throws InvalidArgument
// naming the offending argument, before anything is enqueued.
#pragma once

#include "moejit/moejit.hpp"

namespace moejit {

void validate_problem(const MoeProblem& p);

// vector_aligned: the plan's kernels use 16-byte vector accesses, so tensors must be 16-byte
// aligned (otherwise 2 bytes suffice).
void validate_forward(const ForwardArgs& a, const MoeProblem& p, const MemoryPlan& m, bool vector_aligned);
void validate_backward(const BackwardArgs& a, const MoeProblem& p, const MemoryPlan& m, bool vector_aligned);

// Checking mode (Options::check_expert_ids), on ids read back from the device: throws
// InvalidArgument("topk_ids") for the first token that names one expert in two of its `topk`
// slots. Top-k routing never does; the memory-efficient backward's chunks of experts assume it.
void check_distinct_experts(const std::int32_t* topk_ids, long long tokens, int topk);

}  // namespace moejit
