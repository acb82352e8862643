#include "db/tuning_db.hpp"

#include <fmt/format.h>

#include <array>
#include <compare>
#include <limits>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "core/log.hpp"
#include "moejit/error.hpp"

namespace moejit::db {
namespace {

// kMigrations[v] takes a database from schema version v to v + 1; version 0 is an empty file.
constexpr std::array<const char*, kSchemaVersion> kMigrations = {
    R"sql(
CREATE TABLE winners (
  key_id TEXT PRIMARY KEY NOT NULL,
  device TEXT NOT NULL, arch TEXT NOT NULL, role TEXT NOT NULL, dtype TEXT NOT NULL,
  h INTEGER NOT NULL, i INTEGER NOT NULL, e INTEGER NOT NULL, k INTEGER NOT NULL,
  key_block_m INTEGER NOT NULL, key_use_tma INTEGER NOT NULL, tpe_bucket INTEGER NOT NULL, mode TEXT NOT NULL,
  block_m INTEGER NOT NULL, block_n INTEGER NOT NULL, block_k INTEGER NOT NULL, stages INTEGER NOT NULL,
  warps INTEGER NOT NULL, group_m INTEGER NOT NULL, cluster INTEGER NOT NULL, items INTEGER NOT NULL,
  use_tma INTEGER NOT NULL, arch_tag TEXT NOT NULL,
  median_ms REAL NOT NULL, spread_ms REAL NOT NULL,
  nvrtc_version TEXT NOT NULL, driver_version INTEGER NOT NULL, template_hash TEXT NOT NULL,
  library_version TEXT NOT NULL, created_at TEXT NOT NULL
);
CREATE INDEX winners_by_family ON winners (device, arch, role, dtype, h, i, e, k, key_block_m, key_use_tma, mode);
CREATE TABLE candidates (
  key_id TEXT NOT NULL, config_name TEXT NOT NULL,
  block_m INTEGER NOT NULL, block_n INTEGER NOT NULL, block_k INTEGER NOT NULL, stages INTEGER NOT NULL,
  warps INTEGER NOT NULL, group_m INTEGER NOT NULL, cluster INTEGER NOT NULL, items INTEGER NOT NULL,
  use_tma INTEGER NOT NULL, arch_tag TEXT NOT NULL,
  median_ms REAL, spread_ms REAL, rejected INTEGER NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (key_id, config_name)
) WITHOUT ROWID;
)sql",
    // 2: configs record whether a Hopper GEMM runs warp-specialized (TileConfig::warp_specialized).
    R"sql(
ALTER TABLE winners ADD COLUMN warp_specialized INTEGER NOT NULL DEFAULT 0;
ALTER TABLE candidates ADD COLUMN warp_specialized INTEGER NOT NULL DEFAULT 0;
)sql",
    // 3: configs record whether a block runs several tiles (TileConfig::persistent).
    R"sql(
ALTER TABLE winners ADD COLUMN persistent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE candidates ADD COLUMN persistent INTEGER NOT NULL DEFAULT 0;
)sql",
    // 4: rows are kept per key and build (template hash, NVRTC version), so builds sharing the
    // file stop replacing each other's rows. SQLite cannot change a primary key in place: the
    // tables are rebuilt. Each candidate takes its winner's build (a candidate without a winner,
    // which record() never leaves, has no build and is dropped).
    R"sql(
