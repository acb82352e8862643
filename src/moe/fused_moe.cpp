// FusedMoe: the plan (configs chosen, kernels compiled and loaded) and the forward/backward
// orchestration of DESIGN.md's kernel roles on the caller's stream.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/env.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"
#include "jit/kernel_cache.hpp"
#include "moe/kernel_params.hpp"
#include "moe/launch.hpp"
#include "moe/memory_layout.hpp"
#include "moe/routing.hpp"
#include "moe/validate.hpp"
#include "moejit/moejit.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

struct RoleKernel {
  TileConfig config;
  const jit::LoadedKernel* kernel = nullptr;
  LaunchGeometry geometry;
};

TileConfig choose_config(Role role, const MoeShape& shape, const cuda::DeviceInfo& device, const Options& options) {
  auto it = options.config_overrides.find(role_name(role));
  if (it == options.config_overrides.end()) return default_config(role, shape, device);
  for (const TileConfig& c : config_space(role, shape)) {
    if (c.name() != it->second) continue;
    if (auto why = prune_reason(role, c, shape, device)) {
      throw InvalidArgument("config_overrides", fmt::format("{} config {} is pruned: {}", role_name(role), c.name(), *why));
    }
    return c;
  }
  throw InvalidArgument("config_overrides",
                        fmt::format("{} has no config named '{}' for this problem", role_name(role), it->second));
}

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

}  // namespace

struct FusedMoe::Impl {
  MoeProblem problem;
  MoeShape shape;
  Options options;
  MemoryPlan memory;
  MemoryLayout layout;
  cuda::DeviceInfo device;
  unsigned long long context = 0;  // cuda::current_context_id() of the context kernels are loaded in
  int block_m = 0;
  bool aligned = true;  // H and I multiples of 8: 16-byte vector paths
  std::map<Role, RoleKernel> kernels;
  std::set<const void*> consumed;  // memory-efficient saved states already used by a backward

  const RoleKernel& role(Role r) const { return kernels.at(r); }

  void check_context() const {
    if (cuda::current_context_id() != context) {
      throw StateError("the current CUDA context is not the one this FusedMoe was built in");
    }
  }

  params::RoutingView routing_view(void* routing_base) const {
    const RoutingBuffers b = routing_buffers(reinterpret_cast<CUdeviceptr>(routing_base), layout.routing);
    return {b.sorted_pairs,
            b.expert_offsets,
            b.expert_tile_offsets,
            b.tile_expert,
            b.tile_row_begin,
            problem.experts,
            problem.topk,
            static_cast<std::int32_t>(layout.routing.max_tiles)};
  }

  void run_routing(const std::int32_t* topk_ids, void* routing_base, CUstream stream) const {
    RoutingArgs args{reinterpret_cast<CUdeviceptr>(topk_ids), problem.tokens, problem.topk, problem.experts, block_m,
                     reinterpret_cast<CUdeviceptr>(routing_base), layout.routing.total_bytes, stream};
    const RoleKernel& k = role(Role::kRouting);
    launch_routing(*k.kernel, k.config, args);
    if (options.check_expert_ids) check_expert_ids(routing_base, stream);
  }

  // Reads the dropped-pair count back: the one synchronising path, opt-in.
  void check_expert_ids(void* routing_base, CUstream stream) const {
    const cuda::Driver& d = cuda::driver();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    MOEJIT_CU(d.cuStreamIsCapturing(stream, &status));
    if (status != CU_STREAM_CAPTURE_STATUS_NONE) {
      throw InvalidArgument("check_expert_ids", "cannot read expert ids back while the stream is being captured");
    }
    MOEJIT_CU(d.cuStreamSynchronize(stream));
    std::int32_t dropped = 0;
    const RoutingBuffers b = routing_buffers(reinterpret_cast<CUdeviceptr>(routing_base), layout.routing);
    MOEJIT_CU(d.cuMemcpyDtoH(&dropped, reinterpret_cast<CUdeviceptr>(b.expert_counts + problem.experts), 4));
    if (dropped > 0) {
      throw InvalidArgument("topk_ids", fmt::format("{} expert id(s) outside [0, {})", dropped, problem.experts));
    }
  }

  void launch(Role r, void* params, CUstream stream) const {
    const RoleKernel& k = role(r);
    launch_role(*k.kernel, k.geometry, params, stream);
  }
};

FusedMoe::FusedMoe(const MoeProblem& problem, const Options& options) : impl_(std::make_unique<Impl>()) {
  validate_problem(problem);
  Impl& s = *impl_;
  s.problem = problem;
  s.options = options;
  s.shape = {problem.tokens, problem.experts, problem.hidden, problem.intermediate, problem.topk, problem.dtype};
  s.context = cuda::current_context_id();
  s.device = cuda::query_current_device();
  s.block_m = token_block_m(s.shape);
  s.aligned = problem.hidden % 8 == 0 && problem.intermediate % 8 == 0;
  s.layout = memory_layout(s.shape, problem.mode, s.block_m);
  s.memory = {s.layout.saved_bytes, s.layout.forward_bytes, s.layout.backward_bytes};

  std::vector<Role> roles = {Role::kRouting, Role::kFwdUp, Role::kFwdDown, Role::kGatherSum};
  if (problem.mode != Mode::kInference) {
    roles.insert(roles.end(), {Role::kBwdDown, Role::kBwdDw2, Role::kBwdDx, Role::kBwdDw1});
  }
  std::vector<jit::KernelSpec> specs;
  for (Role r : roles) {
    const TileConfig c = choose_config(r, s.shape, s.device, options);
    jit::KernelSpec spec{r, c, problem.dtype, s.device.arch()};
    spec.aligned = r == Role::kRouting || s.aligned;
    spec.fused_act = r == Role::kBwdDw2 && problem.mode == Mode::kMemoryEfficient;
    specs.push_back(spec);
  }
  // Compile every missing kernel in parallel first; load() then finds them in memory (and
  // rethrows a compile error with its log).
  auto& cache = jit::KernelCache::instance();
  cache.compile_all(specs, env::compile_jobs());
  for (const jit::KernelSpec& spec : specs) {
    RoleKernel k;
    k.config = spec.config;
    k.kernel = &cache.load(spec);
    if (spec.role != Role::kRouting) {
      k.geometry = launch_geometry(spec.role, spec.config, s.shape, s.layout.routing.max_tiles, s.aligned);
    }
    s.kernels[spec.role] = k;
  }
}

