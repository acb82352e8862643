// The check of each timed step's outputs: after the timing, one more step on input set 0 with
// what it writes poisoned (MoeSteps::sampled_step), and a sample of its outputs against the fp64
// host reference (moe/reference/moe_reference.hpp). Without it a fast but wrong kernel (tiles
// skipped, a bad --override, an A/B variant) would reach the table as a speedup. Everything here
// is host code, unit-tested without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moejit/moejit.hpp"
#include "steps.hpp"

namespace moejit::bench {

// What a step of `kind` writes, so what its check reads: out always; dx and d_topk_weights after
// a backward; dW1 and dW2 unless frozen (which passes them as null).
struct Checked {
  bool backward = false;          // dx and d_topk_weights
  bool weight_gradients = false;  // dW1 and dW2
};
Checked checked_outputs(StepKind kind);

// Where the check looks. A token's out, dx and d_topk_weights depend only on its own K pairs, so
// a few tokens are read whole. An element of dW1 or dW2 sums over every pair of its expert; the
// intermediate column i of an expert (dW1 rows i and I + i, dW2 column i) needs only that column
// of the weights, so a few columns of a few experts are read.
struct CheckSample {
  struct Columns {
    int expert = 0;
    std::vector<int> columns;  // ascending, distinct, in [0, I)
  };
  std::vector<long long> tokens;  // ascending, distinct
  std::vector<Columns> weights;   // ascending, distinct experts
};

inline constexpr int kCheckTokens = 64, kCheckExperts = 4, kCheckColumns = 4;

// kCheckTokens tokens (all when T is fewer) and kCheckColumns columns of each of kCheckExperts
// experts, drawn uniformly (experts without pairs too: their gradients must be written zeros).
CheckSample choose_sample(const MoeProblem& problem, std::uint64_t seed);

// A step's outputs at the sample, in one layout for the device's values and the reference's.
struct SampledOutputs {
  std::vector<double> out, dx;         // [tokens, H]: the sampled tokens' rows
  std::vector<double> d_topk_weights;  // [tokens, K]
  std::vector<double> dw1;             // per sampled (expert, i) in order: dW1[e] rows i and I + i, [2, H]
  std::vector<double> dw2;             // per sampled (expert, i): dW2[e][:, i], [H]
};

// Input set 0 and the expert weights as the device holds them: 16-bit values of the run's dtype.
struct HostInputs {
  std::vector<std::uint16_t> x, topk_weights, d_out;
  std::vector<std::int32_t> topk_ids;
};
struct HostWeights {
  std::vector<std::uint16_t> w1, w2;
};

// The fp64 reference at the sample, its intermediates rounded to the dtype where the GPU stores
// them (as tests/gpu/test_fused_moe.cpp's reference is). Computed on every host core, piece by
// piece: each expert's share of the sampled tokens, and each sampled expert's pairs in chunks
// with its weights cut to the sampled columns, so the cost follows the sample, not the problem.
SampledOutputs reference_outputs(const MoeProblem& problem, const CheckSample& sample, const HostInputs& inputs,
                                 const HostWeights& weights);

struct CheckResult {
  bool ok = true;
  double max_rel_err = 0;  // the largest row error of the outputs read (d_topk_weights: its whole error)
  std::string failure;     // empty when ok: the first bound broken, and where
};

// tests/gpu/test_fused_moe.cpp's bound on the relative L2 error of a whole output: 1e-2 in bf16,
// half that in fp16 (three more mantissa bits). Each row is held to 3x the bound.
double check_tolerance(DType dtype);

// `got` against `want` for the outputs `what` names, as the GPU tests judge whole tensors: every
// value finite (poison left in place is NaN), the relative L2 error of each output's sample within
// the tolerance and of each row (a token's out or dx, a dW1 row, a dW2 column; its norm plus a
// tenth of the sample's mean row norm) within 3x; d_topk_weights whole only (a row's K values can
// cancel to rounding noise).
CheckResult judge(const MoeProblem& problem, Checked what, const CheckSample& sample, const SampledOutputs& got,
                  const SampledOutputs& want);

}  // namespace moejit::bench
