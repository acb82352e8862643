// The autotuner's pure parts without a GPU: winner tie-break, tuning keys, the offline work
// list (resume, dedupe, shards), and tuning shared across processes with fabricated timings.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/env.hpp"
#include "core/fs.hpp"
#include "db/sqlite.hpp"
#include "db/tuning_db.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "support/users.hpp"
#include "tuner/config_resolver.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"
#include "tuner/shared_tuning.hpp"
#include "tuner/tune_plan.hpp"
#include "tuner/tuning_keys.hpp"
#include "tuner/tuning_session.hpp"
#include "tuner/winner.hpp"

using namespace moejit;
using moejit::test::ScopedEnv;
using moejit::test::TempDir;

namespace {

TileConfig gemm(int bm, int bn, int bk) {
  TileConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.stages = 3;
  c.warps = 4;
  c.group_m = 8;
  return c;
}

db::CandidateResult timed(const TileConfig& c, double ms) { return {c, ms, 0.01, false, ""}; }

const MoeProblem kProblem{8192, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
constexpr double kBudgetS = 60;  // tune_shared's lock wait only: the fake tunes take none

// A row of this build for `role` of `problem`, its whole space timed (the winner alone here).
db::TuningRow whole_row(Role role, const MoeProblem& problem, const TileConfig& winner) {
  db::TuningRow row;
  row.key = tuning_key(role, problem, cuda::fabricated::h200());
  row.winner = winner;
  row.median_ms = 0.1;
  row.candidates = {timed(winner, 0.1)};
  row.provenance = db::current_provenance(0);
  return row;
}

// This build's rows of every role of `problem`, tuned whole, the heuristic defaults winning.
std::map<std::string, db::TuningRow> tuned_whole(const MoeProblem& problem) {
  const auto h200 = cuda::fabricated::h200();
  std::map<std::string, db::TuningRow> out;
  for (Role role : roles_of(problem.mode)) {
    db::TuningRow row = whole_row(role, problem, default_config(role, shape_of(problem), h200, problem.mode));
    out.emplace(row.key.id(), std::move(row));
  }
  return out;
}

// A config that left `role`'s space at `shape` (host code trims it without a template change, so
// stored rows stay current): a portable 128-row tile of BK 64 x 4, a depth the space gives tiles
// under 64 rows only.
TileConfig trimmed_config(Role role, const MoeShape& shape) {
  TileConfig c = gemm(128, 128, 64);
  c.stages = 4;
  c.warps = 8;
  const std::vector<TileConfig> space = config_space(role, shape);
  REQUIRE(std::find(space.begin(), space.end(), c) == space.end());
  return c;
}

// `moejit tune`'s request for `problem` alone.
TunePlanRequest request_of(const MoeProblem& problem) {
  TunePlanRequest r;
  r.experts = problem.experts;
  r.hidden = problem.hidden;
  r.intermediate = problem.intermediate;
  r.topk = problem.topk;
  r.tokens = {problem.tokens};
  r.modes = {problem.mode};
  return r;
}


// Runs `child` in `n` processes forked at once (its result their exit code, 3 where it throws)
// and checks that each exited 0; then how many lines `marker` holds (one per process that tuned).
long tuned_in_children(int n, const std::string& marker, const std::function<int()>& child) {
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 3;
      try {
        rc = child();
      } catch (...) {
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const std::string tuned_by = fs::read_all(marker).value_or("");
  return std::count(tuned_by.begin(), tuned_by.end(), '\n');
}

}  // namespace

TEST_CASE("the tuner's check weighs an output in at most 256 chunks of at least 16384 elements", "[tuner]") {
  using Chunks = std::vector<std::pair<std::size_t, std::size_t>>;
  CHECK(check_chunks(0).empty());
  CHECK(check_chunks(1) == Chunks{{0, 1}});
  CHECK(check_chunks(20000) == Chunks{{0, 20000}});  // the remainder joins the chunk before
  const Chunks y64 = check_chunks(262144);  // the GPU tests' fwd_down y, [1024, 256]: 16 of 16384
  REQUIRE(y64.size() == 16);
  CHECK(y64[3] == std::pair<std::size_t, std::size_t>{49152, 65536});
  // fwd_down's y at the default shape, T=32768: 256 chunks of 1024 rows of 2048.
  const Chunks y = check_chunks(262144ull * 2048);
  REQUIRE(y.size() == 256);
  CHECK(y[1] == std::pair<std::size_t, std::size_t>{1024 * 2048, 2048 * 2048});
  for (std::size_t count : {1ull, 16383ull, 16385ull, 32767ull, 1000003ull, 4194305ull, 536870913ull}) {
    INFO(count);
    const Chunks c = check_chunks(count);
    CHECK(c.size() <= 256);
    CHECK(c.front().first == 0);
    CHECK(c.back().second == count);
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (i > 0) CHECK(c[i].first == c[i - 1].second);
      if (count >= 16384) CHECK(c[i].second - c[i].first >= 16384);
    }
  }
}

TEST_CASE("under a budget the reference, the incumbent and the TMA warp-specialized configs are timed first",
          "[tuner]") {
  const auto ws = [](int bn) {
    TileConfig c = gemm(128, bn, 64);
    c.use_tma = c.warp_specialized = true;
    return c;
  };
  const TileConfig reference = gemm(64, 64, 32), a = gemm(128, 64, 32), b = gemm(128, 128, 32);
  std::vector<TileConfig> order = {reference, a, ws(128), b, ws(256)};
  order_for_budget(order, std::nullopt);
  CHECK(order == std::vector<TileConfig>{reference, ws(128), ws(256), a, b});  // each group in the space's order
  order = {reference, a, ws(128), b, ws(256)};
  order_for_budget(order, b);
  CHECK(order == std::vector<TileConfig>{reference, b, ws(128), ws(256), a});
  order = {ws(128), a, reference};  // the first candidate stays first, whatever it is
  order_for_budget(order, reference);
  CHECK(order == std::vector<TileConfig>{ws(128), reference, a});
}

TEST_CASE("a key's smallest token count has the key; one token fewer has another", "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  for (const auto& [e, k] : {std::pair{128, 8}, std::pair{8, 2}, std::pair{64, 6}}) {
    for (long long t : {1LL, 2LL, 7LL, 100LL, 257LL, 1024LL, 3000LL, 8192LL, 32768LL, 100000LL}) {
      const MoeProblem p{t, e, 2048, 768, k};
      INFO("E=" << e << " K=" << k << " T=" << t);
      const long long floor = key_floor_tokens(Role::kRouting, p, h200);
      REQUIRE(floor >= 1);
      REQUIRE(floor <= t);
      MoeProblem q = p;
      q.tokens = floor;
      CHECK(tuning_key(Role::kRouting, q, h200) == tuning_key(Role::kRouting, p, h200));
      if (floor > 1) {
        q.tokens = floor - 1;
        CHECK_FALSE(tuning_key(Role::kRouting, q, h200) == tuning_key(Role::kRouting, p, h200));
      }
    }
  }
  // Worked by hand: E=128, K=8, T=3000 is 24000 pairs, 188 per expert: bucket 256, 128-row tiles.
  // Bucket 256 starts past 128 per expert, at 128 * 128 + 1 pairs, T = 2049.
  CHECK(key_floor_tokens(Role::kRouting, MoeProblem{3000, 128, 2048, 768, 8}, h200) == 2049);
}

