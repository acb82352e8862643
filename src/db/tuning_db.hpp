// The tuning database: one SQLite file holding the winner of every tuning key and every
// candidate's result. Several processes may write the same file at once (WAL, busy timeout,
// BEGIN IMMEDIATE): eight ranks tuning on one host neither corrupt it nor lose rows.
//
// Schema (version kSchemaVersion, kept in PRAGMA user_version):
//   winners(key_id PK, the key's fields as columns, the winner config's fields as columns,
//           median_ms, spread_ms, provenance columns)
//   candidates(key_id, config_name) PK, config fields, median_ms, spread_ms, rejected, reason)
// Candidates are upserted, never wiped: re-tuning a key after adding configs to the space
// keeps the results of the configs measured before.
//
// A TuningDb is one connection; share it between threads only under a lock of your own.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "db/sqlite.hpp"
#include "db/tuning_key.hpp"
#include "db/tuning_row.hpp"

namespace moejit::db {

inline constexpr int kSchemaVersion = 3;

class TuningDb {
 public:
  using RowFilter = std::function<bool(const TuningRow&)>;

  struct MergeStats {
    int added = 0;     // keys that were not in this database
    int replaced = 0;  // keys whose winner lost to the incoming one (stale, or slower)
    int kept = 0;      // keys whose winner stayed (current against a stale one, or as fast)
  };

  // kReadWrite creates the file (and directories) and its schema, or migrates an older schema.
  // kReadOnly needs an existing database and never writes it: an older schema is migrated in a
  // copy in memory. Either way a database written by a newer moejit is refused with DatabaseError.
  explicit TuningDb(const std::filesystem::path& path, OpenMode mode = OpenMode::kReadWrite);
  // An empty database in memory (shipped tables are imported into one).
  static TuningDb in_memory();

  const std::string& path() const { return conn_.path(); }
  int schema_version() const;  // PRAGMA user_version of what this connection reads

  // Upserts the row's winner and each of its candidates in one transaction. Throws
  // InvalidArgument for an invalid row (see validate()).
  void record(const TuningRow& row);
  // The same, unless the key already has a row that `keep_existing` accepts: decided inside the
  // write transaction, so another process's row recorded meanwhile is weighed too. Returns
  // whether `row` was written.
  bool record(const TuningRow& row, const RowFilter& keep_existing);

  // The row of exactly this key. Here and below, a row this build cannot read (a newer moejit's
  // role, dtype or arch tag; a value out of range; a key id that does not match its fields) is
  // skipped with a warning, as if absent.
  std::optional<TuningRow> lookup(const TuningKey& key) const;

  // Every row, ordered by key id; candidates ordered by config name.
  std::vector<TuningRow> rows() const;

  // Among rows whose key equals `key` in everything but tpe_bucket and that `accept` allows
  // (all when empty), the one whose bucket is nearest in log2 distance; ties go to the larger
  // bucket, whose tiles were measured with more work per expert.
  std::optional<TuningRow> nearest_bucket(const TuningKey& key, const RowFilter& accept = {}) const;

  // Per key keeps the current winner over a stale one (is_stale against `current`: lookups skip
  // stale rows, so a faster stale time must not displace a current row), else the faster
  // (lower median_ms; ties keep the existing one). A row that is written brings its candidates
  // (replacing those of the same config name); a kept row keeps its own alone. One transaction.
  MergeStats merge(const TuningDb& other, const Provenance& current);
  MergeStats merge_rows(const std::vector<TuningRow>& rows, const Provenance& current);

  // Diffable text: {"schema_version": N, "rows": [...]}, rows sorted by key id, object keys
  // sorted, indent 2, trailing newline.
  std::string export_json() const;
  // Parses and validates all of `text` before writing anything, then merges (merge_rows).
  // Throws DatabaseError naming the row and field that is wrong.
  MergeStats import_json(const std::string& text, const Provenance& current);

 private:
  explicit TuningDb(Connection conn);

  Connection conn_;
};

}  // namespace moejit::db
