// The fp64 MoE reference against an inline direct formula and central finite differences, and
// the bf16/fp16 host conversions the GPU tests build their inputs with.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "core/float16.hpp"
#include "moe/reference/moe_reference.hpp"
#include "moejit/error.hpp"

using namespace moejit;
using reference::MoeTensors;

namespace {

std::vector<double> random_values(std::size_t n, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& e : v) e = dist(rng);
  return v;
}

MoeTensors random_problem(long long tokens, int experts, int hidden, int inter, int topk,
                          std::vector<std::int32_t> ids, std::mt19937& rng) {
  MoeTensors m;
  m.tokens = tokens;
  m.experts = experts;
  m.hidden = hidden;
  m.intermediate = inter;
  m.topk = topk;
  const auto t = static_cast<std::size_t>(tokens);
  m.x = random_values(t * hidden, rng, -1, 1);
  m.w1 = random_values(std::size_t(experts) * 2 * inter * hidden, rng, -1, 1);
  m.w2 = random_values(std::size_t(experts) * hidden * inter, rng, -1, 1);
  m.topk_ids = std::move(ids);
  m.topk_weights = random_values(t * topk, rng, 0.1, 1);
  return m;
}

// T=3, E=4, H=5, I=3, K=2; expert 2 receives no token.
MoeTensors tiny_problem(std::mt19937& rng) { return random_problem(3, 4, 5, 3, 2, {0, 1, 3, 1, 1, 0}, rng); }

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double relative_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(diff / dot(b, b));
}

bool all_zero(const double* begin, std::size_t n) {
  return std::all_of(begin, begin + n, [](double v) { return v == 0.0; });
}

}  // namespace

TEST_CASE("reference forward matches the direct formula", "[reference]") {
  std::mt19937 rng(1234);
  const MoeTensors m = tiny_problem(rng);
  const int T = 3, E = 4, H = 5, I = 3, K = 2;
  const auto f = reference::moe_forward(m);
  REQUIRE(f.out.size() == std::size_t(T * H));
  REQUIRE(f.pre_act.size() == std::size_t(T * K * 2 * I));

  std::vector<double> out(T * H, 0.0);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      const int p = t * K + k, e = m.topk_ids[p];
      REQUIRE((e >= 0 && e < E));
      std::vector<double> a(I);
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int h = 0; h < H; ++h) {
          g += m.x[t * H + h] * m.w1[(e * 2 * I + i) * H + h];
          u += m.x[t * H + h] * m.w1[(e * 2 * I + I + i) * H + h];
        }
        a[i] = g / (1 + std::exp(-g)) * u;
        CHECK(f.pre_act[p * 2 * I + i] == Approx(g).epsilon(1e-12));
        CHECK(f.pre_act[p * 2 * I + I + i] == Approx(u).epsilon(1e-12));
        CHECK(f.act[p * I + i] == Approx(a[i]).epsilon(1e-12));
      }
      for (int h = 0; h < H; ++h) {
        double y = 0;
        for (int i = 0; i < I; ++i) y += a[i] * m.w2[(e * H + h) * I + i];
        CHECK(f.y[p * H + h] == Approx(y).epsilon(1e-12));
        out[t * H + h] += m.topk_weights[p] * y;
      }
    }
  }
  for (int i = 0; i < T * H; ++i) CHECK(f.out[i] == Approx(out[i]).epsilon(1e-12));
}