TEST_CASE("each role's first pass gets an equal share of the budget left", "[tuner]") {
  CHECK(budget_share_s(60, 6) == Approx(10));
  CHECK(budget_share_s(60, 1) == Approx(60));  // the last role takes all that is left
  CHECK(budget_share_s(7.5, 3) == Approx(2.5));
  CHECK(budget_share_s(0, 4) == 0);
  CHECK(budget_share_s(-3, 4) == 0);  // the deadline already passed
  CHECK(budget_share_s(std::nan(""), 4) == 0);
  CHECK(budget_share_s(60, 0) == 0);
}

TEST_CASE("the fastest candidate wins outside the noise band", "[tuner]") {
  std::vector<db::CandidateResult> c = {timed(gemm(64, 64, 32), 1.00), timed(gemm(64, 128, 32), 0.80),
                                        timed(gemm(128, 128, 32), 0.90)};
  CHECK(choose_winner(c, std::nullopt) == 1u);
  CHECK(choose_winner(c, gemm(64, 64, 32)) == 1u);  // the incumbent is 25% slower: not a tie
}

TEST_CASE("within the noise band the incumbent stays, then the smaller config", "[tuner]") {
  std::vector<db::CandidateResult> c = {timed(gemm(128, 128, 32), 1.000), timed(gemm(64, 128, 32), 1.010),
                                        timed(gemm(128, 64, 64), 1.015), timed(gemm(64, 64, 32), 1.5)};
  CHECK(choose_winner(c, gemm(128, 64, 64)) == 2u);      // incumbent among the ties
  CHECK(choose_winner(c, std::nullopt) == 1u);           // 64x128x32 is the smallest tie
  CHECK(choose_winner(c, gemm(64, 64, 32)) == 1u);       // incumbent too slow to be a tie
}

TEST_CASE("rejected and untimed candidates never win", "[tuner]") {
  const double nan = std::nan("");
  std::vector<db::CandidateResult> c = {{gemm(64, 64, 32), 0.1, 0.0, true, "output differs"},
                                        {gemm(64, 128, 32), nan, nan, true, "skipped"},
                                        timed(gemm(128, 128, 32), 2.0)};
  CHECK(choose_winner(c, std::nullopt) == 2u);
  c.pop_back();
  CHECK_FALSE(choose_winner(c, std::nullopt));
}

TEST_CASE("finalists: the eligible candidates near the fastest, fastest first, a few at most", "[tuner]") {
  const double nan = std::nan("");
  std::vector<db::CandidateResult> c = {timed(gemm(64, 64, 32), 1.08),   timed(gemm(64, 128, 32), 1.00),
                                        timed(gemm(128, 64, 32), 1.20),  {gemm(128, 128, 32), 0.5, 0.0, true, "wrong"},
                                        {gemm(64, 64, 64), nan, nan, true, "skipped"}, timed(gemm(128, 128, 64), 1.10)};
  // 1.08 and 1.10 are within 10% of 1.00; 1.20 is not; the rejected 0.5 is never one.
  CHECK(finalists(c, std::nullopt) == std::vector<std::size_t>{1, 0, 5});
  for (double ms : {1.01, 1.02, 1.03, 1.04}) c.push_back(timed(gemm(64, 256, 32), ms));
  REQUIRE(finalists(c, std::nullopt).size() == kMaxFinalists);
  CHECK(finalists(c, std::nullopt) == std::vector<std::size_t>{1, 6, 7, 8});
  // The incumbent joins them where it is near enough (1.08), never from outside the band (1.20).
  CHECK(finalists(c, gemm(64, 64, 32)) == std::vector<std::size_t>{1, 6, 7, 8, 0});
  CHECK(finalists(c, gemm(128, 64, 32)) == std::vector<std::size_t>{1, 6, 7, 8});
  CHECK(finalists(c, gemm(64, 128, 32)) == std::vector<std::size_t>{1, 6, 7, 8});  // already one
  CHECK(finalists(std::vector<db::CandidateResult>{c[3], c[4]}, std::nullopt).empty());
}

TEST_CASE("finalists of equal medians are the same whatever order they were timed in", "[tuner]") {
  // Five candidates at one median (event times come in 32 ns steps) for four slots: the incumbent
  // first, then the smaller configs, in either order of timing.
  std::vector<db::CandidateResult> c = {timed(gemm(128, 256, 64), 1.0), timed(gemm(64, 64, 32), 1.0),
                                        timed(gemm(128, 128, 32), 1.0), timed(gemm(64, 128, 32), 1.0),
                                        timed(gemm(128, 64, 32), 1.0)};
  const auto names = [](const std::vector<db::CandidateResult>& from, const std::vector<std::size_t>& at) {
    std::set<std::string> out;
    for (std::size_t i : at) out.insert(from[i].config.name());
    return out;
  };
  for (const std::optional<TileConfig>& incumbent : {std::optional<TileConfig>{}, std::optional{gemm(128, 256, 64)}}) {
    const auto forward = names(c, finalists(c, incumbent));
    std::vector<db::CandidateResult> reversed(c.rbegin(), c.rend());
    CHECK(names(reversed, finalists(reversed, incumbent)) == forward);
    CHECK(forward.size() == kMaxFinalists);
    CHECK(forward.count(gemm(128, 256, 64).name()) == (incumbent ? 1u : 0u));
  }
}

TEST_CASE("the winner among the finalists only, as an index into all candidates", "[tuner]") {
  // Candidate 0 looked fastest in the first pass but is not a finalist here: only the
  // finalists' medians were measured together.
  std::vector<db::CandidateResult> c = {timed(gemm(64, 64, 32), 0.50), timed(gemm(128, 128, 32), 1.00),
                                        timed(gemm(64, 128, 32), 1.01), timed(gemm(128, 64, 64), 0.90)};
  CHECK(choose_winner(c, {1, 2, 3}, std::nullopt) == 3u);
  CHECK(choose_winner(c, {1, 2}, std::nullopt) == 2u);           // a tie: the smaller config
  CHECK(choose_winner(c, {1, 2}, gemm(128, 128, 32)) == 1u);     // a tie: the incumbent
  CHECK_FALSE(choose_winner(c, {}, std::nullopt));
}

