// The benchmark's statistics (bench/timing.cpp) without a GPU: the summary of a step's samples,
// rounds merged into one summary that keeps every sample and every span in order, the order of
// a round's items, and the per-round ratios the reported ratio is the median of.
#include <catch2/catch.hpp>

#include "timing.hpp"

using moejit::bench::median_of;
using moejit::bench::merge;
using moejit::bench::round_order;
using moejit::bench::round_ratios;
using moejit::bench::Stats;
using moejit::bench::summarize;

TEST_CASE("a step's samples: median, minimum and nearest-rank 90th percentile", "[bench]") {
  const Stats odd = summarize({5.f, 1.f, 4.f, 2.f, 3.f});
  CHECK(odd.median_ms == 3.0);
  CHECK(odd.min_ms == 1.0);
  CHECK(odd.p90_ms == 5.0);
  CHECK(odd.samples_ms == std::vector<float>{5.f, 1.f, 4.f, 2.f, 3.f});  // in the order they ran
  const Stats even = summarize({4.f, 1.f, 3.f, 2.f});
  CHECK(even.median_ms == 2.5);
  std::vector<float> ten;
  for (int i = 10; i >= 1; --i) ten.push_back(static_cast<float>(i));
  CHECK(summarize(ten).p90_ms == 9.0);
  CHECK(summarize({}).samples_ms.empty());
}

TEST_CASE("rounds merge into one summary with every sample and every round's span", "[bench]") {
  Stats a = summarize({3.f, 1.f});
  a.host_us_per_iter = 10;
  a.spans_unix_s = {{100.0, 100.5}};
  Stats b = summarize({2.f});
  b.host_us_per_iter = 40;
  b.host_bound = true;
  b.spans_unix_s = {{101.0, 101.25}};
  const Stats m = merge({a, b});
  CHECK(m.samples_ms == std::vector<float>{3.f, 1.f, 2.f});
  CHECK(m.median_ms == 2.0);
  CHECK(m.min_ms == 1.0);
  CHECK(m.host_us_per_iter == Approx(20.0));  // weighted by each round's samples
  CHECK(m.host_bound);
  REQUIRE(m.spans_unix_s.size() == 2);
  CHECK(m.spans_unix_s[0] == std::array<double, 2>{100.0, 100.5});
  CHECK(m.spans_unix_s[1] == std::array<double, 2>{101.0, 101.25});
}

TEST_CASE("each round rotates the order of its items by one", "[bench]") {
  using Order = std::vector<std::size_t>;
  CHECK(round_order(3, 0) == Order{0, 1, 2});
  CHECK(round_order(3, 1) == Order{1, 2, 0});
  CHECK(round_order(3, 2) == Order{2, 0, 1});
  CHECK(round_order(3, 3) == Order{0, 1, 2});
  CHECK(round_order(1, 5) == Order{0});
  CHECK(round_order(0, 2).empty());
  // Over n rounds every item takes every position once.
  for (std::size_t item = 0; item < 5; ++item) {
    std::vector<int> seen(5, 0);
    for (int round = 0; round < 5; ++round) {
      const Order o = round_order(5, round);
      for (std::size_t pos = 0; pos < 5; ++pos) seen[pos] += o[pos] == item;
    }
    CHECK(seen == std::vector<int>(5, 1));
  }
}

TEST_CASE("the ratio is the median of each round's dense / ours, not the ratio of pooled medians", "[bench]") {
  // Clocks dropped after round 0 and both sides slowed: per round the ratios are 1, 1.1 and 0.9,
  // but pooled, ours' slow rounds meet dense's spread and the ratio of the medians reads 0.9.
  const std::vector<Stats> ours{summarize({1.f, 1.f}), summarize({2.f, 2.f}), summarize({2.f, 2.f})};
  const std::vector<Stats> dense{summarize({1.f, 1.f}), summarize({2.2f, 2.2f}), summarize({1.8f, 1.8f})};
  const std::vector<double> ratios = round_ratios(ours, dense);
  REQUIRE(ratios.size() == 3);
  CHECK(ratios[0] == Approx(1.0));
  CHECK(ratios[1] == Approx(1.1));
  CHECK(ratios[2] == Approx(0.9));
  CHECK(median_of(ratios) == Approx(1.0));
  CHECK(merge(dense).median_ms / merge(ours).median_ms == Approx(0.9));
  // Only the rounds both sides timed count; a zero median (nothing timed) is skipped.
  CHECK(round_ratios(ours, {summarize({3.f})}) == std::vector<double>{3.0});
  CHECK(round_ratios({summarize({})}, {summarize({1.f})}).empty());
  CHECK(median_of({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK(median_of({}) == 0.0);
}