TEST_CASE("reference backward matches central finite differences", "[reference]") {
  std::mt19937 rng(99);
  const MoeTensors base = tiny_problem(rng);
  const auto d_out = random_values(base.x.size(), rng, -1, 1);
  const auto b = reference::moe_backward(base, d_out);
  const reference::ReferenceOptions serial{.threads = 1};

  // L = sum(out * dO), so dL/dtheta is what backward returns for each input.
  auto check = [&](const char* name, std::vector<double> MoeTensors::*field, const std::vector<double>& grad) {
    MoeTensors m = base;
    std::vector<double>& theta = m.*field;
    REQUIRE(grad.size() == theta.size());
    double worst = 0;
    std::size_t worst_at = 0;
    for (std::size_t i = 0; i < theta.size(); ++i) {
      const double keep = theta[i], step = 1e-5;
      theta[i] = keep + step;
      const double up = dot(reference::moe_forward(m, serial).out, d_out);
      theta[i] = keep - step;
      const double down = dot(reference::moe_forward(m, serial).out, d_out);
      theta[i] = keep;
      const double fd = (up - down) / (2 * step);
      // An exactly zero gradient (the unused expert) must be matched exactly.
      const double err = grad[i] == 0 ? std::fabs(fd) : std::fabs(fd - grad[i]) / std::fabs(grad[i]);
      if (err > worst) {
        worst = err;
        worst_at = i;
      }
    }
    INFO(name << ": worst relative error " << worst << " at element " << worst_at << " (analytic "
              << grad[worst_at] << ")");
    CHECK(worst < 1e-6);
  };
  check("dx", &MoeTensors::x, b.dx);
  check("dw1", &MoeTensors::w1, b.dw1);
  check("dw2", &MoeTensors::w2, b.dw2);
  check("d_topk_weights", &MoeTensors::topk_weights, b.d_topk_weights);
}

TEST_CASE("reference drops expert ids outside [0, E)", "[reference]") {
  std::mt19937 rng(7);
  // Slots 1 (id -1) and 3 (id E) are dropped. The same problem with those slots routed to the
  // otherwise unused expert 2 at weight 0 must give the same results.
  const MoeTensors dropped = random_problem(3, 4, 5, 3, 2, {0, -1, 3, 4, 1, 0}, rng);
  MoeTensors zeroed = dropped;
  for (int p : {1, 3}) zeroed.topk_ids[p] = 2, zeroed.topk_weights[p] = 0;
  const auto d_out = random_values(dropped.x.size(), rng, -1, 1);

  const auto fd = reference::moe_forward(dropped), fz = reference::moe_forward(zeroed);
  const auto bd = reference::moe_backward(dropped, d_out), bz = reference::moe_backward(zeroed, d_out);
  CHECK_THAT(fd.out, Catch::Approx(fz.out).epsilon(1e-14));
  CHECK_THAT(bd.dx, Catch::Approx(bz.dx).epsilon(1e-14));
  CHECK_THAT(bd.dw1, Catch::Approx(bz.dw1).epsilon(1e-14));
  CHECK_THAT(bd.dw2, Catch::Approx(bz.dw2).epsilon(1e-14));
  for (int p : {1, 3}) {
    INFO("pair " << p);
    CHECK(bd.d_topk_weights[p] == 0.0);
    CHECK(bz.d_topk_weights[p] != 0.0);  // weight 0 still has a gradient when routed
    CHECK(all_zero(fd.pre_act.data() + p * 6, 6));
    CHECK(all_zero(fd.act.data() + p * 3, 3));
    CHECK(all_zero(fd.y.data() + p * 5, 5));
    CHECK(all_zero(bd.d_act.data() + p * 3, 3));
    CHECK(all_zero(bd.d_pre_act.data() + p * 6, 6));
    CHECK(all_zero(bd.weighted_act.data() + p * 3, 3));
  }
  for (int p : {0, 2, 4, 5}) CHECK(bd.d_topk_weights[p] == Approx(bz.d_topk_weights[p]).epsilon(1e-14));
}

TEST_CASE("reference gives an expert without tokens zero weight gradients", "[reference]") {
  std::mt19937 rng(11);
  const MoeTensors m = tiny_problem(rng);
  const auto b = reference::moe_backward(m, random_values(m.x.size(), rng, -1, 1));
  const std::size_t w1_slice = 2 * 3 * 5, w2_slice = 5 * 3;
  for (int e = 0; e < 4; ++e) {
    INFO("expert " << e);
    CHECK(all_zero(b.dw1.data() + e * w1_slice, w1_slice) == (e == 2));
    CHECK(all_zero(b.dw2.data() + e * w2_slice, w2_slice) == (e == 2));
  }
}