TEST_CASE("tuning keys name the kernel variant, not the caller's mode", "[tuner]") {
  const MoeShape qwen3{32768, 128, 2048, 768, 8, DType::kBF16};
  // 2 E H = 1024 rows: dW1's buffer cannot hold the weighted activation of one expert of up to
  // 1100 tokens (it holds 512 tokens' a few experts at a time, in training's kernels).
  const MoeShape narrow{1100, 8, 64, 32, 8, DType::kBF16};
  const MoeShape chunked{512, 8, 64, 32, 8, DType::kBF16};
  CHECK(key_mode(Role::kBwdDw2, chunked, Mode::kMemoryEfficient) == "train");
  CHECK(key_mode(Role::kBwdDown, chunked, Mode::kMemoryEfficient) == "train");
  CHECK(key_mode(Role::kFwdUp, qwen3, Mode::kInference) == "infer");
  CHECK(key_mode(Role::kFwdDown, qwen3, Mode::kInference) == "train");
  CHECK(key_mode(Role::kBwdDw2, narrow, Mode::kMemoryEfficient) == "memeff");
  CHECK(key_mode(Role::kBwdDown, narrow, Mode::kMemoryEfficient) == "memeff");
  CHECK(key_mode(Role::kBwdDx, narrow, Mode::kMemoryEfficient) == "train");
  // Where it fits, memory-efficient mode runs training's bwd_down and bwd_dw2.
  CHECK(key_mode(Role::kBwdDw2, qwen3, Mode::kMemoryEfficient) == "train");
  CHECK(key_mode(Role::kBwdDown, qwen3, Mode::kMemoryEfficient) == "train");
  const db::TuningKey k = tuning_key(Role::kFwdUp, kProblem, cuda::fabricated::h200());
  CHECK(k.id() == "NVIDIA H200|sm_90a|fwd_up|bf16|H2048|I768|E128|K8|bm128|tma1|tpe512|train");
  // use_tma: whether the shape lets the role copy tiles with TMA (GEMM roles, 16-byte rows).
  CHECK(tuning_key(Role::kBwdDw1, kProblem, cuda::fabricated::h200()).use_tma);
  CHECK(tuning_key(Role::kBwdDw2, kProblem, cuda::fabricated::h200()).use_tma);
  CHECK_FALSE(tuning_key(Role::kGatherSum, kProblem, cuda::fabricated::h200()).use_tma);
  MoeProblem odd = kProblem;
  odd.intermediate = 772;
  CHECK_FALSE(tuning_key(Role::kFwdUp, odd, cuda::fabricated::h200()).use_tma);
  CHECK(roles_of(Mode::kInference).size() == 4);
  CHECK(roles_of(Mode::kMemoryEfficient).size() == 8);
}

TEST_CASE("the offline work list resumes, dedupes shared keys and shards", "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  TunePlanRequest r;
  r.experts = 128;
  r.hidden = 2048;
  r.intermediate = 768;
  r.topk = 8;
  r.tokens = {8192, 1024};
  r.modes = {Mode::kTraining, Mode::kInference};
  auto all = plan_tuning(r, h200, {});
  REQUIRE(all.size() == 4);  // (1024, train), (1024, infer), (8192, train), (8192, infer)
  CHECK(all[0].problem.tokens == 1024);
  CHECK(all[0].roles.size() == 8);
  REQUIRE(all[1].roles.size() == 1);  // only fwd_up has its own inference key
  CHECK(all[1].roles[0] == Role::kFwdUp);

  // Resume: keys already in the database are skipped.
  const std::map<std::string, db::TuningRow> done = tuned_whole(all[0].problem);
  auto rest = plan_tuning(r, h200, done);
  CHECK(rest.size() == 3);
  CHECK(rest[0].problem.mode == Mode::kInference);
  r.force = true;
  CHECK(plan_tuning(r, h200, done).size() == 4);
  r.force = false;

  // Shards are disjoint and together cover the whole list.
  std::set<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    r.shard = i;
    r.shards = 3;
    for (const TuneItem& item : plan_tuning(r, h200, {})) {
      for (Role role : item.roles) CHECK(seen.insert(tuning_key(role, item.problem, h200).id()).second);
    }
  }
  CHECK(seen.size() == 18);  // per token count: 8 training keys and fwd_up's inference key

  // A shard that resumes keeps its own items: shard 0 of 2 owns items 0 and 2, (1024, train)
  // and (8192, train); with the first done it has the second left, not shard 1's (1024, infer).
  r.shards = 2;
  r.shard = 0;
  const auto shard0 = plan_tuning(r, h200, {});
  REQUIRE(shard0.size() == 2);
  const auto resumed = plan_tuning(r, h200, done);
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0].problem.tokens == shard0[1].problem.tokens);
  CHECK(resumed[0].problem.mode == shard0[1].problem.mode);
  r.shards = 3;
  r.shard = 3;
  CHECK_THROWS_AS(plan_tuning(r, h200, {}), InvalidArgument);
}

TEST_CASE("moejit tune's resume tunes again a key tuned partly or whose stored winner cannot run there", "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  const TunePlanRequest r = request_of(kProblem);
  const std::map<std::string, db::TuningRow> whole = tuned_whole(kProblem);
  for (const auto& [id, row] : whole) REQUIRE(winner_legal(row, shape_of(kProblem), h200));
  REQUIRE(plan_tuning(r, h200, whole).empty());
  const std::string up = tuning_key(Role::kFwdUp, kProblem, h200).id();
  const auto left_with = [&](const std::function<void(db::TuningRow&)>& edit) {
    std::map<std::string, db::TuningRow> stored = whole;
    edit(stored.at(up));
    const std::vector<TuneItem> items = plan_tuning(r, h200, stored);
    return items.empty() ? std::vector<Role>{} : items.front().roles;
  };
  const std::vector<Role> fwd_up{Role::kFwdUp};
  // An imported winner outside the space (BLOCK_K 48), and one pruning refuses (a token tile of
  // the wrong height): both are passed over by plans, so they are not done.
  CHECK(left_with([](db::TuningRow& row) { row.winner.block_k = 48; }) == fwd_up);
  CHECK(left_with([](db::TuningRow& row) { row.winner.block_m = 16; }) == fwd_up);
  // A plan's first call timed a narrower space; a budget ran out before every candidate was timed.
  const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, shape_of(kProblem), h200);
  const auto excluded = std::find_if(space.begin(), space.end(), [&](const PruneDecision& d) {
    return !d.reason && first_call_exclusion(d.config, space);
  });
  REQUIRE(excluded != space.end());
  CHECK(left_with([&](db::TuningRow& row) {
          row.candidates.push_back({excluded->config, std::nan(""), std::nan(""), true,
                                    *first_call_exclusion(excluded->config, space)});
        }) == fwd_up);
  CHECK(left_with([&](db::TuningRow& row) {
          row.candidates.push_back({excluded->config, std::nan(""), std::nan(""), true, budget_skip_reason(5)});
        }) == fwd_up);
  // Rejections for other reasons leave the key done.
  CHECK(left_with([&](db::TuningRow& row) {
          row.candidates.push_back({excluded->config, std::nan(""), std::nan(""), true, "compile failed: x"});
        }).empty());
}

