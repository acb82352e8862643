#include "db/tuning_lookup.hpp"

#include <tuple>

#include "core/fs.hpp"
#include "core/log.hpp"
#include "moejit/error.hpp"

namespace moejit::db {

const char* Resolved::source_name() const noexcept {
  switch (source) {
    case Source::kMemory: return "memory";
    case Source::kUserDb: return "user_db";
    case Source::kShippedDb: return "shipped_db";
    case Source::kNearestBucket: return "nearest_bucket";
    case Source::kHeuristic: return "heuristic";
  }
  return "unknown";
}

std::string shipped_db_file_name(const std::string& device) {
  std::string name = device;
  for (char& c : name) {
    const bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum) c = '_';
  }
  return name + ".json";
}

TuningLookup::TuningLookup(std::filesystem::path user_db, std::filesystem::path shipped_dir, Provenance current,
                           Heuristic heuristic)
    : user_path_(std::move(user_db)),
      shipped_dir_(std::move(shipped_dir)),
      current_(std::move(current)),
      heuristic_(std::move(heuristic)) {
  if (!heuristic_) throw InvalidArgument("heuristic", "the lookup needs a heuristic default");
}

std::optional<TuningDb>& TuningLookup::user_db() {
  if (user_path_.empty()) return user_;
  // Ranks that waited on a tuning lock while another emptied a damaged file read the rows it then
  // saved: otherwise each would tune the problem again.
  if (user_damaged_ && fs::file_version(user_path_) != user_damaged_) {
    user_tried_ = false;
    user_damaged_.reset();
  }
  if (!user_tried_) {
    user_tried_ = true;
    const std::optional<fs::FileVersion> version = fs::file_version(user_path_);
    try {
      user_.emplace(user_path_);
    } catch (const Error& e) {
      if (dynamic_cast<const CorruptDatabase*>(&e)) user_damaged_ = version;
      log::warn("tuning lookup: user database skipped: {}", e.what());
    }
  }
  return user_;
}

std::optional<TuningDb>& TuningLookup::shipped_db(const std::string& device) {
  auto [it, inserted] = shipped_.try_emplace(device);
  if (inserted && !shipped_dir_.empty()) {
    const std::filesystem::path file = shipped_dir_ / shipped_db_file_name(device);
    if (std::optional<std::string> text = fs::read_all(file)) {
      try {
        TuningDb db = TuningDb::in_memory();
        // One row this build cannot read costs its own key alone, as in a database file.
        for (const std::string& row : db.import_json(*text, TuningDb::BadRows::kSkip).skipped) {
          log::warn("tuning lookup: shipped table {}: skipped {}", file.string(), row);
        }
        it->second.emplace(std::move(db));
      } catch (const Error& e) {
        log::warn("tuning lookup: shipped table {} skipped: {}", file.string(), e.what());
      }
    } else {
      log::debug("tuning lookup: no shipped table {}", file.string());
    }
  }
  return it->second;
}

template <typename Query>
std::optional<TuningRow> TuningLookup::guarded(std::optional<TuningDb>& db, const char* what, Query query) {
  if (!db) return std::nullopt;
  try {
    return query(*db);
  } catch (const Error& e) {
    log::warn("tuning lookup: {} {} skipped from now on: {}", what, db->path(), e.what());
    if (&db == &user_ && dynamic_cast<const CorruptDatabase*>(&e)) user_damaged_ = fs::file_version(user_path_);
    db.reset();
    return std::nullopt;
  }
}

bool TuningLookup::usable(const TuningRow& row, const TuningDb::RowFilter& accept) const {
  return !is_stale(row, current_) && (!accept || accept(row));
}

Resolved TuningLookup::resolve(const TuningKey& key, const TuningDb::RowFilter& accept) {
  using Source = Resolved::Source;
  const std::string id = key.id();
  std::unique_lock lock(mu_);
  if (auto it = memory_.find(id); it != memory_.end() && usable(it->second, accept)) {
    return Resolved{it->second.winner, Source::kMemory, it->second};
  }

  auto exact = [&](const TuningDb& db) { return db.lookup(key, current_); };
  std::optional<TuningDb>& user = user_db();
  std::optional<TuningDb>& shipped = shipped_db(key.device);
  for (auto [db, what, source] : {std::tuple{&user, "user database", Source::kUserDb},
                                  std::tuple{&shipped, "shipped database", Source::kShippedDb}}) {
    if (std::optional<TuningRow> row = guarded(*db, what, exact); row && usable(*row, accept)) {
      memory_[id] = *row;
      return Resolved{row->winner, source, std::move(row)};
    }
  }

  auto fits = [&](const TuningRow& row) { return usable(row, accept); };
  auto nearest = [&](const TuningDb& db) { return db.nearest_bucket(key, current_, fits); };
  for (auto [db, what] : {std::pair{&user, "user database"}, std::pair{&shipped, "shipped database"}}) {
    if (std::optional<TuningRow> row = guarded(*db, what, nearest)) {
      return Resolved{row->winner, Source::kNearestBucket, std::move(row)};
    }
  }

  // The heuristic is the caller's code: run it without holding the lock.
  lock.unlock();
  return Resolved{heuristic_(key), Source::kHeuristic, std::nullopt};
}

void TuningLookup::close_user_db() {
  std::lock_guard lock(mu_);
  if (!user_) return;
  user_.reset();
  user_tried_ = false;
}

void TuningLookup::remember(const TuningRow& row) {
  std::lock_guard lock(mu_);
  memory_[row.key.id()] = row;
}

}  // namespace moejit::db
