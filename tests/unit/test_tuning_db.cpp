// The tuning database: keys, SQLite storage, JSON export/import, merging, the lookup chain,
// and several processes writing one file at once. No GPU needed.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fs.hpp"
#include "db/sqlite.hpp"
#include "db/tuning_db.hpp"
#include "db/tuning_lookup.hpp"
#include "jit/template_hash.hpp"
#include "moejit/error.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/users.hpp"

using namespace moejit;
using namespace moejit::db;
using moejit::test::TempDir;

namespace {

// Forks `n` children and releases them together through a pipe, so their opens race; each runs
// child(c) as its exit code (1 where it throws, the message on stderr). Returns their exit codes,
// -1 for one that did not exit. A failed fork releases and reaps those made before it.
std::vector<int> run_together(int n, const std::function<int(int)>& child) {
  int go[2];
  REQUIRE(::pipe(go) == 0);
  std::vector<pid_t> children;
  bool forked = true;
  for (int c = 0; c < n && forked; ++c) {
    const pid_t pid = ::fork();
    forked = pid >= 0;
    if (pid == 0) {
      ::close(go[1]);
      char byte;
      while (::read(go[0], &byte, 1) < 0) {}  // returns 0 once the parent closes its end
      int code = 1;
      try {
        code = child(c);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", c, e.what());
      } catch (...) {
      }
      ::_exit(code);
    }
    if (forked) children.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  std::vector<int> codes;
  for (pid_t pid : children) {
    int status = 0;
    codes.push_back(::waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  REQUIRE(forked);
  return codes;
}

const Provenance kFresh{"13.0", 13000, "templates-now", "0.1.0", "2025-06-01T12:00:00Z"};

TuningKey key_at(int tpe, int hidden = 2048) {
  TuningKey k;
  k.device = "NVIDIA H200";
  k.arch = "sm_90a";
  k.role = Role::kFwdUp;
  k.dtype = DType::kBF16;
  k.hidden = hidden;
  k.intermediate = 768;
  k.experts = 128;
  k.topk = 8;
  k.block_m = 64;
  k.use_tma = false;
  k.tpe_bucket = tpe;
  k.mode = "train";
  return k;
}

TileConfig config(int block_n, int stages = 4) {
  TileConfig c;
  c.block_m = 64;
  c.block_n = block_n;
  c.block_k = 64;
  c.stages = stages;
  c.warps = 8;
  c.group_m = 8;
  c.arch_tag = ArchTag::kHopper;
  c.use_tma = true;
  return c;
}

// What a lookup falls back to: a config no row holds.
TileConfig heuristic_config() {
  TileConfig c;
  c.block_m = 1;
  c.block_n = 1;
  return c;
}

CandidateResult timed(const TileConfig& c, double ms) { return CandidateResult{c, ms, ms / 50, false, ""}; }

CandidateResult rejected(const TileConfig& c, const std::string& why) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return CandidateResult{c, nan, nan, true, why};
}

TuningRow row_for(const TuningKey& key, int winner_n, double ms, Provenance prov = kFresh) {
  TuningRow r;
  r.key = key;
  r.winner = config(winner_n);
  r.median_ms = ms;
  r.spread_ms = ms / 100;
  r.candidates = {timed(config(winner_n), ms), timed(config(winner_n * 2), ms * 1.5)};
  r.provenance = std::move(prov);
  return r;
}

std::string as_json(const TuningRow& r) { return nlohmann::json(r).dump(); }

// Rebuilds a database of the current schema as version 3 had it: one row per key (its build in
// plain columns), candidates by key and config name. The migration reads columns only, so the
// tables need not carry version 3's constraints.
const std::string kToVersion3 = R"sql(
CREATE TABLE w3 AS SELECT key_id, device, arch, role, dtype, h, i, e, k, key_block_m, key_use_tma, tpe_bucket, mode,
  block_m, block_n, block_k, stages, warps, group_m, cluster, items, use_tma, arch_tag, median_ms, spread_ms,
  nvrtc_version, driver_version, template_hash, library_version, created_at, warp_specialized, persistent
  FROM winners;
CREATE TABLE c3 AS SELECT key_id, config_name, block_m, block_n, block_k, stages, warps, group_m, cluster, items,
  use_tma, arch_tag, median_ms, spread_ms, rejected, reason, warp_specialized, persistent FROM candidates;
DROP TABLE candidates;
DROP TABLE winners;
ALTER TABLE w3 RENAME TO winners;
ALTER TABLE c3 RENAME TO candidates;
PRAGMA user_version = 3;
)sql";

std::vector<std::string> candidate_names(const TuningRow& r) {
  std::vector<std::string> names;
  for (const CandidateResult& c : r.candidates) names.push_back(c.config.name());
  return names;
}

// Candidates come back from the database ordered by config name.
TuningRow sorted(TuningRow r) {
  std::sort(r.candidates.begin(), r.candidates.end(),
            [](const CandidateResult& a, const CandidateResult& b) { return a.config.name() < b.config.name(); });
  return r;
}

}  // namespace

TEST_CASE("tuning key ids are canonical and keys are validated", "[db]") {
  CHECK(key_at(64).id() == "NVIDIA H200|sm_90a|fwd_up|bf16|H2048|I768|E128|K8|bm64|tma0|tpe64|train");
  TuningKey k = key_at(4096);
  k.role = Role::kBwdDw1;
  k.dtype = DType::kFP16;
  k.use_tma = true;
  k.mode = "memeff";
  CHECK(k.id() == "NVIDIA H200|sm_90a|bwd_dw1|fp16|H2048|I768|E128|K8|bm64|tma1|tpe4096|memeff");
  CHECK(nlohmann::json(k).get<TuningKey>() == k);

  CHECK_NOTHROW(key_at(16).validate());
  TuningKey bad = key_at(64);
  bad.device = "A|B";
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = key_at(48);
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = key_at(8192);
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = key_at(64);
  bad.mode = "training";
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
  bad = key_at(64);
  bad.experts = 0;
  CHECK_THROWS_AS(bad.validate(), InvalidArgument);
}

TEST_CASE("tpe_bucket rounds TK/E up to a power of two within [16, 4096]", "[db]") {
  // Exact powers of two stay: 8192 pairs over 128 experts is 64 per expert.
  CHECK(tpe_bucket(8192, 128) == 64);
  CHECK(tpe_bucket(65536, 128) == 512);
  // Non-powers round up: ceil(8193/128) = 65 -> 128; ceil(3000/7) = 429 -> 512; 96/1 -> 128.
  CHECK(tpe_bucket(8193, 128) == 128);
  CHECK(tpe_bucket(3000, 7) == 512);
  CHECK(tpe_bucket(96, 1) == 128);
  CHECK(tpe_bucket(2049, 128) == 32);  // ceil(16.008) = 17 -> 32
  // Low clamp: 0, 1 and ceil(1000/128) = 8 all land in 16.
  CHECK(tpe_bucket(0, 128) == 16);
  CHECK(tpe_bucket(1, 128) == 16);
  CHECK(tpe_bucket(1000, 128) == 16);
  CHECK(tpe_bucket(-5, 8) == 16);
  CHECK(tpe_bucket(17, 1) == 32);
  // High clamp: 4096 exactly, 4097 and 2^40/8 = 2^37 all land in 4096.
  CHECK(tpe_bucket(4096LL * 128, 128) == 4096);
  CHECK(tpe_bucket(4096LL * 128 + 1, 128) == 4096);
  CHECK(tpe_bucket(1LL << 40, 8) == 4096);
  CHECK_THROWS_AS(tpe_bucket(100, 0), InvalidArgument);
}

TEST_CASE("closer_bucket prefers the nearer bucket in log2 distance, ties to the larger", "[db]") {
  // The bucket nearest_bucket's loop ends on, given the stored buckets in this order.
  const auto nearest = [](std::vector<int> stored, int wanted) {
    int best = stored.front();
    for (int b : stored) {
      if (closer_bucket(b, best, wanted)) best = b;
    }
    return best;
  };
  // Exact match wins over any other, whatever the order.
  CHECK(closer_bucket(64, 128, 64));
  CHECK_FALSE(closer_bucket(128, 64, 64));
  CHECK(nearest({16, 64, 1024}, 64) == 64);
  CHECK(nearest({1024, 64, 16}, 64) == 64);
  // Ties (one doubling either way; two) go to the larger bucket in either order.
  CHECK(closer_bucket(64, 16, 32));
  CHECK_FALSE(closer_bucket(16, 64, 32));
  CHECK(nearest({16, 64}, 32) == 64);
  CHECK(nearest({64, 16}, 32) == 64);
  CHECK(nearest({64, 1024}, 256) == 1024);
  // The same bucket is no closer than itself: the first row read stays.
  CHECK_FALSE(closer_bucket(64, 64, 32));
  // Below the smallest stored bucket, or above the largest: the nearest end.
  CHECK(nearest({64, 256, 1024}, 16) == 64);
  CHECK(nearest({1024, 256, 64}, 16) == 64);
  CHECK(nearest({64, 256, 1024}, 4096) == 1024);
  CHECK(nearest({1024, 256, 64}, 4096) == 1024);
  // Log2 distance, not linear: 16 is nearer 32 than 128 is (one doubling against two).
  CHECK(nearest({128, 16}, 32) == 16);
}

TEST_CASE("record then lookup returns the row exactly, across reopening", "[db]") {
  TempDir dir("db");
  const auto path = dir / "nested" / "dir" / "tuning.sqlite";  // parent directories are created
  TuningRow row = row_for(key_at(64), 128, 0.25);
  row.candidates.push_back(rejected(config(256, 7), "shared memory 262144 B over the 232448 B limit"));
  row.candidates.push_back(CandidateResult{config(32), 0.9, 0.01, true, "wrong result: max error 0.5"});
  {
    TuningDb db(path);
    db.record(row);
    auto got = db.lookup(key_at(64), kFresh);
    REQUIRE(got);
    CHECK(as_json(*got) == as_json(sorted(row)));
    CHECK_FALSE(db.lookup(key_at(128), kFresh));
  }
  TuningDb reopened(path);
  auto got = reopened.lookup(key_at(64), kFresh);
  REQUIRE(got);
  CHECK(got->winner == config(128));
  CHECK(as_json(*got) == as_json(sorted(row)));
  const auto nan_count = std::count_if(got->candidates.begin(), got->candidates.end(),
                                       [](const CandidateResult& c) { return std::isnan(c.median_ms); });
  CHECK(nan_count == 1);
  CHECK_THROWS_AS(reopened.record(row_for(key_at(64), 128, std::numeric_limits<double>::infinity())), InvalidArgument);
  // Warp specialization outside the Hopper tag would share a config name with another config.
  TuningRow portable_ws = row_for(key_at(64), 128, 0.1);
  TileConfig c = config(256);
  c.arch_tag = ArchTag::kPortable;
  c.warp_specialized = true;
  portable_ws.candidates.push_back(timed(c, 0.2));
  CHECK_THROWS_WITH(reopened.record(portable_ws), Catch::StartsWith("warp_specialized"));
  portable_ws.candidates.pop_back();
  portable_ws.winner = c;
  CHECK_THROWS_WITH(reopened.record(portable_ws), Catch::StartsWith("warp_specialized"));
  CHECK(reopened.lookup(key_at(64), kFresh)->winner == config(128));
}

TEST_CASE("recording a key again upserts candidates and never wipes earlier ones", "[db]") {
  TempDir dir("db");
  TuningDb db(dir / "tuning.sqlite");
  TuningRow first = row_for(key_at(64), 128, 0.30);  // candidates n128, n256
  db.record(first);

  TuningRow second;
  second.key = key_at(64);
  second.winner = config(64);
  second.median_ms = 0.20;
  second.spread_ms = 0.01;
  second.candidates = {timed(config(64), 0.20), timed(config(256), 0.41)};  // a new config and a re-measured one
  second.provenance = kFresh;
  db.record(second);

  auto got = db.lookup(key_at(64), kFresh);
  REQUIRE(got);
  CHECK(got->winner == config(64));
  CHECK(got->median_ms == 0.20);
  const auto names = candidate_names(*got);
  CHECK(names.size() == 3);
  CHECK(std::set<std::string>(names.begin(), names.end()) ==
        std::set<std::string>{config(64).name(), config(128).name(), config(256).name()});
  for (const CandidateResult& c : got->candidates) {
    if (c.config == config(256)) CHECK(c.median_ms == 0.41);
    if (c.config == config(128)) CHECK(c.median_ms == 0.30);
  }
}

TEST_CASE("the schema version is recorded and a newer schema is refused", "[db]") {
  TempDir dir("db");
  const auto path = dir / "tuning.sqlite";
  CHECK(TuningDb(path).schema_version() == kSchemaVersion);
  CHECK(Connection(path, OpenMode::kReadOnly).query_int("PRAGMA user_version") == kSchemaVersion);

  Connection(path, OpenMode::kReadWrite).exec("PRAGMA user_version = 7");
  CHECK_THROWS_AS(TuningDb(path), DatabaseError);
  CHECK_THROWS_WITH(TuningDb(path, OpenMode::kReadOnly), Catch::Contains("newer moejit"));

  // Read-only never writes a schema: a file without one (another process creating it) reads as
  // a database without rows, and stays as it was.
  const auto fresh = dir / "fresh.sqlite";
  std::ofstream(fresh).close();
  CHECK(TuningDb(fresh, OpenMode::kReadOnly).rows().empty());
  CHECK(std::filesystem::file_size(fresh) == 0);
  // One with another program's tables is not a tuning database.
  const auto empty = dir / "empty.sqlite";
  Connection(empty, OpenMode::kReadWrite).exec("CREATE TABLE other (x INTEGER)");
  CHECK_THROWS_WITH(TuningDb(empty, OpenMode::kReadOnly), Catch::Contains("not a moejit tuning database"));
  // Nor does read-write take over another program's tables: the file is left as it was, its
  // journal mode included.
  CHECK_THROWS_WITH(TuningDb(empty), Catch::Contains("not a moejit tuning database"));
  CHECK(Connection(empty, OpenMode::kReadOnly).query_int("PRAGMA user_version") == 0);
  CHECK(Connection(empty, OpenMode::kReadOnly).query_int("SELECT count(*) FROM sqlite_master") == 1);
  CHECK(Connection(empty, OpenMode::kReadOnly).query_text("PRAGMA journal_mode") == "delete");
  // Our own file is switched to WAL.
  CHECK(Connection(path, OpenMode::kReadOnly).query_text("PRAGMA journal_mode") == "wal");
  // Its -wal is cut back to 4 MiB at a checkpoint, not kept at its largest.
  const Connection ours(path, OpenMode::kReadWrite);
  ours.set_journal_mode();
  CHECK(ours.query_int("PRAGMA journal_size_limit") == 4194304);

  // A file that is not SQLite at all names the file.
  const auto junk = dir / "junk.sqlite";
  fs::atomic_write(junk, std::string(4096, 'x'));
  CHECK_THROWS_WITH(TuningDb(junk), Catch::Contains(junk.string()));
}

TEST_CASE("warp-specialized and persistent configs survive the database, and old files migrate", "[db]") {
  TempDir dir("db");
  const auto path = dir / "tuning.sqlite";
  TuningRow r = row_for(key_at(64), 128, 0.30);
  r.winner.warp_specialized = true;
  r.winner.persistent = true;
  TileConfig one_tile = r.winner;
  one_tile.persistent = false;
  TileConfig multistage = one_tile;
  multistage.warp_specialized = false;
  // Same tile three ways: the twins differ only in the flags, so only the flags tell them apart.
  r.candidates = {timed(r.winner, 0.30), timed(one_tile, 0.31), timed(multistage, 0.33)};
  const auto flags = [](const TuningRow& row) {
    std::vector<std::pair<bool, bool>> out;
    for (const auto& c : row.candidates) out.emplace_back(c.config.warp_specialized, c.config.persistent);
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::pair<bool, bool>> expected{{false, false}, {true, false}, {true, true}};
  {
    TuningDb db(path);
    db.record(r);
    const auto got = db.lookup(key_at(64), kFresh);
    REQUIRE(got);
    CHECK(got->winner == r.winner);
    CHECK(flags(*got) == expected);
    CHECK(flags(db.rows().at(0)) == expected);
    TuningDb copy = TuningDb::in_memory();
    copy.import_json(db.export_json());
    CHECK(copy.lookup(key_at(64), kFresh)->winner == r.winner);
    CHECK(flags(*copy.lookup(key_at(64), kFresh)) == expected);
  }
  // Files of older schemas migrate on open; the flags they lack read as false.
  const auto downgrade_and_reopen = [&](const std::string& downgrade) {
    Connection(path, OpenMode::kReadWrite).exec(downgrade);
    const long long old_version = Connection(path, OpenMode::kReadOnly).query_int("PRAGMA user_version");
    {
      // Read-only (moejit db list, export, merge's source): read through a migrated copy, the
      // file untouched.
      const TuningDb inspected(path, OpenMode::kReadOnly);
      REQUIRE(inspected.lookup(key_at(64), kFresh));
      CHECK(inspected.lookup(key_at(64), kFresh)->winner.block_n == 128);
      CHECK(inspected.rows().size() == 1);
      CHECK(Connection(path, OpenMode::kReadOnly).query_int("PRAGMA user_version") == old_version);
    }
    TuningDb migrated(path);
    CHECK(migrated.schema_version() == kSchemaVersion);
    const auto old = migrated.lookup(key_at(64), kFresh);
    REQUIRE(old);
    CHECK(old->winner.block_n == 128);
    CHECK(static_cast<long long>(old->candidates.size()) ==
          Connection(path, OpenMode::kReadOnly).query_int("SELECT count(*) FROM candidates"));
    CHECK(old->candidates.size() >= 2);
    return old->winner;
  };
  // Version 3 keeps one row per key, whatever its build: its rows and candidates take their
  // winner's build.
  CHECK(downgrade_and_reopen(kToVersion3) == r.winner);
  // Version 2 has no persistent columns: its rows read as one tile per block.
  const TileConfig v2 = downgrade_and_reopen(kToVersion3 +
                                             "DELETE FROM candidates WHERE persistent = 1; ALTER TABLE winners DROP "
                                             "COLUMN persistent; ALTER TABLE candidates DROP COLUMN persistent; "
                                             "PRAGMA user_version = 2");
  CHECK(v2.warp_specialized);
  CHECK_FALSE(v2.persistent);
  // Version 1 has no warp_specialized columns either: its rows read as multistage.
  const TileConfig v1 = downgrade_and_reopen(kToVersion3 +
                                             "ALTER TABLE winners DROP COLUMN persistent; ALTER TABLE candidates DROP "
                                             "COLUMN persistent; ALTER TABLE winners DROP COLUMN warp_specialized; "
                                             "ALTER TABLE candidates DROP COLUMN warp_specialized; PRAGMA "
                                             "user_version = 1");
  CHECK_FALSE(v1.warp_specialized);
  CHECK_FALSE(v1.persistent);
}

TEST_CASE("a version 3 file migrates with every row and candidate under its build, then takes other builds' rows",
          "[db]") {
  TempDir dir("db");
  const auto path = dir / "tuning.sqlite";
  Provenance before = kFresh;
  before.template_hash = "templates-before";
  {
    TuningDb db(path);
    db.record(row_for(key_at(64), 128, 0.30, before));
    db.record(row_for(key_at(128), 64, 0.20));
  }
  Connection(path, OpenMode::kReadWrite).exec(kToVersion3);
  REQUIRE(Connection(path, OpenMode::kReadOnly).query_int("SELECT count(*) FROM candidates") == 4);
  TuningDb db(path);
  CHECK(db.schema_version() == kSchemaVersion);
  CHECK(db.lookup(key_at(64), before)->candidates.size() == 2);
  CHECK(db.lookup(key_at(128), kFresh)->candidates.size() == 2);
  CHECK_FALSE(db.lookup(key_at(64), kFresh));
  db.record(row_for(key_at(64), 256, 0.25));
  CHECK(db.lookup(key_at(64), before)->winner == config(128));
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(256));
  CHECK(db.rows().size() == 3);
}

TEST_CASE("export then import into a fresh database reproduces the rows exactly", "[db]") {
  TempDir dir("db");
  TuningDb source(dir / "a.sqlite");
  TuningRow with_rejects = row_for(key_at(16), 64, 0.011);
  with_rejects.candidates.push_back(rejected(config(512), "tile wider than the padded problem"));
  source.record(with_rejects);
  source.record(row_for(key_at(1024), 256, 1.25));
  TuningKey infer = key_at(64, 4096);
  infer.mode = "infer";
  infer.use_tma = true;
  source.record(row_for(infer, 128, 0.5));

  const std::string text = source.export_json();
  CHECK(text.rfind(fmt::format("{{\n  \"schema_version\": {},\n  \"rows\": [", kSchemaVersion), 0) == 0);
  CHECK(text.back() == '\n');
  const auto doc = nlohmann::json::parse(text);
  REQUIRE(doc["rows"].size() == 3);
  CHECK(doc["rows"][0]["id"].get<std::string>() < doc["rows"][1]["id"].get<std::string>());
  CHECK(doc["rows"][1]["id"].get<std::string>() < doc["rows"][2]["id"].get<std::string>());

  TuningDb copy(dir / "b.sqlite");
  auto stats = copy.import_json(text);
  CHECK(stats.added == 3);
  CHECK(stats.replaced == 0);
  CHECK(copy.export_json() == text);
  for (const TuningRow& r : source.rows()) CHECK(as_json(*copy.lookup(r.key, kFresh)) == as_json(r));

  stats = copy.import_json(text);  // importing again changes nothing
  CHECK(stats.added == 0);
  CHECK(stats.kept == 3);
  CHECK(copy.export_json() == text);
}

TEST_CASE("merge keeps the faster row per key; a written row brings its candidates, a kept one keeps its own", "[db]") {
  TempDir dir("db");
  TuningDb mine(dir / "mine.sqlite");
  TuningDb theirs(dir / "theirs.sqlite");
  mine.record(row_for(key_at(16), 64, 0.50));
  mine.record(row_for(key_at(32), 64, 0.30));
  theirs.record(row_for(key_at(16), 128, 0.40));  // faster: replaces
  TuningRow slower = row_for(key_at(32), 32, 0.60);
  slower.candidates.push_back(timed(config(512), 0.9));
  theirs.record(slower);                          // slower: kept, with its own candidates alone
  theirs.record(row_for(key_at(64), 64, 0.70));  // new: added
  TuningRow tie = row_for(key_at(128), 64, 0.25);
  mine.record(tie);
  tie.winner = config(16);
  theirs.record(tie);  // equal time: the existing winner stays

  const auto stats = mine.merge(theirs);
  CHECK(stats.added == 1);
  CHECK(stats.replaced == 1);
  CHECK(stats.kept == 2);
  CHECK(mine.lookup(key_at(16), kFresh)->winner == config(128));
  CHECK(mine.lookup(key_at(16), kFresh)->median_ms == 0.40);
  const auto kept = *mine.lookup(key_at(32), kFresh);
  CHECK(kept.winner == config(64));
  CHECK(kept.median_ms == 0.30);
  CHECK(candidate_names(kept) == std::vector<std::string>{config(128).name(), config(64).name()});
  for (const CandidateResult& c : kept.candidates) CHECK(c.median_ms == (c.config == config(64) ? 0.30 : 0.30 * 1.5));
  // The replaced row unites both: n64, n128 (mine) + n128, n256 (theirs, re-measuring n128).
  const auto replaced = *mine.lookup(key_at(16), kFresh);
  CHECK(replaced.candidates.size() == 3);
  for (const CandidateResult& c : replaced.candidates) {
    if (c.config == config(128)) CHECK(c.median_ms == 0.40);
  }
  CHECK(mine.lookup(key_at(64), kFresh));
  CHECK(mine.lookup(key_at(128), kFresh)->winner == config(64));
  CHECK(mine.rows().size() == 4);
}

TEST_CASE("two builds sharing one database keep a row each; lookups, merges and prune go by build", "[db]") {
  TempDir dir("db");
  const auto path = dir / "shared.sqlite";
  Provenance before = kFresh;  // the install beside this one
  before.template_hash = "templates-before";
  Provenance old_nvrtc = kFresh;
  old_nvrtc.nvrtc_version = "12.8";
  Provenance other_driver = kFresh;
  other_driver.driver_version = 12080;  // the driver is not part of a build
  CHECK(same_build(kFresh, other_driver));
  CHECK_FALSE(same_build(kFresh, before));
  CHECK_FALSE(same_build(kFresh, old_nvrtc));
  {
    TuningDb db(path);
    db.record(row_for(key_at(64), 64, 0.30));          // candidates n64 0.30, n128 0.45
    db.record(row_for(key_at(64), 128, 0.10, before));  // candidates n128 0.10, n256 0.15
    db.record(row_for(key_at(64), 256, 0.20, old_nvrtc));
    db.record(row_for(key_at(64), 32, 0.25, other_driver));  // this build's row again
  }
  TuningDb db(path);
  CHECK(db.rows().size() == 3);
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(32));
  CHECK(db.lookup(key_at(64), before)->winner == config(128));
  CHECK(db.lookup(key_at(64), old_nvrtc)->winner == config(256));
  // Candidates stay with their build: this build's n128 keeps its own time.
  const TuningRow mine = *db.lookup(key_at(64), kFresh);
  for (const CandidateResult& c : mine.candidates) {
    CHECK(c.median_ms != 0.10);
    if (c.config == config(128)) CHECK(c.median_ms == 0.30 * 1.5);
  }
  CHECK(candidate_names(*db.lookup(key_at(64), before)) ==
        std::vector<std::string>{config(128).name(), config(256).name()});
  CHECK(db.nearest_bucket(key_at(32), before)->winner == config(128));
  CHECK_FALSE(db.nearest_bucket(key_at(32), Provenance{"13.0", 0, "templates-unknown", "", ""}));
  // Rows come in key order, then build order.
  std::vector<std::string> order;
  for (const TuningRow& r : db.rows()) order.push_back(r.provenance.template_hash + "/" + r.provenance.nvrtc_version);
  CHECK(order == std::vector<std::string>{"templates-before/13.0", "templates-now/12.8", "templates-now/13.0"});