TEST_CASE("reference with bf16-rounded intermediates stays close to exact", "[reference]") {
  std::mt19937 rng(2024);
  const int T = 16, E = 4, K = 2;
  std::vector<std::int32_t> ids(T * K);
  for (int t = 0; t < T; ++t) ids[t * K] = t % E, ids[t * K + 1] = (t + 1 + t / E) % E;
  const MoeTensors m = random_problem(T, E, 32, 16, K, ids, rng);
  const auto d_out = random_values(m.x.size(), rng, -1, 1);
  const reference::ReferenceOptions bf16{.round_stored = [](double v) { return round_to(DType::kBF16, v); }};

  const auto fe = reference::moe_forward(m), fr = reference::moe_forward(m, bf16);
  const auto be = reference::moe_backward(m, d_out), br = reference::moe_backward(m, d_out, bf16);
  for (const auto& [name, rounded, exact] :
       {std::tuple{"out", &fr.out, &fe.out}, {"dx", &br.dx, &be.dx}, {"dw1", &br.dw1, &be.dw1},
        {"dw2", &br.dw2, &be.dw2}, {"d_topk_weights", &br.d_topk_weights, &be.d_topk_weights}}) {
    const double rel = relative_l2(*rounded, *exact);
    INFO(name << ": relative L2 difference " << rel);
    CHECK(rel > 0);
    CHECK(rel < 1e-2);
  }

  auto representable = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double e) { return round_to(DType::kBF16, e) == e; });
  };
  CHECK(representable(fr.pre_act));
  CHECK(representable(fr.act));
  CHECK(representable(fr.y));
  CHECK(representable(br.d_pre_act));
  CHECK(representable(br.weighted_act));
  CHECK_FALSE(representable(br.d_act));  // the GPU keeps d_act in fp32
  CHECK_FALSE(representable(fe.act));

  // Forward's act comes from the unrounded g, u; backward recomputes it from the stored pre_act
  // and takes d_topk_weights from the unrounded d_act, as the GPU does.
  auto bf = [](double v) { return round_to(DType::kBF16, v); };
  auto swiglu = [](double g, double u) { return g / (1 + std::exp(-g)) * u; };
  const std::size_t I = 16;
  int act_mismatches = 0, weighted_mismatches = 0;
  for (std::size_t p = 0; p < std::size_t(T * K); ++p) {
    double ds = 0;
    for (std::size_t i = 0; i < I; ++i) {
      const double g = fe.pre_act[p * 2 * I + i], u = fe.pre_act[p * 2 * I + I + i];
      act_mismatches += fr.act[p * I + i] != bf(swiglu(g, u));
      const double stored_act = bf(swiglu(bf(g), bf(u)));
      weighted_mismatches += br.weighted_act[p * I + i] != bf(m.topk_weights[p] * stored_act);
      ds += br.d_act[p * I + i] * stored_act;
    }
    CHECK(br.d_topk_weights[p] == Approx(ds).epsilon(1e-12));
  }
  CHECK(act_mismatches == 0);
  CHECK(weighted_mismatches == 0);
}

TEST_CASE("reference results do not depend on the thread count", "[reference]") {
  std::mt19937 rng(5);
  std::vector<std::int32_t> ids(40);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % 6);
  const MoeTensors m = random_problem(20, 5, 70, 40, 2, ids, rng);
  const auto d_out = random_values(m.x.size(), rng, -1, 1);
  const auto f1 = reference::moe_forward(m, {.threads = 1}), f3 = reference::moe_forward(m, {.threads = 3});
  const auto b1 = reference::moe_backward(m, d_out, {.threads = 1});
  const auto b3 = reference::moe_backward(m, d_out, {.threads = 3});
  CHECK(f1.out == f3.out);
  CHECK(b1.dx == b3.dx);
  CHECK(b1.dw1 == b3.dw1);
  CHECK(b1.dw2 == b3.dw2);
  CHECK(b1.d_topk_weights == b3.d_topk_weights);
}