TEST_CASE("moejit tune's resume tunes routing again where its stored winner cannot run at the key's smallest T",
          "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  // 8192 pairs; the key starts at T = 2049, whose 4098 pairs pad to 5120.
  const MoeProblem problem{4096, 8, 256, 128, 2, DType::kBF16, Mode::kTraining};
  MoeShape smallest = shape_of(problem);
  smallest.tokens = key_floor_tokens(Role::kRouting, problem, h200);
  REQUIRE(smallest.tokens == 2049);
  std::optional<TileConfig> wide, narrow;
  for (const PruneDecision& d : prune_space(Role::kRouting, shape_of(problem), h200)) {
    if (d.reason) continue;
    (prune_reason(Role::kRouting, d.config, smallest, h200) ? wide : narrow) = d.config;
  }
  REQUIRE(wide);
  REQUIRE(narrow);
  std::map<std::string, db::TuningRow> stored;
  for (Role role : roles_of(problem.mode)) {
    const TileConfig winner = role == Role::kRouting ? *narrow : default_config(role, shape_of(problem), h200);
    db::TuningRow row = whole_row(role, problem, winner);
    stored.emplace(row.key.id(), std::move(row));
  }
  CHECK(plan_tuning(request_of(problem), h200, stored).empty());
  const db::TuningRow wide_row = whole_row(Role::kRouting, problem, *wide);
  stored.at(wide_row.key.id()) = wide_row;
  const std::vector<TuneItem> items = plan_tuning(request_of(problem), h200, stored);
  REQUIRE(items.size() == 1);
  CHECK(items.front().roles == std::vector<Role>{Role::kRouting});
}

TEST_CASE("moejit tune's resume skips a key whose only partial marks are on configs its space no longer holds",
          "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  const TunePlanRequest r = request_of(kProblem);
  const std::map<std::string, db::TuningRow> whole = tuned_whole(kProblem);
  const std::string up = tuning_key(Role::kFwdUp, kProblem, h200).id();
  const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, shape_of(kProblem), h200);
  const auto excluded = std::find_if(space.begin(), space.end(), [&](const PruneDecision& d) {
    return !d.reason && first_call_exclusion(d.config, space);
  });
  REQUIRE(excluded != space.end());
  const std::string first_call = *first_call_exclusion(excluded->config, space);
  const TileConfig trimmed = trimmed_config(Role::kFwdUp, shape_of(kProblem));
  const auto left_with = [&](const std::vector<db::CandidateResult>& marks) {
    std::map<std::string, db::TuningRow> stored = whole;
    for (const db::CandidateResult& m : marks) stored.at(up).candidates.push_back(m);
    const std::vector<TuneItem> items = plan_tuning(r, h200, stored);
    return items.empty() ? std::vector<Role>{} : items.front().roles;
  };
  const auto mark = [](const TileConfig& c, const std::string& why) {
    return db::CandidateResult{c, std::nan(""), std::nan(""), true, why};
  };
  // Its first call's or budget's mark stays in the stored row, naming a config no tune times.
  CHECK(left_with({mark(trimmed, first_call)}).empty());
  CHECK(left_with({mark(trimmed, budget_skip_reason(5))}).empty());
  // A key with a mark on a config the space still holds is tuned again, stale marks or not.
  const std::vector<Role> fwd_up{Role::kFwdUp};
  CHECK(left_with({mark(trimmed, first_call), mark(excluded->config, first_call)}) == fwd_up);
  CHECK(left_with({mark(trimmed, first_call), mark(excluded->config, budget_skip_reason(5))}) == fwd_up);
}

TEST_CASE("the default tuning grid gives every T up to the largest a row of its own key", "[tuner]") {
  const auto h200 = cuda::fabricated::h200();
  // Qwen3-30B-A3B, worked by hand from token_block_m's rule (tile >= mean + 2 spreads): 16-row
  // tiles up to 9 pairs per expert (T = 144), 32 up to 22 (T = 352), 64 up to 49 (T = 784); the
  // buckets turn at 16, 32, 64, ... pairs per expert.
  CHECK(table_token_counts(128, 8, 32768) ==
        std::vector<long long>{144, 256, 352, 512, 784, 1024, 2048, 4096, 8192, 16384, 32768});
  for (auto [e, k] : {std::pair{128, 8}, std::pair{8, 2}, std::pair{32, 4}, std::pair{64, 6}, std::pair{1, 1}}) {
    INFO("E=" << e << " K=" << k);
    const std::vector<long long> grid = table_token_counts(e, k, 32768);
    REQUIRE(!grid.empty());
    CHECK(std::is_sorted(grid.begin(), grid.end()));
    CHECK(grid.back() == 32768);
    std::set<std::string> keys;
    for (long long t : grid) {
      const MoeProblem p{t, e, 2048, 768, k, DType::kBF16, Mode::kTraining};
      CHECK(keys.insert(tuning_key(Role::kFwdUp, p, h200).id()).second);  // one T per key
    }
    for (long long t = 1; t <= 32768; t += 1 + t / 64) {  // every T's key is in the grid
      const MoeProblem p{t, e, 2048, 768, k, DType::kBF16, Mode::kTraining};
      INFO("T=" << t);
      CHECK(keys.count(tuning_key(Role::kFwdUp, p, h200).id()) == 1);
    }
  }
  CHECK_THROWS_AS(table_token_counts(8, 9, 1024), InvalidArgument);
  CHECK_THROWS_AS(table_token_counts(8, 2, 0), InvalidArgument);
}

TEST_CASE("processes starting together tune a problem once and share its rows", "[tuner][multiprocess]") {
  TempDir dir("shared");
  ScopedEnv db("MOEJIT_DB", (dir / "tuning.sqlite").string());
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", "");
  const auto h200 = cuda::fabricated::h200();
  const std::vector<Role> roles = {Role::kFwdUp, Role::kFwdDown};
  const std::string marker = (dir / "tuned_by").string();
  CHECK(tuned_in_children(4, marker, [&] {
          db::TuningLookup lookup(dir / "tuning.sqlite", "", db::current_provenance(0),
                                  [](const db::TuningKey&) { return TileConfig{}; });
          const TuneFn fake = [&](const std::vector<Role>& missing) {
            std::ofstream(marker, std::ios::app) << ::getpid() << "\n";
            std::this_thread::sleep_for(std::chrono::milliseconds(300));  // others pile up on the lock
            std::vector<db::TuningRow> rows;
            for (Role role : missing) {
              db::TuningRow row;
              row.key = tuning_key(role, kProblem, h200);
              row.winner = gemm(128, 64, 32);
              row.median_ms = 0.5;
              row.candidates = {timed(row.winner, 0.5), timed(gemm(128, 128, 32), 0.7)};
              row.provenance = db::current_provenance(0);
              rows.push_back(row);
            }
            return rows;
          };
          const auto rows = tune_shared(kProblem, h200, roles, lookup, fake, {}, kBudgetS);
          return rows.size() == roles.size() && rows[0].winner == gemm(128, 64, 32) ? 0 : 2;
        }) == 1);
  CHECK(db::TuningDb(dir / "tuning.sqlite").rows().size() == roles.size());
}

