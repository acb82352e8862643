#include "moe/validate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "moe/routing_layout.hpp"
#include "moe/shape.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

void require_pointer(const void* p, const char* name, std::size_t alignment) {
  if (p == nullptr) throw InvalidArgument(name, "null device pointer");
  if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
    throw InvalidArgument(name, fmt::format("must be {}-byte aligned (address {})", alignment, p));
  }
}

// Each end of a tensor must be this device's memory (of this context, where the driver names
// one) or managed memory.
void require_device_kind(const TensorRegion& t, const cuda::PointerInfo& info, int device, std::uintptr_t context,
                         bool first) {
  switch (info.kind) {
    case cuda::MemoryKind::kManaged: return;
    case cuda::MemoryKind::kDevice:
      if (info.device != device) {
        throw InvalidArgument(t.name, fmt::format("{} memory of device {}; this plan runs on device {}",
                                                  first ? "is" : "ends in", info.device, device));
      }
      if (context != 0 && info.context != 0 && info.context != context) {
        throw InvalidArgument(t.name, fmt::format("{} memory of another CUDA context on device {} than this plan's, "
                                                  "which cannot reach it",
                                                  first ? "is" : "ends in", device));
      }
      return;
    case cuda::MemoryKind::kHost:
      throw InvalidArgument(t.name, fmt::format("{} page-locked host memory; pass device memory", first ? "is" : "ends in"));
    case cuda::MemoryKind::kUnknown:
      throw InvalidArgument(t.name, first ? fmt::format("address {} is not CUDA memory (host memory from malloc or "
                                                        "new?); pass device memory", t.begin)
                                          : fmt::format("its {} bytes from {} run past the memory allocated there: is "
                                                        "the buffer smaller than the problem's shape?",
                                                        t.bytes, t.begin));
  }
}

void require_size(std::size_t given, std::size_t needed, const char* size_name) {
  if (given < needed) {
    throw InvalidArgument(size_name, fmt::format("{} bytes given, {} needed (see FusedMoe::memory())", given, needed));
  }
}

// Bytes of the caller's tensors (2-byte elements; topk_ids are int32).
struct Sizes {
  explicit Sizes(const MoeProblem& p)
      : pairs(static_cast<std::size_t>(p.tokens) * p.topk),
        tokens_h(static_cast<std::size_t>(p.tokens) * p.hidden * elt),
        w1(static_cast<std::size_t>(p.experts) * 2 * p.intermediate * p.hidden * elt),
        w2(static_cast<std::size_t>(p.experts) * p.hidden * p.intermediate * elt) {}
  static constexpr std::size_t elt = 2;
  std::size_t pairs, tokens_h, w1, w2;
};

// Each written region must overlap no other region: a kernel would read what another wrote
// over it, or two would write the same bytes.
void require_disjoint(const std::vector<TensorRegion>& regions) {
  const auto overlap = [](const TensorRegion& a, const TensorRegion& b) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a.begin), b0 = reinterpret_cast<std::uintptr_t>(b.begin);
    return a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
  };
  // Pairs in list order, the written one named first, as a caller reads "dx: overlaps x".
  for (std::size_t i = 0; i < regions.size(); ++i) {
    for (std::size_t j = 0; j < regions.size(); ++j) {
      const bool pair = regions[i].written && (regions[j].written ? j > i : true);
      if (pair && overlap(regions[i], regions[j])) {
        throw InvalidArgument(regions[i].name, fmt::format("overlaps {}", regions[j].name));
      }
    }
  }
}

constexpr std::size_t kBuffer = 256;  // saved state and workspaces

// The inputs forward() and backward() share, read only. Where the call reads no x or no
// topk_ids (optional_x, optional_ids), a null one is no tensor: no bytes, so no check sees it.
template <typename Args>
void append_inputs(std::vector<TensorRegion>& t, const Args& a, const Sizes& z, std::size_t tensor, bool optional_x,
                   bool optional_ids) {
  const auto bytes = [](const void* p, bool optional, std::size_t n) { return optional && p == nullptr ? 0 : n; };
  t.push_back({"x", a.x, bytes(a.x, optional_x, z.tokens_h), tensor, false});
  t.push_back({"w1", a.w1, z.w1, tensor, false});
  t.push_back({"w2", a.w2, z.w2, tensor, false});
  t.push_back({"topk_ids", a.topk_ids, bytes(a.topk_ids, optional_ids, z.pairs * sizeof(std::int32_t)), 4, false});
  t.push_back({"topk_weights", a.topk_weights, z.pairs * z.elt, 2, false});
}

void require_backward(const MoeProblem& p) {
  if (p.mode == Mode::kInference) throw StateError("an inference plan has no backward; build it with a training mode");
}

