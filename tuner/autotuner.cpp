#include "tuner/autotuner.hpp"

#include <algorithm>
#include <chrono>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "core/env.hpp"
#include "jit/kernel_cache.hpp"
#include "moe/kernel_specs.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/shared_tuning.hpp"
#include "tuner/tuning_keys.hpp"
#include "tuner/tuning_session.hpp"
#include "tuner/winner.hpp"

namespace moejit {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kLongKernelMs = 2.0;

struct RoleCandidates {
  Role role;
  TileConfig reference;                 // the heuristic default, timed first
  std::vector<TileConfig> survivors;    // reference first
  std::vector<db::CandidateResult> results;  // survivors in order, then the pruned
  std::vector<db::CandidateResult> pruned;
  std::optional<TileConfig> incumbent;  // options.incumbents' config of the role, if any
  std::size_t next = 0;                 // survivors[next] is the first not yet run
  int reps = 0;                         // timed launches per candidate
  double seconds = 0;                   // spent on the role's first pass
};

db::CandidateResult rejected(const TileConfig& c, std::string reason) { return {c, kNaN, kNaN, true, std::move(reason)}; }

}  // namespace

std::vector<db::TuningRow> autotune(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                    const std::vector<Role>& roles, const TuneOptions& options) {
  const auto start = Clock::now();
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.budget_s));
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  const MoeShape shape = shape_of(problem);
  const std::string arch = device.arch();

  // Prune every role's space; collect what to compile (every pipeline role's default too: the
  // scratch problem is primed with them).
  std::vector<RoleCandidates> work;
  std::vector<jit::KernelSpec> specs = {{Role::kUtility, TileConfig{}, problem.dtype, arch}};
  // A row stands for every T of its key: routing's configs are pruned, and its reference chosen, at
  // the key's smallest T, or a chunk wider than that T's pairs would be passed over there and the
  // key tuned again (the other roles' pruning does not depend on T).
  const auto space_shape = [&](Role r) {
    MoeShape s = shape;
    if (r == Role::kRouting) s.tokens = key_floor_tokens(r, problem, device);
    return s;
  };
  std::map<Role, TileConfig> defaults;
  for (Role r : roles_of(problem.mode)) {
    defaults[r] = default_config(r, space_shape(r), device, problem.mode);
    specs.push_back(role_kernel_spec(r, defaults[r], problem, arch));
  }
  for (Role r : roles) {
    if (!defaults.count(r)) {
      throw InvalidArgument("roles", fmt::format("{} does not run in {} mode", role_name(r), mode_name(problem.mode)));
    }
    RoleCandidates rc{r, defaults.at(r), {}, {}, {}, {}, 0, options.reps, 0};
    if (auto it = options.incumbents.find(r); it != options.incumbents.end()) rc.incumbent = it->second;
    rc.survivors.push_back(rc.reference);
    const MoeShape at = space_shape(r);
    const std::vector<PruneDecision> space = prune_space(r, at, device);
    const std::string where = at.tokens == shape.tokens ? "" : fmt::format(" at T={}, the key's smallest", at.tokens);
    for (const PruneDecision& d : space) {
      if (d.reason) {
        rc.pruned.push_back(rejected(d.config, "pruned" + where + ": " + *d.reason));
      } else if (d.config == rc.reference) {
        continue;
      } else if (auto why = options.first_call_space ? first_call_exclusion(d.config, space) : std::nullopt) {
        rc.pruned.push_back(rejected(d.config, *why));
      } else {
        rc.survivors.push_back(d.config);
        specs.push_back(role_kernel_spec(r, d.config, problem, arch));
      }
    }
    order_for_budget(rc.survivors, rc.incumbent);
    work.push_back(std::move(rc));
  }
  auto& cache = jit::KernelCache::instance();
  // A kernel that failed to compile is not cached, so load() would compile it again, one at a
  // time inside the budget: failures are rejected from these results instead.
  std::map<std::string, std::string> compile_errors;  // by readable_name
  for (const jit::CompileResult& r : cache.compile_all(specs, env::compile_jobs())) {
    if (!r.kernel) compile_errors[r.spec.readable_name()] = r.error;
  }
  say(fmt::format("compiled {} kernels in {:.1f} s", specs.size(),
                  std::chrono::duration<double>(Clock::now() - start).count()));

  // Compiled above without it: only the GPU's timings must not overlap. The wait is another
  // tuner's time, not this one's budget.
  const auto waiting = Clock::now();
  const std::optional<fs::FileLock> gpu_lock = lock_gpu_timing(device, options.budget_s);
  deadline += Clock::now() - waiting;
  TuningSession session(problem, device);
  std::map<Role, TuningSession::RoleKernel> primed;
  for (const auto& [r, c] : defaults) {
    const jit::KernelSpec spec = role_kernel_spec(r, c, problem, arch);
    primed[r] = {c, &cache.load(spec)};
    // Loaded: a compile that failed in the parallel pass (NVRTC out of memory, say) and passed
    // here is no failure; each role's reference is timed first and every candidate scaled by it.
    compile_errors.erase(spec.readable_name());
  }
  session.prime(primed);

  // The reference's outputs, the later roles' inputs, back in place; a role resumed in the
  // second pass takes its reference's snapshot again (a later role's replaced it).
  const auto restore = [&](const RoleCandidates& rc) { session.run(rc.role, primed.at(rc.role)); };
  const auto first_line = [](const std::string& what) { return what.substr(0, what.find('\n')); };
  // The first pass over one role's survivors from rc.next on, until `until` (the reference runs
  // whatever the time).
  const auto first_pass = [&](RoleCandidates& rc, Clock::time_point until) {
    const auto pass_start = Clock::now();
    if (rc.next > 0) {
      session.poison(rc.role);
      restore(rc);
      if (session.snapshot(rc.role) > 0) {
        throw InternalError(fmt::format("{}'s reference left output values unwritten on its second run",
                                        role_name(rc.role)));
      }
    }
    for (; rc.next < rc.survivors.size(); ++rc.next) {
      const std::size_t i = rc.next;
      const TileConfig& c = rc.survivors[i];
      if (i > 0 && Clock::now() > until) break;
      // prime() loaded every role's reference (survivors[0]), so only the candidates after it can
      // fail here.
      const jit::KernelSpec spec = role_kernel_spec(rc.role, c, problem, arch);
      if (auto failed = compile_errors.find(spec.readable_name()); failed != compile_errors.end()) {
        rc.results.push_back(rejected(c, "compile failed: " + first_line(failed->second)));
        continue;
      }
      const jit::LoadedKernel* kernel = nullptr;
      try {
        kernel = &cache.load(spec);
      } catch (const Error& e) {
        rc.results.push_back(rejected(c, "load failed: " + first_line(e.what())));
        continue;
      }
      const TuningSession::RoleKernel k{c, kernel};
      // A candidate that leaves some of its outputs unwritten would otherwise match the
      // reference's values still there; the reference's own show as non-finite in its snapshot.
      session.poison(rc.role);
      if (i == 0) {
        session.run(rc.role, k);
      } else if (std::optional<std::string> why = session.try_run(rc.role, k)) {
        rc.results.push_back(rejected(c, "launch failed: " + first_line(*why)));
        restore(rc);
        continue;
      }
      if (options.inspect) {
        const std::vector<TuningSession::Span> outputs = session.outputs_of(rc.role);
        for (std::size_t o = 0; o < outputs.size(); ++o) {
          options.inspect(rc.role, c, static_cast<int>(o), outputs[o].ptr, outputs[o].bytes);
        }
      }
      if (i == 0) {
        // Every candidate is checked against this output: one with values left unwritten or not
        // finite would pass any candidate (a NaN ratio) or none, so the tune stops here.
        if (const double bad = session.snapshot(rc.role); bad > 0) {
          throw InternalError(fmt::format("{}'s reference config {} left {:.0f} output values unwritten or not finite",
                                          role_name(rc.role), c.name(), bad));
        }
      } else if (const double diff = session.diff(rc.role); !(diff <= kTuneTolerance)) {
        rc.results.push_back(rejected(c, fmt::format("output differs from the reference config by {:.3g}", diff)));
        restore(rc);
        continue;
      }
      if (i == 0) {
        const Timing t = session.time(rc.role, k, rc.reps, options.sustained);
        rc.results.push_back({c, t.median_ms, t.spread_ms, false, ""});
        // Long kernels vary little: fewer repetitions keep tuning of large problems short.
        if (t.median_ms > kLongKernelMs) rc.reps = std::min(rc.reps, 3);
        continue;
      }
      // Candidates are timed seconds apart, and the clocks under the power cap move by more than
      // the finalists' window in that time: each is timed in turns with the reference, and its
      // times are scaled by the reference's first median over its median now.
      const std::vector<Timing> t = session.time(rc.role, {primed.at(rc.role), k}, rc.reps, options.sustained);
      const double scale = t[0].median_ms > 0 ? rc.results.front().median_ms / t[0].median_ms : 1.0;
      rc.results.push_back({c, t[1].median_ms * scale, t[1].spread_ms * scale, false, ""});
    }
    restore(rc);
    rc.seconds += std::chrono::duration<double>(Clock::now() - pass_start).count();
  };
  // Each role first gets its share of what is left (budget_share_s), so that a budget too short
  // for every candidate still times each role's likeliest winners (order_for_budget), not the
  // first roles' whole spaces; what the roles before it did not use goes to the next. Roles cut
  // short then go on, in pipeline order, until the budget is spent.
  for (std::size_t r = 0; r < work.size(); ++r) {
    const double left_s = std::chrono::duration<double>(deadline - Clock::now()).count();
    const double share_s = budget_share_s(left_s, work.size() - r);
    first_pass(work[r], Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(share_s)));
  }
  for (RoleCandidates& rc : work) {
    if (rc.next < rc.survivors.size() && Clock::now() <= deadline) first_pass(rc, deadline);
    for (std::size_t i = rc.next; i < rc.survivors.size(); ++i) {
      rc.results.push_back(rejected(rc.survivors[i], budget_skip_reason(options.budget_s)));
    }
  }

  std::vector<db::TuningRow> rows;
  for (RoleCandidates& rc : work) {
    const auto role_start = Clock::now();
    // The first pass's scaled times still carry each pair's noise: the finalists are timed again
    // in turns, all together, and the winner is one of them, by those times.
    const std::vector<std::size_t> final = finalists(rc.results, rc.incumbent);
    if (final.size() > 1) {
      std::vector<TuningSession::RoleKernel> kernels;
      for (std::size_t i : final) {
        const TileConfig& c = rc.results[i].config;
        kernels.push_back({c, &cache.load(role_kernel_spec(rc.role, c, problem, arch))});
      }
      const std::vector<Timing> t = session.time(rc.role, kernels, options.final_rounds, options.sustained);
      for (std::size_t j = 0; j < final.size(); ++j) {
        rc.results[final[j]].median_ms = t[j].median_ms;
        rc.results[final[j]].spread_ms = t[j].spread_ms;
      }
    }
    // Later roles read this role's output: leave the reference's there.
    restore(rc);
    const double ref_ms = rc.results.front().median_ms;  // the reference is timed first
    rc.results.insert(rc.results.end(), rc.pruned.begin(), rc.pruned.end());
    const auto w = choose_winner(rc.results, final, rc.incumbent);
    if (!w) {
      say(fmt::format("{}: no correct candidate", role_name(rc.role)));
      continue;
    }
    db::TuningRow row;
    row.key = tuning_key(rc.role, problem, device);
    row.winner = rc.results[*w].config;
    row.median_ms = rc.results[*w].median_ms;
    row.spread_ms = rc.results[*w].spread_ms;
    row.candidates = rc.results;
    row.provenance = db::current_provenance(device.driver_version);
    say(fmt::format("{:<10} {:<28} {:8.4f} ms (reference {:8.4f} ms, x{:.2f}) {} candidates, {:.1f} s",
                    role_name(rc.role), row.winner.name(), row.median_ms, ref_ms, ref_ms / row.median_ms,
                    rc.results.size(),
                    rc.seconds + std::chrono::duration<double>(Clock::now() - role_start).count()));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace moejit
