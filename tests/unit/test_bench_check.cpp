// moejit_bench's check of a step's outputs (bench/check.cpp) without a GPU: the sample it reads,
// its reference built in pieces against the whole fp64 reference, and that it passes what a
// correct step stores and fails what a wrong one leaves (poison, a skipped row, a small bias).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "check.hpp"
#include "core/float16.hpp"
#include "moe/reference/moe_reference.hpp"

using namespace moejit;
using namespace moejit::bench;

namespace {

struct Case {
  MoeProblem problem;
  HostInputs inputs;
  HostWeights weights;
};

std::vector<std::uint16_t> random_bits(std::size_t n, DType dt, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& e : v) e = dist(rng);
  return to_storage(dt, v);
}

// T=600, E=4, H=24, I=20, K=2, each token's two experts among 0..2: expert 3 gets no pair, the
// others about 400 each, more than one reference piece holds.
Case random_case(DType dt) {
  Case c;
  c.problem = {600, 4, 24, 20, 2, dt, Mode::kTraining};
  const std::size_t T = 600, E = 4, H = 24, I = 20, K = 2;
  std::mt19937 rng(11);
  c.inputs.x = random_bits(T * H, dt, -1, 1, rng);
  c.inputs.d_out = random_bits(T * H, dt, -1, 1, rng);
  c.inputs.topk_weights = random_bits(T * K, dt, 0.05, 1, rng);
  for (std::size_t t = 0; t < T; ++t) {
    const int first = static_cast<int>(rng() % 3);
    c.inputs.topk_ids.push_back(first);
    c.inputs.topk_ids.push_back((first + 1 + static_cast<int>(rng() % 2)) % 3);
  }
  c.weights.w1 = random_bits(E * 2 * I * H, dt, -0.2, 0.2, rng);
  c.weights.w2 = random_bits(E * H * I, dt, -0.2, 0.2, rng);
  return c;
}

// The whole problem's fp64 reference, read at the sample in SampledOutputs' layout.
SampledOutputs whole_reference_at(const Case& c, const CheckSample& s) {
  const MoeProblem& p = c.problem;
  const DType dt = p.dtype;
  reference::MoeTensors m;
  m.tokens = p.tokens;
  m.experts = p.experts;
  m.hidden = p.hidden;
  m.intermediate = p.intermediate;
  m.topk = p.topk;
  m.x = from_storage(dt, c.inputs.x);
  m.w1 = from_storage(dt, c.weights.w1);
  m.w2 = from_storage(dt, c.weights.w2);
  m.topk_ids = c.inputs.topk_ids;
  m.topk_weights = from_storage(dt, c.inputs.topk_weights);
  reference::ReferenceOptions options;
  options.round_stored = [dt](double v) { return round_to(dt, v); };
  const auto f = reference::moe_forward(m, options);
  const auto b = reference::moe_backward(m, from_storage(dt, c.inputs.d_out), options);
  const std::size_t H = p.hidden, I = p.intermediate, K = p.topk;
  SampledOutputs w;
  for (long long t : s.tokens) {
    w.out.insert(w.out.end(), f.out.begin() + t * H, f.out.begin() + (t + 1) * H);
    w.dx.insert(w.dx.end(), b.dx.begin() + t * H, b.dx.begin() + (t + 1) * H);
    w.d_topk_weights.insert(w.d_topk_weights.end(), b.d_topk_weights.begin() + t * K,
                            b.d_topk_weights.begin() + (t + 1) * K);
  }
  for (const CheckSample::Columns& ec : s.weights) {
    const std::size_t e = ec.expert;
    for (int i : ec.columns) {
      for (std::size_t row : {std::size_t(i), I + i}) {
        const auto from = b.dw1.begin() + static_cast<std::ptrdiff_t>((e * 2 * I + row) * H);
        w.dw1.insert(w.dw1.end(), from, from + static_cast<std::ptrdiff_t>(H));
      }
      for (std::size_t h = 0; h < H; ++h) w.dw2.push_back(b.dw2[(e * H + h) * I + i]);
    }
  }
  return w;
}

