// Resolves a tuning key to a tile config. Lookup order (DESIGN.md), first hit wins:
//   1. in-process map: rows given to remember(), and exact hits of levels 2 and 3, so a key
//      costs one map lookup after its first call;
//   2. user DB (the path given, normally env::user_db_path()), exact key;
//   3. shipped DB of the device SKU, exact key: <shipped dir>/shipped_db_file_name(device),
//      a JSON export imported into an in-memory database on first use;
//   4. nearest TPE bucket of the same key (TuningDb::nearest_bucket): user DB first, then the
//      shipped DB;
//   5. the heuristic default passed in.
// Stale rows (template hash or NVRTC version differ from the current provenance) are ignored
// at every level (the databases are asked for the current build's rows only), and so are rows
// the caller's `accept` refuses (a winner that no longer passes pruning: its rules live in host
// code, outside the template hash). Rows this build cannot read cost their own key alone: a
// database file's are skipped as read, a shipped table's left out one by one at its import, each
// logged (TuningDb::BadRows::kSkip). A database that cannot be opened, parsed or read is logged
// once and skipped from then on, a damaged user DB until its file changes (emptied by a tuner,
// TuningDb::open_for_saving): a lookup never fails because of a database, it falls through to the
// next level. A user DB this process cannot write is read all the same.
// Databases are opened on first use, never at construction (the user DB is created if missing,
// as the tuner would); do not carry a lookup that has resolved keys across fork(): SQLite
// connections must not cross it.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/fs.hpp"
#include "db/tuning_db.hpp"
#include "db/tuning_row.hpp"
#include "tuner/tile_config.hpp"

namespace moejit::db {

struct Resolved {
  enum class Source { kMemory, kUserDb, kShippedDb, kNearestBucket, kHeuristic };

  TileConfig config;
  Source source = Source::kHeuristic;
  std::optional<TuningRow> row;  // the row the config came from; empty for the heuristic

  const char* source_name() const noexcept;  // "memory", "user_db", "shipped_db", "nearest_bucket", "heuristic"
};

// "NVIDIA_H200.json" for "NVIDIA H200": every character that is not [A-Za-z0-9] becomes '_'.
std::string shipped_db_file_name(const std::string& device);

// Thread-safe: one mutex guards the map and the databases.
class TuningLookup {
 public:
  using Heuristic = std::function<TileConfig(const TuningKey&)>;

  // An empty user_db or shipped_dir turns that level off. Throws InvalidArgument when
  // heuristic is empty.
  TuningLookup(std::filesystem::path user_db, std::filesystem::path shipped_dir, Provenance current,
               Heuristic heuristic);

  // The config for `key`, from the first level above that has a fresh row `accept` allows (all
  // when empty).
  Resolved resolve(const TuningKey& key, const TuningDb::RowFilter& accept = {});

  // Puts a row (typically just tuned) in the in-process map, replacing that key's entry.
  void remember(const TuningRow& row);

  // The user database this lookup reads (empty: none), where its tunes are saved: a setting
  // changed since it was made names another file, which this lookup's rows did not come from.
  const std::filesystem::path& user_db_path() const { return user_path_; }

  // Closes the user DB if open; the next resolve opens it again. A tuner about to save lets go of
  // it first: emptying a damaged file needs it alone (TuningDb::open_for_saving).
  void close_user_db();

 private:
  // The databases, opened on first use; empty when absent or failed.
  std::optional<TuningDb>& user_db();
  std::optional<TuningDb>& shipped_db(const std::string& device);
  // Runs a query on a database; on an error logs it, closes the database for good, returns nullopt.
  template <typename Query>
  std::optional<TuningRow> guarded(std::optional<TuningDb>& db, const char* what, Query query);
  bool usable(const TuningRow& row, const TuningDb::RowFilter& accept) const;

  const std::filesystem::path user_path_;
  const std::filesystem::path shipped_dir_;
  const Provenance current_;
  const Heuristic heuristic_;

  std::mutex mu_;
  std::unordered_map<std::string, TuningRow> memory_;  // by key id
  std::optional<TuningDb> user_;
  bool user_tried_ = false;
  std::optional<fs::FileVersion> user_damaged_;  // the user DB's file when found damaged
  std::map<std::string, std::optional<TuningDb>> shipped_;  // by device; nullopt: none or failed
};

}  // namespace moejit::db