CREATE TABLE winners_v4 (
  key_id TEXT NOT NULL, template_hash TEXT NOT NULL, nvrtc_version TEXT NOT NULL,
  device TEXT NOT NULL, arch TEXT NOT NULL, role TEXT NOT NULL, dtype TEXT NOT NULL,
  h INTEGER NOT NULL, i INTEGER NOT NULL, e INTEGER NOT NULL, k INTEGER NOT NULL,
  key_block_m INTEGER NOT NULL, key_use_tma INTEGER NOT NULL, tpe_bucket INTEGER NOT NULL, mode TEXT NOT NULL,
  block_m INTEGER NOT NULL, block_n INTEGER NOT NULL, block_k INTEGER NOT NULL, stages INTEGER NOT NULL,
  warps INTEGER NOT NULL, group_m INTEGER NOT NULL, cluster INTEGER NOT NULL, items INTEGER NOT NULL,
  use_tma INTEGER NOT NULL, arch_tag TEXT NOT NULL, warp_specialized INTEGER NOT NULL, persistent INTEGER NOT NULL,
  median_ms REAL NOT NULL, spread_ms REAL NOT NULL,
  driver_version INTEGER NOT NULL, library_version TEXT NOT NULL, created_at TEXT NOT NULL,
  PRIMARY KEY (key_id, template_hash, nvrtc_version)
) WITHOUT ROWID;
INSERT INTO winners_v4 SELECT key_id, template_hash, nvrtc_version, device, arch, role, dtype, h, i, e, k,
  key_block_m, key_use_tma, tpe_bucket, mode, block_m, block_n, block_k, stages, warps, group_m, cluster, items,
  use_tma, arch_tag, warp_specialized, persistent, median_ms, spread_ms, driver_version, library_version, created_at
  FROM winners;
CREATE TABLE candidates_v4 (
  key_id TEXT NOT NULL, template_hash TEXT NOT NULL, nvrtc_version TEXT NOT NULL, config_name TEXT NOT NULL,
  block_m INTEGER NOT NULL, block_n INTEGER NOT NULL, block_k INTEGER NOT NULL, stages INTEGER NOT NULL,
  warps INTEGER NOT NULL, group_m INTEGER NOT NULL, cluster INTEGER NOT NULL, items INTEGER NOT NULL,
  use_tma INTEGER NOT NULL, arch_tag TEXT NOT NULL, warp_specialized INTEGER NOT NULL, persistent INTEGER NOT NULL,
  median_ms REAL, spread_ms REAL, rejected INTEGER NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (key_id, template_hash, nvrtc_version, config_name)
) WITHOUT ROWID;
INSERT INTO candidates_v4 SELECT c.key_id, w.template_hash, w.nvrtc_version, c.config_name, c.block_m, c.block_n,
  c.block_k, c.stages, c.warps, c.group_m, c.cluster, c.items, c.use_tma, c.arch_tag, c.warp_specialized,
  c.persistent, c.median_ms, c.spread_ms, c.rejected, c.reason
  FROM candidates AS c JOIN winners AS w ON w.key_id = c.key_id;
DROP TABLE candidates;
DROP TABLE winners;
ALTER TABLE winners_v4 RENAME TO winners;
ALTER TABLE candidates_v4 RENAME TO candidates;
CREATE INDEX winners_by_family ON winners (device, arch, role, dtype, h, i, e, k, key_block_m, key_use_tma, mode);
)sql",
};

#define MOEJIT_CONFIG_COLUMNS \
  "block_m, block_n, block_k, stages, warps, group_m, cluster, items, use_tma, arch_tag, warp_specialized, persistent"
#define MOEJIT_CONFIG_PARAMS \
  ":block_m, :block_n, :block_k, :stages, :warps, :group_m, :cluster, :items, :use_tma, :arch_tag, :warp_specialized, :persistent"

// Both SELECTs start with a row's identity (key id and build), which read_winner and
// read_candidate skip.
#define MOEJIT_ROW_ID_COLUMNS "key_id, template_hash, nvrtc_version"
constexpr int kRowIdColumns = 3;

constexpr const char* kSelectWinners =
    "SELECT " MOEJIT_ROW_ID_COLUMNS ", device, arch, role, dtype, h, i, e, k, key_block_m, key_use_tma, tpe_bucket, "
    "mode, " MOEJIT_CONFIG_COLUMNS ", median_ms, spread_ms, driver_version, library_version, created_at FROM winners ";