// The largest |a - b| over the largest |b|.
double scaled_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / std::max(scale, 1e-300);
}

// What a correct step leaves: the reference rounded to the storage dtype.
SampledOutputs stored(const SampledOutputs& want, DType dt) {
  SampledOutputs got = want;
  for (auto* v : {&got.out, &got.dx, &got.d_topk_weights, &got.dw1, &got.dw2}) {
    for (double& e : *v) e = round_to(dt, e);
  }
  return got;
}

}  // namespace

TEST_CASE("the check's sample: distinct tokens, experts and columns in range, every token of a small T", "[bench]") {
  const MoeProblem p{32768, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  const CheckSample s = choose_sample(p, 5);
  REQUIRE(s.tokens.size() == kCheckTokens);
  CHECK(std::is_sorted(s.tokens.begin(), s.tokens.end()));
  CHECK(std::adjacent_find(s.tokens.begin(), s.tokens.end()) == s.tokens.end());
  CHECK(s.tokens.front() >= 0);
  CHECK(s.tokens.back() < p.tokens);
  REQUIRE(s.weights.size() == kCheckExperts);
  std::set<int> experts;
  for (const CheckSample::Columns& c : s.weights) {
    experts.insert(c.expert);
    CHECK((c.expert >= 0 && c.expert < p.experts));
    REQUIRE(c.columns.size() == kCheckColumns);
    CHECK(std::is_sorted(c.columns.begin(), c.columns.end()));
    CHECK(std::adjacent_find(c.columns.begin(), c.columns.end()) == c.columns.end());
    CHECK((c.columns.front() >= 0 && c.columns.back() < p.intermediate));
  }
  CHECK(experts.size() == kCheckExperts);
  CHECK(choose_sample(p, 5).tokens == s.tokens);
  CHECK(choose_sample(p, 6).tokens != s.tokens);

  const CheckSample small = choose_sample({3, 2, 8, 1, 1, DType::kBF16, Mode::kTraining}, 5);
  CHECK(small.tokens == std::vector<long long>{0, 1, 2});
  REQUIRE(small.weights.size() == 2);
  CHECK(small.weights[0].columns == std::vector<int>{0});
}

TEST_CASE("the check's reference, built in pieces, is the whole problem's fp64 reference at the sample", "[bench]") {
  for (DType dt : {DType::kBF16, DType::kFP16}) {
    INFO(dtype_name(dt));
    const Case c = random_case(dt);
    const CheckSample s = choose_sample(c.problem, 3);
    REQUIRE(s.weights.size() == 4);  // every expert, the one without pairs too
    const SampledOutputs pieces = reference_outputs(c.problem, s, c.inputs, c.weights);
    const SampledOutputs whole = whole_reference_at(c, s);
    CHECK(scaled_difference(pieces.out, whole.out) < 1e-12);
    CHECK(scaled_difference(pieces.dx, whole.dx) < 1e-12);
    CHECK(scaled_difference(pieces.d_topk_weights, whole.d_topk_weights) < 1e-12);
    CHECK(scaled_difference(pieces.dw1, whole.dw1) < 1e-12);
    CHECK(scaled_difference(pieces.dw2, whole.dw2) < 1e-12);
    // Expert 3 has no pairs: its gradients are zeros, which the device must still write.
    const auto slot = std::find_if(s.weights.begin(), s.weights.end(), [](const auto& w) { return w.expert == 3; });
    const std::size_t first = static_cast<std::size_t>(slot - s.weights.begin()) * kCheckColumns;
    const std::size_t H = c.problem.hidden;
    CHECK(std::all_of(pieces.dw2.begin() + first * H, pieces.dw2.begin() + (first + kCheckColumns) * H,
                      [](double v) { return v == 0.0; }));
    CHECK(std::any_of(pieces.dw2.begin(), pieces.dw2.end(), [](double v) { return v != 0.0; }));
  }
}

TEST_CASE("the check passes what a correct step stores and fails poison, a skipped row or a bias", "[bench]") {
  const Case c = random_case(DType::kBF16);
  const MoeProblem& p = c.problem;
  const CheckSample s = choose_sample(p, 3);
  const SampledOutputs want = reference_outputs(p, s, c.inputs, c.weights);
  const SampledOutputs good = stored(want, p.dtype);
  const Checked all = checked_outputs(StepKind::kFull);
  const std::size_t H = p.hidden;
  const double nan = std::numeric_limits<double>::quiet_NaN();

  const CheckResult ok = judge(p, all, s, good, want);
  CHECK(ok.ok);
  CHECK(ok.failure.empty());
  CHECK(ok.max_rel_err > 0);
  CHECK(ok.max_rel_err < check_tolerance(p.dtype));

  SECTION("an output left poisoned") {
    SampledOutputs got = good;
    std::fill(got.out.begin() + 5 * H, got.out.begin() + 6 * H, nan);
    const CheckResult r = judge(p, all, s, got, want);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.failure, Catch::StartsWith("out: 24 of") && Catch::Contains("not finite") &&
                              Catch::Contains(fmt::format("token {}", s.tokens[5])));
    CHECK(std::isinf(r.max_rel_err));
  }
  SECTION("a score gradient left poisoned") {
    SampledOutputs got = good;
    got.d_topk_weights[7] = nan;
    const CheckResult r = judge(p, all, s, got, want);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.failure, Catch::StartsWith("d_topk_weights: 1 of") &&
                              Catch::Contains(fmt::format("token {}, element 1", s.tokens[3])));
  }
  SECTION("a weight-gradient row of a skipped tile") {
    // The up row of the second column of the first sampled expert that has pairs.
    const auto slot = static_cast<std::size_t>(
        std::find_if(s.weights.begin(), s.weights.end(), [](const auto& w) { return w.expert != 3; }) -
        s.weights.begin());
    const std::size_t row = (slot * kCheckColumns + 1) * 2 + 1;
    SampledOutputs got = good;
    std::fill(got.dw1.begin() + row * H, got.dw1.begin() + (row + 1) * H, 0.0);
    const CheckResult r = judge(p, all, s, got, want);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.failure, Catch::StartsWith(fmt::format("dW1: expert {} row {} (up) relative error 0.",
                                                        s.weights[slot].expert,
                                                        p.intermediate + s.weights[slot].columns[1])));
  }
  SECTION("a bias of 3 % on every value of dx") {
    SampledOutputs got = good;
    for (double& v : got.dx) v *= 1.03;
    const CheckResult r = judge(p, all, s, got, want);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.failure, Catch::StartsWith("dx: relative L2 error 0.03"));
  }
  SECTION("a step reads only what it writes") {
    SampledOutputs got = good;
    std::fill(got.dw1.begin(), got.dw1.end(), nan);
    std::fill(got.dw2.begin(), got.dw2.end(), nan);
    CHECK(judge(p, checked_outputs(StepKind::kFrozen), s, got, want).ok);
    CHECK_FALSE(judge(p, checked_outputs(StepKind::kMemEff), s, got, want).ok);
    std::fill(got.dx.begin(), got.dx.end(), nan);
    std::fill(got.d_topk_weights.begin(), got.d_topk_weights.end(), nan);
    CHECK(judge(p, checked_outputs(StepKind::kForward), s, got, want).ok);
    CHECK(judge(p, checked_outputs(StepKind::kInference), s, got, want).ok);
    CHECK_FALSE(judge(p, checked_outputs(StepKind::kBackward), s, got, want).ok);
  }
}

TEST_CASE("the check's bounds are the GPU tests' (1e-2 in bf16, half in fp16); a mode is held to what it writes",
          "[bench]") {
  CHECK(check_tolerance(DType::kBF16) == 1e-2);
  CHECK(check_tolerance(DType::kFP16) == 0.5e-2);
  CHECK(checked_outputs(StepKind::kForward).backward == false);
  CHECK(checked_outputs(StepKind::kFrozen).backward);
  CHECK_FALSE(checked_outputs(StepKind::kFrozen).weight_gradients);
  CHECK(checked_outputs(StepKind::kBackward).weight_gradients);
  CHECK(checked_outputs(StepKind::kFull).weight_gradients);
}