TEST_CASE("a problem's modes share one tuning lock; other shapes and buckets have their own", "[tuner]") {
  TempDir dir("locks");
  const auto h200 = cuda::fabricated::h200();
  MoeProblem infer = kProblem, memeff = kProblem, wider = kProblem, more = kProblem;
  infer.mode = Mode::kInference;
  memeff.mode = Mode::kMemoryEfficient;
  wider.hidden *= 2;
  more.tokens *= 16;
  const std::filesystem::path user_db = dir / "tuning.sqlite";
  const auto lock = tuning_lock_path(user_db, kProblem, h200);
  CHECK(lock.parent_path() == dir / "tuning.sqlite.locks");
  CHECK(tuning_lock_path(user_db, infer, h200) == lock);
  CHECK(tuning_lock_path(user_db, memeff, h200) == lock);
  CHECK(tuning_lock_path(user_db, wider, h200) != lock);
  CHECK(tuning_lock_path(user_db, more, h200) != lock);
}

TEST_CASE("a stored row the caller refuses (pruned since) is tuned again, not taken as tuned", "[tuner]") {
  TempDir dir("refused");
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", "");
  const auto h200 = cuda::fabricated::h200();
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());  // where tune_shared records, never the caller's
  db::TuningRow stored;
  stored.key = tuning_key(Role::kFwdUp, kProblem, h200);
  stored.winner = gemm(128, 128, 32);
  stored.median_ms = 0.4;
  stored.provenance = db::current_provenance(0);
  db::TuningDb(db_path).record(stored);
  db::TuningLookup lookup(db_path, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
  int tuned = 0;
  const TuneFn fake = [&](const std::vector<Role>& missing) {
    tuned += static_cast<int>(missing.size());
    db::TuningRow row = stored;
    row.winner = gemm(128, 64, 32);
    return std::vector<db::TuningRow>{row};
  };
  const db::TuningDb::RowFilter refuse_stored = [&](const db::TuningRow& r) { return r.winner != stored.winner; };
  const auto rows = tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, fake, refuse_stored, kBudgetS);
  CHECK(tuned == 1);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].winner == gemm(128, 64, 32));
  // An allowed stored row counts as tuned by another process: nothing is tuned.
  tuned = 0;
  CHECK(tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, fake, {}, kBudgetS).size() == 1);
  CHECK(tuned == 0);
}

TEST_CASE("a tune is saved in the database its lookup read, though MOEJIT_DB names another since", "[tuner]") {
  TempDir dir("db-changed");
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", "");
  const auto h200 = cuda::fabricated::h200();
  const auto looked_up = dir / "looked-up.sqlite", set_since = dir / "set-since.sqlite";
  db::TuningLookup lookup(looked_up, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
  ScopedEnv db_env("MOEJIT_DB", set_since.string());  // set_option("DB") while the plan was being built
  const TuneFn fake = [&](const std::vector<Role>&) {
    db::TuningRow row;
    row.key = tuning_key(Role::kFwdUp, kProblem, h200);
    row.winner = gemm(128, 64, 32);
    row.median_ms = 0.5;
    row.provenance = db::current_provenance(0);
    return std::vector<db::TuningRow>{row};
  };
  REQUIRE(tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, fake, {}, kBudgetS).size() == 1);
  CHECK(db::TuningDb(looked_up).rows().size() == 1);
  CHECK(std::filesystem::exists(looked_up.string() + ".locks"));  // and locked beside it
  CHECK_FALSE(std::filesystem::exists(set_since));
  CHECK_FALSE(std::filesystem::exists(set_since.string() + ".locks"));
}

TEST_CASE("a first call's narrow row does not replace a whole-space row recorded while it tuned", "[tuner]") {
  TempDir dir("narrow-after-whole");
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());  // where tune_shared records
  const auto h200 = cuda::fabricated::h200();
  // A first call's candidates: the configs outside its space carry first_call_exclusion's reason.
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, shape, h200);
  db::TuningRow narrow;
  narrow.key = tuning_key(Role::kFwdUp, kProblem, h200);
  narrow.winner = gemm(128, 64, 32);
  narrow.median_ms = 0.5;
  narrow.provenance = db::current_provenance(0);
  for (const PruneDecision& p : space) {
    if (p.reason) continue;
    const auto why = first_call_exclusion(p.config, space);
    narrow.candidates.push_back({p.config, why ? std::nan("") : 0.5, why ? std::nan("") : 0.01, why.has_value(),
                                 why.value_or("")});
  }
  REQUIRE(tuned_partly(narrow, shape));
  db::TuningRow whole = narrow;
  whole.winner = gemm(128, 128, 64);
  whole.median_ms = 0.4;
  whole.candidates = {timed(whole.winner, 0.4), timed(narrow.winner, 0.5)};
  for (bool whole_first : {true, false}) {
    INFO((whole_first ? "moejit tune records while the plan tunes" : "no row meanwhile"));
    std::filesystem::remove(db_path);
    db::TuningLookup lookup(db_path, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
    const TuneFn first_call = [&](const std::vector<Role>&) {
      if (whole_first) db::TuningDb(db_path).record(whole);  // another process, not under the lock
      return std::vector<db::TuningRow>{narrow};
    };
    const auto rows = tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, first_call, {}, kBudgetS);
    REQUIRE(rows.size() == 1);
    const TileConfig expected = whole_first ? whole.winner : narrow.winner;
    CHECK(rows[0].winner == expected);
    CHECK(db::TuningDb(db_path).lookup(narrow.key, db::current_provenance(0))->winner == expected);
  }
}

