// The steps the benchmark times, their names on the command line and their FLOPs.
#pragma once

#include <string>

#include "moejit/moejit.hpp"

namespace moejit::bench {

enum class StepKind {
  kForward,    // training-mode forward (saves state for backward)
  kBackward,   // backward alone, after an untimed forward
  kFull,       // forward + backward
  kInference,  // an inference plan's forward
  kMemEff,     // forward + backward of a memory-efficient plan
  kFrozen,     // forward + backward without weight gradients (frozen experts: dx and d_topk_weights)
};

const char* step_name(StepKind kind);      // "forward", "backward", "full", "inference", "memeff", "frozen"
StepKind parse_step(const std::string& name);  // throws InvalidArgument naming --modes

// DESIGN.md's FLOP model: per (token, slot) pair, forward 6·H·I, backward 12·H·I, full 18·H·I;
// frozen 12·H·I (the forward, then dAct 2·H·I and dX 4·H·I).
double step_flops(StepKind kind, const MoeProblem& problem);

// The expert weights' traffic no step can avoid, bytes: W1 and W2 read once by the forward and
// once more by the backward (for dx and d_act), dW1 and dW2 written once (not by frozen). At small T, where every
// expert gets a few rows, this (not the dense ceiling) bounds the step: it is the same for any T.
double step_weight_bytes(StepKind kind, const MoeProblem& problem);

}  // namespace moejit::bench
