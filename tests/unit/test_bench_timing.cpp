// The benchmark's statistics (bench/timing.cpp) without a GPU: the summary of a step's samples,
// and rounds merged into one summary that keeps every sample and every span in order.
#include <catch2/catch.hpp>

#include "timing.hpp"

using moejit::bench::merge;
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
