#include "tuner/config_resolver.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "core/env.hpp"
#include "core/fs.hpp"
#include "core/log.hpp"
#include "cuda/handles.hpp"
#include "db/tuning_lookup.hpp"
#include "tuner/autotuner.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/shared_tuning.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

db::TuningLookup& tuning_lookup(const cuda::DeviceInfo& device) {
  // Never destroyed, as the kernel cache: a thread still resolving when the process exits (a
  // Python daemon thread, say) must not find the lookups and their SQLite connections closed.
  static std::mutex* mu = new std::mutex;
  static auto* lookups = new std::map<std::string, std::unique_ptr<db::TuningLookup>>;
  const db::Provenance current = db::current_provenance(device.driver_version);
  // No user database path: the lookup reads the shipped tables alone (an empty path).
  const std::filesystem::path user_db = env::user_db_path().value_or(std::filesystem::path());
  const std::filesystem::path shipped_dir = env::shipped_db_dir();  // once: the id names what the lookup reads
  const std::string id = user_db.string() + "|" + shipped_dir.string() + "|" + current.template_hash + "|" +
                         current.nvrtc_version;
  std::lock_guard<std::mutex> lock(*mu);
  auto& slot = (*lookups)[id];
  if (!slot) {
    // The heuristic level is handled by the resolver (it needs the problem's real shape).
    slot = std::make_unique<db::TuningLookup>(user_db, shipped_dir, current,
                                              [](const db::TuningKey&) { return TileConfig{}; });
  }
  return *slot;
}

namespace {

// A stream the driver cannot answer for is taken as capturing: the plan is built untuned (the
// warning below says why), and the stream's error comes from the call that enqueues on it. The
// legacy stream is never captured itself; asked while a blocking stream is (this thread's, say),
// the driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, without harm to that capture, and the
// tune runs on a stream of its own.
bool capturing(CUstream_st* stream) {
  const auto s = reinterpret_cast<CUstream>(stream);
  try {
    return cuda::stream_capturing(s);
  } catch (const CudaError& e) {
    const bool legacy = s == nullptr || s == CU_STREAM_LEGACY;
    if (legacy && e.result() == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return false;
    log::warn("cannot tell whether the plan's stream is capturing a CUDA graph: {}", e.what());
    return true;
  }
}

std::optional<TileConfig> override_for(Role role, const MoeShape& shape, const cuda::DeviceInfo& device,
                                       const Options& options) {
  auto it = options.config_overrides.find(role_name(role));
  if (it == options.config_overrides.end()) return std::nullopt;
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

}  // namespace

std::map<Role, ResolvedConfig> resolve_configs(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                               const Options& options, bool allow_tuning) {
  const MoeShape shape = shape_of(problem);
  // Read on every resolve, not only when a key is missing: a malformed value is an error whether
  // or not the tables cover this problem.
  const bool autotune_on = env::autotune_enabled();
  const double budget_s = env::tune_budget_s();
  // A misspelt role would otherwise override nothing, silently; a role this mode does not run
  // is fine (one set of overrides may serve training and inference plans).
  for (const auto& [role, config] : options.config_overrides) {
    try {
      parse_role(role);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("config_overrides", e.what());
    }
  }
  db::TuningLookup& lookup = tuning_lookup(device);
  std::map<Role, ResolvedConfig> out;
  std::map<Role, db::Resolved> fallback;
  std::vector<Role> missing;
  // A stored winner that no longer passes pruning, or that the role's space does not hold, is
  // passed over at every level, to fall back instead of failing the plan. Said at info level: a
  // nearest-bucket scan passes over other buckets' rows as a matter of course.
  const db::TuningDb::RowFilter legal = [&](const db::TuningRow& row) {
    if (winner_legal(row, shape, device)) return true;
    if (log::enabled(env::LogLevel::kInfo) &&
        log::first_time(fmt::format("passed over {} {} {}", row.key.id(), row.winner.name(), problem.tokens))) {
      log::info("passing over the stored winner {} of {} at T={}: pruned or outside the config space here",
                row.winner.name(), row.key.id(), problem.tokens);
    }
    return false;
  };
  for (Role r : roles_of(problem.mode)) {
    if (auto c = override_for(r, shape, device, options)) {
      out[r] = {*c, "override"};
      continue;
    }
    db::Resolved res = lookup.resolve(tuning_key(r, problem, device), legal);
    const bool exact = res.source == db::Resolved::Source::kMemory || res.source == db::Resolved::Source::kUserDb ||
                       res.source == db::Resolved::Source::kShippedDb;
    if (exact) {
      out[r] = {res.config, res.source_name()};
    } else {
      missing.push_back(r);
      fallback[r] = std::move(res);
    }
  }
  if (missing.empty()) return out;

  const bool tuning = allow_tuning && autotune_on;
  if (tuning && !capturing(options.stream)) {
    const TuneFn tune = [&](const std::vector<Role>& roles) {
      const auto t0 = std::chrono::steady_clock::now();
      TuneOptions tune_options;
      tune_options.budget_s = budget_s;
      tune_options.first_call_space = true;
      auto rows = autotune(problem, device, roles, tune_options);
      log::info("tuned {} role(s) of E={} H={} I={} K={} T={} in {:.1f} s", rows.size(), problem.experts,
                problem.hidden, problem.intermediate, problem.topk, problem.tokens,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return rows;
    };
    try {
      for (const auto& row : tune_shared(problem, device, missing, lookup, tune, legal, budget_s)) {
        if (legal(row)) out[row.key.role] = {row.winner, "tuned"};
      }
    } catch (const OutOfMemoryError& e) {
      // The tuner's scratch is a whole step's tensors beside the caller's; a process whose
      // allocator holds the rest of the device (PyTorch's cache) leaves it no room. The plan
      // still runs, on the levels below, and the next plan of this problem tries again.
      log::warn("self-tuning E={} H={} I={} K={} T={} skipped, no device memory for its scratch ({}); using the "
                "nearest tuned bucket or the heuristic config. Free memory first (torch.cuda.empty_cache()), "
                "or tune ahead with `moejit tune`",
                problem.experts, problem.hidden, problem.intermediate, problem.topk, problem.tokens, e.what());
    } catch (const fs::LockTimeout& e) {
      // Timed beside another tuner, both would keep skewed winners: this plan runs the levels
      // below, and the next plan of this problem tries again.
      log::warn("self-tuning E={} H={} I={} K={} T={} skipped, another tuner still times on this GPU ({}); using the "
                "nearest tuned bucket or the heuristic config",
                problem.experts, problem.hidden, problem.intermediate, problem.topk, problem.tokens, e.what());
    }
  } else if (tuning) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) log::warn("not tuning while the plan's stream is capturing a CUDA graph");
  }
  for (Role r : missing) {
    if (out.count(r)) continue;
    const db::Resolved& res = fallback[r];
    if (res.source == db::Resolved::Source::kNearestBucket) {
      out[r] = {res.config, res.source_name()};
    } else {
      out[r] = {default_config(r, shape, device, problem.mode), "heuristic"};
    }
  }
  return out;
}

}  // namespace moejit
