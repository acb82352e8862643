// A fused-MoE test case on the GPU: random inputs rounded to the storage dtype, device copies,
// poisoned outputs and workspaces, one forward and one backward through FusedMoe, and the fp64
// reference of the same inputs.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/float16.hpp"
#include "cuda/handles.hpp"
#include "moe/reference/moe_reference.hpp"
#include "moejit/moejit.hpp"

namespace moejit::test {

// kSkewed: K distinct experts per token, expert of popularity rank r drawn with weight
// (r + 1)^-1.5 (Zipf, as moejit_bench's zipf-shuffled:1.5), the ranks on the experts in a random order.
enum class Routing { kRandom, kOneExpert, kEvenExpertsOnly, kSkewed };

struct CaseSpec {
  long long tokens;
  int experts, hidden, intermediate, topk;
  DType dtype = DType::kBF16;
  Routing routing = Routing::kRandom;
  std::uint32_t seed = 1;
  // Experts no token names: kRandom draws each token's K distinct experts among the others.
  std::vector<int> empty_experts = {};
};

std::string describe(const CaseSpec& c);

// Host data of a case (values already representable in the storage dtype).
struct CaseData {
  CaseSpec spec;
  reference::MoeTensors tensors;
  std::vector<double> d_out;
};

CaseData make_case(const CaseSpec& spec);

// A case's inputs as the device stores them: 16-bit values and int32 expert ids. Cases too large
// for double host copies build these directly.
struct StoredInputs {
  std::vector<std::uint16_t> x, w1, w2, topk_weights, d_out;
  std::vector<std::int32_t> topk_ids;
};

StoredInputs stored_inputs(const CaseData& data);

// Device copies and outputs of one case for one plan.
struct DeviceRun {
  cuda::DeviceBuffer x, w1, w2, ids, weights, d_out;
  cuda::DeviceBuffer out, dx, dw1, dw2, d_weights;
  cuda::DeviceBuffer saved, fwd_ws, bwd_ws;

  DeviceRun(const CaseData& data, const MemoryPlan& memory);
  DeviceRun(const StoredInputs& inputs, const MemoryPlan& memory);
  // Writes new input values (same shapes), e.g. before replaying a captured graph.
  void upload_inputs(const CaseData& data);
  // Fills outputs and workspaces with 0xff bytes (NaN in bf16 and fp16).
  void poison();
  ForwardArgs forward_args(CUstream stream) const;
  BackwardArgs backward_args(CUstream stream) const;
};

std::vector<double> download(const cuda::DeviceBuffer& b, DType dtype, std::size_t count, std::size_t offset = 0);

// ||got - want|| / ||want|| (the norm of want floored at 1e-30); infinite when got has a NaN.
double rel_l2(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace moejit::test