constexpr const char* kSelectCandidates =
    "SELECT " MOEJIT_ROW_ID_COLUMNS ", " MOEJIT_CONFIG_COLUMNS
    ", median_ms, spread_ms, rejected, reason FROM candidates ";

// One row: its key and build.
constexpr const char* kWhereRow =
    "WHERE key_id = :key_id AND template_hash = :template_hash AND nvrtc_version = :nvrtc_version ";
constexpr const char* kRowOrder = "ORDER BY key_id, template_hash, nvrtc_version";

constexpr const char* kUpsertWinner =
    "INSERT OR REPLACE INTO winners (key_id, device, arch, role, dtype, h, i, e, k, key_block_m, key_use_tma, "
    "tpe_bucket, mode, " MOEJIT_CONFIG_COLUMNS ", median_ms, spread_ms, nvrtc_version, driver_version, template_hash, "
    "library_version, created_at) VALUES (:key_id, :device, :arch, :role, :dtype, :h, :i, :e, :k, :key_block_m, "
    ":key_use_tma, :tpe_bucket, :mode, " MOEJIT_CONFIG_PARAMS ", :median_ms, :spread_ms, :nvrtc_version, "
    ":driver_version, :template_hash, :library_version, :created_at)";

constexpr const char* kUpsertCandidate =
    "INSERT OR REPLACE INTO candidates (" MOEJIT_ROW_ID_COLUMNS ", config_name, " MOEJIT_CONFIG_COLUMNS
    ", median_ms, spread_ms, rejected, reason) VALUES (:key_id, :template_hash, :nvrtc_version, :config_name, "
    MOEJIT_CONFIG_PARAMS ", :median_ms, :spread_ms, :rejected, :reason)";

#undef MOEJIT_CONFIG_COLUMNS
#undef MOEJIT_CONFIG_PARAMS
#undef MOEJIT_ROW_ID_COLUMNS

// Reads the columns of a result row left to right, so the order lives only in the SELECTs.
class Cursor {
 public:
  Cursor(const Statement& s, int first_col) : s_(s), col_(first_col) {}
  int i() {
    const long long v = s_.column_int(col_);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      throw DatabaseError(fmt::format("column {} holds {}, past an int", col_, v));
    }
    ++col_;
    return static_cast<int>(v);
  }
  bool b() { return s_.column_int(col_++) != 0; }
  double d() { return s_.column_double(col_++); }
  std::string t() { return s_.column_text(col_++); }

  // The config columns, parsed by TileConfig's own JSON reader so arch tags have one parser.
  TileConfig config() {
    nlohmann::json j{{"block_m", i()}, {"block_n", i()}, {"block_k", i()}, {"stages", i()}, {"warps", i()},
                     {"group_m", i()}, {"cluster", i()}, {"items", i()},   {"use_tma", b()}};
    j["arch_tag"] = t();
    j["warp_specialized"] = b();
    j["persistent"] = b();
    return j.get<TileConfig>();
  }

 private:
  const Statement& s_;
  int col_;
};

// The structured binding names every field, so it stops compiling when TileConfig gains one: the
// new field needs a column (a migration), a bind here and a read in Cursor::config.
void bind_config(Statement& s, const TileConfig& c) {
  const auto& [block_m, block_n, block_k, stages, warps, group_m, cluster, items, use_tma, warp_specialized,
               persistent, arch_tag] = c;
  s.bind(":block_m", block_m)
      .bind(":block_n", block_n)
      .bind(":block_k", block_k)
      .bind(":stages", stages)
      .bind(":warps", warps)
      .bind(":group_m", group_m)
      .bind(":cluster", cluster)
      .bind(":items", items)
      .bind(":use_tma", use_tma)
      .bind(":arch_tag", arch_tag_name(arch_tag))
      .bind(":warp_specialized", warp_specialized)
      .bind(":persistent", persistent);
}