  // Each build resolves its own row through the lookup chain; neither tunes the other's away.
  for (const auto& [build, winner] : {std::pair{kFresh, config(32)}, std::pair{before, config(128)}}) {
    TuningLookup lookup(path, {}, build, [](const TuningKey&) { return heuristic_config(); });
    const Resolved r = lookup.resolve(key_at(64));
    CHECK(r.source == Resolved::Source::kUserDb);
    CHECK(r.config == winner);
  }

  // Merging weighs only rows of the same key and build.
  TuningDb theirs = TuningDb::in_memory();
  theirs.record(row_for(key_at(64), 512, 0.05, before));    // faster than `before`'s row: replaces it
  theirs.record(row_for(key_at(64), 16, 0.50));             // slower than this build's: kept out
  Provenance third = kFresh;
  third.template_hash = "templates-after";
  theirs.record(row_for(key_at(64), 16, 0.01, third));     // a build this file has not seen: added
  const auto stats = db.merge(theirs);
  CHECK(stats.added == 1);
  CHECK(stats.replaced == 1);
  CHECK(stats.kept == 1);
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(32));
  CHECK(db.lookup(key_at(64), before)->winner == config(512));
  CHECK(db.rows().size() == 4);

  // Prune keeps one build's rows and candidates.
  CHECK(db.prune(kFresh) == 3);
  CHECK(db.rows().size() == 1);
  CHECK(db.lookup(key_at(64), kFresh)->candidates.size() == 3);
  Connection raw(path, OpenMode::kReadOnly);
  CHECK(raw.query_int("SELECT count(*) FROM candidates WHERE template_hash != 'templates-now' OR nvrtc_version != "
                      "'13.0'") == 0);
  CHECK(db.prune(kFresh) == 0);
}

