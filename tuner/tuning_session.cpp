#include "tuner/tuning_session.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/driver.hpp"
#include "jit/codegen.hpp"
#include "moe/kernel_params.hpp"
#include "moe/launch.hpp"
#include "moe/routing.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

cuda::DeviceBuffer alloc(std::size_t bytes) { return cuda::DeviceBuffer(std::max<std::size_t>(bytes, 256)); }

char* at(const cuda::DeviceBuffer& b, std::size_t offset) { return b.as<char>() + offset; }

// Where each output's copy starts in the snapshot: 256-byte aligned, as the buffers it copies.
std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

constexpr std::size_t kMaxCheckChunks = 256, kMinCheckChunk = 16384;

// ||got - want|| / ||want|| of one chunk's sums; a NaN (a NaN or an infinity in the reference) is
// returned as infinity, since max() would drop it.
double chunk_ratio(double diff2, double want2) {
  const double r = std::sqrt(diff2) / std::max(std::sqrt(want2), 1e-30);
  return std::isnan(r) ? std::numeric_limits<double>::infinity() : r;
}

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> check_chunks(std::size_t count) {
  const std::size_t size = std::max(kMinCheckChunk, (count + kMaxCheckChunks - 1) / kMaxCheckChunks);
  const std::size_t n = count == 0 ? 0 : std::max<std::size_t>(1, count / size);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t c = 0; c < n; ++c) out.emplace_back(c * size, c + 1 == n ? count : (c + 1) * size);
  return out;
}