// Binds the key columns that identify a family of rows (all but tpe_bucket).
void bind_family(Statement& s, const TuningKey& k) {
  s.bind(":device", k.device)
      .bind(":arch", k.arch)
      .bind(":role", role_name(k.role))
      .bind(":dtype", dtype_name(k.dtype))
      .bind(":h", k.hidden)
      .bind(":i", k.intermediate)
      .bind(":e", k.experts)
      .bind(":k", k.topk)
      .bind(":key_block_m", k.block_m)
      .bind(":key_use_tma", k.use_tma)
      .bind(":mode", k.mode);
}

// What a row is stored under: its key and the build that tuned it (same_build's fields).
struct RowId {
  std::string key_id;
  std::string template_hash;
  std::string nvrtc_version;

  static RowId of(const TuningKey& key, const Provenance& build) {
    return {key.id(), build.template_hash, build.nvrtc_version};
  }
  static RowId of(const TuningRow& row) { return of(row.key, row.provenance); }
  // The first kRowIdColumns columns of either SELECT.
  static RowId read(const Statement& s) { return {s.column_text(0), s.column_text(1), s.column_text(2)}; }

  void bind(Statement& s) const {
    s.bind(":key_id", key_id).bind(":template_hash", template_hash).bind(":nvrtc_version", nvrtc_version);
  }
  std::string label() const { return fmt::format("{} (templates {}, NVRTC {})", key_id, template_hash, nvrtc_version); }
  // kRowOrder's order: SQLite compares text bytewise, as std::string does.
  auto operator<=>(const RowId&) const = default;
};

// A winner row without its candidates. The key id is skipped: id() rebuilds it.
TuningRow read_winner(const Statement& s) {
  Cursor c(s, 1);
  TuningRow r;
  r.provenance.template_hash = c.t();
  r.provenance.nvrtc_version = c.t();
  r.key.device = c.t();
  r.key.arch = c.t();
  r.key.role = parse_role(c.t());
  r.key.dtype = parse_dtype(c.t());
  r.key.hidden = c.i();
  r.key.intermediate = c.i();
  r.key.experts = c.i();
  r.key.topk = c.i();
  r.key.block_m = c.i();
  r.key.use_tma = c.b();
  r.key.tpe_bucket = c.i();
  r.key.mode = c.t();
  r.winner = c.config();
  r.median_ms = c.d();
  r.spread_ms = c.d();
  r.provenance.driver_version = c.i();
  r.provenance.library_version = c.t();
  r.provenance.created_at = c.t();
  return r;
}

// A candidate row. Its row's identity is skipped: the caller matches it.
CandidateResult read_candidate(const Statement& s) {
  Cursor c(s, kRowIdColumns);
  CandidateResult r;
  r.config = c.config();
  r.median_ms = c.d();
  r.spread_ms = c.d();
  r.rejected = c.b();
  r.reason = c.t();
  return r;
}

// A candidate this build cannot read (a newer moejit's arch tag, a size out of range) is left
// out with a warning: candidates inform, the winner decides, and recording the key again
// replaces only candidates of the same config name, so a whole row skipped for one would stay
// unreadable.
template <typename Warn>
std::optional<CandidateResult> readable_candidate(const Statement& s, Warn warn) {
  try {
    CandidateResult c = read_candidate(s);
    validate_config(c.config);
    return c;
  } catch (const Error& e) {
    warn(e.what());
  } catch (const nlohmann::json::exception& e) {
    warn(e.what());
  }
  return std::nullopt;
}

std::vector<CandidateResult> read_candidates(const Connection& conn, const RowId& id) {
  Statement s = conn.prepare(std::string(kSelectCandidates) + kWhereRow + "ORDER BY config_name");
  id.bind(s);
  std::vector<CandidateResult> out;
  while (s.step()) {
    const auto warn = [&](const char* why) {
      log::warn("{}: a candidate of {} skipped: {}", conn.path(), id.label(), why);
    };
    if (auto c = readable_candidate(s, warn)) out.push_back(std::move(*c));
  }
  return out;
}

