// Host-side checks of a problem and of the arguments of each call. Each throws InvalidArgument
// naming the offending argument, before anything is enqueued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/pointer.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// One tensor of a call, as the problem and the plan size it: [begin, begin + bytes), and the
// alignment its kernels need.
struct TensorRegion {
  const char* name;
  const void* begin;
  std::size_t bytes;
  std::size_t alignment;
  bool written;
};

// Every tensor a forward() or backward() call touches, written ones first. vector_aligned: the
// plan's kernels use 16-byte vector accesses, so tensors must be 16-byte aligned (otherwise 2
// bytes suffice); saved state and workspaces are 256-byte aligned.
std::vector<TensorRegion> forward_tensors(const ForwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                          bool vector_aligned);
std::vector<TensorRegion> backward_tensors(const BackwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                           bool vector_aligned);

void validate_problem(const MoeProblem& p);

// A call's arguments: sizes given, every tensor non-null and aligned (except backward's
// topk_ids, and its x, dw1 and dw2 when dw1 and dw2 are both null), no written one overlapping
// another tensor. Returns the call's tensors (forward_tensors, backward_tensors), a null one
// allowed there with no bytes.
std::vector<TensorRegion> validate_forward(const ForwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                           bool vector_aligned);
std::vector<TensorRegion> validate_backward(const BackwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                            bool vector_aligned);

// adopt_saved's buffer: a training plan's, non-null and 256-byte aligned. Returns it as a written
// tensor of saved_bytes, for require_device_memory and SavedStates::overwrite.
std::vector<TensorRegion> validate_adopted(const void* saved, const MoeProblem& p, const MemoryPlan& m);

// Each tensor's first and last byte must be device memory of `device` (or managed memory), and
// a tensor must lie within the allocation holding its first byte: a host or another GPU's
// address, another context's memory on this GPU (each context maps its own allocations; the
// driver names the context, `context` is the plan's, 0 to skip), reserved address space with
// nothing mapped, or a tensor running past its allocation would fault inside a kernel or write
// over another buffer. A tensor carved out of a larger
// allocation (a caching allocator's block; for memory mapped with cuMemMap, the whole reserved
// range) is checked against that allocation only. `query` is cuda::query_pointer outside the unit
// tests. Throws InvalidArgument naming the tensor.
void require_device_memory(const std::vector<TensorRegion>& tensors, int device, std::uintptr_t context,
                           const std::function<cuda::PointerInfo(const void*)>& query);

// Checking mode (Options::check_expert_ids), on ids read back from the device: throws
// InvalidArgument("topk_ids") for the first token that names one expert in two of its `topk`
// slots. Top-k routing never does; the memory-efficient backward's chunks of experts assume it.
void check_distinct_experts(const std::int32_t* topk_ids, long long tokens, int topk);

}  // namespace moejit
