// Random benchmark inputs on the device: uniform values in the storage dtype (never zeros, whose
// cheap arithmetic flatters every kernel), top-K routing ids, and the rotation over several copies
// of the per-step inputs that keeps a step from finding the previous step's data in L2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/handles.hpp"
#include "moejit/moejit.hpp"

namespace moejit::bench {

// How tokens pick experts. Zipf ranks expert e as e + 1: p(e) is proportional to (e + 1)^-s.
// Balanced gives every expert ceil or floor of T*K/E pairs, the load a perfectly balancing router
// reaches: against uniform it shows what the spread of pairs per expert costs (tiles that spill).
struct RoutingSpec {
  bool zipf = false;
  bool balanced = false;
  double exponent = 0.0;
  bool shuffled = false;  // zipf: the popularity ranks fall on experts in a random order, not 0, 1, ...
};

// "uniform", "balanced", "zipf:S" or "zipf-shuffled:S" (S > 0); throws InvalidArgument naming
// --routing.
RoutingSpec parse_routing(const std::string& text);
std::string routing_name(const RoutingSpec& r);

// Fills the whole buffer with `dtype` values drawn from U(lo, hi), using every host core.
void fill_uniform(const cuda::DeviceBuffer& buffer, DType dtype, double lo, double hi, std::uint64_t seed);

// topk_ids [tokens, topk]: each token's K distinct experts, drawn without replacement with the
// routing's probabilities, or for balanced routing dealt round-robin to tokens in a random order.
std::vector<std::int32_t> routing_ids(long long tokens, int experts, int topk, const RoutingSpec& routing,
                                      std::uint64_t seed);

// How many copies of `bytes_per_copy` to rotate over so that together they exceed 3x the L2:
// at least 2 (consecutive steps never share inputs) and at most 64.
int rotation_copies(std::size_t bytes_per_copy, long long l2_bytes);

// The inputs that change every step (x, topk_ids, topk_weights, d_out), in rotation_copies sets:
// x ~ U(-1, 1), router scores ~ U(0.05, 1), d_out ~ U(-1, 1).
struct StepInputs {
  std::vector<cuda::DeviceBuffer> x, topk_ids, topk_weights, d_out;

  StepInputs(const MoeProblem& problem, const RoutingSpec& routing, long long l2_bytes, std::uint64_t seed);
  int copies() const { return static_cast<int>(x.size()); }
};

}  // namespace moejit::bench