// Every tensor the plan needs bytes of is non-null and aligned, and no written one overlaps another.
void require_tensors(const std::vector<TensorRegion>& tensors) {
  for (const TensorRegion& t : tensors) {
    if (t.bytes > 0) require_pointer(t.begin, t.name, t.alignment);
  }
  require_disjoint(tensors);
}

}  // namespace

void validate_problem(const MoeProblem& p) {
  if (p.tokens < 1) throw InvalidArgument("tokens", fmt::format("must be at least 1, got {}", p.tokens));
  if (p.experts < 1 || p.experts > kMaxExperts) {
    throw InvalidArgument("experts", fmt::format("must be in [1, {}], got {}", kMaxExperts, p.experts));
  }
  if (p.topk < 1 || p.topk > p.experts) {
    throw InvalidArgument("topk", fmt::format("must be in [1, experts = {}], got {}", p.experts, p.topk));
  }
  if (p.hidden < 1) throw InvalidArgument("hidden", fmt::format("must be at least 1, got {}", p.hidden));
  if (p.intermediate < 1) {
    throw InvalidArgument("intermediate", fmt::format("must be at least 1, got {}", p.intermediate));
  }
  if (p.tokens > kMaxPairs / p.topk) {
    throw InvalidArgument("tokens", fmt::format("tokens * topk = {} * {} must be at most 2^31 - {}", p.tokens, p.topk,
                                                kMaxBlockM));
  }
  if (p.hidden >= (1 << 28)) throw InvalidArgument("hidden", fmt::format("must stay below 2^28, got {}", p.hidden));
  // gather_sum's grid spans a row of H in at most kMaxGatherColumnBlocks blocks, so its widest
  // blocks bound H (narrower configs are pruned where they would need more).
  TileConfig widest;
  widest.warps = kMaxGatherWarps;
  const bool vector = shape_of(p).vector_aligned();
  if (const long long most = kMaxGatherColumnBlocks * gather_block_columns(widest, vector); p.hidden > most) {
    throw InvalidArgument("hidden", fmt::format("must be at most {}{}, got {}", most,
                                                vector ? "" : " unless H and I are multiples of 8", p.hidden));
  }
  if (p.intermediate >= (1 << 28)) {
    throw InvalidArgument("intermediate", fmt::format("must stay below 2^28, got {}", p.intermediate));
  }
  // W1's bytes, a size_t product every size check relies on: each factor is bounded above, their
  // product is not (4096 experts at H = I = 2^27 would wrap it to a small number). Exact in 128
  // bits, where a double product rounds past 2^61 by a few weights.
  const unsigned __int128 weights = static_cast<unsigned __int128>(2) * static_cast<unsigned>(p.experts) *
                                    static_cast<unsigned>(p.intermediate) * static_cast<unsigned>(p.hidden);
  if (weights > static_cast<unsigned __int128>(1) << 61) {
    throw InvalidArgument("experts * 2 * intermediate * hidden",
                          fmt::format("{} * 2 * {} * {} weights must be at most 2^61", p.experts, p.intermediate,
                                      p.hidden));
  }
  if (p.dtype != DType::kBF16 && p.dtype != DType::kFP16) throw InvalidArgument("dtype", "must be bf16 or fp16");
  if (p.mode != Mode::kTraining && p.mode != Mode::kInference && p.mode != Mode::kMemoryEfficient) {
    throw InvalidArgument("mode", "unknown mode");
  }
}

std::vector<TensorRegion> forward_tensors(const ForwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                          bool vector_aligned) {
  const Sizes z(p);
  const std::size_t tensor = vector_aligned ? 16 : 2;
  std::vector<TensorRegion> t = {{"out", a.out, z.tokens_h, tensor, true},
                                 {"saved", a.saved, p.mode == Mode::kInference ? 0 : m.saved_bytes, kBuffer, true},
                                 {"workspace", a.workspace, m.forward_workspace_bytes, kBuffer, true}};
  append_inputs(t, a, z, tensor, false, false);
  return t;
}

