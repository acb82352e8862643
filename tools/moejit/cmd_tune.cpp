// moejit tune: offline tuning of a list of token counts and modes into a database, one worker
// per visible GPU, resumable (keys already tuned are skipped unless --force) and shardable
// across machines (--shard i/n; combine the databases with `moejit db merge`).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "args.hpp"
#include "commands.hpp"
#include "core/env.hpp"
#include "core/fs.hpp"
#include "core/log.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"
#include "db/tuning_db.hpp"
#include "problem_args.hpp"
#include "tuner/autotuner.hpp"
#include "tuner/tune_plan.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit::cli {
namespace {

std::vector<int> parse_devices(const Args& a) {
  // The list is parsed before the driver is asked, so a typo is a usage error on any machine.
  const bool all = !a.has("devices") || a.get("devices") == "all";
  const std::vector<long long> listed = all ? std::vector<long long>{} : a.get_ints("devices", 0, kNoMax);
  // One worker per entry: a GPU listed twice would time two tuners against each other.
  for (auto d = listed.begin(); d != listed.end(); ++d) {
    if (std::find(listed.begin(), d, *d) != d) {
      throw InvalidArgument("--devices", fmt::format("device {} is listed twice", *d));
    }
  }
  int count = 0;
  MOEJIT_CU(cuda::driver().cuDeviceGetCount(&count));
  std::vector<int> out;
  if (all) {
    for (int d = 0; d < count; ++d) out.push_back(d);
  }
  for (long long d : listed) {
    if (d >= count) throw InvalidArgument("--devices", fmt::format("device {} of {} visible", d, count));
    out.push_back(static_cast<int>(d));
  }
  if (out.empty()) throw NoDeviceError("no GPU to tune on");
  return out;
}

// The winners of an earlier table (`--incumbents FILE`, a `moejit db export` such as
// db/NVIDIA_H200.json), by key id, whatever their template hash (the newest row where a key has
// several builds'): the tuner keeps such a config where it ties with the fastest
// (tuner/winner.hpp). A retune after a template change otherwise swaps winners on the power cap's
// noise: 97 of 351 in session 20's, one of which cost 0.08 ms of the T=32768 forward
// (performance log).
std::map<std::string, TileConfig> prior_winners(const Args& a) {
  std::map<std::string, TileConfig> out;
  if (!a.has("incumbents")) return out;
  const std::string file = a.get("incumbents");
  std::string why;
  const std::optional<std::string> text = fs::read_all(file, std::nullopt, &why);
  if (!text) throw IoError(fmt::format("--incumbents: cannot read {}: {}", file, why));
  db::TuningDb table = db::TuningDb::in_memory();
  try {
    // A row this build cannot read is no incumbent; the rest of the table still are.
    for (const std::string& row : table.import_json(*text, db::TuningDb::BadRows::kSkip).skipped) {
      log::warn("--incumbents {}: skipped {}", file, row);
    }
  } catch (const DatabaseError& e) {
    throw DatabaseError(fmt::format("--incumbents {}: {}", file, e.what()));
  }
  std::map<std::string, std::string> tuned_at;
  for (const db::TuningRow& row : table.rows()) {
    const std::string id = row.key.id();
    // ISO-8601 UTC stamps order as text.
    if (auto at = tuned_at.find(id); at != tuned_at.end() && at->second > row.provenance.created_at) continue;
    tuned_at[id] = row.provenance.created_at;
    out[id] = row.winner;
  }
  return out;
}

void parse_shard(const Args& a, TunePlanRequest& r) {
  if (!a.has("shard")) return;
  const std::string s = a.get("shard");
  const auto slash = s.find('/');
  if (slash == std::string::npos) throw InvalidArgument("--shard", fmt::format("expected i/n, e.g. 0/4, got '{}'", s));
  r.shards = static_cast<int>(parse_int("--shard", s.substr(slash + 1), 1, std::numeric_limits<int>::max()));
  r.shard = static_cast<int>(parse_int("--shard", s.substr(0, slash), 0, r.shards - 1));
}

}  // namespace