TEST_CASE("a merge ranks rows by the caller's standing before their times", "[db]") {
  // `moejit db` ranks rows tuned whole first: a faster row cut short (a first call's, perhaps timed
  // at a smaller T of the key) does not replace a slower whole one, and a whole row replaces a
  // faster cut-short one. Here a row of one candidate stands for one cut short.
  const TuningDb::Standing whole_first = [](const TuningRow& r) { return r.candidates.size() > 1 ? 1 : 0; };
  const auto cut_short = [](int key_tpe, int winner, double ms) {
    TuningRow r = row_for(key_at(key_tpe), winner, ms);
    r.candidates = {timed(config(winner), ms)};
    return r;
  };
  TuningDb db = TuningDb::in_memory();
  db.record(row_for(key_at(64), 128, 0.30));
  db.record(cut_short(128, 64, 0.20));
  db.record(row_for(key_at(256), 128, 0.30));
  const auto stats = db.merge_rows(
      {cut_short(64, 64, 0.20), row_for(key_at(128), 32, 0.90), row_for(key_at(256), 32, 0.25)}, whole_first);
  CHECK(stats.kept == 1);
  CHECK(stats.replaced == 2);
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(128));  // whole kept over a faster cut-short row
  CHECK(db.lookup(key_at(128), kFresh)->winner == config(32));  // whole over cut short, though slower
  CHECK(db.lookup(key_at(256), kFresh)->winner == config(32));  // same standing: the faster
  // Without a standing, times alone decide, as before.
  CHECK(db.merge_rows({cut_short(64, 64, 0.20)}).replaced == 1);
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(64));
}

TEST_CASE("merging a losing row marks nothing on the kept row's candidates", "[db]") {
  // A row from a whole-space tune, and another database's slower row of the same build from a
  // first call's narrow tune, which rejected the kept winner as outside its space.
  TuningDb mine = TuningDb::in_memory();
  mine.record(row_for(key_at(64), 128, 0.30));
  TuningRow narrow = row_for(key_at(64), 64, 0.40);
  narrow.candidates = {timed(config(64), 0.40), rejected(config(128), "outside the first call's space")};
  TuningDb theirs = TuningDb::in_memory();
  theirs.record(narrow);

  CHECK(mine.merge(theirs).kept == 1);
  const auto got = *mine.lookup(key_at(64), kFresh);
  CHECK(got.winner == config(128));
  CHECK(candidate_names(got) == std::vector<std::string>{config(128).name(), config(256).name()});
  for (const CandidateResult& c : got.candidates) CHECK_FALSE(c.rejected);
}