// A row read back (winner and readable candidates) and checked as record() checks what it writes,
// its key id matching its fields; nullopt, with a warning, for a row this build cannot read: a
// newer moejit's role, dtype or arch tag, or a hand-edited value out of range. One such row then
// costs its key alone (tuned again, or looked up elsewhere), not the whole database.
template <typename Read>
std::optional<TuningRow> readable(const std::string& path, const RowId& id, Read read) {
  try {
    TuningRow row = read();
    validate(row);
    if (row.key.id() != id.key_id) throw DatabaseError(fmt::format("its fields make the key {}", row.key.id()));
    return row;
  } catch (const Error& e) {
    log::warn("{}: row {} skipped: {}", path, id.label(), e.what());
  } catch (const nlohmann::json::exception& e) {
    log::warn("{}: row {} skipped: {}", path, id.label(), e.what());
  }
  return std::nullopt;
}

// The row that `s` has stepped onto, with its candidates.
std::optional<TuningRow> read_row(const Connection& conn, const Statement& s) {
  const RowId id = RowId::read(s);
  return readable(conn.path(), id, [&] {
    TuningRow r = read_winner(s);
    r.candidates = read_candidates(conn, id);
    return r;
  });
}

// Writes the row's winner and its candidates under its key and build; candidates of other config
// names, from earlier tunings of the same build, stay.
void upsert(const Connection& conn, const TuningRow& row) {
  const RowId id = RowId::of(row);
  Statement w = conn.prepare(kUpsertWinner);
  bind_family(w, row.key);
  bind_config(w, row.winner);
  id.bind(w);
  w.bind(":tpe_bucket", row.key.tpe_bucket)
      .bind(":median_ms", row.median_ms)
      .bind(":spread_ms", row.spread_ms)
      .bind(":driver_version", row.provenance.driver_version)
      .bind(":library_version", row.provenance.library_version)
      .bind(":created_at", row.provenance.created_at)
      .run();
  Statement s = conn.prepare(kUpsertCandidate);
  for (const CandidateResult& c : row.candidates) {
    s.reset();
    bind_config(s, c.config);
    id.bind(s);
    s.bind(":config_name", c.config.name())
        .bind(":median_ms", c.median_ms)
        .bind(":spread_ms", c.spread_ms)
        .bind(":rejected", c.rejected)
        .bind(":reason", c.reason)
        .run();
  }
}

// Inside a write transaction: the stored row of `row`'s key and build if `keep_existing` keeps it,
// else nullopt, `row` written.
std::optional<TuningRow> write_unless_kept(const Connection& conn, const TuningRow& row,
                                           const TuningDb::RowFilter& keep_existing) {
  if (keep_existing) {
    Statement s = conn.prepare(std::string(kSelectWinners) + kWhereRow);
    RowId::of(row).bind(s);
    if (s.step()) {
      std::optional<TuningRow> existing = read_row(conn, s);
      if (existing && keep_existing(*existing)) return existing;
    }
  }
  upsert(conn, row);
  return std::nullopt;
}

void check_not_newer(const std::string& path, long long version) {
  if (version > kSchemaVersion) {
    throw DatabaseError(fmt::format("{}: schema version {} was written by a newer moejit; this build reads up to "
                                    "version {}. Use a newer moejit or another database file ($MOEJIT_DB).",
                                    path, version, kSchemaVersion));
  }
  if (version < 0) throw DatabaseError(fmt::format("{}: invalid schema version {}", path, version));
}

// Version 0 with tables is another program's database (a mistyped $MOEJIT_DB): refused, and left
// as it is.
void refuse_foreign(const Connection& conn, long long version) {
  if (version == 0 && conn.query_int("SELECT count(*) FROM sqlite_master") > 0) {
    throw DatabaseError(
        fmt::format("{}: not a moejit tuning database (it holds another schema's tables)", conn.path()));
  }
}