TEST_CASE("a plan's partial row keeps only a whole stored row the caller accepts; a refused one is replaced",
          "[tuner]") {
  TempDir dir("partial-vs-stored");
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());  // where tune_shared records
  const auto h200 = cuda::fabricated::h200();
  const MoeShape shape = shape_of(kProblem);
  const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, shape, h200);
  std::vector<TileConfig> first_call, other;  // legal configs in and out of the first call's space
  for (const PruneDecision& d : space) {
    if (!d.reason) (first_call_exclusion(d.config, space) ? other : first_call).push_back(d.config);
  }
  REQUIRE(first_call.size() >= 2);
  REQUIRE(!other.empty());
  // The rows: tuned whole; timed over the first call's space; cut short by the budget; tuned whole
  // but still marked as a first call's on a config the space has lost since.
  const auto row_of = [&](const TileConfig& winner, const std::string& kind) {
    db::TuningRow row = whole_row(Role::kFwdUp, kProblem, winner);
    if (kind == "narrow") {
      row.candidates.push_back({other.front(), std::nan(""), std::nan(""), true,
                                *first_call_exclusion(other.front(), space)});
    } else if (kind == "cut") {
      row.candidates.push_back({other.front(), std::nan(""), std::nan(""), true, budget_skip_reason(60)});
    } else if (kind == "stale") {
      row.candidates.push_back({trimmed_config(Role::kFwdUp, shape), std::nan(""), std::nan(""), true,
                                *first_call_exclusion(other.front(), space)});
    }
    return row;
  };
  const db::TuningDb::RowFilter legal = [&](const db::TuningRow& row) { return winner_legal(row, shape, h200); };
  TileConfig illegal = first_call[1];
  illegal.block_k = 48;  // an imported row: no template takes it
  struct Case {
    TileConfig stored;
    std::string stored_kind, fresh_kind;
    bool keeps_stored;
  };
  const std::vector<Case> cases = {
      {illegal, "whole", "narrow", false},  // was kept, dropped by the resolver, tuned at every plan
      {illegal, "whole", "cut", false},
      {illegal, "whole", "whole", false},
      {first_call[1], "whole", "narrow", true},
      {first_call[1], "whole", "cut", true},  // was replaced by the budget-cut row
      {first_call[1], "whole", "whole", false},
      {first_call[1], "cut", "narrow", false},  // was kept as if whole
      {first_call[1], "cut", "cut", false},
      {first_call[1], "narrow", "narrow", false},
      {first_call[1], "stale", "narrow", true},  // was replaced, the stored row taken as partial
      {first_call[1], "stale", "cut", true},
      {first_call[1], "whole", "stale", false},  // was not recorded, the fresh row taken as partial
  };
  for (const Case& c : cases) {
    INFO("stored " << c.stored.name() << " (" << c.stored_kind << "), fresh row " << c.fresh_kind);
    std::filesystem::remove(db_path);
    db::TuningLookup lookup(db_path, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
    const db::TuningRow fresh = row_of(first_call[0], c.fresh_kind);
    const TuneFn tune = [&](const std::vector<Role>&) {
      db::TuningDb(db_path).record(row_of(c.stored, c.stored_kind));  // another process, or an import
      return std::vector<db::TuningRow>{fresh};
    };
    const auto rows = tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, tune, legal, kBudgetS);
    REQUIRE(rows.size() == 1);
    const TileConfig expected = c.keeps_stored ? c.stored : fresh.winner;
    CHECK(rows[0].winner == expected);
    CHECK(db::TuningDb(db_path).lookup(fresh.key, db::current_provenance(0))->winner == expected);
  }
}

TEST_CASE("a plan's tuned rows are saved in one transaction; a row that cannot be saved costs no other", "[tuner]") {
  TempDir dir("save-all");
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());  // where tune_shared records
  const auto h200 = cuda::fabricated::h200();
  const std::vector<Role> roles = {Role::kFwdUp, Role::kFwdDown, Role::kBwdDx};
  db::TuningLookup lookup(db_path, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
  const TuneFn tune = [&](const std::vector<Role>& missing) {
    std::vector<db::TuningRow> rows;
    for (Role role : missing) rows.push_back(whole_row(role, kProblem, gemm(128, 64, 32)));
    rows[1].median_ms = std::nan("");  // refused by validate(): each row had its own transaction, and a
                                       // failing one dropped the rows after it
    return rows;
  };
  CHECK(tune_shared(kProblem, h200, roles, lookup, tune, {}, kBudgetS).size() == roles.size());
  db::TuningDb db(db_path);
  CHECK(db.lookup(tuning_key(Role::kFwdUp, kProblem, h200), db::current_provenance(0)));
  CHECK_FALSE(db.lookup(tuning_key(Role::kFwdDown, kProblem, h200), db::current_provenance(0)));
  CHECK(db.lookup(tuning_key(Role::kBwdDx, kProblem, h200), db::current_provenance(0)));
}

TEST_CASE("tuned rows are not saved into another user's database, and nothing is made beside it", "[tuner]") {
  MOEJIT_REQUIRE_USERS();
  TempDir dir("not-mine");
  using perms = std::filesystem::perms;
  if (test::running_as_root()) REQUIRE(::chown(dir.path().c_str(), test::kOwnerUid, test::kOwnerUid) == 0);
  std::filesystem::permissions(dir.path(), perms::all | perms::sticky_bit);
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());
  const auto h200 = cuda::fabricated::h200();
  REQUIRE(test::as_owner([&] { db::TuningDb(db_path).record(whole_row(Role::kFwdUp, kProblem, gemm(128, 64, 32))); }) ==
          0);
  CHECK(test::as_reader(db_path, [&] {
          db::TuningLookup lookup(db_path, {}, db::current_provenance(0),
                                  [](const db::TuningKey&) { return TileConfig{}; });
          int tuned = 0;
          const TuneFn tune = [&](const std::vector<Role>& missing) {
            tuned += static_cast<int>(missing.size());
            return std::vector<db::TuningRow>{whole_row(Role::kFwdDown, kProblem, gemm(128, 64, 32))};
          };
          const auto rows = tune_shared(kProblem, h200, {Role::kFwdUp, Role::kFwdDown}, lookup, tune, {}, kBudgetS);
          test::expect(rows.size() == 2 && tuned == 1, "the owner's row is not used, or the other not tuned");
          test::expect(db::TuningDb(db_path, db::OpenMode::kReadOnly).rows().size() == 1, "a row was saved");
        }) == 0);
  CHECK_FALSE(std::filesystem::exists(db_path.string() + "-wal"));
  CHECK_FALSE(std::filesystem::exists(db_path.string() + "-shm"));
  CHECK(test::as_owner([&] {
          db::TuningDb(db_path).record(whole_row(Role::kFwdDown, kProblem, gemm(128, 128, 32)));
        }) == 0);
}

TEST_CASE("ranks finding a damaged user database tune a problem once: one empties it, the others read its rows",
          "[tuner][multiprocess]") {
  // Before, every rank tuned in turn under the lock, none could save, and so at every job start.
  TempDir dir("damaged-shared");
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());
  // A database's header, then garbage: damage (another program's file would be left alone).
  fs::atomic_write(db_path, std::string("SQLite format 3\0", 16) + std::string(8192 - 16, 'x'));
  const auto h200 = cuda::fabricated::h200();
  const std::vector<Role> roles = {Role::kFwdUp, Role::kFwdDown};
  const std::string marker = (dir / "tuned_by").string();
  CHECK(tuned_in_children(4, marker, [&] {
          db::TuningLookup lookup(db_path, "", db::current_provenance(0),
                                  [](const db::TuningKey&) { return TileConfig{}; });
          // As the resolver does before tuning: the damaged file is skipped.
          lookup.resolve(tuning_key(Role::kFwdUp, kProblem, h200));
          const TuneFn fake = [&](const std::vector<Role>& missing) {
            std::ofstream(marker, std::ios::app) << ::getpid() << "\n";
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            std::vector<db::TuningRow> rows;
            for (Role role : missing) rows.push_back(whole_row(role, kProblem, gemm(128, 64, 32)));
            return rows;
          };
          return tune_shared(kProblem, h200, roles, lookup, fake, {}, kBudgetS).size() == roles.size() ? 0 : 2;
        }) == 1);
  CHECK(db::TuningDb(db_path).rows().size() == roles.size());
  int copies = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    copies += f.path().filename().string().rfind("tuning.sqlite.corrupt-", 0) == 0;
  }
  CHECK(copies == 1);
}

