// moejit db: inspect tuning databases and move rows between them (JSON exports, other files).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "core/fs.hpp"
#include "db/tuning_db.hpp"
#include "moejit/error.hpp"
#include "tuner/prune.hpp"

namespace moejit::cli {
namespace {

// The subcommand's positional arguments, which must number exactly `count`.
void expect_positionals(const Args& a, const char* sub, std::size_t count, const char* what) {
  if (a.positional.size() < count) throw InvalidArgument(fmt::format("db {}", sub), fmt::format("needs {}", what));
  if (a.positional.size() > count) {
    throw InvalidArgument(fmt::format("db {}", sub), fmt::format("unexpected argument '{}'", a.positional[count]));
  }
}

// Opens an existing database read-only, so inspecting a file never creates or changes it.
db::TuningDb open_existing(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw IoError(fmt::format("no tuning database at {}", path.string()));
  require_regular_file_if_any(path, "tuning database");
  return db::TuningDb(path, db::OpenMode::kReadOnly);
}

// The database a command writes into (database_path's, so a regular file where one exists),
// checked first: rows merged into a damaged file could be lost with it, or make it worse.
db::TuningDb open_target(const std::filesystem::path& path) {
  db::TuningDb target(path);
  try {
    target.check_intact();
  } catch (const db::CorruptDatabase& e) {
    throw db::CorruptDatabase(fmt::format("{}; nothing was written. Move it aside (keep it: sqlite3's .recover may "
                                          "save rows from it) and write into a new file",
                                          e.what()));
  }
  return target;
}

void print_stats(const std::string& what, const db::TuningDb::MergeStats& s) {
  fmt::print("{}: added {}, replaced {}, kept {}\n", what, s.added, s.replaced, s.kept);
}

int list(const Args& a) {
  expect_positionals(a, "list", 0, "no arguments");
  const std::filesystem::path path = database_path(a);
  // The default database (MOEJIT_DB's, or the user's) is made by the first tuning: before it, it
  // is empty. A path given with --db names a file that must exist, so a typo is not "empty".
  if (!a.has("db") && !std::filesystem::exists(path)) {
    fmt::print("database: {}\n(empty)\n", path.string());
    return 0;
  }
  std::vector<db::TuningRow> rows = open_existing(path).rows();
  fmt::print("database: {}\n", path.string());
  if (a.has("stale")) {
    // Stale: tuned with other templates or another NVRTC; this build's lookups pass them over.
    const db::Provenance current = db::current_provenance(0);
    std::erase_if(rows, [&](const db::TuningRow& r) { return !db::is_stale(r, current); });
    fmt::print("stale rows (this build: templates {}, NVRTC {}):\n", current.template_hash, current.nvrtc_version);
  }
  if (rows.empty()) {
    fmt::print("(empty)\n");
    return 0;
  }
  // A key appears once per build that tuned it: BUILD tells them apart.
  const auto build = [](const db::TuningRow& r) {
    return fmt::format("{}/{}", r.provenance.template_hash, r.provenance.nvrtc_version);
  };
  std::size_t key_w = 3, winner_w = 6, build_w = 5;
  for (const db::TuningRow& r : rows) {
    key_w = std::max(key_w, r.key.id().size());
    winner_w = std::max(winner_w, r.winner.name().size());
    build_w = std::max(build_w, build(r).size());
  }
  fmt::print("{:<{}}  {:<{}}  {:>10}  {:>10}  {:<{}}  {}\n", "KEY", key_w, "WINNER", winner_w, "MEDIAN_MS",
             "CANDIDATES", "BUILD", build_w, "CREATED_AT");
  for (const db::TuningRow& r : rows) {
    fmt::print("{:<{}}  {:<{}}  {:>10.4f}  {:>10}  {:<{}}  {}\n", r.key.id(), key_w, r.winner.name(), winner_w,
               r.median_ms, r.candidates.size(), build(r), build_w, r.provenance.created_at);
  }
  fmt::print("{} row{}\n", rows.size(), rows.size() == 1 ? "" : "s");
  return 0;
}

// Whether `a` and `b` name one file: the same file where both exist, else the same path once
// symbolic links are resolved (a database's -wal comes and goes).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  const std::filesystem::path canonical_a = std::filesystem::weakly_canonical(a, ec);
  if (ec) return false;
  const std::filesystem::path canonical_b = std::filesystem::weakly_canonical(b, ec);
  return !ec && canonical_a == canonical_b;
}

int export_rows(const Args& a) {
  expect_positionals(a, "export", 0, "no arguments");
  if (!a.has("out") || a.get("out").empty()) throw InvalidArgument("--out", "db export needs --out FILE (or '-')");
  const std::filesystem::path path = database_path(a);
  const std::string out = a.get("out");
  // The JSON would replace the database, or a sidecar: its latest commits (-wal), the undo of an
  // interrupted write (-journal), the WAL's index that its open connections share (-shm).
  for (const std::string suffix : {"", "-wal", "-journal", "-shm"}) {
    if (out != "-" && same_file(out, path.string() + suffix)) {
      throw InvalidArgument("--out", fmt::format("{} is the database{}; export to another file", out,
                                                 suffix.empty() ? " itself" : "'s " + suffix + " file"));
    }
  }
  const std::string text = open_existing(path).export_json();
  if (out == "-") {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
      throw IoError("cannot write the export to stdout");
    }
    return 0;
  }
  fs::atomic_write(out, text);
  fmt::print("exported {} to {}\n", path.string(), out);
  return 0;
}