TuningSession::TuningSession(const MoeProblem& problem, const cuda::DeviceInfo& device)
    : problem_(problem),
      shape_(shape_of(problem)),
      device_(device),
      block_m_(token_block_m(shape_)),
      aligned_(problem.hidden % 8 == 0 && problem.intermediate % 8 == 0),
      stream_(cuda::current_context()) {
  // The training layout holds every intermediate of every mode; variants differ only in params.
  layout_ = memory_layout(shape_, Mode::kTraining, block_m_);
  const std::size_t T = problem.tokens, E = problem.experts, H = problem.hidden, I = problem.intermediate,
                    K = problem.topk, TK = T * K;
  x_ = alloc(T * H * 2);
  w1_ = alloc(E * 2 * I * H * 2);
  w2_ = alloc(E * H * I * 2);
  ids_ = alloc(TK * 4);
  scores_ = alloc(TK * 2);
  d_out_ = alloc(T * H * 2);
  out_ = alloc(T * H * 2);
  dx_ = alloc(T * H * 2);
  dw1_ = alloc(E * 2 * I * H * 2);
  dw2_ = alloc(E * H * I * 2);
  ds_ = alloc(TK * 2);
  saved_ = alloc(layout_.saved_bytes);
  fwd_ws_ = alloc(layout_.forward_bytes);
  bwd_ws_ = alloc(layout_.backward_bytes);
  flush_ = alloc(2 * static_cast<std::size_t>(device.l2_bytes));
  sums_ = alloc(3 * kMaxCheckChunks * sizeof(double));
  x_rows_ = alloc(TK * H * 2);
  d_out_rows_ = alloc(TK * H * 2);
  weighted_act_ = alloc(TK * I * 2);

  utility_ = &jit::KernelCache::instance().load({Role::kUtility, TileConfig{}, problem.dtype, device.arch()});
  auto fill = [&](const cuda::DeviceBuffer& b, std::size_t count, float lo, float hi, unsigned long long seed) {
    params::Fill p{b.as<void>(), static_cast<long long>(count), seed, lo, hi};
    void* args[] = {&p};
    utility_->launch(jit::kUtilityFill, {static_cast<unsigned>(device.sm_count * 8)}, {256}, 0, stream_.get(), args);
  };
  fill(x_, T * H, -1.f, 1.f, 1);
  fill(w1_, E * 2 * I * H, -2.f / std::sqrt(float(H)), 2.f / std::sqrt(float(H)), 2);
  fill(w2_, E * H * I, -2.f / std::sqrt(float(I)), 2.f / std::sqrt(float(I)), 3);
  fill(scores_, TK, 0.05f, 1.f, 4);
  fill(d_out_, T * H, -1.f, 1.f, 5);
  params::TopkIds ids{ids_.as<std::int32_t>(), problem.tokens, problem.topk, problem.experts, 6};
  void* args[] = {&ids};
  utility_->launch(jit::kUtilityTopkIds, {static_cast<unsigned>(device.sm_count * 4)}, {256}, 0, stream_.get(), args);

  ForwardArgs f;
  f.x = x_.as<void>();
  f.w1 = w1_.as<void>();
  f.w2 = w2_.as<void>();
  f.topk_ids = ids_.as<std::int32_t>();
  f.topk_weights = scores_.as<void>();
  f.out = out_.as<void>();
  f.saved = saved_.as<void>();
  f.workspace = fwd_ws_.as<void>();
  f.stream = stream_.get();
  MoeProblem training = problem;
  training.mode = Mode::kTraining;
  fwd_ = forward_steps(f, training, layout_, block_m_);
  if (problem.mode == Mode::kInference) fwd_.fwd_up.pre_act = nullptr;
  BackwardArgs b;
  b.d_out = d_out_.as<void>();
  b.x = f.x;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.topk_ids = f.topk_ids;
  b.topk_weights = f.topk_weights;
  b.saved = f.saved;
  b.dx = dx_.as<void>();
  b.dw1 = dw1_.as<void>();
  b.dw2 = dw2_.as<void>();
  b.d_topk_weights = ds_.as<void>();
  b.workspace = bwd_ws_.as<void>();
  b.stream = stream_.get();
  bwd_ = backward_steps(b, training, layout_);
  // Memory-efficient kernels run on separate buffers here (tuning must not consume pre_act).
  // Where they recompute the activation, bwd_down only skips the weighted-activation store and
  // bwd_dw2's fused variant reads pre_act; otherwise they are training's kernels.
  if (memeff_recomputes_act(shape_, problem.mode)) {
    bwd_.bwd_down.weighted_act = nullptr;
  }
  if (bwd_.bwd_down.weighted_act != nullptr) {
    bwd_.bwd_down.weighted_act = weighted_act_.as<void>();
    bwd_.bwd_dw2.weighted_act = bwd_.bwd_down.weighted_act;
    bwd_.bwd_down.wact_ld = bwd_.bwd_dw2.wact_ld = static_cast<std::int32_t>(I);
    bwd_.bwd_down.weighted_act_rows = bwd_.bwd_dw2.weighted_act_rows = static_cast<std::int32_t>(TK);
  }
  fwd_.scatter_x.rows = bwd_.scatter_x.rows = x_rows_.as<void>();
  fwd_.fwd_up.x_rows = bwd_.bwd_dw1.x_rows = x_rows_.as<void>();
  bwd_.scatter_d_out.rows = d_out_rows_.as<void>();
  bwd_.bwd_down.d_out_rows = bwd_.bwd_dw2.d_out_rows = d_out_rows_.as<void>();
  std::size_t snapshot_bytes = 0;
  for (Role r : kAllRoles) {
    std::size_t bytes = 0;
    for (const Span& o : outputs_of(r)) bytes += round_up(o.bytes);
    snapshot_bytes = std::max(snapshot_bytes, bytes);
  }
  snapshot_ = alloc(snapshot_bytes);
  stream_.synchronize();
}

