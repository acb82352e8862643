#include "steps.hpp"

#include "moejit/error.hpp"

namespace moejit::bench {

const char* step_name(StepKind kind) {
  switch (kind) {
    case StepKind::kForward: return "forward";
    case StepKind::kBackward: return "backward";
    case StepKind::kFull: return "full";
    case StepKind::kInference: return "inference";
    case StepKind::kMemEff: return "memeff";
    case StepKind::kFrozen: return "frozen";
  }
  return "?";
}

StepKind parse_step(const std::string& name) {
  for (StepKind k : {StepKind::kForward, StepKind::kBackward, StepKind::kFull, StepKind::kInference,
                     StepKind::kMemEff, StepKind::kFrozen}) {
    if (name == step_name(k)) return k;
  }
  throw InvalidArgument("--modes", "unknown mode '" + name + "' (forward, backward, full, inference, memeff, frozen)");
}

double step_flops(StepKind kind, const MoeProblem& p) {
  const double per_pair_hi = kind == StepKind::kBackward || kind == StepKind::kFrozen ? 12.0
                             : kind == StepKind::kFull || kind == StepKind::kMemEff ? 18.0
                                                                                    : 6.0;
  return per_pair_hi * double(p.hidden) * p.intermediate * double(p.tokens) * p.topk;
}

double step_weight_bytes(StepKind kind, const MoeProblem& p) {
  const double weights = 2.0 * p.experts * 3.0 * double(p.hidden) * p.intermediate;  // W1 [2I, H] + W2 [H, I], 2-byte
  const double passes = kind == StepKind::kBackward || kind == StepKind::kFrozen ? 2.0  // read twice, or read and dW written
                        : kind == StepKind::kFull || kind == StepKind::kMemEff ? 3.0
                                                                               : 1.0;
  return passes * weights;
}

}  // namespace moejit::bench
