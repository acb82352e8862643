#include "moe_steps.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/float16.hpp"
#include "cuda/driver.hpp"

namespace moejit::bench {
namespace {

// Builds the plans (config choice, NVRTC compiles or cache loads, module loads), timing them.
std::map<Mode, FusedMoe> build_plans(MoeProblem p, const Options& options, bool with_inference, double& seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  std::map<Mode, FusedMoe> plans;
  for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient, Mode::kInference}) {
    if (mode == Mode::kInference && !with_inference) continue;
    p.mode = mode;
    plans.emplace(mode, FusedMoe(p, options));
  }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return plans;
}

Mode plan_mode(StepKind kind) {
  if (kind == StepKind::kMemEff) return Mode::kMemoryEfficient;
  if (kind == StepKind::kInference) return Mode::kInference;
  return Mode::kTraining;
}

// `count` elements of type T from element `offset` of b.
template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& b, std::size_t offset, std::size_t count) {
  std::vector<T> v(count);
  b.download(v.data(), count * sizeof(T), offset * sizeof(T));
  return v;
}

template <typename T>
std::vector<T> download_all(const cuda::DeviceBuffer& b) {
  return download<T>(b, 0, b.bytes() / sizeof(T));
}

void append(std::vector<double>& to, const std::vector<double>& values) {
  to.insert(to.end(), values.begin(), values.end());
}

}  // namespace

Weights::Weights(const MoeProblem& p, std::uint64_t seed) {
  const std::size_t e = p.experts, h = p.hidden, i = p.intermediate, elt = 2;
  w1 = cuda::DeviceBuffer(e * 2 * i * h * elt);
  w2 = cuda::DeviceBuffer(e * h * i * elt);
  fill_uniform(w1, p.dtype, -1.0 / std::sqrt(double(h)), 1.0 / std::sqrt(double(h)), seed);
  fill_uniform(w2, p.dtype, -1.0 / std::sqrt(double(i)), 1.0 / std::sqrt(double(i)), seed + 1);
  dw1 = cuda::DeviceBuffer(w1.bytes());
  dw2 = cuda::DeviceBuffer(w2.bytes());
}

HostWeights Weights::download() const { return {download_all<std::uint16_t>(w1), download_all<std::uint16_t>(w2)}; }

Footprint footprint(const MoeProblem& p, const MemoryPlan& m) {
  const std::size_t elt = 2, rows = static_cast<std::size_t>(p.tokens) * p.hidden * elt;
  const std::size_t scores = static_cast<std::size_t>(p.tokens) * p.topk * elt;
  const std::size_t dw1 = std::size_t{2} * p.experts * p.intermediate * p.hidden * elt;
  const std::size_t dw2 = std::size_t{1} * p.experts * p.hidden * p.intermediate * elt;
  // out (rows) stays alive through the backward, as it does in a training loop and in
  // bench_torch.py's torch.cuda.max_memory_allocated, the way Liger's peak was measured.
  return {m, m.saved_bytes + std::max(m.forward_workspace_bytes + rows,
                                      m.backward_workspace_bytes + 2 * rows + dw1 + dw2 + scores)};
}

MoeSteps::MoeSteps(const MoeProblem& p, const Options& options, bool with_inference, const RoutingSpec& routing,
                   long long l2_bytes, std::uint64_t seed, const Weights& weights, CUstream stream)
    : problem_(p),
      weights_(weights),
      stream_(stream),
      plans_(build_plans(p, options, with_inference, plan_seconds_)),
      inputs_(p, routing, l2_bytes, seed),
      out_(static_cast<std::size_t>(p.tokens) * p.hidden * 2),
      dx_(out_.bytes()),
      d_topk_weights_(static_cast<std::size_t>(p.tokens) * p.topk * 2) {}

std::map<std::string, std::map<std::string, std::string>> MoeSteps::configs() const {
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const auto& [mode, plan] : plans_) out[mode_name(mode)] = plan.configs();
  return out;
}

Footprint MoeSteps::memory(Mode mode) const { return footprint(problem_, plans_.at(mode).memory()); }

ForwardArgs MoeSteps::forward_args(int step, const PlanBuffers& scratch) const {
  const int c = step % inputs_.copies();
  ForwardArgs a;
  a.x = inputs_.x[c].as<void>();
  a.w1 = weights_.w1.as<void>();
  a.w2 = weights_.w2.as<void>();
  a.topk_ids = inputs_.topk_ids[c].as<std::int32_t>();
  a.topk_weights = inputs_.topk_weights[c].as<void>();
  a.out = out_.as<void>();
  a.saved = scratch.saved.as<void>();
  a.saved_bytes = scratch.saved.bytes();
  a.workspace = scratch.forward_ws.as<void>();
  a.workspace_bytes = scratch.forward_ws.bytes();
  a.stream = stream_;
  return a;
}

BackwardArgs MoeSteps::backward_args(int step, const PlanBuffers& scratch) const {
  const int c = step % inputs_.copies();
  BackwardArgs a;
  a.d_out = inputs_.d_out[c].as<void>();
  a.x = inputs_.x[c].as<void>();
  a.w1 = weights_.w1.as<void>();
  a.w2 = weights_.w2.as<void>();
  a.topk_ids = inputs_.topk_ids[c].as<std::int32_t>();
  a.topk_weights = inputs_.topk_weights[c].as<void>();
  a.saved = scratch.saved.as<void>();
  a.saved_bytes = scratch.saved.bytes();
  a.dx = dx_.as<void>();
  a.dw1 = weights_.dw1.as<void>();
  a.dw2 = weights_.dw2.as<void>();
  a.d_topk_weights = d_topk_weights_.as<void>();
  a.workspace = scratch.backward_ws.as<void>();
  a.workspace_bytes = scratch.backward_ws.bytes();
  a.stream = stream_;
  return a;
}