std::vector<TensorRegion> backward_tensors(const BackwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                           bool vector_aligned) {
  const Sizes z(p);
  const std::size_t tensor = vector_aligned ? 16 : 2;
  // Memory-efficient mode writes d_pre_act over pre_act inside saved: there saved is written, so
  // it may overlap no input either; otherwise it is only read.
  const bool memeff = p.mode == Mode::kMemoryEfficient;
  // Both weight gradients null: frozen experts, neither is computed (validate_backward).
  const bool weight_grads = a.dw1 != nullptr || a.dw2 != nullptr;
  std::vector<TensorRegion> t = {{"dx", a.dx, z.tokens_h, tensor, true},
                                 {"dw1", a.dw1, weight_grads ? z.w1 : 0, tensor, true},
                                 {"dw2", a.dw2, weight_grads ? z.w2 : 0, tensor, true},
                                 {"d_topk_weights", a.d_topk_weights, z.pairs * z.elt, 2, true},
                                 {"workspace", a.workspace, m.backward_workspace_bytes, kBuffer, true}};
  if (memeff) t.push_back({"saved", a.saved, m.saved_bytes, kBuffer, true});
  t.push_back({"d_out", a.d_out, z.tokens_h, tensor, false});
  // The routing comes from saved, so no kernel reads topk_ids; only the weight gradients read x.
  append_inputs(t, a, z, tensor, !weight_grads, true);
  if (!memeff) t.push_back({"saved", a.saved, m.saved_bytes, kBuffer, false});
  return t;
}

std::vector<TensorRegion> validate_forward(const ForwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                           bool vector_aligned) {
  std::vector<TensorRegion> tensors = forward_tensors(a, p, m, vector_aligned);
  if (p.mode != Mode::kInference) require_size(a.saved_bytes, m.saved_bytes, "saved_bytes");
  require_size(a.workspace_bytes, m.forward_workspace_bytes, "workspace_bytes");
  require_tensors(tensors);
  return tensors;
}

std::vector<TensorRegion> validate_backward(const BackwardArgs& a, const MoeProblem& p, const MemoryPlan& m,
                                            bool vector_aligned) {
  require_backward(p);
  if ((a.dw1 == nullptr) != (a.dw2 == nullptr)) {
    throw InvalidArgument(a.dw1 == nullptr ? "dw1" : "dw2",
                          fmt::format("null device pointer while {} is given: pass both weight gradients, or neither "
                                      "(frozen experts: dx and d_topk_weights only)",
                                      a.dw1 == nullptr ? "dw2" : "dw1"));
  }
  if (a.x == nullptr && a.dw1 != nullptr) {
    throw InvalidArgument("x", "null device pointer while dw1 and dw2 are given: the weight gradients read it (a "
                               "backward without them may omit x)");
  }
  std::vector<TensorRegion> tensors = backward_tensors(a, p, m, vector_aligned);
  require_size(a.saved_bytes, m.saved_bytes, "saved_bytes");
  require_size(a.workspace_bytes, m.backward_workspace_bytes, "workspace_bytes");
  require_tensors(tensors);
  return tensors;
}

std::vector<TensorRegion> validate_adopted(const void* saved, const MoeProblem& p, const MemoryPlan& m) {
  require_backward(p);
  std::vector<TensorRegion> tensors = {{"saved", saved, m.saved_bytes, kBuffer, true}};
  require_tensors(tensors);
  return tensors;
}

void require_device_memory(const std::vector<TensorRegion>& tensors, int device, std::uintptr_t context,
                           const std::function<cuda::PointerInfo(const void*)>& query) {
  for (const TensorRegion& t : tensors) {
    if (t.bytes == 0) continue;
    const auto begin = reinterpret_cast<std::uintptr_t>(t.begin);
    const cuda::PointerInfo first = query(t.begin);
    require_device_kind(t, first, device, context, true);
    // A last byte in the next allocation passes the check of that byte alone. A size past the top
    // of the address space has no last byte.
    if (t.bytes > UINTPTR_MAX - begin ||
        (first.range_bytes > 0 &&
         (t.bytes > first.range_bytes || begin - first.range_begin > first.range_bytes - t.bytes))) {
      throw InvalidArgument(t.name, fmt::format("its {} bytes from {} run past the allocation there ({} bytes from "
                                                "{:#x}): is the buffer smaller than the problem's shape?",
                                                t.bytes, t.begin, first.range_bytes, first.range_begin));
    }
    require_device_kind(t, query(reinterpret_cast<const void*>(begin + (t.bytes - 1))), device, context, false);
  }
}

void check_distinct_experts(const std::int32_t* ids, long long tokens, int topk) {
  // Each token's (expert, slot) pairs sorted: a repeat sits next to its first slot, and K up to E
  // costs K log K per token rather than K^2.
  std::vector<std::pair<std::int32_t, int>> row(static_cast<std::size_t>(topk));
  for (long long t = 0; t < tokens; ++t) {
    for (int k = 0; k < topk; ++k) row[k] = {ids[t * topk + k], k};
    std::sort(row.begin(), row.end());
    for (int k = 1; k < topk; ++k) {
      if (row[k].first == row[k - 1].first) {
        throw InvalidArgument("topk_ids", fmt::format("token {} names expert {} twice (slots {} and {})", t,
                                                      row[k].first, row[k - 1].second, row[k].second));
      }
    }
  }
}

}  // namespace moejit