TEST_CASE("nearest_bucket picks the closest bucket in log2 distance, ties to the larger", "[db]") {
  TempDir dir("db");
  TuningDb db(dir / "tuning.sqlite");
  for (int b : {16, 64, 1024}) db.record(row_for(key_at(b), b, 0.1));
  db.record(row_for(key_at(128, 4096), 128, 0.1));  // another family (H=4096)

  auto bucket_for = [&](int query) { return db.nearest_bucket(key_at(query), kFresh)->key.tpe_bucket; };
  CHECK(bucket_for(16) == 16);
  CHECK(bucket_for(32) == 64);  // 16 and 64 are both one doubling away
  CHECK(bucket_for(128) == 64);
  CHECK(bucket_for(256) == 1024);  // 64 and 1024 both two doublings away
  CHECK(bucket_for(512) == 1024);
  CHECK(bucket_for(4096) == 1024);
  CHECK(db.nearest_bucket(key_at(16, 4096), kFresh)->key.tpe_bucket == 128);
  CHECK_FALSE(db.nearest_bucket(key_at(64, 1024), kFresh));
  TuningKey other_mode = key_at(64);
  other_mode.mode = "infer";
  CHECK_FALSE(db.nearest_bucket(other_mode, kFresh));

  auto not_64 = [](const TuningRow& r) { return r.key.tpe_bucket != 64; };
  CHECK(db.nearest_bucket(key_at(32), kFresh, not_64)->key.tpe_bucket == 16);
  CHECK(db.nearest_bucket(key_at(32), kFresh, not_64)->candidates.size() == 2);
}

namespace {

// A shipped table for `device` in `dir`, written as the CLI's export writes it.
void write_shipped(const std::filesystem::path& dir, const std::string& device, const std::vector<TuningRow>& rows) {
  TuningDb db = TuningDb::in_memory();
  for (const TuningRow& r : rows) db.record(r);
  fs::atomic_write(dir / shipped_db_file_name(device), db.export_json());
}

}  // namespace

TEST_CASE("the lookup chain tries memory, user DB, shipped DB, nearest bucket, heuristic in turn", "[db]") {
  TempDir dir("db");
  const auto user_path = dir / "user.sqlite";
  const auto shipped_dir = dir / "shipped";
  CHECK(shipped_db_file_name("NVIDIA H200") == "NVIDIA_H200.json");
  CHECK(shipped_db_file_name("NVIDIA GeForce RTX 5090") == "NVIDIA_GeForce_RTX_5090.json");

  {
    TuningDb user(user_path);
    user.record(row_for(key_at(64), 64, 0.1));            // exact hit for tpe64, and a neighbour
    user.record(row_for(key_at(16, 1024), 16, 0.1));     // family H1024 known to the user DB only
  }
  write_shipped(shipped_dir, "NVIDIA H200",
                {row_for(key_at(64), 512, 0.2),                 // shadowed by the user DB
                 row_for(key_at(256), 256, 0.2),                // exact hit for tpe256
                 row_for(key_at(2048), 2048, 0.2),              // nearer to tpe4096 than user's 64
                 row_for(key_at(128, 4096), 128, 0.2)});        // family H4096: shipped only

  int heuristic_calls = 0;
  TuningLookup lookup(user_path, shipped_dir, kFresh, [&](const TuningKey& k) {
    ++heuristic_calls;
    CHECK(k.hidden == 7168);
    return heuristic_config();
  });

  lookup.remember(row_for(key_at(512), 32, 0.05));
  Resolved r = lookup.resolve(key_at(512));
  CHECK(r.source == Resolved::Source::kMemory);
  CHECK(std::string(r.source_name()) == "memory");
  CHECK(r.config == config(32));

  r = lookup.resolve(key_at(64));
  CHECK(r.source == Resolved::Source::kUserDb);
  CHECK(r.config == config(64));
  REQUIRE(r.row);
  CHECK(r.row->key == key_at(64));
  CHECK(lookup.resolve(key_at(64)).source == Resolved::Source::kMemory);  // cached after the first hit

  r = lookup.resolve(key_at(256));
  CHECK(r.source == Resolved::Source::kShippedDb);
  CHECK(std::string(r.source_name()) == "shipped_db");
  CHECK(r.config == config(256));

  // Nearest bucket: the user DB is asked first even though the shipped 2048 is nearer.
  r = lookup.resolve(key_at(4096));
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.row->key.tpe_bucket == 64);
  CHECK(r.config == config(64));
  CHECK(lookup.resolve(key_at(1024, 1024)).row->key.tpe_bucket == 16);
  // A family only the shipped table knows.
  r = lookup.resolve(key_at(16, 4096));
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(128));

  r = lookup.resolve(key_at(64, 7168));
  CHECK(r.source == Resolved::Source::kHeuristic);
  CHECK(std::string(r.source_name()) == "heuristic");
  CHECK(r.config == heuristic_config());
  CHECK_FALSE(r.row);
  CHECK(heuristic_calls == 1);

  // Memory comes before the user DB.
  lookup.remember(row_for(key_at(64), 16, 0.01));
  CHECK(lookup.resolve(key_at(64)).config == config(16));

  // A device without a shipped table, and a lookup with no databases at all.
  TuningKey other = key_at(64, 7168);
  other.device = "NVIDIA B200";
  CHECK(lookup.resolve(other).source == Resolved::Source::kHeuristic);
  TuningLookup bare({}, {}, kFresh, [](const TuningKey&) { return heuristic_config(); });
  CHECK(bare.resolve(key_at(64)).source == Resolved::Source::kHeuristic);
  CHECK_THROWS_AS(TuningLookup({}, {}, kFresh, nullptr), InvalidArgument);
}

TEST_CASE("the lookup chain ignores stale rows at every level", "[db]") {
  TempDir dir("db");
  const auto user_path = dir / "user.sqlite";
  const auto shipped_dir = dir / "shipped";
  Provenance old_templates = kFresh;
  old_templates.template_hash = "templates-before";
  Provenance old_nvrtc = kFresh;
  old_nvrtc.nvrtc_version = "12.8";
  Provenance other_driver = kFresh;
  other_driver.driver_version = 12080;  // the driver is not part of staleness
  CHECK(is_stale(row_for(key_at(64), 64, 0.1, old_templates), kFresh));
  CHECK(is_stale(row_for(key_at(64), 64, 0.1, old_nvrtc), kFresh));
  CHECK_FALSE(is_stale(row_for(key_at(64), 64, 0.1, other_driver), kFresh));

  {
    TuningDb user(user_path);
    user.record(row_for(key_at(64), 64, 0.1, old_templates));
    user.record(row_for(key_at(128), 128, 0.1, old_nvrtc));
    user.record(row_for(key_at(16, 4096), 16, 0.1, old_templates));
  }
  write_shipped(shipped_dir, "NVIDIA H200",
                {row_for(key_at(64), 512, 0.2), row_for(key_at(32, 4096), 32, 0.2, old_nvrtc)});

  TuningLookup lookup(user_path, shipped_dir, kFresh, [](const TuningKey&) { return heuristic_config(); });
  // Exact user row stale -> the shipped row.
  Resolved r = lookup.resolve(key_at(64));
  CHECK(r.source == Resolved::Source::kShippedDb);
  CHECK(r.config == config(512));
  // Exact user row stale, no shipped row; the user's neighbours are stale too -> shipped neighbour.
  r = lookup.resolve(key_at(128));
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(512));
  // A stale remembered row is skipped as well.
  lookup.remember(row_for(key_at(256), 16, 0.01, old_templates));
  r = lookup.resolve(key_at(256));
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(512));
  // Every row of the family stale, in both databases -> the heuristic.
  CHECK(lookup.resolve(key_at(16, 4096)).source == Resolved::Source::kHeuristic);
  CHECK(lookup.resolve(key_at(32, 4096)).source == Resolved::Source::kHeuristic);
}

TEST_CASE("the lookup chain passes over rows the caller refuses, at every level", "[db]") {
  TempDir dir("db");
  const auto user_path = dir / "user.sqlite";
  const auto shipped_dir = dir / "shipped";
  {
    TuningDb user(user_path);
    user.record(row_for(key_at(64), 32, 0.1));     // refused below (a winner pruning now rejects)
    user.record(row_for(key_at(1024), 128, 0.1));  // allowed
  }
  write_shipped(shipped_dir, "NVIDIA H200", {row_for(key_at(64), 32, 0.2), row_for(key_at(128), 512, 0.2)});
  TuningLookup lookup(user_path, shipped_dir, kFresh, [](const TuningKey&) { return heuristic_config(); });
  const TuningDb::RowFilter not_32 = [](const TuningRow& row) { return row.winner != config(32); };

  // The exact rows of both databases refused -> the user DB's nearest allowed bucket (its own
  // 64 refused, so 1024; the user DB is asked before the shipped table's nearer 128).
  Resolved r = lookup.resolve(key_at(64), not_32);
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(128));
  // Without the filter the exact row is used (and remembered), and a remembered row is refused too.
  CHECK(lookup.resolve(key_at(64)).source == Resolved::Source::kUserDb);
  r = lookup.resolve(key_at(64), not_32);
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(128));
  // Every user row refused -> the shipped table's nearest allowed bucket.
  r = lookup.resolve(key_at(32), [](const TuningRow& row) { return row.winner == config(512); });
  CHECK(r.source == Resolved::Source::kNearestBucket);
  CHECK(r.config == config(512));
  // Nothing allowed anywhere -> the heuristic.
  const TuningDb::RowFilter none = [](const TuningRow&) { return false; };
  CHECK(lookup.resolve(key_at(64), none).source == Resolved::Source::kHeuristic);
}

