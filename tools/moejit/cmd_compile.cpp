// moejit compile: prune each role's config space for a target and shape, compile every survivor
// in parallel into the kernel cache, as the kernels plans of the problem load (plan_kernel_specs),
// and print the plan. Needs no GPU.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "problem_args.hpp"
#include "core/env.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/nvrtc.hpp"
#include "moe/kernel_specs.hpp"
#include "moejit/error.hpp"
#include "tuner/config_space.hpp"
#include "tuner/gating.hpp"
#include "tuner/prune.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit::cli {
namespace {

// A target moejit cannot build for is refused up front: below sm_80 (the portable path's floor)
// pruning would drop every config and report success with nothing built, and NVRTC would fail
// every kernel of an arch it does not know. `what` names the target in the message.
void require_buildable(int cc, const std::string& what) {
  if (arch_gate_reason(ArchTag::kPortable, cc)) {
    throw InvalidArgument("--arch", fmt::format("{}: moejit's kernels need sm_80 or newer", what));
  }
  const std::vector<int>& ccs = jit::nvrtc_target_ccs();
  if (std::find(ccs.begin(), ccs.end(), cc) == ccs.end()) {
    std::string targets;
    for (int c : ccs) {
      if (!arch_gate_reason(ArchTag::kPortable, c)) targets += (targets.empty() ? "" : ", ") + cuda::arch_for_cc(c);
    }
    throw InvalidArgument("--arch",
                          fmt::format("{}: NVRTC {} cannot target it ({})", what, jit::nvrtc_version(), targets));
  }
}

// The device to plan for: the visible GPU when it matches (or no --arch was given), otherwise a
// fabricated descriptor of the requested architecture.
cuda::DeviceInfo target_device(const Args& a) {
  std::string why;
  const bool gpu = cuda::device_available(&why);
  if (!a.has("arch")) {
    if (!gpu) throw InvalidArgument("--arch", "no GPU here (" + why + "); name a target, e.g. --arch sm_90a");
    cuda::DeviceInfo d = cuda::query_device(0);
    require_buildable(d.cc(), fmt::format("the GPU here ({}, {})", d.name, d.arch()));
    return d;
  }
  const int cc = as_option("--arch", [&] { return cuda::cc_from_arch(a.get("arch")); });
  require_buildable(cc, a.get("arch"));
  const std::string arch = cuda::arch_for_cc(cc);
  if (gpu) {
    cuda::DeviceInfo d = cuda::query_device(0);
    if (d.arch() == arch) return d;
  }
  return cuda::fabricated::for_arch(arch);
}

// --mode, else all three: a cache filled for every plan of the problem. The modes share most
// kernels; inference runs the forward roles alone, and memory-efficient bwd_dw2 has a kernel of its
// own where it recomputes the activation (memeff_recomputes_act).
std::vector<Mode> modes_of(const Args& a) {
  if (a.has("mode")) return {parse_mode(a.get("mode"))};
  return {Mode::kTraining, Mode::kInference, Mode::kMemoryEfficient};
}

bool runs(Mode mode, Role role) {
  const std::vector<Role> roles = roles_of(mode);
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

std::string mode_list(const std::vector<Mode>& modes) {
  std::string out;
  for (Mode m : modes) {
    if (!out.empty()) out += ',';
    out += mode_name(m);
  }
  return out;
}

// --role, else every role the modes run. A role none of them runs would compile nothing.
std::vector<Role> selected_roles(const Args& a, const std::vector<Mode>& modes) {
  std::vector<Role> named(kAllRoles.begin(), kAllRoles.end());
  if (a.has("role")) named = {as_option("--role", [&] { return parse_role(a.get("role")); })};
  std::vector<Role> out;
  for (Role r : named) {
    if (std::any_of(modes.begin(), modes.end(), [r](Mode m) { return runs(m, r); })) out.push_back(r);
  }
  if (out.empty()) {
    throw InvalidArgument("--role", fmt::format("{} does not run in {} mode", a.get("role"), mode_list(modes)));
  }
  return out;
}

// The heuristic default of each role per mode that runs it, one line per config with its modes
// (memory-efficient bwd_dw2 prefers other tiles where it recomputes the activation).
void print_defaults(const std::vector<Role>& roles, const std::vector<Mode>& modes, const MoeShape& shape,
                    const cuda::DeviceInfo& device) {
  fmt::print("\nplan (heuristic default per role):\n");
  for (Role r : roles) {
    std::vector<std::pair<TileConfig, std::vector<Mode>>> lines;
    for (Mode m : modes) {
      if (!runs(m, r)) continue;
      const TileConfig c = default_config(r, shape, device, m);
      auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& line) { return line.first == c; });
      if (it == lines.end()) {
        lines.push_back({c, {m}});
      } else {
        it->second.push_back(m);
      }
    }
    for (const auto& [c, served] : lines) {
      auto why = prune_reason(r, c, shape, device);
      fmt::print("  {:<12} {:<34} {}{}\n", role_name(r), c.name(), mode_list(served),
                 why ? " (pruned: " + *why + ")" : "");
    }
  }
}

// Median NVRTC time of what this run compiled, and the cost of an in-process cache hit (what
// every plan construction pays per kernel once the cache is warm).
void print_cache_costs(const std::vector<jit::CompileResult>& results) {
  std::vector<double> nvrtc_ms;
  std::vector<jit::KernelSpec> ok;
  for (const auto& r : results) {
    if (!r.kernel) continue;
    ok.push_back(r.spec);
    if (r.origin == jit::Origin::kCompiled) nvrtc_ms.push_back(r.kernel->compile_ms);
  }
  if (!nvrtc_ms.empty()) {
    std::sort(nvrtc_ms.begin(), nvrtc_ms.end());
    fmt::print("median NVRTC compile: {:.1f} ms per kernel ({} kernels)\n", nvrtc_ms[nvrtc_ms.size() / 2],
               nvrtc_ms.size());
  }
  if (ok.empty()) return;
  auto& cache = jit::KernelCache::instance();
  constexpr int kRounds = 20;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    for (const auto& spec : ok) cache.get(spec);
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("in-process cache hit: {:.2f} us per kernel\n", us / (kRounds * ok.size()));
}

