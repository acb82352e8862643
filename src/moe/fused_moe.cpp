// FusedMoe: the plan (configs chosen, kernels compiled and loaded) and the forward/backward
// orchestration of DESIGN.md's kernel roles on the caller's stream.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/env.hpp"
#include "cuda/call_graph.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"
#include "cuda/pointer.hpp"
#include "jit/kernel_cache.hpp"
#include "moe/kernel_specs.hpp"
#include "moe/launch.hpp"
#include "moe/memory_layout.hpp"
#include "moe/routing.hpp"
#include "moe/saved_states.hpp"
#include "moe/steps.hpp"
#include "moe/validate.hpp"
#include "moejit/moejit.hpp"
#include "tuner/config_resolver.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

struct RoleKernel {
  TileConfig config;
  std::string source;  // where the config came from (tuner/config_resolver.hpp)
  const jit::LoadedKernel* kernel = nullptr;
  LaunchGeometry geometry;
};

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
  std::uint32_t stamp = 0;  // state_stamp(problem)
  bool aligned = true;  // H and I multiples of 8: 16-byte vector paths
  bool graphs = true;   // env::call_graphs() when the plan was built
  std::atomic<bool> last_graphed = false;
  // Held while a call sets and launches its graph: a call from another thread meanwhile (which
  // the API does not promise to serve) enqueues on its stream instead of waiting.
  std::mutex graph_mu;
  std::map<Role, RoleKernel> kernels;
  // One graph per sequence of work a call enqueues (cuda::CallGraph) and stream: a graph's
  // launches are ordered after each other, so one graph on two streams would tie them together
  // (and deadlock streams whose kernels wait on each other, as communication kernels do).
  enum CallKind { kForwardCall, kBackwardCall, kFrozenBackwardCall };
  static constexpr std::size_t kMaxCallGraphs = 16;  // past it, calls on new streams launch one by one
  std::map<std::pair<CallKind, CUstream>, std::unique_ptr<cuda::CallGraph>> call_graphs;

  const RoleKernel& role(Role r) const { return kernels.at(r); }

  // The current context, once it is known to be the plan's: the checks below compare against it.
  CUcontext check_context() const {
    const CUcontext current = cuda::current_context();
    unsigned long long id = 0;
    MOEJIT_CU(cuda::driver().cuCtxGetId(current, &id));
    if (id != context) throw StateError("the current CUDA context is not the one this FusedMoe was built in");
    return current;
  }

  // `ids`: checking mode's host copy of the expert ids, sized before anything is enqueued (empty
  // otherwise), so that a failed allocation leaves the call rejected rather than half-run.
  void run_routing(const RoutingArgs& args, const std::int32_t* dropped_count, std::vector<std::int32_t>& ids,
                   const LaunchStream& on) const {
    const RoleKernel& k = role(Role::kRouting);
    launch_routing(*k.kernel, k.config, args, on.queue);
    if (options.check_expert_ids) check_expert_ids(dropped_count, args, ids);
  }

  // `current` from check_context: the driver answers for it. Two queries per tensor cost about
  // 2 µs per call (0.06-0.09 µs each on the H200's host, session 35).
  void require_device_memory(const std::vector<TensorRegion>& tensors, CUcontext current) const {
    moejit::require_device_memory(tensors, device.ordinal, reinterpret_cast<std::uintptr_t>(current),
                                  cuda::query_pointer);
  }

  // A stream of another context would fail only at the first enqueue, after a memory-efficient
  // backward has given up its saved state. Returns where the call's kernels run: the driver is
  // asked once per call, not at every persistent launch.
  LaunchStream own_stream(CUstream stream, CUcontext current) const {
    if (stream == CU_STREAM_PER_THREAD && cuda::green_context_current()) {
      throw InvalidArgument("stream", "the per-thread default stream cannot be used while a green context is current "
                                      "(the driver's rule): pass a stream of the green context");
    }
    const cuda::StreamOwner owner = cuda::stream_owner(stream);
    if (owner.context != current) {
      throw InvalidArgument("stream", "belongs to another CUDA context than the one this FusedMoe was built in");
    }
    return {stream, cuda::green_sm_count(owner.green), device.sm_count, owner.green != nullptr};
  }

  // Inference writes no saved state: a buffer passed there anyway keeps what it held. Recorded in
  // the plan's context, the one its backward checks.
  void record_saved(const void* saved, SavedStates::State state) const {
    if (memory.saved_bytes > 0) SavedStates::instance().record(context, saved, memory.saved_bytes, problem, state);
  }

  // The state's stamp, stream-ordered (a memset node where the stream is captured).
  void write_stamp(const void* saved, std::uint32_t value, const LaunchStream& on) const {
    on.queue->memset32(reinterpret_cast<CUdeviceptr>(saved) + layout.stamp, value, MemoryLayout::kStampBytes / 4);
  }

  // An adopted or captured state's stamp, read on the backward's stream (after the caller's copy
  // into it, or the graph's run), unless the stream is being captured, where nothing can be read
  // back: it stays unchecked, and the next backward outside a capture checks it. The routing
  // kernel's check phase runs first: a stamp of this problem over tables that a forward would not
  // have written (a damaged copy) comes back as kDamagedStamp, so no kernel indexes with them.
  // Before SavedStates::use: a refusal consumes nothing. MOEJIT_CHECK_ADOPTED=0 spares the check
  // and the stream synchronisation, and trusts the caller.
  void check_unverified(const void* saved, CUstream stream) const {
    const std::optional<SavedStates::Unchecked> unchecked = SavedStates::instance().unchecked(context, saved);
    if (!unchecked || !env::check_adopted_states()) return;
    if (cuda::stream_capturing(stream)) return;
    // Another thread's global-mode capture would take the readback for an unsafe call and end.
    const cuda::CaptureModeGuard relaxed(CU_STREAM_CAPTURE_MODE_RELAXED);
    const cuda::Driver& d = cuda::driver();
    const auto base = reinterpret_cast<CUdeviceptr>(saved);
    const RoleKernel& routing = role(Role::kRouting);
    launch_routing_check(*routing.kernel, routing.config,
                         {base + layout.routing_offset, layout.routing, problem.tokens * problem.topk,
                          problem.experts, block_m, base + layout.stamp, stamp, stream});
    std::array<std::uint32_t, MemoryLayout::kStampBytes / 4> words{};
    MOEJIT_CU(d.cuMemcpyDtoHAsync(words.data(), base + layout.stamp, MemoryLayout::kStampBytes, stream));
    MOEJIT_CU(d.cuStreamSynchronize(stream));
    const auto ours = [&](std::uint32_t w) { return w == stamp; };
    if (!std::all_of(words.begin(), words.end(), ours)) {
      const char* recorded = unchecked->state == SavedStates::State::kAdopted
                                 ? "adopted with adopt_saved()"
                                 : "written by a forward() captured into a CUDA graph";
      const std::string problem_fields = fmt::format("T={}, E={}, H={}, I={}, K={}", problem.tokens, problem.experts,
                                                     problem.hidden, problem.intermediate, problem.topk);
      if (words[0] == kDamagedStamp && std::all_of(words.begin() + 1, words.end(), ours)) {
        throw StateError(fmt::format(
            "saved: {}, and stamped by a forward() of this problem ({}), but its routing tables hold what no forward "
            "writes (a damaged or partial copy); run forward() again first",
            recorded, problem_fields));
      }
      throw StateError(fmt::format(
          "saved: {}, but it holds no completed forward() state of this problem ({}) of this build: its stamp is "
          "another's, or none (a graph not yet run, a forward stopped part-way, a consumed state, or never a state); "
          "run forward() again first",
          recorded, problem_fields));
    }
    SavedStates::instance().checked(context, saved, unchecked->recorded);
  }

  // Reads the dropped-pair count back, then the ids for a token that names an expert twice: the
  // one synchronising path, opt-in. The copies go on the caller's stream: a synchronous copy
  // would wait on every blocking stream of the context.
  void check_expert_ids(const std::int32_t* dropped_count, const RoutingArgs& args, std::vector<std::int32_t>& ids) const {
    CUstream stream = args.stream;
    const cuda::Driver& d = cuda::driver();
    std::int32_t dropped = 0;
    MOEJIT_CU(d.cuMemcpyDtoHAsync(&dropped, reinterpret_cast<CUdeviceptr>(dropped_count), 4, stream));
    MOEJIT_CU(d.cuMemcpyDtoHAsync(ids.data(), args.topk_ids, ids.size() * sizeof(std::int32_t), stream));
    MOEJIT_CU(d.cuStreamSynchronize(stream));
    if (dropped > 0) {
      const auto bad = std::find_if(ids.begin(), ids.end(), [&](std::int32_t e) { return e < 0 || e >= problem.experts; });
      const long long at = bad - ids.begin();
      throw InvalidArgument("topk_ids", fmt::format("{} expert id(s) outside [0, {}), the first at token {}, slot {} ({})",
                                                    dropped, problem.experts, at / args.topk, at % args.topk,
                                                    bad == ids.end() ? 0 : *bad));
    }
    check_distinct_experts(ids.data(), args.tokens, args.topk);
  }

  void launch(Role r, void* params, const LaunchStream& on) const {
    const RoleKernel& k = role(r);
    launch_role(r, k.config, shape, *k.kernel, k.geometry, params, on);
  }

  bool reads_sorted(Role r, SortedRows rows) const { return sorted_rows_read(r, role(r).config) == rows; }

  void scatter(params::GatherSum& params, const LaunchStream& on) const {
    const RoleKernel& k = role(Role::kGatherSum);
    launch_scatter_rows(*k.kernel, k.geometry, params, on);
  }

  // The graph of `kind` on `stream`, made empty on first use; null past kMaxCallGraphs. Under graph_mu.
  cuda::CallGraph* call_graph(CallKind kind, CUstream stream) {
    auto it = call_graphs.find({kind, stream});
    if (it != call_graphs.end()) return it->second.get();
    if (call_graphs.size() >= kMaxCallGraphs) return nullptr;
    return call_graphs.emplace(std::pair{kind, stream}, std::make_unique<cuda::CallGraph>()).first->second.get();
  }

  // Runs `body`, which enqueues one call's work where the LaunchStream it is given says, as the
  // call's graph (cuda::CallGraph), or straight onto the stream: where the stream is being
  // captured (the caller's graph takes the launches), where the call reads back in the middle
  // (check_expert_ids), on a green context's stream, while another thread holds the plan's graphs,
  // on a stream past kMaxCallGraphs, and where graphs are off or the driver refused this one.
  // `body` may run twice: when the graph does not take the call, nothing was enqueued yet.
  template <typename Body>
  void enqueue(CallKind kind, LaunchStream on, CUcontext current, bool stream_only, Body&& body) {
    if (graphs && !stream_only && !on.green) {
      const std::unique_lock<std::mutex> lock(graph_mu, std::try_to_lock);
      cuda::CallGraph* graph = lock.owns_lock() ? call_graph(kind, on.stream) : nullptr;
      if (graph != nullptr && !graph->refused()) {
        // Building and instantiating a graph while another thread captures in the global mode
        // would end that capture, as a plan's construction would.
        const cuda::CaptureModeGuard relaxed(CU_STREAM_CAPTURE_MODE_RELAXED);
        cuda::CallGraph::Call call(*graph, current);
        on.queue = &call;
        body(static_cast<const LaunchStream&>(on));
        if (call.finish(on.stream)) {
          last_graphed = true;
          return;
        }
      }
    }
    cuda::StreamQueue queue(on.stream);
    on.queue = &queue;
    body(static_cast<const LaunchStream&>(on));
  }
};