void TuningSession::launch(Role role, const RoleKernel& k) {
  // The primary context's stream: candidates run on the whole device.
  const LaunchStream s{stream_.get()};
  if (role == Role::kRouting) {
    launch_routing(*k.kernel, k.config, fwd_.routing);
    return;
  }
  // A step scatters x once for fwd_up and once for bwd_dw1, and dO once for bwd_down and bwd_dw2
  // together: bwd_dw2, whose TMA configs win wherever measured, pays for dO's; bwd_down reads
  // the rows prime() left.
  const SortedRows sorted = sorted_rows_read(role, k.config);
  if (sorted == SortedRows::kX) scatter(fwd_.scatter_x);
  if (sorted == SortedRows::kDOut && role == Role::kBwdDw2) scatter(bwd_.scatter_d_out);
  const LaunchGeometry g = launch_geometry(role, k.config, shape_, layout_.routing.max_tiles, aligned_);
  switch (role) {
    case Role::kFwdUp: launch_role(role, k.config, shape_, *k.kernel, g, &fwd_.fwd_up, s); break;
    case Role::kFwdDown: launch_role(role, k.config, shape_, *k.kernel, g, &fwd_.fwd_down, s); break;
    case Role::kGatherSum: launch_role(role, k.config, shape_, *k.kernel, g, &fwd_.gather_out, s); break;
    case Role::kBwdDown: launch_role(role, k.config, shape_, *k.kernel, g, &bwd_.bwd_down, s); break;
    case Role::kBwdDw2: launch_role(role, k.config, shape_, *k.kernel, g, &bwd_.bwd_dw2, s); break;
    case Role::kBwdDx: launch_role(role, k.config, shape_, *k.kernel, g, &bwd_.bwd_dx, s); break;
    case Role::kBwdDw1: launch_role(role, k.config, shape_, *k.kernel, g, &bwd_.bwd_dw1, s); break;
    default: throw InternalError("role cannot be tuned");
  }
}

void TuningSession::run(Role role, const RoleKernel& k) {
  if (role == Role::kBwdDown) {
    MOEJIT_CU(cuda::driver().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(bwd_.ds_acc), 0, bwd_.ds_count,
                                               stream_.get()));
  }
  launch(role, k);
}

std::optional<std::string> TuningSession::try_run(Role role, const RoleKernel& k) {
  try {
    run(role, k);
    return std::nullopt;
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const CudaError& e) {
    // A fault is recorded on the context and every later call returns it; a refused launch is not.
    if (cuda::driver().cuStreamSynchronize(stream_.get()) != CUDA_SUCCESS) throw;
    return std::string(e.what());
  } catch (const UnsupportedError& e) {
    return std::string(e.what());
  }
}

void TuningSession::scatter(params::GatherSum& params) {
  if (gather_sum_.kernel == nullptr) throw InternalError("token rows are scattered by the primed gather_sum kernel");
  const LaunchGeometry g = launch_geometry(Role::kGatherSum, gather_sum_.config, shape_, layout_.routing.max_tiles, aligned_);
  launch_scatter_rows(*gather_sum_.kernel, g, params, LaunchStream{stream_.get()});
}

void TuningSession::prime(const std::map<Role, RoleKernel>& kernels) {
  gather_sum_ = kernels.at(Role::kGatherSum);
  for (Role r : {Role::kRouting, Role::kFwdUp, Role::kFwdDown, Role::kGatherSum, Role::kBwdDown, Role::kBwdDw2,
                 Role::kBwdDx, Role::kBwdDw1}) {
    auto it = kernels.find(r);
    if (it != kernels.end()) run(r, it->second);
    if (r == Role::kRouting) {
      scatter(fwd_.scatter_x);
      scatter(bwd_.scatter_d_out);
    }
  }
  stream_.synchronize();
}

Timing TuningSession::time(Role role, const RoleKernel& k, int reps, bool sustained) {
  return time(role, std::vector<RoleKernel>{k}, reps, sustained).front();
}