// One row of the table: every column as text, so the four kinds of row share one layout. stack
// is a kernel's local memory per thread, which ptxas does not count as spills.
void print_row(std::string_view role, std::string_view config, std::string_view status, std::string_view ms,
               std::string_view regs, std::string_view spills, std::string_view stack, std::string_view note) {
  fmt::print("{:<12} {:<34} {:<10} {:>9} {:>5} {:>7} {:>6}  {}\n", role, config, status, ms, regs, spills, stack, note);
}

}  // namespace

int run_compile(int argc, char** argv, int start) {
  Args a = parse_args(argc, argv, start, {}, {"arch", "role", "shape", "tokens", "dtype", "mode", "jobs"});
  const cuda::DeviceInfo device = target_device(a);
  MoeProblem p = parse_dims(a);
  p.tokens = parse_token(a, p, 8192);
  const MoeShape shape = shape_of(p);
  const std::vector<Mode> modes = modes_of(a);
  const std::vector<Role> roles = selected_roles(a, modes);
  // MOEJIT_JOBS is read only without --jobs, so a bad value there does not fail a call that names its count.
  if (a.has("jobs") && a.get("jobs").empty()) throw InvalidArgument("--jobs", "needs a value");
  const unsigned jobs = a.has("jobs") ? env::parse_jobs(a.get("jobs"), "--jobs") : env::compile_jobs();

  const auto cache_dir = env::kernel_cache_dir();
  fmt::print("target  {} ({})\nshape   E={} H={} I={} K={} T={} {}\nmodes   {}\ncache   {}\n\n", device.arch(),
             device.name, shape.experts, shape.hidden, shape.intermediate, shape.topk, shape.tokens,
             dtype_name(shape.dtype), mode_list(modes),
             !env::disk_cache_enabled() ? "(disk cache disabled)"
             : cache_dir                ? cache_dir->string()
                                        : "(disk cache off: no folder for it)");

  std::map<Role, std::vector<TileConfig>> legal;
  int pruned = 0;
  print_row("role", "config", "status", "ms", "regs", "spills", "stack", "note");
  for (Role r : roles) {
    for (const PruneDecision& d : prune_space(r, shape, device)) {
      if (d.reason) {
        ++pruned;
        print_row(role_name(r), d.config.name(), "pruned", "-", "-", "-", "-", *d.reason);
      } else {
        legal[r].push_back(d.config);
      }
    }
  }
  const std::vector<jit::KernelSpec> specs = plan_kernel_specs(p, modes, legal, device.arch());

  auto t0 = std::chrono::steady_clock::now();
  auto results = jit::KernelCache::instance().compile_all(specs, jobs);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int compiled = 0, cached = 0, failed = 0, not_stored = 0;
  const jit::CompileResult *first_failure = nullptr, *first_not_stored = nullptr;
  for (const jit::CompileResult& r : results) {
    if (!r.kernel) {
      ++failed;
      if (first_failure == nullptr) first_failure = &r;
      std::string first_line = r.error.substr(0, r.error.find('\n'));
      print_row(role_name(r.spec.role), r.spec.config.name(), "FAILED", fmt::format("{:.1f}", r.wall_ms), "-", "-", "-",
                first_line);
      continue;
    }
    const bool from_cache = r.origin != jit::Origin::kCompiled;
    (from_cache ? cached : compiled) += 1;
    std::string note = r.kernel->key.stem();
    if (r.not_stored) {
      ++not_stored;
      if (first_not_stored == nullptr) first_not_stored = &r;
      note += "  not stored";
    }
    // The advisory's code, e.g. (C7515): a serialized wgmma pipeline (src/jit/ptxas_info.hpp).
    for (const std::string& loss : r.kernel->performance_losses) note += "  ptxas " + loss.substr(0, loss.find(' '));
    print_row(role_name(r.spec.role), r.spec.config.name(), from_cache ? "cached" : "compiled",
              fmt::format("{:.1f}", r.wall_ms), std::to_string(r.kernel->max_registers()),
              std::to_string(r.kernel->max_spill_bytes()), std::to_string(r.kernel->max_stack_bytes()), note);
  }
  print_defaults(roles, modes, shape, device);
  // As parallel_for starts them: no more threads than kernels.
  const std::size_t threads = std::clamp<std::size_t>(specs.size(), 1, jobs);
  fmt::print("\n{} compiled, {} from cache, {} pruned, {} failed in {:.2f} s on {} thread{}\n", compiled, cached,
             pruned, failed, wall, threads, threads == 1 ? "" : "s");
  // Filling the cache is the command's job: a kernel it could not keep is a failure too.
  if (first_not_stored != nullptr) {
    fmt::print("{} compiled kernel{} not stored in the kernel cache: {}\n", not_stored, not_stored == 1 ? "" : "s",
               *first_not_stored->not_stored);
  }
  print_cache_costs(results);
  // The table shows each failure's first line; the first one's whole error (the NVRTC log) here.
  if (first_failure != nullptr) {
    fmt::print("\nfirst failure, {} {}:\n{}\n", role_name(first_failure->spec.role), first_failure->spec.config.name(),
               first_failure->error);
  }
  return failed == 0 && not_stored == 0 ? 0 : 1;
}

}  // namespace moejit::cli