Enqueue MoeSteps::enqueue_us(int calls) {
  FusedMoe& plan = plans_.at(Mode::kTraining);
  const PlanBuffers scratch(plan.memory());
  // One step outside the timing: the plan's first calls, and a saved state for the backwards.
  plan.forward(forward_args(0, scratch));
  plan.backward(backward_args(0, scratch));
  MOEJIT_CU(cuda::driver().cuStreamSynchronize(stream_));
  const auto per_call = [&](auto call) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call(i);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    MOEJIT_CU(cuda::driver().cuStreamSynchronize(stream_));
    return us / calls;
  };
  // The arguments are built before each timing (a call's own cost only), rotating the inputs.
  std::vector<ForwardArgs> fwd;
  std::vector<BackwardArgs> bwd;
  for (int i = 0; i < calls; ++i) {
    fwd.push_back(forward_args(i, scratch));
    bwd.push_back(backward_args(i, scratch));
  }
  Enqueue e;
  e.forward_us = per_call([&](int i) { plan.forward(fwd[i]); });
  e.backward_us = per_call([&](int i) { plan.backward(bwd[i]); });
  const cuda::CapturedGraph step(stream_, [&] {
    plan.forward(fwd[0]);
    plan.backward(bwd[0]);
  });
  e.graph_step_us = per_call([&](int) { step.launch(stream_); });
  return e;
}

Stats MoeSteps::measure(StepKind kind, StreamTimer& timer, int warmup, int iters) {
  FusedMoe& plan = plans_.at(plan_mode(kind));
  const PlanBuffers scratch(plan.memory());
  auto forward = [&](int step) { plan.forward(forward_args(step, scratch)); };
  auto backward = [&](int step) { plan.backward(backward_args(step, scratch)); };
  switch (kind) {
    case StepKind::kForward:
    case StepKind::kInference: return timer.measure(warmup, iters, {}, forward);
    case StepKind::kBackward: return timer.measure(warmup, iters, forward, backward);
    case StepKind::kFull:
    case StepKind::kMemEff: break;
    case StepKind::kFrozen:
      return timer.measure(warmup, iters, {}, [&](int step) {
        forward(step);
        BackwardArgs a = backward_args(step, scratch);
        a.dw1 = a.dw2 = nullptr;
        plan.backward(a);
      });
  }
  return timer.measure(warmup, iters, {}, [&](int step) {
    forward(step);
    backward(step);
  });
}

HostInputs MoeSteps::host_inputs() const {
  return {download_all<std::uint16_t>(inputs_.x[0]), download_all<std::uint16_t>(inputs_.topk_weights[0]),
          download_all<std::uint16_t>(inputs_.d_out[0]), download_all<std::int32_t>(inputs_.topk_ids[0])};
}

SampledOutputs MoeSteps::sampled_step(StepKind kind, const CheckSample& sample) {
  FusedMoe& plan = plans_.at(plan_mode(kind));
  const PlanBuffers scratch(plan.memory());
  const Checked what = checked_outputs(kind);
  std::vector<const cuda::DeviceBuffer*> poisoned = {&out_, &scratch.saved, &scratch.forward_ws};
  if (what.backward) poisoned.insert(poisoned.end(), {&dx_, &d_topk_weights_, &scratch.backward_ws});
  if (what.weight_gradients) poisoned.insert(poisoned.end(), {&weights_.dw1, &weights_.dw2});
  // On the step's stream, so the fills are ordered before it wherever the stream runs (a green
  // context's too).
  for (const cuda::DeviceBuffer* b : poisoned) {
    if (b->bytes() > 0) MOEJIT_CU(cuda::driver().cuMemsetD8Async(b->get(), 0xff, b->bytes(), stream_));
  }
  plan.forward(forward_args(0, scratch));
  if (what.backward) {
    BackwardArgs a = backward_args(0, scratch);
    if (!what.weight_gradients) a.dw1 = a.dw2 = nullptr;
    plan.backward(a);
  }
  MOEJIT_CU(cuda::driver().cuStreamSynchronize(stream_));

  const std::size_t H = problem_.hidden, I = problem_.intermediate, K = problem_.topk;
  const auto values = [&](const cuda::DeviceBuffer& b, std::size_t offset, std::size_t count) {
    return from_storage(problem_.dtype, download<std::uint16_t>(b, offset, count));
  };
  SampledOutputs got;
  for (long long t : sample.tokens) {
    const auto row = static_cast<std::size_t>(t);
    append(got.out, values(out_, row * H, H));
    if (!what.backward) continue;
    append(got.dx, values(dx_, row * H, H));
    append(got.d_topk_weights, values(d_topk_weights_, row * K, K));
  }
  if (!what.weight_gradients) return got;
  for (const CheckSample::Columns& c : sample.weights) {
    const std::size_t e = c.expert;
    // dW2[e]'s columns are strided: read the expert's whole [H, I] slice.
    const std::vector<double> dw2 = values(weights_.dw2, e * H * I, H * I);
    for (int i : c.columns) {
      append(got.dw1, values(weights_.dw1, (e * 2 * I + i) * H, H));
      append(got.dw1, values(weights_.dw1, (e * 2 * I + I + i) * H, H));
      for (std::size_t h = 0; h < H; ++h) got.dw2.push_back(dw2[h * I + i]);
    }
  }
  return got;
}

}  // namespace moejit::bench