// Brings the schema to kSchemaVersion. The version is re-read inside the write transaction
// because another process may have created or migrated the file meanwhile.
void initialise(const Connection& conn) {
  long long version = 0;
  {
    // Refused before anything of it changes, its journal mode included. A moejit schema and its
    // version are written in one transaction, so a file being created reads as empty or as ours,
    // provided the version and the tables are read in one snapshot: read apart, another process's
    // commit between them would show a version-0 file with tables (another program's, then).
    Transaction snapshot(conn, Transaction::Kind::kRead);
    version = conn.query_int("PRAGMA user_version");
    check_not_newer(conn.path(), version);
    refuse_foreign(conn, version);
    snapshot.commit();
  }
  conn.set_journal_mode();
  if (version == kSchemaVersion) return;
  Transaction t(conn, Transaction::Kind::kWrite);
  version = conn.query_int("PRAGMA user_version");
  check_not_newer(conn.path(), version);
  if (version == kSchemaVersion) return;
  refuse_foreign(conn, version);
  for (; version < kSchemaVersion; ++version) conn.exec(kMigrations[static_cast<std::size_t>(version)]);
  conn.exec(fmt::format("PRAGMA user_version = {}", kSchemaVersion));
  t.commit();
}

// Read-only opens (kReadOnly) of an older schema read a migrated copy in memory: inspecting a file
// (moejit db list, export, or merging it into another) never changes it. So do those of an empty
// file (version 0; one with another program's tables is refused there as here): another process
// may be creating it, and until its first commit it reads as a database without rows. Not a
// kReadWrite open this process cannot write: rows saved into a copy would vanish while every
// command said they were saved, so its migration's write transaction fails, saying why.
Connection open_connection(const std::filesystem::path& path, OpenMode mode) {
  Connection conn(path, mode);
  if (mode != OpenMode::kReadOnly) return conn;
  const long long version = conn.query_int("PRAGMA user_version");
  return version >= 0 && version < kSchemaVersion ? conn.memory_copy() : std::move(conn);
}

}  // namespace

TuningDb::TuningDb(const std::filesystem::path& path, OpenMode mode) : TuningDb(open_connection(path, mode)) {}

TuningDb TuningDb::in_memory() { return TuningDb(Connection::memory()); }

TuningDb::TuningDb(Connection conn) : conn_(std::move(conn)) { initialise(conn_); }

int TuningDb::schema_version() const { return static_cast<int>(conn_.query_int("PRAGMA user_version")); }

void TuningDb::record(const TuningRow& row) { record(row, {}); }

bool TuningDb::record(const TuningRow& row, const RowFilter& keep_existing) {
  validate(row);
  Transaction t(conn_, Transaction::Kind::kWrite);
  const bool written = !write_unless_kept(conn_, row, keep_existing);
  t.commit();
  return written;
}

TuningDb::Saved TuningDb::record_all(const std::vector<TuningRow>& rows, const KeepExisting& keep_existing) {
  Saved saved{rows, {}};
  std::vector<bool> valid(rows.size(), false);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    try {
      validate(rows[r]);
      valid[r] = true;
    } catch (const InvalidArgument& e) {
      saved.skipped.push_back(fmt::format("{}: {}", rows[r].key.id(), e.what()));
    }
  }
  Transaction t(conn_, Transaction::Kind::kWrite);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (!valid[r]) continue;
    RowFilter keep;
    if (keep_existing) keep = [&](const TuningRow& existing) { return keep_existing(rows[r], existing); };
    if (std::optional<TuningRow> kept = write_unless_kept(conn_, rows[r], keep)) saved.rows[r] = std::move(*kept);
  }
  t.commit();
  // The rows go into the main file now, as far as readers allow, not at a last close: a process's
  // lookup keeps its connection open for good (never destroyed, so exit cannot free it under a
  // thread still using it), and another user's reader opens the file immutable, reading the main
  // file alone. A no-op under the rollback journal; a failure leaves them in the -wal, still saved.
  try {
    conn_.exec("PRAGMA wal_checkpoint(PASSIVE)");
  } catch (const DatabaseError& e) {
    log::debug("{}: checkpoint after saving: {}", path(), e.what());
  }
  return saved;
}