FusedMoe::~FusedMoe() = default;
FusedMoe::FusedMoe(FusedMoe&&) noexcept = default;
FusedMoe& FusedMoe::operator=(FusedMoe&&) noexcept = default;

const MoeProblem& FusedMoe::problem() const { return impl_->problem; }
const MemoryPlan& FusedMoe::memory() const { return impl_->memory; }

std::map<std::string, std::string> FusedMoe::configs() const {
  std::map<std::string, std::string> out;
  for (const auto& [r, k] : impl_->kernels) out[role_name(r)] = k.config.name();
  return out;
}

void FusedMoe::forward(const ForwardArgs& a) {
  Impl& s = *impl_;
  validate_forward(a, s.problem, s.memory, s.aligned);
  s.check_context();
  const MemoryLayout& l = s.layout;
  CUstream stream = reinterpret_cast<CUstream>(a.stream);
  void* routing_base = l.routing_in_saved ? at(a.saved, l.routing_offset) : at(a.workspace, l.routing_offset);
  s.run_routing(a.topk_ids, routing_base, stream);
  const params::RoutingView view = s.routing_view(routing_base);
  const std::int32_t h = s.problem.hidden, i = s.problem.intermediate;

  params::FwdUp up{a.x, a.w1, at(a.workspace, l.act), l.pre_act == MemoryLayout::kNone ? nullptr : at(a.saved, l.pre_act),
                   view, h, i};
  s.launch(Role::kFwdUp, &up, stream);
  params::FwdDown down{at(a.workspace, l.act), a.w2, at(a.workspace, l.y), view, h, i};
  s.launch(Role::kFwdDown, &down, stream);
  const RoutingBuffers rb = routing_buffers(reinterpret_cast<CUdeviceptr>(routing_base), l.routing);
  params::GatherSum sum{at(a.workspace, l.y), a.topk_weights, rb.pair_rows, view.expert_offsets, a.out,
                        nullptr, nullptr, h, s.problem.topk, s.problem.experts};
  s.launch(Role::kGatherSum, &sum, stream);
  s.consumed.erase(a.saved);
}

void FusedMoe::backward(const BackwardArgs& a) {
  Impl& s = *impl_;
  validate_backward(a, s.problem, s.memory, s.aligned);
  const bool memeff = s.problem.mode == Mode::kMemoryEfficient;
  if (memeff && s.consumed.count(a.saved)) {
    throw StateError("memory-efficient backward already consumed this saved state; run forward() again first");
  }
  s.check_context();
  const MemoryLayout& l = s.layout;
  CUstream stream = reinterpret_cast<CUstream>(a.stream);
  void* routing_base = at(a.saved, l.routing_offset);
  const params::RoutingView view = s.routing_view(routing_base);
  const std::int32_t h = s.problem.hidden, i = s.problem.intermediate;
  void* pre_act = at(a.saved, l.pre_act);
  float* ds_acc = reinterpret_cast<float*>(at(a.workspace, l.ds_acc));
  MOEJIT_CU(cuda::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(ds_acc), 0,
                                             static_cast<std::size_t>(s.shape.pairs()), stream));

  void* d_pre_act = memeff ? pre_act : at(a.workspace, l.d_pre_act);
  void* weighted_act = memeff ? nullptr : at(a.workspace, l.weighted_act);
  params::BwdDown down{a.d_out, a.w2, a.topk_weights, pre_act, d_pre_act, weighted_act, ds_acc, view, h, i};
  params::BwdDw2 dw2{a.d_out, weighted_act, pre_act, a.topk_weights, a.dw2, view, h, i};
  if (memeff) {
    // dW2 recomputes s * act from pre_act, so it must run before bwd_down overwrites pre_act.
    s.launch(Role::kBwdDw2, &dw2, stream);
    s.launch(Role::kBwdDown, &down, stream);
  } else {
    s.launch(Role::kBwdDown, &down, stream);
    s.launch(Role::kBwdDw2, &dw2, stream);
  }
  params::BwdDx dx{d_pre_act, a.w1, at(a.workspace, l.dx_rows), view, h, i};
  s.launch(Role::kBwdDx, &dx, stream);
  const RoutingBuffers rb = routing_buffers(reinterpret_cast<CUdeviceptr>(routing_base), l.routing);
  params::GatherSum sum{at(a.workspace, l.dx_rows), nullptr, rb.pair_rows, view.expert_offsets, a.dx,
                        ds_acc, a.d_topk_weights, h, s.problem.topk, s.problem.experts};
  s.launch(Role::kGatherSum, &sum, stream);
  params::BwdDw1 dw1{d_pre_act, a.x, a.dw1, view, h, i};
  s.launch(Role::kBwdDw1, &dw1, stream);
  if (memeff) s.consumed.insert(a.saved);
}

}  // namespace moejit