TEST_CASE("a plan's own lookup lets go of a malformed user database, so its tuner can empty it", "[tuner]") {
  // A malformed file whose first pages are whole opens, and the lookup keeps it open: emptying it
  // needs it alone.
  TempDir dir("malformed-own");
  const auto db_path = dir / "tuning.sqlite";
  ScopedEnv db_env("MOEJIT_DB", db_path.string());
  const auto h200 = cuda::fabricated::h200();
  {
    db::TuningDb db(db_path);
    for (int n = 0; n < 60; ++n) {
      MoeProblem other = kProblem;
      other.hidden = 1024 + 8 * n;
      db.record(whole_row(Role::kFwdDown, other, gemm(128, 64, 32)));
    }
  }
  // The candidates' root page: read only for a row found, and this plan's key has none.
  const std::size_t page = static_cast<std::size_t>(
      db::Connection(db_path, db::OpenMode::kReadOnly).query_int("PRAGMA page_size"));
  const std::size_t root = static_cast<std::size_t>(db::Connection(db_path, db::OpenMode::kReadOnly)
                                                        .query_int("SELECT rootpage FROM sqlite_master WHERE name = 'candidates'"));
  std::string bytes = fs::read_all(db_path).value();
  REQUIRE(bytes.size() >= root * page);
  std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>((root - 1) * page), page, '\xa5');
  fs::atomic_write(db_path, bytes);
  db::TuningLookup lookup(db_path, {}, db::current_provenance(0), [](const db::TuningKey&) { return TileConfig{}; });
  REQUIRE(lookup.resolve(tuning_key(Role::kFwdUp, kProblem, h200)).source == db::Resolved::Source::kHeuristic);
  const TuneFn tune = [&](const std::vector<Role>& missing) {
    std::vector<db::TuningRow> rows;
    for (Role role : missing) rows.push_back(whole_row(role, kProblem, gemm(128, 64, 32)));
    return rows;
  };
  CHECK(tune_shared(kProblem, h200, {Role::kFwdUp}, lookup, tune, {}, kBudgetS).size() == 1);
  db::TuningDb db(db_path);
  CHECK_NOTHROW(db.check_intact());
  CHECK(db.lookup(tuning_key(Role::kFwdUp, kProblem, h200), db::current_provenance(0)));
  CHECK(lookup.resolve(tuning_key(Role::kFwdUp, kProblem, h200)).source == db::Resolved::Source::kMemory);
}

TEST_CASE("a malformed MOEJIT_AUTOTUNE or tuning budget fails every resolve, covered by the tables or not",
          "[tuner][env]") {
  TempDir dir("autotune-env");
  ScopedEnv db("MOEJIT_DB", (dir / "tuning.sqlite").string());
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", (dir / "no-shipped-tables").string());
  const auto h200 = cuda::fabricated::h200();
  const auto resolves = [&](bool allow_tuning) { return resolve_configs(kProblem, h200, Options{}, allow_tuning); };
  for (bool covered : {false, true}) {
    INFO((covered ? "every role has a row" : "no rows"));
    if (covered) {
      db::TuningDb user(dir / "tuning.sqlite");
      for (const auto& [id, row] : tuned_whole(kProblem)) user.record(row);
    }
    for (const char* bad : {"false", "off", "1x"}) {
      INFO(bad);
      ScopedEnv autotune("MOEJIT_AUTOTUNE", bad);
      CHECK_THROWS_WITH(resolves(false), Catch::Contains("MOEJIT_AUTOTUNE"));
      // With rows for every role nothing is tuned, so no device is asked.
      if (covered) CHECK_THROWS_WITH(resolves(true), Catch::Contains("MOEJIT_AUTOTUNE"));
    }
    {
      ScopedEnv autotune("MOEJIT_AUTOTUNE", "0");
      ScopedEnv budget("MOEJIT_TUNE_BUDGET_S", "10s");
      CHECK_THROWS_WITH(resolves(false), Catch::Contains("MOEJIT_TUNE_BUDGET_S"));
    }
    ScopedEnv autotune("MOEJIT_AUTOTUNE", "0");
    CHECK((resolves(false).at(Role::kFwdUp).source == "heuristic") != covered);
    if (covered) CHECK(resolves(true).at(Role::kFwdUp).source == "memory");  // the user DB's row, kept
  }
}

TEST_CASE("config overrides naming no role are rejected; a role the mode does not run is ignored", "[tuner]") {
  TempDir dir("overrides");
  ScopedEnv db("MOEJIT_DB", (dir / "tuning.sqlite").string());
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", "");
  const auto h200 = cuda::fabricated::h200();
  MoeProblem infer = kProblem;
  infer.mode = Mode::kInference;
  Options o;
  o.config_overrides["fwd-up"] = "bm128_bn128_bk64_s4_w8_g8_tma_ws";
  CHECK_THROWS_WITH(resolve_configs(infer, h200, o, false),
                    Catch::StartsWith("config_overrides") && Catch::Contains("fwd-up"));
  o.config_overrides.clear();
  o.config_overrides["bwd_down"] = "any name: inference runs no bwd_down";
  const auto configs = resolve_configs(infer, h200, o, false);
  CHECK(configs.count(Role::kFwdUp) == 1);
  CHECK(configs.count(Role::kBwdDown) == 0);
}

TEST_CASE("a stored winner outside its role's space is passed over, not handed to NVRTC", "[tuner]") {
  TempDir dir("outside-space");
  ScopedEnv db("MOEJIT_DB", (dir / "tuning.sqlite").string());
  ScopedEnv shipped("MOEJIT_SHIPPED_DB_DIR", (dir / "no-shipped-tables").string());
  const auto h200 = cuda::fabricated::h200();
  // A hand-edited row: BLOCK_K 48 passes the row checks and pruning, but no template takes it.
  db::TuningRow edited;
  edited.key = tuning_key(Role::kFwdDown, kProblem, h200);
  edited.winner = gemm(128, 128, 48);
  edited.median_ms = 0.1;
  edited.provenance = db::current_provenance(0);
  db::TuningDb((dir / "tuning.sqlite")).record(edited);
  const MoeShape shape{kProblem.tokens, kProblem.experts, kProblem.hidden, kProblem.intermediate, kProblem.topk,
                       kProblem.dtype};
  REQUIRE_FALSE(prune_reason(Role::kFwdDown, edited.winner, shape, h200));
  const auto configs = resolve_configs(kProblem, h200, Options{}, false);
  CHECK(configs.at(Role::kFwdDown).source == "heuristic");
  CHECK(configs.at(Role::kFwdDown).config == default_config(Role::kFwdDown, shape, h200));
  // The same row with a config of the space is taken.
  edited.winner = gemm(128, 128, 64);
  db::TuningDb((dir / "tuning.sqlite")).record(edited);
  CHECK(resolve_configs(kProblem, h200, Options{}, false).at(Role::kFwdDown).source == "user_db");
}