std::optional<TuningRow> TuningDb::lookup(const TuningKey& key, const Provenance& build) const {
  Transaction t(conn_, Transaction::Kind::kRead);
  Statement s = conn_.prepare(std::string(kSelectWinners) + kWhereRow);
  RowId::of(key, build).bind(s);
  if (!s.step()) return std::nullopt;
  std::optional<TuningRow> row = read_row(conn_, s);
  t.commit();
  return row;
}

std::vector<TuningRow> TuningDb::rows() const {
  Transaction t(conn_, Transaction::Kind::kRead);
  // Winners, then one pass over the candidates in the same order instead of one query per row; a
  // row whose winner this build cannot read is left out (readable()), a candidate likewise.
  std::vector<RowId> ids;
  std::vector<std::optional<TuningRow>> read;
  Statement w = conn_.prepare(std::string(kSelectWinners) + kRowOrder);
  while (w.step()) {
    ids.push_back(RowId::read(w));
    read.push_back(readable(conn_.path(), ids.back(), [&] { return read_winner(w); }));
  }
  Statement c = conn_.prepare(std::string(kSelectCandidates) + kRowOrder + ", config_name");
  std::size_t at = 0;
  while (c.step()) {
    const RowId id = RowId::read(c);
    while (at < ids.size() && ids[at] < id) ++at;
    if (at == ids.size() || ids[at] != id || !read[at]) continue;
    const auto warn = [&](const char* why) {
      log::warn("{}: a candidate of {} skipped: {}", conn_.path(), id.label(), why);
    };
    if (auto candidate = readable_candidate(c, warn)) read[at]->candidates.push_back(std::move(*candidate));
  }
  t.commit();
  std::vector<TuningRow> out;
  for (std::size_t r = 0; r < read.size(); ++r) {
    if (!read[r]) continue;
    // Checked whole once its candidates are in (validate() covers them too).
    if (auto row = readable(conn_.path(), ids[r], [&] { return std::move(*read[r]); })) out.push_back(std::move(*row));
  }
  return out;
}

std::optional<TuningRow> TuningDb::nearest_bucket(const TuningKey& key, const Provenance& build,
                                                  const RowFilter& accept) const {
  Transaction t(conn_, Transaction::Kind::kRead);
  Statement s = conn_.prepare(std::string(kSelectWinners) +
                              "WHERE device = :device AND arch = :arch AND role = :role AND dtype = :dtype AND h = :h "
                              "AND i = :i AND e = :e AND k = :k AND key_block_m = :key_block_m AND key_use_tma = "
                              ":key_use_tma AND mode = :mode AND template_hash = :template_hash AND nvrtc_version = "
                              ":nvrtc_version");
  bind_family(s, key);
  s.bind(":template_hash", build.template_hash).bind(":nvrtc_version", build.nvrtc_version);
  std::optional<TuningRow> best;
  while (s.step()) {
    std::optional<TuningRow> read = read_row(conn_, s);
    if (!read) continue;
    TuningRow& row = *read;
    if (accept && !accept(row)) continue;
    if (!best || closer_bucket(row.key.tpe_bucket, best->key.tpe_bucket, key.tpe_bucket)) best = std::move(row);
  }
  t.commit();
  return best;
}

TuningDb::MergeStats TuningDb::merge(const TuningDb& other, const Standing& standing) {
  return merge_rows(other.rows(), standing);
}

