// moejit bench: per role, the heuristic default against the config the tuning databases hold
// for this problem, timed on a scratch problem (CUDA events, L2 flushed before each launch).
#include <fmt/format.h>

#include <limits>

#include "args.hpp"
#include "commands.hpp"
#include "core/env.hpp"
#include "cuda/device.hpp"
#include "cuda/handles.hpp"
#include "jit/kernel_cache.hpp"
#include "moe/kernel_specs.hpp"
#include "problem_args.hpp"
#include "tuner/config_resolver.hpp"
#include "tuner/config_space.hpp"
#include "tuner/shared_tuning.hpp"
#include "tuner/tuning_session.hpp"

namespace moejit::cli {

int run_bench(int argc, char** argv, int start) {
  Args a = parse_args(argc, argv, start, {}, {"shape", "tokens", "dtype", "mode", "reps", "device"});
  MoeProblem p = parse_dims(a);
  p.mode = parse_mode(a.get("mode", "train"));
  const auto reps = static_cast<int>(a.get_int("reps", 20, 1, std::numeric_limits<int>::max()));
  // Parsed before the context exists, so a bad list is a usage error even without a GPU.
  const std::vector<long long> token_counts = parse_tokens(a, p, {1024, 8192, 32768});
  cuda::PrimaryContext context(static_cast<int>(a.get_int("device", 0, 0, std::numeric_limits<int>::max())));
  const cuda::DeviceInfo device = cuda::query_current_device();
  auto& cache = jit::KernelCache::instance();
  fmt::print("{} | E={} H={} I={} K={} {} {} | median of {} launches, ms\n", device.name, p.experts, p.hidden,
             p.intermediate, p.topk, dtype_name(p.dtype), mode_name(p.mode), reps);
  for (long long tokens : token_counts) {
    p.tokens = tokens;
    const MoeShape shape = shape_of(p);
    const auto stored = resolve_configs(p, device, Options{}, /*allow_tuning=*/false);
    std::map<Role, TuningSession::RoleKernel> heuristic, tuned;
    std::vector<jit::KernelSpec> specs;
    for (const auto& [r, c] : stored) {
      specs.push_back(role_kernel_spec(r, default_config(r, shape, device, p.mode), p, device.arch()));
      specs.push_back(role_kernel_spec(r, c.config, p, device.arch()));
    }
    cache.compile_all(specs, env::compile_jobs());
    for (const auto& [r, c] : stored) {
      const TileConfig d = default_config(r, shape, device, p.mode);
      heuristic[r] = {d, &cache.load(role_kernel_spec(r, d, p, device.arch()))};
      tuned[r] = {c.config, &cache.load(role_kernel_spec(r, c.config, p, device.arch()))};
    }
    // Timed as a tuner times, so not beside one on this GPU (its timings and these would skew).
    const std::optional<fs::FileLock> gpu_lock = lock_gpu_timing(device, env::tune_budget_s());
    TuningSession session(p, device);
    session.prime(heuristic);
    fmt::print("\nT={}\n  {:<11} {:>10} {:>10} {:>8}  {:<28} {}\n", tokens, "role", "heuristic", "stored", "speedup",
               "stored config", "source");
    double sum_h = 0, sum_t = 0;
    for (const auto& [r, c] : stored) {
      // In turns, so a clock change under the power cap does not favour either.
      const std::vector<Timing> both = session.time(r, {heuristic[r], tuned[r]}, reps);
      const double h = both[0].median_ms, t = both[1].median_ms;
      sum_h += h;
      sum_t += t;
      fmt::print("  {:<11} {:>10.4f} {:>10.4f} {:>7.2f}x  {:<28} {}\n", role_name(r), h, t, h / t, c.config.name(),
                 c.source);
    }
    fmt::print("  {:<11} {:>10.4f} {:>10.4f} {:>7.2f}x  (sum of kernels; backward gather counted once)\n", "total",
               sum_h, sum_t, sum_h / sum_t);
  }
  return 0;
}

}  // namespace moejit::cli