TEST_CASE("reference rejects inconsistent sizes, naming the field", "[reference]") {
  std::mt19937 rng(3);
  const MoeTensors good = tiny_problem(rng);
  const std::vector<double> d_out(good.x.size());
  auto field_of = [&](const MoeTensors& m, const std::vector<double>& dO) -> std::string {
    try {
      reference::moe_backward(m, dO);
    } catch (const InvalidArgument& e) {
      return e.argument();
    }
    return "";
  };
  CHECK(field_of(good, d_out).empty());
  CHECK(field_of(good, {1.0}) == "d_out");
  MoeTensors m = good;
  m.w1.pop_back();
  CHECK(field_of(m, d_out) == "w1");
  m = good;
  m.topk_ids.push_back(0);
  CHECK(field_of(m, d_out) == "topk_ids");
  m = good;
  m.topk = 0;
  CHECK(field_of(m, d_out) == "topk");
  m = good;
  m.w2.clear();
  CHECK_THROWS_AS(reference::moe_forward(m), InvalidArgument);
}

TEST_CASE("bf16 conversions round to nearest even and keep NaN", "[reference]") {
  // Every non-NaN bf16 survives a round trip, through float and through round_to.
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float f = bf16_to_float(b);
    if (std::isnan(f)) continue;
    if (float_to_bf16(f) != b || round_to(DType::kBF16, f) != f) FAIL("bf16 round trip of " << bits);
  }
  // Ties between neighbours b and b+1 sit 0x8000 above b's float pattern; they go to the even one.
  for (std::uint32_t b : {0x3F80u, 0x3F81u, 0x0001u, 0x4B12u, 0xC2C7u, 0x7F7Eu}) {
    INFO("bf16 " << b);
    const float tie = std::bit_cast<float>((b << 16) | 0x8000u);
    CHECK(float_to_bf16(tie) == ((b & 1u) ? b + 1 : b));
    CHECK(float_to_bf16(std::bit_cast<float>((b << 16) | 0x7FFFu)) == b);
    CHECK(float_to_bf16(std::bit_cast<float>((b << 16) | 0x8001u)) == b + 1);
  }
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80u);  // rounds past the largest bf16
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xFF80u);
  CHECK(bf16_to_float(0x0001u) == std::ldexp(1.0f, -133));  // subnormal
  // A NaN whose payload is only in the low half must not truncate to inf.
  for (std::uint32_t nan : {0x7F800001u, 0xFFC00000u, 0x7FBFFFFFu}) {
    const std::uint16_t b = float_to_bf16(std::bit_cast<float>(nan));
    CHECK(std::isnan(bf16_to_float(b)));
    CHECK((b & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  CHECK(std::isnan(round_to(DType::kBF16, std::nan(""))));
}

TEST_CASE("fp16 conversions round to nearest even, overflow to inf and handle subnormals", "[reference]") {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_to_float(h);
    if (std::isnan(f)) continue;
    if (float_to_fp16(f) != h || round_to(DType::kFP16, f) != f) FAIL("fp16 round trip of " << bits);
  }
  // Normal halves widen exactly; their tie with h+1 is float bit 12 (13 extra mantissa bits).
  for (std::uint32_t h : {0x3C00u, 0x3C01u, 0x0400u, 0x07FFu, 0x5A5Bu, 0xBBFFu, 0x7BFEu, 0x7BFFu}) {
    INFO("fp16 " << h);
    const std::uint32_t f = std::bit_cast<std::uint32_t>(fp16_to_float(static_cast<std::uint16_t>(h)));
    CHECK(float_to_fp16(std::bit_cast<float>(f | 0x1000u)) == ((h & 1u) ? h + 1 : h));
    CHECK(float_to_fp16(std::bit_cast<float>(f | 0x0FFFu)) == h);
    CHECK(float_to_fp16(std::bit_cast<float>(f | 0x1001u)) == h + 1);
  }
  CHECK(fp16_to_float(0x7BFFu) == 65504.0f);
  CHECK(float_to_fp16(65519.99f) == 0x7BFFu);
  CHECK(float_to_fp16(65520.0f) == 0x7C00u);  // the tie above the largest half goes to inf (even)
  CHECK(float_to_fp16(1e6f) == 0x7C00u);
  CHECK(float_to_fp16(-1e6f) == 0xFC00u);
  CHECK(float_to_fp16(std::numeric_limits<float>::max()) == 0x7C00u);
  CHECK(float_to_fp16(std::numeric_limits<float>::infinity()) == 0x7C00u);
  CHECK(std::isinf(round_to(DType::kFP16, 1e300)));

  // Subnormals count in units of 2^-24; ties between m and m+1 units go to the even one.
  CHECK(fp16_to_float(0x0001u) == std::ldexp(1.0f, -24));
  CHECK(fp16_to_float(0x03FFu) == std::ldexp(1023.0f, -24));
  CHECK(fp16_to_float(0x8001u) == -std::ldexp(1.0f, -24));
  CHECK(float_to_fp16(std::ldexp(1.0f, -14)) == 0x0400u);
  CHECK(float_to_fp16(std::ldexp(1023.5f, -24)) == 0x0400u);  // rounds up into the normals
  for (std::uint32_t m = 0; m < 1023; ++m) {
    const float tie = std::ldexp(static_cast<float>(2 * m + 1), -25);
    if (float_to_fp16(tie) != ((m & 1u) ? m + 1 : m)) FAIL("fp16 subnormal tie above " << m);
  }
  CHECK(float_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001u);
  CHECK(float_to_fp16(std::ldexp(1.0f, -30)) == 0x0000u);
  CHECK(float_to_fp16(-std::ldexp(1.0f, -30)) == 0x8000u);
  CHECK(float_to_fp16(std::numeric_limits<float>::denorm_min()) == 0x0000u);

  for (std::uint32_t nan : {0x7F800001u, 0xFFC00000u, 0x7F801FFFu}) {
    const std::uint16_t h = float_to_fp16(std::bit_cast<float>(nan));
    CHECK(std::isnan(fp16_to_float(h)));
    CHECK((h & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  CHECK(std::isnan(fp16_to_float(0x7E00u)));
  CHECK(std::isnan(round_to(DType::kFP16, std::nan(""))));
}

TEST_CASE("round_to rounds a double once, not through float", "[reference]") {
  // Just above a tie by less than float keeps: via float it would land on the tie and round to even.
  const double above_bf16_tie = 1 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  CHECK(round_to(DType::kBF16, above_bf16_tie) == 1 + std::ldexp(1.0, -7));
  CHECK(round_to(DType::kBF16, -above_bf16_tie) == -(1 + std::ldexp(1.0, -7)));
  CHECK(round_to(DType::kBF16, 1 + std::ldexp(1.0, -8)) == 1.0);
  const double above_fp16_tie = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  CHECK(round_to(DType::kFP16, above_fp16_tie) == 1 + std::ldexp(1.0, -10));
  CHECK(round_to(DType::kFP16, 1 + std::ldexp(1.0, -11)) == 1.0);
  // Just below a tie: via float it would round up to the tie and then to even (up here).
  const double below_bf16_tie = 1 + 3 * std::ldexp(1.0, -8) - std::ldexp(1.0, -30);
  CHECK(round_to(DType::kBF16, below_bf16_tie) == 1 + std::ldexp(1.0, -7));

  const std::vector<double> values{0.1, -2.5, 65504, 1e-8, 3.0e38};
  const auto bf = from_storage(DType::kBF16, to_storage(DType::kBF16, values));
  const auto hf = from_storage(DType::kFP16, to_storage(DType::kFP16, values));
  REQUIRE(bf.size() == values.size());
  REQUIRE(hf.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(bf[i] == round_to(DType::kBF16, values[i]));
    CHECK(hf[i] == round_to(DType::kFP16, values[i]));
  }
  CHECK(to_storage(DType::kBF16, {1.0, -2.0}) == std::vector<std::uint16_t>{0x3F80u, 0xC000u});
  CHECK(to_storage(DType::kFP16, {1.0, -2.0}) == std::vector<std::uint16_t>{0x3C00u, 0xC000u});
  CHECK(hf[4] == std::numeric_limits<double>::infinity());
}
