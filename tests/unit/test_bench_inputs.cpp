// The benchmark's routings (bench/inputs.cpp) without a GPU: what each --routing promises about
// the experts it deals, since the bench's balanced-against-uniform comparison rests on it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "inputs.hpp"
#include "moejit/error.hpp"

using namespace moejit;
using moejit::bench::parse_routing;
using moejit::bench::routing_ids;
using moejit::bench::routing_name;

namespace {

// Pairs per expert; fails the test on an id outside [0, E) or a token that repeats an expert.
std::vector<long long> expert_loads(const std::vector<std::int32_t>& ids, long long tokens, int experts, int topk) {
  REQUIRE(ids.size() == static_cast<std::size_t>(tokens * topk));
  std::vector<long long> loads(experts, 0);
  long long bad_tokens = 0;
  for (long long t = 0; t < tokens; ++t) {
    std::set<std::int32_t> seen;
    bool bad = false;
    for (int k = 0; k < topk; ++k) {
      const std::int32_t e = ids[t * topk + k];
      if (e < 0 || e >= experts || !seen.insert(e).second) {
        bad = true;
      } else {
        ++loads[e];
      }
    }
    bad_tokens += bad;
  }
  CHECK(bad_tokens == 0);
  return loads;
}

}  // namespace

TEST_CASE("--routing parses uniform, balanced and zipf:S and names them back", "[bench]") {
  for (const char* text : {"uniform", "balanced", "zipf:1.5", "zipf-shuffled:1.5"}) {
    CHECK(routing_name(parse_routing(text)) == text);
  }
  CHECK(parse_routing("zipf-shuffled:1.5").shuffled);
  CHECK_FALSE(parse_routing("zipf:1.5").shuffled);
  CHECK(parse_routing("balanced").balanced);
  CHECK_FALSE(parse_routing("balanced").zipf);
  CHECK(parse_routing("zipf:1.5").exponent == 1.5);
  CHECK_FALSE(parse_routing("zipf:1.5").balanced);
  for (const char* bad : {"", "Balanced", "zipf:", "zipf:0", "zipf:-1", "zipf:1x", "zipf-shuffled:", "zipf-shuffled"}) {
    CHECK_THROWS_AS(parse_routing(bad), InvalidArgument);
  }
}

TEST_CASE("balanced routing gives every expert T*K/E pairs to within one", "[bench]") {
  struct Case {
    long long tokens;
    int experts, topk;
  };
  for (const Case c : {Case{8192, 128, 8}, Case{1000, 128, 8}, Case{1, 8, 2}, Case{333, 8, 8}, Case{77, 64, 1}}) {
    CAPTURE(c.tokens, c.experts, c.topk);
    const auto loads = expert_loads(routing_ids(c.tokens, c.experts, c.topk, parse_routing("balanced"), 7), c.tokens,
                                    c.experts, c.topk);
    const long long pairs = c.tokens * c.topk;
    CHECK(*std::min_element(loads.begin(), loads.end()) == pairs / c.experts);
    CHECK(*std::max_element(loads.begin(), loads.end()) == (pairs + c.experts - 1) / c.experts);
  }
}

TEST_CASE("balanced routing scatters an expert's tokens, differently per seed", "[bench]") {
  const auto a = routing_ids(4096, 128, 8, parse_routing("balanced"), 1);
  const auto b = routing_ids(4096, 128, 8, parse_routing("balanced"), 2);
  CHECK(a == routing_ids(4096, 128, 8, parse_routing("balanced"), 1));
  CHECK(a != b);
  // Unshuffled, token t would hold experts 8t mod 128 onwards: expert 0 only on every 16th token.
  long long first_expert_on_16th = 0;
  for (long long t = 0; t < 4096; t += 16) first_expert_on_16th += a[t * 8] == 0;
  CHECK(first_expert_on_16th < 256 / 4);
}

TEST_CASE("uniform routing draws K distinct experts per token, spread as a uniform router's", "[bench]") {
  const long long tokens = 8192;
  const auto loads = expert_loads(routing_ids(tokens, 128, 8, parse_routing("uniform"), 3), tokens, 128, 8);
  // 512 pairs per expert on average, standard deviation about 22: within 6 of them, and spread.
  const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  CHECK(*lo > 512 - 6 * 22);
  CHECK(*hi < 512 + 6 * 22);
  CHECK(*hi - *lo > 22);
}
