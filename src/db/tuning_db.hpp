// The tuning database: one SQLite file holding the winner of every tuning key and every
// candidate's result, per build that tuned it. Several processes may write the same file at
// once (WAL on a local file system, the rollback journal on a network one; busy timeout, BEGIN
// IMMEDIATE): eight ranks tuning on one host neither corrupt it nor lose rows.
//
// Schema (version kSchemaVersion, kept in PRAGMA user_version):
//   winners((key_id, template_hash, nvrtc_version) PK, the key's fields as columns, the winner
//           config's fields as columns, median_ms, spread_ms, the other provenance columns)
//   candidates((key_id, template_hash, nvrtc_version, config_name) PK, config fields, median_ms,
//              spread_ms, rejected, reason)
// A row belongs to its key and its build (same_build: template hash and NVRTC version), so two
// builds sharing one file (an upgrade beside the old install, two environments) keep a row each
// instead of replacing each other's and tuning again at every switch; `prune` drops the rows of
// other builds. Candidates are upserted, never wiped: re-tuning a key after adding configs to the
// space keeps the results of the configs measured before. A row so keeps the candidates of configs
// the space has dropped since; tuned_partly (tuner/prune.hpp) passes over their marks.
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

inline constexpr int kSchemaVersion = 4;

class TuningDb {
 public:
  using RowFilter = std::function<bool(const TuningRow&)>;

  struct MergeStats {
    int added = 0;     // rows (key and build) that were not in this database
    int replaced = 0;  // rows of lower standing, or of the same and a slower winner, than the incoming one
    int kept = 0;      // the others
    // import_json with BadRows::kSkip: each row left out, "rows[N] (<id>): <why>".
    std::vector<std::string> skipped;
  };

  // What import_json does with a row this build cannot read (a newer moejit's role, dtype or arch
  // tag, a value out of range, a key id that does not match the key's fields).
  enum class BadRows {
    kRefuse,  // throw, writing nothing: `moejit db import` moves a table whole or not at all
    kSkip,    // leave it out (MergeStats::skipped): a shipped table or --incumbents serves the rest
  };

  // kReadWrite creates the file (and directories) and its schema, or migrates an older schema; a
  // file this process cannot write, or whose folder it cannot write, is read as kReadOnly reads
  // it (read_only(), and writes throw DatabaseError saying why). kReadOnly needs an existing
  // database and never writes it: an older schema is migrated in a copy in memory. Either way a
  // database written by a newer moejit is refused with DatabaseError, and one SQLite finds damaged
  // with CorruptDatabase.
  explicit TuningDb(const std::filesystem::path& path, OpenMode mode = OpenMode::kReadWrite);
  // An empty database in memory (shipped tables are imported into one).
  static TuningDb in_memory();
  // Opens `path` to save rows, as the tuner does. A database SQLite finds damaged, at opening or by
  // PRAGMA quick_check, is copied with its -wal and -journal to <name>.corrupt-<UTC time> (never
  // over an earlier copy) and emptied in place (Connection::reset), with a warning naming both;
  // under an exclusive lock (<path>.locks/recover.lock), checked again once it is held, so
  // processes that found the same damage empty it once. Where other processes have it open it
  // stays as it is (no copy), said once, and is returned. A damaged file this process cannot
  // write throws CorruptDatabase.
  static TuningDb open_for_saving(const std::filesystem::path& path);

  const std::string& path() const { return conn_.path(); }
  int schema_version() const;  // PRAGMA user_version of what this connection reads
  bool read_only() const { return conn_.read_only(); }
  // Why a kReadWrite open is read-only (Connection::read_only_reason); empty otherwise.
  const std::string& read_only_reason() const { return conn_.read_only_reason(); }
  // Throws CorruptDatabase naming what PRAGMA quick_check found, unless it finds nothing.
  void check_intact() const;