TEST_CASE("moejit db list --stale shows rows tuned by another build", "[tuner][cli]") {
  TempDir dir("stale");
  const auto path = dir / "t.sqlite";
  {
    db::TuningDb db(path);
    for (const char* hash : {"0123456789abcdef", ""}) {
      db::TuningRow row;
      row.key = tuning_key(hash[0] ? Role::kFwdUp : Role::kFwdDown, kProblem, cuda::fabricated::h200());
      row.winner = gemm(128, 64, 32);
      row.median_ms = 0.5;
      row.provenance = db::current_provenance(0);
      if (hash[0]) row.provenance.template_hash = hash;
      db.record(row);
    }
  }
  auto r = test::run_command(test::cli() + " db list --stale --db " + path.string());
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("fwd_up") && Catch::Contains("1 row"));
  CHECK_THAT(r.output, !Catch::Contains("fwd_down"));
}

namespace {

db::TuningDb shipped_h200_table() {
  std::ifstream in(std::filesystem::path(MOEJIT_TEST_SHIPPED_DB_DIR) / "NVIDIA_H200.json");
  std::stringstream text;
  text << in.rdbuf();
  db::TuningDb table = db::TuningDb::in_memory();
  table.import_json(text.str());
  return table;
}

// A shape of a row's key: the grid's T for its bucket and token tile height.
std::optional<MoeShape> key_shape(const db::TuningKey& k) {
  const auto h200 = cuda::fabricated::h200();
  std::optional<MoeShape> shape;
  for (long long t : table_token_counts(k.experts, k.topk, kTableMaxTokens)) {
    const MoeProblem p{t, k.experts, k.hidden, k.intermediate, k.topk, k.dtype, Mode::kTraining};
    if (tuning_key(k.role, p, h200).tpe_bucket == k.tpe_bucket && tuning_key(k.role, p, h200).block_m == k.block_m) {
      shape = MoeShape{t, k.experts, k.hidden, k.intermediate, k.topk, k.dtype};
    }
  }
  return shape;
}

}  // namespace

TEST_CASE("every shipped H200 row's winner is in its role's space and passes pruning, so plans take it", "[tuner][db]") {
  // The resolver passes over a stored winner outside the space (a hand-edited BLOCK_K) or pruned
  // since; a shipped row it passed over would leave its key to self-tuning.
  int checked = 0;
  for (const db::TuningRow& row : shipped_h200_table().rows()) {
    const db::TuningKey& k = row.key;
    INFO(k.id() << " " << row.winner.name());
    const std::optional<MoeShape> shape = key_shape(k);
    REQUIRE(shape);
    const std::vector<TileConfig> space = config_space(k.role, *shape);
    CHECK(std::find(space.begin(), space.end(), row.winner) != space.end());
    CHECK_FALSE(prune_reason(k.role, row.winner, *shape, cuda::fabricated::h200()));
    ++checked;
  }
  CHECK(checked > 500);
}

TEST_CASE("the GEMM roles' H200 defaults run close to every shipped row's winner", "[tuner][db]") {
  // Untabled shapes run the defaults when self-tuning is off: they are picked from the table's
  // measurements (config_space.cpp), and a retune that moves them away shows here. Per row the
  // default is at most 26 % slower than the winner (the dW roles' 12 %), and per role and token
  // tile height 6 % on the geometric mean.
  std::map<std::string, std::pair<double, int>> log_ratios;  // "role bmN" -> (sum of logs, rows)
  for (const db::TuningRow& row : shipped_h200_table().rows()) {
    const db::TuningKey& k = row.key;
    if (role_kind(k.role) != RoleKind::kExpertGemm && role_kind(k.role) != RoleKind::kTokenGemm) continue;
    const std::optional<MoeShape> shape = key_shape(k);
    REQUIRE(shape);
    const TileConfig d = default_config(k.role, *shape, cuda::fabricated::h200());
    INFO(k.id() << " default " << d.name() << ", winner " << row.winner.name());
    const auto timed = std::find_if(row.candidates.begin(), row.candidates.end(),
                                    [&](const db::CandidateResult& c) { return c.config == d && !c.rejected; });
    REQUIRE(timed != row.candidates.end());
    const double ratio = timed->median_ms / row.median_ms;
    CHECK(ratio <= (role_kind(k.role) == RoleKind::kExpertGemm ? 1.12 : 1.26));
    auto& [sum, rows] = log_ratios[std::string(role_name(k.role)) + " bm" + std::to_string(k.block_m)];
    sum += std::log(ratio);
    ++rows;
  }
  CHECK(log_ratios.size() >= 20);
  for (const auto& [group, sum_rows] : log_ratios) {
    INFO(group << ": " << sum_rows.second << " rows");
    CHECK(std::exp(sum_rows.first / sum_rows.second) <= 1.06);
  }
}

TEST_CASE("one GPU's timings take a host-wide lock named by its UUID; a fabricated device takes none", "[tuner]") {
  TempDir tmp("gpu-lock");
  ScopedEnv at("TMPDIR", tmp.path().string());
  cuda::DeviceInfo gpu = cuda::fabricated::h200();
  CHECK_FALSE(lock_gpu_timing(gpu, 60).has_value());  // no UUID: nothing to name it by
  gpu.uuid = "0123456789abcdef0123456789abcdef";
  const std::filesystem::path file = *env::gpu_lock_dir() / ("gpu-" + gpu.uuid + ".lock");
  CHECK(file.parent_path().parent_path().parent_path() == tmp.path());
  const auto try_lock = [&] {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const bool got = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return got;
  };
  {
    const std::optional<fs::FileLock> held = lock_gpu_timing(gpu, 60);
    REQUIRE(held.has_value());
    CHECK_FALSE(try_lock());  // another open file description, as another process or thread has
    // A wait that runs out says so by its type: the tuner then runs nothing and makes no row.
    CHECK_THROWS_AS(fs::FileLock(file, std::chrono::milliseconds(50)), fs::LockTimeout);
  }
  CHECK(try_lock());
  cuda::DeviceInfo other = gpu;
  other.uuid = "fedcba9876543210fedcba9876543210";
  const std::optional<fs::FileLock> first = lock_gpu_timing(gpu, 60), second = lock_gpu_timing(other, 60);
  CHECK((first.has_value() && second.has_value()));  // two GPUs are tuned at once
}

TEST_CASE("a process waits on another's tuning five minutes, or the holder's budget and a minute more", "[tuner]") {
  CHECK(tuning_lock_timeout(60) == std::chrono::minutes(5));
  CHECK(tuning_lock_timeout(0.5) == std::chrono::minutes(5));
  CHECK(tuning_lock_timeout(240) == std::chrono::minutes(5));
  CHECK(tuning_lock_timeout(600) == std::chrono::seconds(660));
  CHECK(tuning_lock_timeout(599.2) == std::chrono::seconds(660));
  CHECK(tuning_lock_timeout(env::kMaxTuneBudgetS) == std::chrono::seconds(1000060));
  // A problem's holder may first wait that long on its GPU's lock, then tune.
  CHECK(problem_lock_timeout(60) == std::chrono::minutes(10));
  CHECK(problem_lock_timeout(600) == std::chrono::seconds(1320));
}