std::vector<Timing> TuningSession::time(Role role, const std::vector<RoleKernel>& kernels, int rounds,
                                        bool sustained) {
  const cuda::Driver& d = cuda::driver();
  const std::size_t n = kernels.size();
  if (n == 0 || rounds < 1) throw InternalError("timing needs a kernel and a round");
  const auto launch_once = [&](const RoleKernel& k) {
    if (role == Role::kBwdDown) {
      MOEJIT_CU(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(bwd_.ds_acc), 0, bwd_.ds_count, stream_.get()));
    }
    launch(role, k);
  };
  std::vector<cuda::Event> starts, stops;  // [round * n + kernel]
  {
    // In the context of the stream they are recorded on: the primary one, where a green context is current.
    const cuda::ScopedContext whole_device(cuda::current_context());
    for (std::size_t i = 0; i < n * static_cast<std::size_t>(rounds); ++i) {
      starts.emplace_back();
      stops.emplace_back();
    }
  }
  if (sustained) {
    // Back-to-back batches, each twice the last, until 25 ms of launches have run: clocks and
    // power settle as in a training loop. Sizing it from one lone launch fell short, because a
    // lone launch's time includes the start-up that back-to-back launches hide.
    constexpr double kBurstMs = 25;
    double burst_ms = 0;
    for (int batch = 1; burst_ms < kBurstMs; batch = std::min(2 * batch, 1024)) {
      starts[0].record(stream_.get());
      for (int i = 0; i < batch; ++i) launch_once(kernels[i % n]);
      stops[0].record(stream_.get());
      stops[0].synchronize();
      burst_ms += stops[0].elapsed_since(starts[0]);
    }
  }
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t at = r * n + j;
      // Evict the previous launch's data from L2 so every repetition reads from memory.
      if (!sustained) {
        MOEJIT_CU(d.cuMemsetD8Async(flush_.get(), static_cast<unsigned char>(at), flush_.bytes(), stream_.get()));
      }
      starts[at].record(stream_.get());
      launch_once(kernels[j]);
      stops[at].record(stream_.get());
    }
  }
  stream_.synchronize();
  std::vector<Timing> out;
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> ms;
    for (int r = 0; r < rounds; ++r) ms.push_back(stops[r * n + j].elapsed_since(starts[r * n + j]));
    std::sort(ms.begin(), ms.end());
    out.push_back({ms[ms.size() / 2], ms.back() - ms.front()});
  }
  return out;
}

std::vector<TuningSession::Span> TuningSession::outputs_of(Role role) const {
  const std::size_t T = problem_.tokens, E = problem_.experts, H = problem_.hidden, I = problem_.intermediate,
                    TK = T * problem_.topk;
  const auto ptr = [](const void* p) { return reinterpret_cast<CUdeviceptr>(p); };
  switch (role) {
    case Role::kRouting: {
      // Everything routing produces except the per-chunk scratch, which depends on the config.
      const std::size_t from = layout_.routing.expert_counts;
      return {{ptr(at(saved_, layout_.routing_offset + from)), layout_.routing.total_bytes - from}};
    }
    case Role::kFwdUp: {
      // act, and in training g and u, which the persistent tiles' spare warps store their own way.
      std::vector<Span> out = {{ptr(at(fwd_ws_, layout_.act)), 2 * TK * I}};
      if (fwd_.fwd_up.pre_act != nullptr) out.push_back({ptr(fwd_.fwd_up.pre_act), 2 * TK * 2 * I});
      return out;
    }
    case Role::kFwdDown: return {{ptr(at(fwd_ws_, layout_.y)), 2 * TK * H}};
    case Role::kGatherSum: return {{out_.get(), 2 * T * H}};
    case Role::kBwdDown: {
      // d_pre_act, the weighted activation bwd_dw2 reads, and the score gradients' fp32 slots.
      std::vector<Span> out = {{ptr(at(bwd_ws_, layout_.d_pre_act)), 2 * TK * 2 * I}};
      if (bwd_.bwd_down.weighted_act != nullptr) out.push_back({weighted_act_.get(), 2 * TK * I});
      out.push_back({ptr(bwd_.ds_acc), bwd_.ds_count * sizeof(float), true});
      return out;
    }
    case Role::kBwdDw2: return {{dw2_.get(), 2 * E * H * I}};
    case Role::kBwdDx: return {{ptr(at(bwd_ws_, layout_.dx_rows)), 2 * TK * H}};
    case Role::kBwdDw1: return {{dw1_.get(), 2 * E * 2 * I * H}};
    default: throw InternalError("role has no output to compare");
  }
}