TEST_CASE("a row this build cannot read is skipped alone, at every read; the rest of the database serves", "[db]") {
  const TempDir dir("unreadable-rows");
  const auto path = dir / "tuning.sqlite";
  {
    TuningDb db(path);
    for (int tpe : {16, 32, 64, 128, 256}) db.record(row_for(key_at(tpe), 128, 0.1 * tpe));
  }
  // What a newer moejit or a hand edit may leave: an arch tag this build does not know (in a
  // winner; in one candidate, which alone is left out), a size past an int (which would read back
  // as 128), a negative bucket, a key id that is not the fields' own.
  Connection raw(path, OpenMode::kReadWrite);
  raw.exec("UPDATE winners SET arch_tag = 'blackwell_gb' WHERE key_id = '" + key_at(16).id() + "'");
  raw.exec("UPDATE candidates SET arch_tag = 'blackwell_gb' WHERE key_id = '" + key_at(128).id() +
           "' AND config_name = '" + config(256).name() + "'");
  raw.exec("UPDATE winners SET block_n = 4294967424 WHERE key_id = '" + key_at(32).id() + "'");
  raw.exec("UPDATE winners SET tpe_bucket = -5 WHERE key_id = '" + key_at(64).id() + "'");
  raw.exec("UPDATE winners SET key_id = '" + key_at(512).id() + "' WHERE key_id = '" + key_at(256).id() + "'");
  raw.exec("UPDATE candidates SET key_id = '" + key_at(512).id() + "' WHERE key_id = '" + key_at(256).id() + "'");
  const TuningDb db(path, OpenMode::kReadOnly);
  for (int tpe : {16, 32, 64, 512}) {
    INFO("tpe " << tpe);
    CHECK_FALSE(db.lookup(key_at(tpe), kFresh));
  }
  REQUIRE(db.lookup(key_at(128), kFresh));
  CHECK(db.lookup(key_at(128), kFresh)->winner == config(128));
  CHECK(candidate_names(*db.lookup(key_at(128), kFresh)) == std::vector<std::string>{config(128).name()});
  const std::vector<TuningRow> rows = db.rows();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].key == key_at(128));
  CHECK(candidate_names(rows[0]) == std::vector<std::string>{config(128).name()});
  // Nearest to 64: the unreadable 32, 64 and mislabelled rows are passed over for 128.
  const auto near = db.nearest_bucket(key_at(64), kFresh);
  REQUIRE(near);
  CHECK(near->key.tpe_bucket == 128);
  // Recording the key again heals it.
  TuningDb writable(path);
  writable.record(row_for(key_at(16), 256, 0.5));
  REQUIRE(writable.lookup(key_at(16), kFresh));
  CHECK(writable.lookup(key_at(16), kFresh)->winner == config(256));
}

TEST_CASE("a conditional record leaves a row its filter keeps, decided in the write transaction", "[db]") {
  TuningDb db = TuningDb::in_memory();
  const TuningRow first = row_for(key_at(64), 128, 0.2), second = row_for(key_at(64), 256, 0.1);
  const auto keep_128 = [](const TuningRow& existing) { return existing.winner == config(128); };
  CHECK(db.record(first, keep_128));  // nothing there yet
  CHECK_FALSE(db.record(second, keep_128));
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(128));
  CHECK(db.lookup(key_at(64), kFresh)->candidates.size() == 2);  // the kept row's own candidates only
  CHECK(db.record(second, [](const TuningRow&) { return false; }));
  CHECK(db.lookup(key_at(64), kFresh)->winner == config(256));
}

TEST_CASE("an unreadable shipped table is skipped, not fatal", "[db]") {
  TempDir dir("db");
  fs::atomic_write(dir / "NVIDIA_H200.json", "{\"schema_version\": 1, \"rows\": [ {\"id\": 3} ]}");
  TuningLookup lookup({}, dir.path(), kFresh, [](const TuningKey&) { return heuristic_config(); });
  CHECK(lookup.resolve(key_at(64)).source == Resolved::Source::kHeuristic);
}

TEST_CASE("a shipped table loses only the rows this build cannot read; db import refuses the table", "[db]") {
  const TempDir dir("shipped-bad-rows");
  write_shipped(dir.path(), "NVIDIA H200", {row_for(key_at(64), 64, 0.1), row_for(key_at(128), 128, 0.2)});
  const auto file = dir / shipped_db_file_name("NVIDIA H200");
  auto doc = nlohmann::json::parse(*fs::read_all(file));
  // What a newer moejit's table may hold: an arch tag this build does not know (the confirmed
  // case, which once sent every key of the table to the heuristic), a key id that is not its
  // fields', and something that is no row at all.
  auto newer = doc["rows"][0];
  newer["key"]["tpe_bucket"] = 256;
  newer["id"] = key_at(256).id();
  newer["winner"]["arch_tag"] = "blackwell_gb";
  auto mislabelled = doc["rows"][0];
  mislabelled["id"] = key_at(512).id();
  for (const auto& row : {newer, mislabelled, nlohmann::json(3)}) doc["rows"].push_back(row);
  const std::string text = doc.dump();
  fs::atomic_write(file, text);

  TuningDb copy = TuningDb::in_memory();
  const TuningDb::MergeStats stats = copy.import_json(text, TuningDb::BadRows::kSkip);
  CHECK(stats.added == 2);
  REQUIRE(stats.skipped.size() == 3);
  CHECK_THAT(stats.skipped[0], Catch::StartsWith("rows[2] (" + key_at(256).id() + "): ") &&
                                   Catch::Contains("blackwell_gb"));
  CHECK_THAT(stats.skipped[1], Catch::StartsWith("rows[3] (" + key_at(512).id() + "): ") &&
                                   Catch::Contains("does not match"));
  CHECK_THAT(stats.skipped[2], Catch::StartsWith("rows[4]: "));
  CHECK(copy.rows().size() == 2);

  TuningLookup lookup({}, dir.path(), kFresh, [](const TuningKey&) { return heuristic_config(); });
  for (int tpe : {64, 128}) {
    const Resolved r = lookup.resolve(key_at(tpe));
    INFO("tpe " << tpe);
    CHECK(r.source == Resolved::Source::kShippedDb);
    CHECK(r.config == config(tpe));
  }
  CHECK(lookup.resolve(key_at(256)).source == Resolved::Source::kNearestBucket);

  // `moejit db import` moves a table whole or not at all: the first bad row stops it, named.
  TuningDb target = TuningDb::in_memory();
  CHECK_THROWS_WITH(target.import_json(text), Catch::Contains("rows[2] (" + key_at(256).id() + ")") &&
                                                  Catch::Contains("blackwell_gb"));
  CHECK(target.rows().empty());
  // A document that is no export is refused either way.
  CHECK_THROWS_AS(target.import_json("{\"rows\": []}", TuningDb::BadRows::kSkip), DatabaseError);
}

TEST_CASE("one unreadable row appended to the shipped H200 table costs no other key", "[db]") {
  const auto text = fs::read_all(std::filesystem::path(MOEJIT_TEST_SHIPPED_DB_DIR) / "NVIDIA_H200.json");
  REQUIRE(text);
  auto doc = nlohmann::json::parse(*text);
  const std::size_t shipped = doc["rows"].size();
  auto bad = doc["rows"][0];
  bad["winner"]["arch_tag"] = "blackwell_gb";
  doc["rows"].push_back(bad);
  const TempDir dir("shipped-h200");
  fs::atomic_write(dir / "NVIDIA_H200.json", doc.dump());
  // Every row of the table resolves from it, under the build that tuned it.
  const TuningRow first = doc["rows"][0].get<TuningRow>();
  TuningLookup lookup({}, dir.path(), first.provenance, [](const TuningKey&) { return heuristic_config(); });
  std::size_t served = 0;
  for (std::size_t n = 0; n < shipped; ++n) {
    const TuningRow row = doc["rows"][n].get<TuningRow>();
    const Resolved r = lookup.resolve(row.key);
    served += r.source == Resolved::Source::kShippedDb && r.config == row.winner;
  }
  CHECK(served == shipped);
}

TEST_CASE("importing malformed JSON throws, names the problem and writes nothing", "[db]") {
  TempDir dir("db");
  TuningDb db(dir / "tuning.sqlite");
  TuningDb good = TuningDb::in_memory();
  good.record(row_for(key_at(64), 64, 0.1));
  const auto valid = nlohmann::json::parse(good.export_json());

  auto rejects = [&](const std::string& text, const std::string& expected) {
    INFO(text);
    CHECK_THROWS_AS(db.import_json(text), DatabaseError);
    CHECK_THROWS_WITH(db.import_json(text), Catch::Contains(expected));
  };
  rejects("{\"schema_version\": 1, \"rows\": [", "not valid JSON");
  rejects("[1, 2]", "expected a JSON object");
  rejects("{\"rows\": []}", "schema_version");
  rejects("{\"schema_version\": 99, \"rows\": []}", "schema_version 99");
  rejects("{\"schema_version\": 1}", "\"rows\"");

  auto with = [&](auto edit) {
    auto doc = valid;
    doc["rows"].push_back(valid["rows"][0]);
    doc["rows"][1]["key"]["tpe_bucket"] = 128;
    doc["rows"][1]["id"] = "NVIDIA H200|sm_90a|fwd_up|bf16|H2048|I768|E128|K8|bm64|tma0|tpe128|train";
    edit(doc["rows"][1]);
    return doc.dump();
  };
  CHECK_NOTHROW(nlohmann::json::parse(with([](nlohmann::json&) {})));
  rejects(with([](nlohmann::json& r) { r["key"].erase("hidden"); }), "rows[1]");
  rejects(with([](nlohmann::json& r) { r["key"].erase("hidden"); }), "hidden");
  rejects(with([](nlohmann::json& r) { r["key"]["role"] = "fwd_sideways"; }), "fwd_sideways");
  rejects(with([](nlohmann::json& r) { r["key"]["mode"] = "training"; }), "mode");
  rejects(with([](nlohmann::json& r) { r["median_ms"] = "fast"; }), "rows[1]");
  rejects(with([](nlohmann::json& r) { r["median_ms"] = -1.0; }), "median_ms");
  rejects(with([](nlohmann::json& r) { r["id"] = "something else"; }), "does not match");
  rejects(with([](nlohmann::json& r) { r["winner"]["arch_tag"] = "volta"; }), "volta");
  rejects(with([](nlohmann::json& r) { r["candidates"] = 3; }), "rows[1]");
  // Integers that do not fit, and tile fields past any real tile.
  rejects(with([](nlohmann::json& r) { r["key"]["hidden"] = 4294969344LL; }), "hidden");
  rejects(with([](nlohmann::json& r) { r["key"]["topk"] = 2.5; }), "topk");
  rejects(with([](nlohmann::json& r) { r["winner"]["block_n"] = -64; }), "block_n");
  rejects(with([](nlohmann::json& r) { r["winner"]["warps"] = 4096; }), "warps");
  rejects(with([](nlohmann::json& r) { r["candidates"][0]["config"]["stages"] = 1000; }), "stages");
  rejects(with([](nlohmann::json& r) { r["provenance"]["driver_version"] = 1e20; }), "driver_version");
  // The valid first row of each document was not written either: import is all or nothing.
  CHECK(db.rows().empty());
  CHECK(db.import_json(with([](nlohmann::json&) {})).added == 2);
}