// Import and merge rank a row tuned whole over one a first call or a budget cut short, before
// times: such a row may have been timed at a smaller T of the key, and would win on that alone.
// The space is asked at a T of the key's bucket (tuned_partly leaves out marks on configs the
// space no longer holds; a row tuned whole since keeps them).
int whole_first(const db::TuningRow& row) {
  const db::TuningKey& k = row.key;
  const long long tokens = std::max<long long>(1, static_cast<long long>(k.tpe_bucket) * k.experts / k.topk);
  return tuned_partly(row, MoeShape{tokens, k.experts, k.hidden, k.intermediate, k.topk, k.dtype}) ? 0 : 1;
}

// Import and merge read their source whole before opening the target, which creates a --db that
// does not exist yet: a source that fails to read leaves no new file behind.
int import_rows(const Args& a) {
  expect_positionals(a, "import", 1, "the JSON file to import");
  const std::filesystem::path path = database_path(a);
  const std::string file = a.positional[0];
  std::string why;
  const std::optional<std::string> text = fs::read_all(file, std::nullopt, &why);
  if (!text) throw IoError(fmt::format("cannot read {}: {}", file, why));
  const db::TuningDb::ExportRows rows =
      db::TuningDb::parse_export(*text, db::TuningDb::BadRows::kRefuse, fmt::format("import of {}", file));
  db::TuningDb target = open_target(path);
  print_stats(fmt::format("imported {} into {}", file, target.path()), target.merge_rows(rows.rows, whole_first));
  return 0;
}

int merge(const Args& a) {
  expect_positionals(a, "merge", 1, "the database file to merge in");
  const std::filesystem::path path = database_path(a);
  const db::TuningDb other = open_existing(a.positional[0]);
  const std::vector<db::TuningRow> rows = other.rows();
  db::TuningDb target = open_target(path);
  print_stats(fmt::format("merged {} into {}", other.path(), target.path()), target.merge_rows(rows, whole_first));
  return 0;
}

// Rows of other builds are kept (another installed moejit may still run them) until pruned.
int prune(const Args& a) {
  expect_positionals(a, "prune", 0, "no arguments");
  const std::filesystem::path path = database_path(a);
  if (!std::filesystem::exists(path)) throw IoError(fmt::format("no tuning database at {}", path.string()));
  const db::Provenance current = db::current_provenance(0);
  db::TuningDb target = open_target(path);
  const int removed = target.prune(current);
  fmt::print("pruned {}: removed {} row{} of other builds than this one (templates {}, NVRTC {})\n", target.path(),
             removed, removed == 1 ? "" : "s", current.template_hash, current.nvrtc_version);
  return 0;
}

}  // namespace

int run_db(int argc, char** argv, int start) {
  const std::string sub = start < argc ? argv[start] : "";
  const std::set<std::string> flags;
  if (sub == "list") return list(parse_args(argc, argv, start + 1, {"stale"}, {"db"}, true));
  if (sub == "export") return export_rows(parse_args(argc, argv, start + 1, flags, {"db", "out"}, true));
  if (sub == "import") return import_rows(parse_args(argc, argv, start + 1, flags, {"db"}, true));
  if (sub == "merge") return merge(parse_args(argc, argv, start + 1, flags, {"db"}, true));
  if (sub == "prune") return prune(parse_args(argc, argv, start + 1, flags, {"db"}, true));
  return help_or_unknown_subcommand("db", sub);
}

}  // namespace moejit::cli
