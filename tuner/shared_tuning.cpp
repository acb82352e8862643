#include "tuner/shared_tuning.hpp"

#include <optional>

#include "core/env.hpp"
#include "core/fs.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "db/tuning_db.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

// Named by the routing key, which every mode of a shape and bucket shares (as it shares the
// keys of fwd_down, gather_sum and more): a training and an inference plan that start together
// tune one after the other, and the second finds the shared rows done.
std::filesystem::path tuning_lock_path(const MoeProblem& problem, const cuda::DeviceInfo& device) {
  const db::TuningKey key = tuning_key(Role::kRouting, problem, device);
  return env::user_db_path().string() + ".locks/" + Hasher().field(key.id()).hex() + ".lock";
}

std::vector<db::TuningRow> tune_shared(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                       const std::vector<Role>& missing, db::TuningLookup& lookup, const TuneFn& tune,
                                       const db::TuningDb::RowFilter& accept) {
  std::optional<fs::FileLock> lock;
  try {
    lock.emplace(tuning_lock_path(problem, device), kTuningLockTimeout);
  } catch (const IoError& e) {
    log::warn("tuning without a cross-process lock: {}", e.what());
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
  try {
    db::TuningDb user(env::user_db_path());
    for (const auto& row : tuned) user.record(row);
  } catch (const Error& e) {
    log::warn("tuned configs not saved to {}: {}", env::user_db_path().string(), e.what());
  }
  for (auto& row : tuned) {
    lookup.remember(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace moejit