namespace {

// One child process: 50 rows of its own, each in its own transaction, and one candidate for
// the shared key half-way through. Returns the exit code; never throws.
int write_rows_as_child(const std::filesystem::path& path, int child) noexcept {
  try {
    TuningDb db(path);
    for (int n = 0; n < 50; ++n) {
      TuningKey k = key_at(64, 1000 + child);
      k.intermediate = 1 + n;
      db.record(row_for(k, 64, 0.1 + n));
      if (n == 25) {
        TuningRow shared = row_for(key_at(16), 16 * (child + 1), 1.0 + child);
        shared.candidates = {timed(config(16 * (child + 1)), 1.0 + child)};
        db.record(shared);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", child, e.what());
    return 1;
  } catch (...) {
    return 1;
  }
}

}  // namespace

TEST_CASE("processes opening a database that does not exist yet all get it, none takes it for another program's",
          "[db]") {
  // One creates the schema while the others check whether the file is another program's: each
  // must see it before the creator's commit (empty) or after (ours), never a mix of the two.
  TempDir dir("create");
  constexpr int kRounds = 30, kChildren = 6;
  int refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto path = dir / fmt::format("round{}.sqlite", round);
    const std::vector<int> codes = run_together(kChildren, [&](int c) {
      try {
        return TuningDb(path).schema_version() == kSchemaVersion ? 0 : 2;
      } catch (const std::exception& e) {
        fs::atomic_write(dir / fmt::format("error{}-{}", round, c), e.what());
        return 1;
      }
    });
    for (int c = 0; c < kChildren; ++c) {
      if (codes[c] == 0) continue;
      ++refused;
      FAIL_CHECK("round " << round << ", child " << c << ": "
                          << fs::read_all(dir / fmt::format("error{}-{}", round, c)).value_or("no message"));
    }
  }
  CHECK(refused == 0);
}

TEST_CASE("eight processes writing one database lose no rows and leave it intact", "[db]") {
  TempDir dir("db");
  const auto path = dir / "ranks" / "tuning.sqlite";  // nobody has created it yet: the schema races too
  constexpr int kChildren = 8;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) ::_exit(write_rows_as_child(path, c));
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  TuningDb db(path);
  std::set<std::string> ids;
  for (const TuningRow& r : db.rows()) ids.insert(r.key.id());
  CHECK(ids.size() == kChildren * 50 + 1);
  for (int c = 0; c < kChildren; ++c) {
    for (int n = 0; n < 50; ++n) {
      TuningKey k = key_at(64, 1000 + c);
      k.intermediate = 1 + n;
      CHECK(ids.count(k.id()) == 1);
    }
  }
  const auto shared = db.lookup(key_at(16), kFresh);
  REQUIRE(shared);
  CHECK(shared->candidates.size() == kChildren);
  for (int c = 0; c < kChildren; ++c) {
    const auto names = candidate_names(*shared);
    CHECK(std::count(names.begin(), names.end(), config(16 * (c + 1)).name()) == 1);
  }
  CHECK(Connection(path, OpenMode::kReadOnly).query_text("PRAGMA integrity_check") == "ok");
}

namespace {

constexpr int kKilledCandidates = 40;

// A row whose every candidate carries its key's number, so a row read back mixes nothing.
TuningRow numbered_row(int child, int n) {
  TuningKey k = key_at(64, 3000 + child);
  k.intermediate = 1 + n;
  TuningRow r = row_for(k, 64, 0.5);
  r.candidates.clear();
  for (int c = 0; c < kKilledCandidates; ++c) r.candidates.push_back(timed(config(8 * (c + 1), 2 + c % 5), n + c / 100.0));
  r.winner = r.candidates[0].config;
  r.median_ms = r.candidates[0].median_ms;
  return r;
}

// Records rows until killed; after each commit appends its number to `log` with one write(), so
// the parent learns a subset of what was committed. Never returns normally; an error it meets
// goes to `log`.error for the parent to show.
[[noreturn]] void write_until_killed(const std::filesystem::path& path, const std::filesystem::path& log,
                                     int child) noexcept {
  try {
    TuningDb db(path);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    for (int n = 0;; ++n) {
      db.record(numbered_row(child, n));
      const std::string line = std::to_string(n) + "\n";
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(2);
    }
  } catch (const std::exception& e) {
    try {
      fs::atomic_write(log.string() + ".error", e.what());
    } catch (...) {
    }
    ::_exit(1);
  } catch (...) {
    ::_exit(1);
  }
}

}  // namespace

TEST_CASE("writers killed mid-transaction lose no committed row and leave the database whole and writable", "[db]") {
  TempDir dir("killed");
  const auto path = dir / "tuning.sqlite";
  constexpr int kChildren = 4;
  std::mt19937 rng(1234);
  for (int round = 0; round < 3; ++round) {
    std::vector<pid_t> children;
    for (int c = 0; c < kChildren; ++c) {
      const int child = round * kChildren + c;
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) write_until_killed(path, dir / fmt::format("log{}", child), child);
      children.push_back(pid);
    }
    // Long enough for each to commit rows, short enough that most die inside one.
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(150, 400)(rng)));
    for (pid_t pid : children) ::kill(pid, SIGKILL);
    for (pid_t pid : children) {
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      INFO("exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
      CHECK(WIFSIGNALED(status));  // an exit instead would mean a child failed to write
    }
    for (int c = 0; c < kChildren; ++c) {
      const auto error = fs::read_all(dir / fmt::format("log{}.error", round * kChildren + c));
      if (error) FAIL_CHECK("child " << round * kChildren + c << ": " << *error);
    }
  }

  CHECK(Connection(path, OpenMode::kReadOnly).query_text("PRAGMA integrity_check") == "ok");
  TuningDb db(path);
  std::map<std::string, TuningRow> stored;
  for (TuningRow& r : db.rows()) stored[r.key.id()] = std::move(r);
  int committed = 0;
  for (int child = 0; child < 3 * kChildren; ++child) {
    std::istringstream log(fs::read_all(dir / fmt::format("log{}", child)).value_or(""));
    for (int n; log >> n; ++committed) {
      const TuningRow want = numbered_row(child, n);
      INFO("child " << child << ", row " << n);
      const auto it = stored.find(want.key.id());
      REQUIRE(it != stored.end());
      CHECK(as_json(it->second) == as_json(sorted(want)));
    }
  }
  CHECK(committed >= 3 * kChildren);
  // Rows the parent was not told about (killed between commit and log) are whole too.
  for (const auto& [id, row] : stored) {
    INFO(id);
    CHECK(row.candidates.size() == kKilledCandidates);
  }
  const TuningRow after = row_for(key_at(32, 4096), 128, 0.25);
  db.record(after);
  REQUIRE(db.lookup(after.key, kFresh));
  CHECK(as_json(*db.lookup(after.key, kFresh)) == as_json(sorted(after)));
}

TEST_CASE("moejit db lists, exports, imports, merges and prunes", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("db");
  const std::string a = (dir / "a.sqlite").string(), b = (dir / "b.sqlite").string();
  {
    TuningDb db(a);
    db.record(row_for(key_at(64), 128, 0.25));
    db.record(row_for(key_at(128), 64, 0.5));
  }

  // A database named with --db must exist (a typo is no empty database); MOEJIT_DB's may not yet.
  auto r = run_command(cli() + " db list --db " + (dir / "none.sqlite").string());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("no tuning database at"));
  r = run_command("MOEJIT_DB=" + (dir / "none.sqlite").string() + " " + cli() + " db list");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("(empty)"));
  CHECK_FALSE(std::filesystem::exists(dir / "none.sqlite"));

  r = run_command(cli() + " db list --db " + a);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains(key_at(64).id()) && Catch::Contains(config(128).name()) &&
                           Catch::Contains("0.2500") && Catch::Contains(kFresh.created_at) &&
                           Catch::Contains("templates-now/13.0"));

  const std::string json = (dir / "out" / "a.json").string();
  r = run_command(cli() + " db export --db " + a + " --out " + json);
  CHECK(r.exit_code == 0);
  CHECK(fs::read_all(json) == TuningDb(a).export_json());
  r = run_command(cli() + " db export --db " + a + " --out -");
  CHECK(r.exit_code == 0);
  CHECK(r.output == TuningDb(a).export_json());

  r = run_command(cli() + " db import " + json + " --db " + b);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("added 2, replaced 0, kept 0"));
  r = run_command(cli() + " db merge " + a + " --db " + b);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("added 0, replaced 0, kept 2"));
  CHECK(TuningDb(b).export_json() == TuningDb(a).export_json());

  // Prune keeps the CLI's own build: the rows above were tuned by "templates-now".
  TuningDb(b).record(row_for(key_at(256), 64, 0.1, current_provenance(0)));
  r = run_command(cli() + " db prune --db " + b);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("removed 2 rows"));
  REQUIRE(TuningDb(b).rows().size() == 1);
  CHECK(TuningDb(b).rows()[0].key == key_at(256));
  CHECK(run_command(cli() + " db prune --db " + (dir / "none.sqlite").string()).exit_code == 1);
  CHECK_FALSE(std::filesystem::exists(dir / "none.sqlite"));

  CHECK(run_command(cli() + " db frobnicate").exit_code == 2);
  CHECK(run_command(cli() + " db").exit_code == 2);
  r = run_command(cli() + " db export --db " + a);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("--out"));
  CHECK(run_command(cli() + " db import --db " + b).exit_code == 2);
  CHECK(run_command(cli() + " db merge " + (dir / "missing.sqlite").string() + " --db " + b).exit_code == 1);
}

TEST_CASE("every shipped table in db/ was tuned with this build's templates, one build and one row per key", "[db]") {
  // A template change makes every shipped row stale (lookups skip it and plans self-tune):
  // retune and re-export in the same change (db/README.md). A table exported from a database
  // that several builds tuned into, without `moejit db prune`, would hold some keys twice.
  int tables = 0;
  for (const auto& f : std::filesystem::directory_iterator(MOEJIT_TEST_SHIPPED_DB_DIR)) {
    if (f.path().extension() != ".json") continue;
    ++tables;
    std::ifstream in(f.path());
    const nlohmann::json j = nlohmann::json::parse(in);
    std::size_t stale = 0;
    std::set<std::string> keys, nvrtc_versions;
    for (const auto& row : j.at("rows")) {
      stale += row.at("provenance").at("template_hash") != jit::template_hash();
      nvrtc_versions.insert(row.at("provenance").at("nvrtc_version").get<std::string>());
      keys.insert(row.at("key").dump());
    }
    INFO(f.path().filename().string() << ": " << stale << " of " << j.at("rows").size() << " rows stale, "
                                      << keys.size() << " keys, " << nvrtc_versions.size() << " NVRTC versions");
    CHECK(j.at("rows").size() > 0);
    CHECK(stale == 0);
    CHECK(keys.size() == j.at("rows").size());
    CHECK(nvrtc_versions.size() == 1);
  }
  CHECK(tables > 0);
}