double TuningSession::snapshot(Role role) {
  std::size_t offset = 0;
  for (const Span& s : outputs_of(role)) {
    MOEJIT_CU(cuda::driver().cuMemcpyDtoDAsync(snapshot_.get() + offset, s.ptr, s.bytes, stream_.get()));
    offset += round_up(s.bytes);
  }
  stream_.synchronize();
  if (role == Role::kRouting) return 0;
  double non_finite = 0;
  offset = 0;
  for (const Span& s : outputs_of(role)) {
    const CUdeviceptr copy = snapshot_.get() + offset;
    offset += round_up(s.bytes);
    // The copy against itself: the kernel counts the non-finite values of its first operand.
    for (const std::array<double, 3>& sums : chunk_sums(s, copy, copy)) non_finite += sums[2];
  }
  return non_finite;
}

std::vector<std::array<double, 3>> TuningSession::chunk_sums(const Span& s, CUdeviceptr got, CUdeviceptr want) {
  const cuda::Driver& d = cuda::driver();
  const std::size_t count = s.bytes / (s.fp32 ? sizeof(float) : 2);
  const std::vector<std::pair<std::size_t, std::size_t>> chunks = check_chunks(count);
  std::vector<std::array<double, 3>> sums(chunks.size(), {0, 0, 0});
  if (s.fp32) {
    // Few values (a pair's score-gradient slots, one per 64 columns of I): compared here rather
    // than by a kernel of their own.
    std::vector<float> g(count), w(count);
    read_back(g.data(), got, s.bytes);
    read_back(w.data(), want, s.bytes);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      for (std::size_t i = chunks[c].first; i < chunks[c].second; ++i) {
        if (!std::isfinite(g[i])) sums[c][2] += 1;
        sums[c][0] += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
        sums[c][1] += static_cast<double>(w[i]) * w[i];
      }
    }
    return sums;
  }
  MOEJIT_CU(d.cuMemsetD8Async(sums_.get(), 0, chunks.size() * 3 * sizeof(double), stream_.get()));
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const auto [first, end] = chunks[c];
    params::RelDiff p{reinterpret_cast<const void*>(got + 2 * first), reinterpret_cast<const void*>(want + 2 * first),
                    static_cast<long long>(end - first), sums_.as<double>() + 3 * c};
    void* args[] = {&p};
    const std::size_t blocks = std::min<std::size_t>(device_.sm_count * 4, (end - first + 255) / 256);
    utility_->launch(jit::kUtilityRelDiff, {static_cast<unsigned>(blocks)}, {256}, 0, stream_.get(), args);
  }
  read_back(sums.data(), sums_.get(), chunks.size() * 3 * sizeof(double));
  return sums;
}

void TuningSession::read_back(void* to, CUdeviceptr from, std::size_t bytes) {
  MOEJIT_CU(cuda::driver().cuMemcpyDtoHAsync(to, from, bytes, stream_.get()));
  stream_.synchronize();
}

void TuningSession::poison(Role role) {
  if (role == Role::kRouting) return;
  for (const Span& s : outputs_of(role)) {
    MOEJIT_CU(cuda::driver().cuMemsetD8Async(s.ptr, 0xff, s.bytes, stream_.get()));
  }
}

double TuningSession::diff(Role role) {
  stream_.synchronize();
  double worst = 0;
  std::size_t offset = 0;
  for (const Span& s : outputs_of(role)) {
    const CUdeviceptr want = snapshot_.get() + offset;
    offset += round_up(s.bytes);
    if (role == Role::kRouting) {
      std::string got_bytes(s.bytes, '\0'), want_bytes(s.bytes, '\0');
      read_back(got_bytes.data(), s.ptr, s.bytes);
      read_back(want_bytes.data(), want, s.bytes);
      if (got_bytes != want_bytes) return std::numeric_limits<double>::infinity();
      continue;
    }
    for (const std::array<double, 3>& c : chunk_sums(s, s.ptr, want)) {
      if (c[2] > 0) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, chunk_ratio(c[0], c[1]));
    }
  }
  return worst;
}

}  // namespace moejit