  // Upserts the row's winner and each of its candidates, under its key and the build of its
  // provenance, in one transaction; other builds' rows of the key stay. Throws InvalidArgument
  // for an invalid row (see validate()).
  void record(const TuningRow& row);
  // The same, unless the key already has a row of the same build that `keep_existing` accepts:
  // decided inside the write transaction, so another process's row recorded meanwhile is weighed
  // too. Returns whether `row` was written.
  bool record(const TuningRow& row, const RowFilter& keep_existing);

  // Per row, whether a stored row of its key and build stays in its place (as keep_existing in
  // record()).
  using KeepExisting = std::function<bool(const TuningRow& incoming, const TuningRow& existing)>;
  struct Saved {
    std::vector<TuningRow> rows;       // per row given: itself, or the stored row kept in its place
    std::vector<std::string> skipped;  // rows validate() refuses, "<key id>: <why>", not written
  };
  // Records the rows as record(row, keep_existing) would, in one write transaction: each row is
  // written, or none is, but a row validate() refuses is left out alone.
  Saved record_all(const std::vector<TuningRow>& rows, const KeepExisting& keep_existing = {});

  // The row of exactly this key tuned by `build` (same_build). Here and below, a row this build
  // cannot read (a newer moejit's role, dtype or arch tag; a value out of range; a key id that
  // does not match its fields) is skipped with a warning, as if absent.
  std::optional<TuningRow> lookup(const TuningKey& key, const Provenance& build) const;

  // Every row of every build, ordered by key id, template hash and NVRTC version; candidates
  // ordered by config name.
  std::vector<TuningRow> rows() const;

  // Among rows of `build` whose key equals `key` in everything but tpe_bucket and that `accept`
  // allows (all when empty), the one whose bucket is nearest in log2 distance; ties go to the
  // larger bucket, whose tiles were measured with more work per expert.
  std::optional<TuningRow> nearest_bucket(const TuningKey& key, const Provenance& build,
                                          const RowFilter& accept = {}) const;

  // How a row ranks in a merge before its time is weighed, higher first (`moejit db` ranks a row
  // tuned whole over one a first call or a budget cut short, whose time may be another T's of the
  // key); none: every row ranks alike.
  using Standing = std::function<int(const TuningRow&)>;
  // Per key and build keeps the row of higher standing, and between rows of one standing the
  // faster winner (lower median_ms; ties keep the existing one); a stored row this build cannot
  // read is replaced. A row that is written brings its candidates (replacing those of the same
  // config name); a kept row keeps its own alone. One transaction.
  MergeStats merge(const TuningDb& other, const Standing& standing = {});
  MergeStats merge_rows(const std::vector<TuningRow>& rows, const Standing& standing = {});

  // Deletes the rows of every build but `keep`'s, with their candidates, in one transaction.
  // Returns how many rows went.
  int prune(const Provenance& keep);

  // Diffable text: {"schema_version": N, "rows": [...]}, rows in rows()' order, object keys
  // sorted, indent 2, trailing newline.
  std::string export_json() const;
  // The rows of an export, each parsed and validated, with no database: `moejit db import` reads a
  // file whole before it opens (or creates) its target. Throws DatabaseError starting with
  // `source` and naming the row and field that is wrong: for any such row under BadRows::kRefuse
  // (else it is listed in `skipped`), and under either for a document that is not an export (not
  // JSON, no readable schema_version, no rows array).
  struct ExportRows {
    std::vector<TuningRow> rows;
    std::vector<std::string> skipped;  // as MergeStats::skipped
  };
  static ExportRows parse_export(const std::string& text, BadRows bad_rows, const std::string& source);
  // parse_export's rows (its errors name "import into <path>"), merged (merge_rows): nothing is
  // written unless all of `text` reads.
  MergeStats import_json(const std::string& text, BadRows bad_rows = BadRows::kRefuse);

 private:
  explicit TuningDb(Connection conn);

  Connection conn_;
};

}  // namespace moejit::db