TEST_CASE("saved rows reach the main file while another connection of the process stays open", "[db]") {
  // A plan's lookup keeps its connection for the process's life, so no last close checkpoints;
  // another user's reader opens the file immutable and reads the main file alone.
  TempDir dir("checkpoint");
  const auto path = dir / "tuning.sqlite";
  TuningDb(path).record(row_for(key_at(64), 128, 0.5));
  const TuningDb lookup(path, OpenMode::kReadOnly);
  CHECK(lookup.rows().size() == 1);
  TuningDb::open_for_saving(path).record_all({row_for(key_at(128), 64, 0.25), row_for(key_at(256), 64, 0.75)});
  const Connection immutable(path, Access::kImmutable);
  CHECK(immutable.query_int("SELECT count(*) FROM winners") == 3);
}

TEST_CASE("a file this process cannot write is opened immutable, making nothing beside it; the URI keeps odd paths",
          "[db]") {
  // The decision alone: as root, access() calls every file writable, so the cases are spelt out.
  const auto state = [](bool exists, bool writable, bool folder_writable, bool wal_exists) {
    return FileState{exists, writable, folder_writable, wal_exists};
  };
  for (const OpenMode mode : {OpenMode::kReadWrite, OpenMode::kReadOnly}) {
    const Access asked = mode == OpenMode::kReadWrite ? Access::kReadWrite : Access::kReadOnly;
    INFO((mode == OpenMode::kReadWrite ? "read-write" : "read-only"));
    CHECK(open_access(mode, state(false, false, true, false)) == asked);  // made, or refused by SQLite
    CHECK(open_access(mode, state(true, true, true, false)) == asked);
    CHECK(open_access(mode, state(true, true, true, true)) == asked);
    // Another user's file in a folder users share (writable, sticky): a -wal or -shm made by this
    // process would stop its owner writing, -wal or not.
    CHECK(open_access(mode, state(true, false, true, false)) == Access::kImmutable);
    CHECK(open_access(mode, state(true, false, true, true)) == Access::kImmutable);
    // A folder this process cannot write (an image, a read-only mount, another user's folder): the
    // file alone, or through the -wal and -shm already there, since nothing can be made.
    CHECK(open_access(mode, state(true, true, false, false)) == Access::kImmutable);
    CHECK(open_access(mode, state(true, false, false, false)) == Access::kImmutable);
    CHECK(open_access(mode, state(true, false, false, true)) == Access::kReadOnly);
    CHECK(open_access(mode, state(true, true, false, true)) == Access::kReadOnly);
  }

  // '?', '#' and '%' in the path: unescaped, the URI would name another file.
  TempDir dir("odd ?#%");
  const auto path = dir / "tuning 100%?x#y.sqlite";
  const TuningRow row = row_for(key_at(64), 128, 0.5);
  TuningDb(path).record(row);
  const FileState file = file_state(path);
  CHECK(file.exists);
  CHECK(file.folder_writable);
  CHECK_FALSE(file.wal_exists);  // the last connection checkpointed and removed it
  if (!moejit::test::running_as_root()) {
    std::filesystem::permissions(path, std::filesystem::perms::owner_read);
    CHECK_FALSE(file_state(path).writable);
    std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  {
    const Connection immutable(path, Access::kImmutable);
    CHECK(immutable.read_only());
    CHECK(immutable.path() == path.string());
    CHECK(immutable.query_int("SELECT count(*) FROM winners") == 1);
    CHECK_THROWS_WITH(Transaction(immutable, Transaction::Kind::kWrite), Catch::Contains("cannot write"));
    CHECK_FALSE(std::filesystem::exists(path.string() + "-wal"));
    CHECK_FALSE(std::filesystem::exists(path.string() + "-shm"));
  }
  CHECK_THROWS_AS(Connection(dir / "absent.sqlite", Access::kImmutable), DatabaseError);
}

namespace {

using moejit::test::as_owner;
using moejit::test::as_reader;
using moejit::test::expect;

bool exists_beside(const std::filesystem::path& path, const char* suffix) {
  return std::filesystem::exists(path.string() + suffix);
}

// Gives the folder to the owner as root, so its files are the owner's and the reader's rights are
// its own; mode as given. Otherwise the folder is this user's already.
void prepare_folder(const std::filesystem::path& dir, std::filesystem::perms mode) {
  if (moejit::test::running_as_root()) {
    REQUIRE(::chown(dir.c_str(), moejit::test::kOwnerUid, moejit::test::kOwnerUid) == 0);
  }
  std::filesystem::permissions(dir, mode);
}

// The owner's database in a folder of the given mode, holding `first`; `later`, a row of another
// key, for the owner to write after a reader.
struct OwnersDatabase {
  OwnersDatabase(const std::string& tag, std::filesystem::perms mode) : dir(tag), path(dir / "tuning.sqlite") {
    prepare_folder(dir.path(), mode);
    REQUIRE(moejit::test::as_owner([&] { TuningDb(path).record(first); }) == 0);
  }
  TempDir dir;
  std::filesystem::path path;
  TuningRow first = row_for(key_at(64), 128, 0.5), later = row_for(key_at(128), 64, 0.4);
};

}  // namespace

TEST_CASE("another user's database in a folder users share is read, never written, and its owner still writes",
          "[db]") {
  // A team database, mode 0644, in a writable sticky folder. SQLite opened it read-write, fell back
  // to read-only without saying so, and, the file being in WAL mode, made a -wal and -shm of this
  // user's that stopped the owner writing even after this process had gone.
  MOEJIT_REQUIRE_USERS();
  using perms = std::filesystem::perms;
  const OwnersDatabase team("team", perms::all | perms::sticky_bit);
  const auto& [dir, path, first, later] = team;

  CHECK(as_reader(path, [&] {
          TuningDb db(path);
          expect(db.read_only(), "opened read-write");
          expect(db.read_only_reason().find("not writable by this process") != std::string::npos,
                 "reason: " + db.read_only_reason());
          expect(db.lookup(first.key, kFresh).has_value(), "the owner's row is not read");
          try {
            db.record(later);
            expect(false, "a row was written");
          } catch (const DatabaseError& e) {
            expect(std::string(e.what()).find("cannot write") != std::string::npos, e.what());
          }
          TuningLookup lookup(path, "", kFresh, [](const TuningKey&) { return heuristic_config(); });
          expect(lookup.resolve(first.key).source == Resolved::Source::kUserDb, "the lookup skipped the database");
          expect(TuningDb(path, OpenMode::kReadOnly).rows().size() == 1, "db list reads no row");
        }) == 0);
  CHECK_FALSE(exists_beside(path, "-wal"));
  CHECK_FALSE(exists_beside(path, "-shm"));
  CHECK(as_owner([&] { TuningDb(path).record(later); }) == 0);
  CHECK(TuningDb(path, OpenMode::kReadOnly).rows().size() == 2);
}

TEST_CASE("a database in a folder this process cannot write is read: the file alone, or through its -wal and -shm",
          "[db]") {
  // A container image or a read-only mount. `PRAGMA synchronous` and the read itself failed with
  // "attempt to write a readonly database": lookups skipped the level, db list and export failed.
  MOEJIT_REQUIRE_USERS();
  using perms = std::filesystem::perms;
  const OwnersDatabase image("read-only-folder", perms::owner_all | perms::group_read | perms::group_exec |
                                                     perms::others_read | perms::others_exec);
  const auto& [dir, path, first, later] = image;
  const auto reads = [&](std::size_t rows) {
    return [&, rows] {
      for (const OpenMode mode : {OpenMode::kReadWrite, OpenMode::kReadOnly}) {
        TuningDb db(path, mode);
        expect(db.read_only(), "opened read-write");
        expect(db.rows().size() == rows, fmt::format("{} rows read, not {}", db.rows().size(), rows));
      }
    };
  };
  CHECK(as_reader(dir.path(), reads(1)) == 0);
  CHECK_FALSE(exists_beside(path, "-wal"));

  // The owner's process dies with a commit still in the -wal: it is read, through the -shm.
  REQUIRE(as_owner([&] {
            const Connection holder(path, OpenMode::kReadWrite);
            holder.query_int("SELECT count(*) FROM winners");  // keeps the -wal from being checkpointed away
            TuningDb(path).record(later);
            ::_exit(0);
          }) == 0);
  REQUIRE(exists_beside(path, "-wal"));
  REQUIRE(exists_beside(path, "-shm"));
  CHECK(as_reader(dir.path(), reads(2)) == 0);

  // Without the -shm, which it cannot make, SQLite cannot read the -wal: said, not read half.
  std::filesystem::remove(path.string() + "-shm");
  CHECK(as_reader(dir.path(), [&] {
          try {
            TuningDb db(path);
            expect(false, "read without its -wal");
          } catch (const DatabaseError& e) {
            expect(std::string(e.what()).find("cannot be read consistently") != std::string::npos, e.what());
          }
        }) == 0);
  CHECK_FALSE(exists_beside(path, "-shm"));
}

namespace {

// A database of `rows` rows, then the bytes of its last page overwritten: SQLite opens it (page 1
// is whole) and finds the damage when it reads that page.
std::string damaged_database(const std::filesystem::path& path, int rows) {
  {
    TuningDb db(path);
    for (int n = 0; n < rows; ++n) db.record(row_for(key_at(64, 1024 + 8 * n), 128, 0.5));
  }
  std::string bytes = fs::read_all(path).value();
  const std::size_t page = static_cast<std::size_t>(Connection(path, OpenMode::kReadOnly).query_int("PRAGMA page_size"));
  REQUIRE(bytes.size() >= 4 * page);
  std::fill(bytes.end() - static_cast<std::ptrdiff_t>(page), bytes.end(), '\xa5');
  fs::atomic_write(path, bytes);
  return bytes;
}

// The copies kept of a damaged database: "<name>.corrupt-<time>" and those of its journals.
std::vector<std::filesystem::path> kept_copies(const std::filesystem::path& path) {
  std::vector<std::filesystem::path> out;
  for (const auto& f : std::filesystem::directory_iterator(path.parent_path())) {
    if (f.path().filename().string().rfind(path.filename().string() + ".corrupt-", 0) == 0) out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `size` bytes that start as a database file does (SQLite's header) and go on as `fill`: a
// database whose header is whole and the rest not (SQLite calls it not a database).
std::string broken_database(std::size_t size, char fill) {
  return std::string("SQLite format 3\0", 16) + std::string(size - 16, fill);
}

}  // namespace

TEST_CASE("a damaged database opened to save rows is copied aside and emptied in place, unless others have it open",
          "[db]") {
  TempDir dir("damaged");
  const TuningRow row = row_for(key_at(64), 128, 0.5);

  // A database's header, then garbage (SQLITE_NOTADB). Emptied in place: the file other processes
  // may be opening stays the same one.
  const auto junk = dir / "junk.sqlite";
  fs::atomic_write(junk, broken_database(4096, 'x'));
  const auto inode = fs::file_version(junk)->inode;
  CHECK_THROWS_AS(TuningDb(junk), CorruptDatabase);  // a plain open changes nothing
  TuningDb::open_for_saving(junk).record(row);
  std::vector<std::filesystem::path> kept = kept_copies(junk);
  REQUIRE(kept.size() == 1);
  CHECK(std::regex_match(kept[0].filename().string(), std::regex(R"(junk\.sqlite\.corrupt-\d{8}T\d{6}Z)")));
  CHECK(fs::read_all(kept[0]) == broken_database(4096, 'x'));
  CHECK(fs::file_version(junk)->inode == inode);
  CHECK(TuningDb(junk).lookup(row.key, kFresh));

  // Malformed inside (SQLITE_CORRUPT) where opening does not look: PRAGMA quick_check finds it.
  // While another connection has it open it is left as it is, and no copy piles up.
  const auto malformed = dir / "malformed.sqlite";
  const std::string bytes = damaged_database(malformed, 60);
  CHECK_THROWS_AS(TuningDb(malformed).check_intact(), CorruptDatabase);
  {
    const Connection holder(malformed, OpenMode::kReadWrite);
    holder.query_int("SELECT count(*) FROM sqlite_master");
    CHECK_THROWS_AS(TuningDb::open_for_saving(malformed).check_intact(), CorruptDatabase);
    CHECK(kept_copies(malformed).empty());
  }
  CHECK(TuningDb::open_for_saving(malformed).rows().empty());
  kept = kept_copies(malformed);
  REQUIRE(kept.size() == 1);
  CHECK(fs::read_all(kept[0]) == bytes);
  CHECK_NOTHROW(TuningDb(malformed).check_intact());

  // Found damaged again, likely in the same second: no copy is written over an earlier one.
  fs::atomic_write(junk, broken_database(4096, 'y'));
  TuningDb::open_for_saving(junk);
  fs::atomic_write(junk, broken_database(4096, 'z'));
  TuningDb::open_for_saving(junk);
  std::multiset<std::string> contents;
  for (const auto& f : kept_copies(junk)) contents.insert(fs::read_all(f).value_or(""));
  CHECK(contents == std::multiset<std::string>{broken_database(4096, 'x'), broken_database(4096, 'y'),
                                               broken_database(4096, 'z')});

  // Another program's file, not a database at all (a mistyped MOEJIT_DB): refused, never emptied.
  const auto other = dir / "export.json";
  const std::string text = "{\"rows\": []}\n" + std::string(4096, ' ');
  fs::atomic_write(other, text);
  try {
    TuningDb::open_for_saving(other);
    FAIL("opened");
  } catch (const CorruptDatabase& e) {
    FAIL("taken for damage: " << e.what());
  } catch (const DatabaseError& e) {
    CHECK_THAT(e.what(), Catch::Contains("file is not a database"));
  }
  CHECK(fs::read_all(other) == text);
  CHECK(kept_copies(other).empty());
}

TEST_CASE("processes finding one damaged database empty it once and all save into it", "[db]") {
  TempDir dir("damaged-ranks");
  const auto path = dir / "tuning.sqlite";
  fs::atomic_write(path, broken_database(8192, 'x'));
  const auto inode = fs::file_version(path)->inode;
  constexpr int kChildren = 6;
  const std::vector<int> codes = run_together(kChildren, [&](int c) {
    TuningDb::open_for_saving(path).record(row_for(key_at(64, 1024 + 8 * c), 128, 0.5));
    return 0;
  });
  CHECK(codes == std::vector<int>(kChildren, 0));
  // Emptied twice, it would have lost the rows saved in between, and kept a second copy.
  const auto kept = kept_copies(path);
  REQUIRE(kept.size() == 1);
  CHECK(fs::read_all(kept[0]) == broken_database(8192, 'x'));
  CHECK(fs::file_version(path)->inode == inode);
  CHECK(TuningDb(path).rows().size() == kChildren);
  CHECK(Connection(path, OpenMode::kReadOnly).query_text("PRAGMA integrity_check") == "ok");
}

TEST_CASE("moejit db import, merge and prune refuse a damaged database and leave it as it was", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("damaged-cli");
  const auto target = dir / "target.sqlite", source = dir / "source.sqlite";
  const std::string bytes = damaged_database(target, 60);
  TuningDb(source).record(row_for(key_at(64, 4096), 128, 0.5));
  const std::string json = (dir / "rows.json").string();
  fs::atomic_write(json, TuningDb(source).export_json());
  for (const std::string& command : {" db import " + json, " db merge " + source.string(), std::string(" db prune")}) {
    const auto r = run_command(cli() + command + " --db " + target.string());
    INFO(command << ": " << r.output);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Catch::Contains("quick_check") && Catch::Contains("nothing was written"));
    CHECK(fs::read_all(target) == bytes);
  }
}

TEST_CASE("a failed moejit db import or merge leaves no new database behind", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("db-no-target");
  const auto target = dir / "new" / "target.sqlite";
  const auto source = dir / "source.sqlite";
  TuningDb(source).record(row_for(key_at(64), 128, 0.5));
  auto doc = nlohmann::json::parse(TuningDb(source).export_json());
  doc["rows"][0]["winner"]["arch_tag"] = "blackwell_gb";
  const std::string bad_json = (dir / "bad.json").string(), newer_row = (dir / "newer.json").string();
  fs::atomic_write(bad_json, "not json");
  fs::atomic_write(newer_row, doc.dump());
  const auto damaged = dir / "damaged.sqlite";
  damaged_database(damaged, 60);
  const std::pair<std::string, std::string> cases[] = {
      {" db import " + bad_json, "import of " + bad_json + ": not valid JSON"},
      {" db import " + newer_row, "import of " + newer_row + ": rows[0]"},
      {" db merge " + damaged.string(), "malformed"},
  };
  for (const auto& [command, message] : cases) {
    const auto r = run_command(cli() + command + " --db " + target.string());
    INFO(command << ": " << r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains(message));
    CHECK_FALSE(std::filesystem::exists(target.parent_path()));
  }
  // A --db that does not exist yet is made by a import or merge that reads its source.
  const auto r = run_command(cli() + " db merge " + source.string() + " --db " + target.string());
  CHECK(r.exit_code == 0);
  CHECK(TuningDb(target).rows().size() == 1);
}

TEST_CASE("moejit db refuses a FIFO, a device or a folder as a database, at once", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("db-not-regular");
  const std::string fifo = (dir / "fifo").string(), b = (dir / "b.sqlite").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string json = (dir / "rows.json").string();
  fs::atomic_write(json, TuningDb::in_memory().export_json());
  // SQLite waited for ever on a FIFO, and took a device for an empty database.
  const std::pair<std::string, std::string> files[] = {
      {fifo, "a FIFO"}, {"/dev/null", "a device"}, {"/dev/zero", "a device"}, {dir.path().string(), "a folder"}};
  for (const auto& [file, kind] : files) {
    for (const std::string& command :
         {" db list --db " + file, " db export --out - --db " + file, " db prune --db " + file,
          " db import " + json + " --db " + file, " db merge " + file + " --db " + b,
          " tune --shape 8,256,128,2 --tokens 512 --db " + file}) {
      const auto r = run_command("timeout 20 " + cli() + command);
      INFO(command << ": " << r.output);
      CHECK(r.exit_code == 1);
      CHECK_THAT(r.output, Catch::Contains(file + " is " + kind + ", not a regular file: it cannot be a tuning database"));
    }
  }
  CHECK_FALSE(std::filesystem::exists(b));
}

TEST_CASE("moejit db import and tune --incumbents say why they cannot read a file", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("db-unreadable-json");
  const std::string fifo = (dir / "fifo").string(), b = (dir / "b.sqlite").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::pair<std::string, std::string> files[] = {
      {(dir / "missing.json").string(), "No such file or directory"},
      {"-", "No such file or directory"},  // a file name, not standard input
      {fifo, "a FIFO, not a regular file"},
      {dir.path().string(), "a folder, not a regular file"},
  };
  for (const auto& [file, why] : files) {
    auto r = run_command("timeout 20 " + cli() + " db import " + file + " --db " + b);
    INFO(file << ": " << r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("cannot read " + file + ": " + why));
    r = run_command("timeout 20 " + cli() + " tune --shape 8,256,128,2 --tokens 512 --db " + b + " --incumbents " + file);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains("--incumbents: cannot read " + file + ": " + why));
  }
  CHECK_FALSE(std::filesystem::exists(b));
}

TEST_CASE("moejit db export refuses to write over the database or its sidecars", "[db][cli]") {
  using moejit::test::cli;
  using moejit::test::run_command;
  TempDir dir("db-export-self");
  const auto a = dir / "a.sqlite";
  TuningDb(a).record(row_for(key_at(64), 128, 0.5));
  const std::string bytes = fs::read_all(a).value();
  std::filesystem::create_symlink(a, dir / "link");
  for (const std::filesystem::path& out :
       {a, dir / "." / "a.sqlite", dir / "link", dir / "a.sqlite-wal", dir / "a.sqlite-journal"}) {
    const auto r = run_command(cli() + " db export --db " + a.string() + " --out " + out.string());
    INFO(out << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--out: " + out.string() + " is the database"));
    CHECK(fs::read_all(a) == bytes);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "a.sqlite-wal"));
  CHECK_FALSE(std::filesystem::exists(dir / "a.sqlite-journal"));
  // Through the link, the database is named differently: still refused (above); another file is not.
  CHECK(run_command(cli() + " db export --db " + (dir / "link").string() + " --out " + (dir / "a.json").string())
            .exit_code == 0);
}