TuningDb::MergeStats TuningDb::merge_rows(const std::vector<TuningRow>& rows, const Standing& standing) {
  for (const TuningRow& row : rows) validate(row);
  const auto rank = [&](const TuningRow& row) { return standing ? standing(row) : 0; };
  MergeStats stats;
  Transaction t(conn_, Transaction::Kind::kWrite);
  for (const TuningRow& row : rows) {
    Statement existing = conn_.prepare(std::string(kSelectWinners) + kWhereRow);
    RowId::of(row).bind(existing);
    const bool had = existing.step();
    const std::optional<TuningRow> old = had ? read_row(conn_, existing) : std::nullopt;
    if (!had) {
      ++stats.added;
    } else if (!old) {
      ++stats.replaced;  // a row this build cannot read (read_row said why): the readable one serves
    } else if (const int in = rank(row), stored = rank(*old);
               in != stored ? in > stored : row.median_ms < old->median_ms) {
      ++stats.replaced;
    } else {
      // A kept row keeps its candidates too: the losing row's were measured in another tuning,
      // and its marks (a first call's narrow space) would misdescribe this one.
      ++stats.kept;
      continue;
    }
    upsert(conn_, row);
  }
  t.commit();
  return stats;
}

int TuningDb::prune(const Provenance& keep) {
  Transaction t(conn_, Transaction::Kind::kWrite);
  const std::string other_builds = " WHERE template_hash != :template_hash OR nvrtc_version != :nvrtc_version";
  Statement winners = conn_.prepare("DELETE FROM winners" + other_builds);
  Statement candidates = conn_.prepare("DELETE FROM candidates" + other_builds);
  for (Statement* s : {&winners, &candidates}) {
    s->bind(":template_hash", keep.template_hash).bind(":nvrtc_version", keep.nvrtc_version);
  }
  winners.run();
  const int removed = conn_.changes();
  candidates.run();
  t.commit();
  return removed;
}

std::string TuningDb::export_json() const {
  const nlohmann::json all = rows();
  // ordered_json at the top only, so the version comes first; each row keeps json's sorted keys.
  nlohmann::ordered_json doc;
  doc["schema_version"] = kSchemaVersion;
  doc["rows"] = nlohmann::ordered_json(all);
  return doc.dump(2) + "\n";
}

TuningDb::ExportRows TuningDb::parse_export(const std::string& text, BadRows bad_rows, const std::string& source) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DatabaseError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!doc.is_object()) throw DatabaseError(fmt::format("{}: expected a JSON object", source));
  if (!doc.contains("schema_version") || !doc["schema_version"].is_number_integer()) {
    throw DatabaseError(fmt::format("{}: \"schema_version\" (an integer) is missing", source));
  }
  const long long version = doc["schema_version"].get<long long>();
  if (version < 1 || version > kSchemaVersion) {
    throw DatabaseError(fmt::format("{}: schema_version {} is not one this build reads (1 to {})", source,
                                    version, kSchemaVersion));
  }
  if (!doc.contains("rows") || !doc["rows"].is_array()) {
    throw DatabaseError(fmt::format("{}: \"rows\" (an array) is missing", source));
  }
  ExportRows out;
  const nlohmann::json& items = doc["rows"];
  for (std::size_t n = 0; n < items.size(); ++n) {
    const auto bad = [&](const char* why) {
      // The id, where the row has one, finds it in the file without counting.
      const nlohmann::json* id = items[n].is_object() && items[n].contains("id") ? &items[n]["id"] : nullptr;
      const std::string row = id && id->is_string() ? fmt::format("rows[{}] ({})", n, id->get<std::string>())
                                                    : fmt::format("rows[{}]", n);
      if (bad_rows == BadRows::kRefuse) throw DatabaseError(fmt::format("{}: {}: {}", source, row, why));
      out.skipped.push_back(fmt::format("{}: {}", row, why));
    };
    try {
      out.rows.push_back(items[n].get<TuningRow>());
    } catch (const nlohmann::json::exception& e) {
      bad(e.what());
    } catch (const InvalidArgument& e) {
      bad(e.what());
    }
  }
  return out;
}

TuningDb::MergeStats TuningDb::import_json(const std::string& text, BadRows bad_rows) {
  ExportRows parsed = parse_export(text, bad_rows, "import into " + path());
  MergeStats stats = merge_rows(parsed.rows);
  stats.skipped = std::move(parsed.skipped);
  return stats;
}

}  // namespace moejit::db
