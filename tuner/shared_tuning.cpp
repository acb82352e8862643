#include "tuner/shared_tuning.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/env.hpp"
#include "core/fs.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "db/tuning_db.hpp"
#include "tuner/prune.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

// Named by the routing key, which every mode of a shape and bucket shares (as it shares the
// keys of fwd_down, gather_sum and more): a training and an inference plan that start together
// tune one after the other, and the second finds the shared rows done.
std::filesystem::path tuning_lock_path(const std::filesystem::path& user_db, const MoeProblem& problem,
                                       const cuda::DeviceInfo& device) {
  const db::TuningKey key = tuning_key(Role::kRouting, problem, device);
  return user_db.string() + ".locks/" + Hasher().field(key.id()).hex() + ".lock";
}

namespace {

// Records the tuned rows in the user database, in one transaction: a busy timeout or a full disk
// saves none of them rather than the ones before it. Returns the rows to run: each tuned row, or
// the stored row kept in its place. `moejit tune` takes no problem's lock (only the GPU's, around
// its timings): a whole row it recorded
// while this process's partial tune ran (the first call's narrower space, or cut short by the
// budget) stays, and this process runs it too. A stored row `accept` refuses is replaced: kept, it
// would be dropped by the caller, and every plan would tune again and drop its result. (Rows are
// weighed against a row of their own build only.)
std::vector<db::TuningRow> save(const std::filesystem::path& user_db, db::TuningLookup& lookup,
                                std::vector<db::TuningRow> tuned, const MoeShape& shape,
                                const db::TuningDb::RowFilter& accept) {
  try {
    lookup.close_user_db();  // a damaged file is emptied only where no connection holds it
    db::TuningDb user = db::TuningDb::open_for_saving(user_db);
    if (user.read_only()) {
      // Another user's database, or a read-only folder: read, never written, said once.
      if (log::first_time("unsaved " + user_db.string())) {
        log::warn("tuned configs cannot be saved to {}, so they serve this process only: {}", user_db.string(),
                  user.read_only_reason());
      }
      return tuned;
    }
    const db::TuningDb::KeepExisting keep = [&](const db::TuningRow& incoming, const db::TuningRow& existing) {
      return tuned_partly(incoming, shape) && !tuned_partly(existing, shape) && (!accept || accept(existing));
    };
    db::TuningDb::Saved saved = user.record_all(tuned, keep);
    if (!saved.skipped.empty()) {
      log::warn("tuned configs not saved to {}: {}", user_db.string(), fmt::join(saved.skipped, "; "));
    }
    return std::move(saved.rows);
  } catch (const Error& e) {
    log::warn("tuned configs not saved to {}: {}", user_db.string(), e.what());
  }
  return tuned;
}

}  // namespace

std::optional<fs::FileLock> lock_gpu_timing(const cuda::DeviceInfo& device, double budget_s) {
  std::optional<fs::FileLock> out;
  if (device.uuid.empty()) return out;
  const std::optional<std::filesystem::path> dir = env::gpu_lock_dir();
  if (!dir) return out;  // env says why, once
  try {
    out.emplace(*dir / ("gpu-" + device.uuid + ".lock"), tuning_lock_timeout(budget_s));
  } catch (const fs::LockTimeout&) {
    throw;  // another tuner still times there
  } catch (const IoError& e) {
    if (log::first_time("gpu timing lock " + device.uuid)) log::warn("timing without the GPU's lock: {}", e.what());
  }
  return out;
}

std::chrono::seconds problem_lock_timeout(double budget_s) {
  return 2 * tuning_lock_timeout(budget_s);
}

std::chrono::seconds tuning_lock_timeout(double budget_s) {
  const auto budget = std::chrono::seconds(static_cast<long long>(std::ceil(budget_s))) + std::chrono::minutes(1);
  return std::max<std::chrono::seconds>(kTuningLockTimeout, budget);
}

std::vector<db::TuningRow> tune_shared(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                       const std::vector<Role>& missing, db::TuningLookup& lookup, const TuneFn& tune,
                                       const db::TuningDb::RowFilter& accept, double budget_s) {
  std::optional<std::filesystem::path> user_db;
  if (!lookup.user_db_path().empty()) user_db = lookup.user_db_path();
  std::optional<fs::FileLock> lock;
  if (!user_db) {
    log::warn("tuning without a cross-process lock or a user database: MOEJIT_DB, XDG_CACHE_HOME and HOME "
              "unset, no private folder in the temporary folder");
  } else {
    try {
      lock.emplace(tuning_lock_path(*user_db, problem, device), problem_lock_timeout(budget_s));
    } catch (const IoError& e) {
      log::warn("tuning without a cross-process lock: {}", e.what());
    }
  }
  std::vector<db::TuningRow> rows;
  std::vector<Role> still;
  for (Role r : missing) {
    db::Resolved res = lookup.resolve(tuning_key(r, problem, device), accept);
    if (res.row && (res.source == db::Resolved::Source::kUserDb || res.source == db::Resolved::Source::kMemory)) {
      rows.push_back(*res.row);  // another process tuned it while this one waited
    } else {
      still.push_back(r);
    }
  }
  if (still.empty()) return rows;
  std::vector<db::TuningRow> tuned = tune(still);
  if (user_db) tuned = save(*user_db, lookup, std::move(tuned), shape_of(problem), accept);
  for (auto& row : tuned) {
    lookup.remember(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace moejit