FusedMoe::FusedMoe(const MoeProblem& problem, const Options& options) : impl_(std::make_unique<Impl>()) {
  validate_problem(problem);
  const cuda::CaptureModeGuard relaxed(CU_STREAM_CAPTURE_MODE_RELAXED);
  Impl& s = *impl_;
  s.problem = problem;
  s.options = options;
  s.shape = shape_of(problem);
  s.context = cuda::current_context_id();
  s.device = cuda::query_current_device();
  s.block_m = token_block_m(s.shape);
  s.stamp = state_stamp(problem);
  // Read by backward(), and only over an adopted state: a malformed value fails the plan now.
  env::check_adopted_states();
  s.aligned = vector_aligned(problem);
  s.graphs = env::call_graphs();
  s.layout = memory_layout(problem);
  s.memory = {s.layout.saved_bytes, s.layout.forward_bytes, s.layout.backward_bytes};

  const std::map<Role, ResolvedConfig> chosen = resolve_configs(problem, s.device, options);
  std::vector<jit::KernelSpec> specs;
  for (const auto& [r, c] : chosen) specs.push_back(role_kernel_spec(r, c.config, problem, s.device.arch()));
  // Compile every missing kernel in parallel first; load() then finds them in memory. A kernel
  // that failed is not cached: load() compiles it once more and throws its CompileError, log
  // included.
  auto& cache = jit::KernelCache::instance();
  cache.compile_all(specs, env::compile_jobs());
  for (const jit::KernelSpec& spec : specs) {
    RoleKernel k;
    k.config = spec.config;
    k.source = chosen.at(spec.role).source;
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

FusedMoe::Impl& FusedMoe::live() const {
  if (!impl_) throw StateError("this FusedMoe was moved from: it holds no plan");
  return *impl_;
}

const MoeProblem& FusedMoe::problem() const { return live().problem; }
const MemoryPlan& FusedMoe::memory() const { return live().memory; }

std::map<std::string, std::string> FusedMoe::configs() const {
  std::map<std::string, std::string> out;
  for (const auto& [r, k] : live().kernels) out[role_name(r)] = k.config.name();
  return out;
}

bool FusedMoe::last_call_graphed() const { return live().last_graphed; }

std::map<std::string, std::string> FusedMoe::config_sources() const {
  std::map<std::string, std::string> out;
  for (const auto& [r, k] : live().kernels) out[role_name(r)] = k.source;
  return out;
}

void FusedMoe::forward(const ForwardArgs& a) {
  Impl& s = live();
  s.last_graphed = false;
  const std::vector<TensorRegion> tensors = validate_forward(a, s.problem, s.memory, s.aligned);
  const CUcontext current = s.check_context();
  s.require_device_memory(tensors, current);
  const LaunchStream on = s.own_stream(reinterpret_cast<CUstream>(a.stream), current);
  CUstream stream = on.stream;
  ForwardSteps f = forward_steps(a, s.problem, s.layout, s.block_m);
  // A captured forward's state is written when its graph runs, if ever: its stamp is checked.
  const bool captured = cuda::stream_capturing(stream);
  std::vector<std::int32_t> ids;
  if (s.options.check_expert_ids) {
    // check_expert_ids synchronises the stream, which a capture forbids: refused before anything is
    // enqueued, as forward() promises, though the readback itself follows routing.
    if (captured) {
      throw InvalidArgument("check_expert_ids", "cannot read expert ids back while the stream is being captured");
    }
    ids.resize(static_cast<std::size_t>(f.routing.tokens * f.routing.topk));
  }
  SavedStates::instance().overwrite(tensors, nullptr);  // this call's own state is recorded below
  try {
    s.enqueue(Impl::kForwardCall, on, current, captured || s.options.check_expert_ids, [&](const LaunchStream& q) {
      // A forward that stops part-way leaves no stamp: a copy of the buffer holds no state.
      if (s.layout.stamp != MemoryLayout::kNone) s.write_stamp(a.saved, 0, q);
      s.run_routing(f.routing, f.dropped_count, ids, q);
      if (s.reads_sorted(Role::kFwdUp, SortedRows::kX)) s.scatter(f.scatter_x, q);
      s.launch(Role::kFwdUp, &f.fwd_up, q);
      s.launch(Role::kFwdDown, &f.fwd_down, q);
      s.launch(Role::kGatherSum, &f.gather_out, q);
      if (s.layout.stamp != MemoryLayout::kNone) s.write_stamp(a.saved, s.stamp, q);
    });
  } catch (...) {
    s.record_saved(a.saved, SavedStates::State::kPartial);
    throw;
  }
  s.record_saved(a.saved, captured ? SavedStates::State::kCaptured : SavedStates::State::kComplete);
}

void FusedMoe::adopt_saved(const void* saved) {
  Impl& s = live();
  const std::vector<TensorRegion> tensors = validate_adopted(saved, s.problem, s.memory);
  s.require_device_memory(tensors, s.check_context());
  // The copy wrote these bytes: states recorded over them are gone, as after a forward.
  SavedStates::instance().overwrite(tensors, nullptr);
  s.record_saved(saved, SavedStates::State::kAdopted);
}

void FusedMoe::backward(const BackwardArgs& a) {
  Impl& s = live();
  s.last_graphed = false;
  const std::vector<TensorRegion> tensors = validate_backward(a, s.problem, s.memory, s.aligned);
  const CUcontext current = s.check_context();
  s.require_device_memory(tensors, current);
  const LaunchStream on = s.own_stream(reinterpret_cast<CUstream>(a.stream), current);
  CUstream stream = on.stream;
  BackwardSteps b = backward_steps(a, s.problem, s.layout);
  s.check_unverified(a.saved, stream);
  // Last before the launches. bwd_down writes d_pre_act over the saved pre_act here: from the
  // first launch on, even one that fails later, the state is gone. No InvalidArgument, StateError
  // or NoDeviceError after this: the PyTorch front end takes those as refusals that left the
  // state whole (python/moejit/torch/ops.py).
  SavedStates::instance().use(s.context, a.saved, s.problem,
                              s.problem.mode == Mode::kMemoryEfficient ? SavedStates::Use::kConsume
                                                                       : SavedStates::Use::kRead);
  SavedStates::instance().overwrite(tensors, a.saved);
  const Impl::CallKind kind = b.weight_grads ? Impl::kBackwardCall : Impl::kFrozenBackwardCall;
  s.enqueue(kind, on, current, cuda::stream_capturing(stream), [&](const LaunchStream& q) {
    q.queue->memset32(reinterpret_cast<CUdeviceptr>(b.ds_acc), 0, b.ds_count);
    // A copy of the state taken from here on holds no state: its stamp says so.
    if (s.problem.mode == Mode::kMemoryEfficient) s.write_stamp(a.saved, 0, q);
    if (s.reads_sorted(Role::kBwdDown, SortedRows::kDOut) ||
        (b.weight_grads && s.reads_sorted(Role::kBwdDw2, SortedRows::kDOut))) {
      s.scatter(b.scatter_d_out, q);
    }
    if (b.dw2_first) s.launch(Role::kBwdDw2, &b.bwd_dw2, q);
    if (b.chunk_experts < s.problem.experts || b.chunk_columns < s.problem.intermediate) {
      const RoleKernel& down = s.role(Role::kBwdDown);
      const RoleKernel& dw2 = s.role(Role::kBwdDw2);
      const int inter = static_cast<int>(s.problem.intermediate);
      for (int first = 0; first < s.problem.experts; first += b.chunk_experts) {
        for (int n_begin = 0; n_begin < inter; n_begin += b.chunk_columns) {
          ExpertChunk c = expert_chunk(b, first, n_begin);
          const int columns = c.bwd_dw2.n_end - n_begin;
          launch_role(Role::kBwdDown, down.config, s.shape, *down.kernel,
                      column_subset(down.geometry, inter, columns, down.config.block_n), &c.bwd_down, q);
          launch_role(Role::kBwdDw2, dw2.config, s.shape, *dw2.kernel,
                      expert_subset(column_subset(dw2.geometry, inter, columns, dw2.config.block_n),
                                    s.problem.experts, c.bwd_dw2.routing.experts),
                      &c.bwd_dw2, q);
        }
      }
    } else {
      s.launch(Role::kBwdDown, &b.bwd_down, q);
      if (b.weight_grads && !b.dw2_first) s.launch(Role::kBwdDw2, &b.bwd_dw2, q);
    }
    s.launch(Role::kBwdDx, &b.bwd_dx, q);
    s.launch(Role::kGatherSum, &b.gather_dx, q);
    if (!b.weight_grads) return;
    if (s.reads_sorted(Role::kBwdDw1, SortedRows::kX)) s.scatter(b.scatter_x, q);
    s.launch(Role::kBwdDw1, &b.bwd_dw1, q);
  });
}

}  // namespace moejit
