// The fused MoE side of the benchmark for one token count: the plans (built, so compiled and
// loaded, before anything is timed), the memory a step needs, and the timed steps.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "check.hpp"
#include "cuda/handles.hpp"
#include "inputs.hpp"
#include "moejit/moejit.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace moejit::bench {

// Expert weights and their gradients: one copy, kept across token counts (their shapes do not
// depend on T, and at real shapes they are far bigger than L2). W1, W2 ~ U(-1, 1)/sqrt(fan_in).
struct Weights {
  cuda::DeviceBuffer w1, w2, dw1, dw2;
  Weights(const MoeProblem& problem, std::uint64_t seed);
  // W1 and W2 as the device holds them, for the check's reference.
  HostWeights download() const;
};

struct Footprint {
  MemoryPlan plan;
  // A training step's peak beyond the resident tensors: saved + max(forward workspace + out,
  // backward workspace + out + dx + dW1 + dW2 + d_topk_weights).
  std::size_t full_step_bytes = 0;
};

Footprint footprint(const MoeProblem& problem, const MemoryPlan& plan);

// Scratch of one plan, allocated for the steps that use it and freed after them.
struct PlanBuffers {
  cuda::DeviceBuffer saved, forward_ws, backward_ws;
  explicit PlanBuffers(const MemoryPlan& m)
      : saved(m.saved_bytes), forward_ws(m.forward_workspace_bytes), backward_ws(m.backward_workspace_bytes) {}
};

// Host microseconds per call (MoeSteps::enqueue_us).
struct Enqueue {
  double forward_us = 0;
  double backward_us = 0;
  double graph_step_us = 0;  // one replay of a CUDA graph of forward() and backward()
};

class MoeSteps {
 public:
  // Builds a training plan and a memory-efficient one (for its MemoryPlan, and timed only as
  // memeff), plus an inference plan when `with_inference`; then the rotating inputs.
  MoeSteps(const MoeProblem& problem, const Options& options, bool with_inference, const RoutingSpec& routing,
           long long l2_bytes, std::uint64_t seed, const Weights& weights, CUstream stream);

  double plan_seconds() const { return plan_seconds_; }
  int copies() const { return inputs_.copies(); }
  // Role -> config of each plan built, by mode_name() ("train", "infer", "memeff").
  std::map<std::string, std::map<std::string, std::string>> configs() const;
  // The footprint of a plan that was built.
  Footprint memory(Mode mode) const;

  Stats measure(StepKind kind, StreamTimer& timer, int warmup, int iters);

  // Host cost of a training forward() alone, then of backward() alone, then of replaying a CUDA
  // graph that captured one of each: `calls` back-to-back calls each, timed on the host clock (no
  // events, no synchronisation between them).
  Enqueue enqueue_us(int calls);

  // Input set 0 as the device holds it, for the check's reference.
  HostInputs host_inputs() const;
  // One step of `kind` on input set 0 with the plan it is timed with, finished, what it writes
  // and the plan's scratch filled with 0xff bytes first (NaN in bf16 and fp16), so a value it
  // never writes cannot pass; then its outputs at the sample (check.hpp).
  SampledOutputs sampled_step(StepKind kind, const CheckSample& sample);

 private:
  ForwardArgs forward_args(int step, const PlanBuffers& scratch) const;
  BackwardArgs backward_args(int step, const PlanBuffers& scratch) const;
  MoeProblem problem_;
  const Weights& weights_;
  CUstream stream_;
  double plan_seconds_ = 0;
  std::map<Mode, FusedMoe> plans_;
  StepInputs inputs_;
  cuda::DeviceBuffer out_, dx_, d_topk_weights_;
};

}  // namespace moejit::bench