int run_tune(int argc, char** argv, int start) {
  Args a = parse_args(argc, argv, start, {"force"},
                      {"shape", "tokens", "dtype", "modes", "roles", "db", "devices", "shard", "budget", "timing",
                       "incumbents"});
  const MoeProblem dims = parse_dims(a);
  TunePlanRequest req;
  req.experts = dims.experts;
  req.hidden = dims.hidden;
  req.intermediate = dims.intermediate;
  req.topk = dims.topk;
  req.dtype = dims.dtype;
  req.tokens = parse_tokens(a, dims, table_token_counts(dims.experts, dims.topk, kTableMaxTokens));
  const auto modes = a.has("modes") ? a.get_list("modes") : std::vector<std::string>{"train", "infer"};
  for (const std::string& m : modes) req.modes.push_back(as_option("--modes", [&] { return parse_mode(m); }));
  // No --roles means every role; get_list rejects --roles= rather than read it as that default.
  if (a.has("roles")) {
    for (const std::string& r : a.get_list("roles")) {
      req.roles.push_back(as_option("--roles", [&] { return parse_role(r); }));
    }
  }
  req.force = a.has("force");
  parse_shard(a, req);
  const double budget = a.has("budget") ? env::parse_tune_budget_s(a.get("budget"), "--budget") : env::tune_budget_s();
  const std::string timing = a.get("timing", "burst");
  if (timing != "burst" && timing != "sustained") {
    throw InvalidArgument("--timing", "expected burst or sustained, got '" + timing + "'");
  }
  const std::filesystem::path db_path = database_path(a);
  // Incumbents: the earlier table's winners, replaced below by this database's current rows.
  std::map<std::string, TileConfig> incumbents = prior_winners(a);

  const std::vector<int> devices = parse_devices(a);
  const cuda::DeviceInfo first = cuda::query_device(devices.front());
  for (int d : devices) {
    if (cuda::query_device(d).name != first.name) {
      throw InvalidArgument("--devices", "tune one GPU model per run (keys are per SKU)");
    }
  }
  // This build's rows: plan_tuning skips the keys they tuned whole; a key tuned partly (a plan's
  // first call, a budget) is tuned again, its winner an incumbent.
  std::map<std::string, db::TuningRow> stored;
  const db::Provenance current = db::current_provenance(first.driver_version);
  // Opened as a plan's tuner opens it (a damaged file is emptied, a copy kept), and refused before any
  // tuning where the rows could not be saved.
  {
    // Closed before tuning: a plan's tuner on this host may need the file alone to empty it.
    const db::TuningDb target = db::TuningDb::open_for_saving(db_path);
    if (target.read_only()) {
      throw DatabaseError(
          fmt::format("cannot save tuned rows to {}: {}", db_path.string(), target.read_only_reason()));
    }
    for (auto& row : target.rows()) {
      if (db::is_stale(row, current)) continue;
      incumbents[row.key.id()] = row.winner;
      stored.emplace(row.key.id(), std::move(row));
    }
  }
  const std::vector<TuneItem> items = plan_tuning(req, first, stored);
  fmt::print("tuning {} item(s) on {} GPU(s) ({}) into {}\n", items.size(), devices.size(), first.name,
             db_path.string());

  std::atomic<std::size_t> next{0};
  std::atomic<int> failures{0};
  std::mutex print_mu;
  auto worker = [&](int device) {
    try {
      cuda::PrimaryContext context(device);
      const cuda::DeviceInfo info = cuda::query_device(device);
      db::TuningDb db(db_path);
      for (std::size_t i = next++; i < items.size(); i = next++) {
        const TuneItem& item = items[i];
        const auto t0 = std::chrono::steady_clock::now();
        TuneOptions opt;
        opt.budget_s = budget;
        opt.sustained = timing == "sustained";
        for (Role r : item.roles) {
          auto it = incumbents.find(tuning_key(r, item.problem, info).id());
          if (it != incumbents.end()) opt.incumbents[r] = it->second;
        }
        std::vector<std::string> lines;
        opt.progress = [&](const std::string& line) { lines.push_back(line); };
        try {
          for (const auto& row : autotune(item.problem, info, item.roles, opt)) db.record(row);
        } catch (const Error& e) {
          ++failures;
          lines.push_back(fmt::format("FAILED: {}", e.what()));
          // Also on stderr, which callers (moejit.tune) report as the error.
          std::lock_guard<std::mutex> lock(print_mu);
          fmt::print(stderr, "moejit tune: gpu{} T={} {}: {}\n", device, item.problem.tokens,
                     mode_name(item.problem.mode), e.what());
        }
        std::lock_guard<std::mutex> lock(print_mu);
        fmt::print("[{}/{}] gpu{} T={} {} ({:.1f} s)\n", i + 1, items.size(), device, item.problem.tokens,
                   mode_name(item.problem.mode),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        for (const auto& l : lines) fmt::print("    {}\n", l);
        std::fflush(stdout);
      }
    } catch (const std::exception& e) {
      ++failures;
      std::lock_guard<std::mutex> lock(print_mu);
      fmt::print("gpu{}: {}\n", device, e.what());
      fmt::print(stderr, "moejit tune: gpu{}: {}\n", device, e.what());
    }
  };
  // jthread: if one cannot start, those already started are joined as the exception leaves,
  // where a joinable std::thread's destructor would call std::terminate; they take no more items.
  std::vector<std::jthread> threads;
  try {
    for (int d : devices) threads.emplace_back(worker, d);
  } catch (...) {
    next = items.size();
    throw;
  }
  for (auto& t : threads) t.join();
  fmt::print("done: {} item(s), {} failure(s)\n", items.size(), failures.load());
  return failures == 0 ? 0 : 1;
}

}  // namespace moejit::cli
