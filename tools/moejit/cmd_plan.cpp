// moejit plan: build the plan of one problem on a GPU (self-tuning it when MOEJIT_AUTOTUNE
// allows and the database has no row) and show each role's config, its source and the memory
// the caller must provide.
#include <fmt/format.h>

#include <chrono>
#include <limits>

#include "args.hpp"
#include "commands.hpp"
#include "cuda/handles.hpp"
#include "problem_args.hpp"

namespace moejit::cli {

int run_plan(int argc, char** argv, int start) {
  Args a = parse_args(argc, argv, start, {}, {"shape", "tokens", "dtype", "mode", "device"});
  MoeProblem p = parse_dims(a);
  p.tokens = parse_token(a, p, 8192);
  p.mode = parse_mode(a.get("mode", "train"));
  cuda::PrimaryContext context(static_cast<int>(a.get_int("device", 0, 0, std::numeric_limits<int>::max())));
  const auto t0 = std::chrono::steady_clock::now();
  FusedMoe plan(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("problem  E={} H={} I={} K={} T={} {} {}\nbuilt in {:.3f} s\n\n", p.experts, p.hidden, p.intermediate,
             p.topk, p.tokens, dtype_name(p.dtype), mode_name(p.mode), s);
  const auto configs = plan.configs(), sources = plan.config_sources();
  for (const auto& [role, config] : configs) fmt::print("  {:<12} {:<30} {}\n", role, config, sources.at(role));
  const MemoryPlan& m = plan.memory();
  fmt::print("\nsaved {:.1f} MiB, forward workspace {:.1f} MiB, backward workspace {:.1f} MiB\n",
             m.saved_bytes / 1048576.0, m.forward_workspace_bytes / 1048576.0, m.backward_workspace_bytes / 1048576.0);
  return 0;
}

}  // namespace moejit::cli
