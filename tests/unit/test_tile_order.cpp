// The persistent grids' work-item decode (templates/common/tile_order.cuh), compiled here as host
// code: the header's arithmetic is plain C++ but for two device intrinsics, given their
// definitions below. Checked exactly against the division it replaces.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#define __device__
#define __forceinline__ inline
namespace moejit {
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<std::uint64_t>(a) * b) >> 32);
}
}  // namespace moejit
#include "common/tile_order.cuh"
#undef __device__
#undef __forceinline__

namespace {

using moejit::FastDiv;
using moejit::GroupedOrder;
using moejit::PlainDiv;

constexpr std::uint32_t kMaxNumerator = 0x7FFFFFFFu;  // grids stop at 2^31 - 1 blocks

std::vector<std::uint32_t> numerators(std::uint32_t d, std::mt19937& rng) {
  std::vector<std::uint32_t> n = {0, 1, kMaxNumerator, kMaxNumerator - 1};
  for (std::uint64_t q : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{1000}, std::uint64_t{kMaxNumerator / d}}) {
    for (std::int64_t off : {-1, 0, 1}) {
      const std::int64_t v = static_cast<std::int64_t>(q * d) + off;
      if (v >= 0 && v <= kMaxNumerator) n.push_back(static_cast<std::uint32_t>(v));
    }
  }
  std::uniform_int_distribution<std::uint32_t> any(0, kMaxNumerator);
  for (int i = 0; i < 64; ++i) n.push_back(any(rng));
  return n;
}

}  // namespace

TEST_CASE("FastDiv's quotients equal division's, divisors 1 to 2^31, numerators below 2^31", "[tile_order]") {
  std::mt19937 rng(20);
  std::vector<std::uint32_t> divisors;
  for (std::uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 31; ++k) {
    for (std::int64_t off : {-1, 0, 1}) {
      if ((1ll << k) + off <= 0x80000000ll) divisors.push_back(static_cast<std::uint32_t>((1ll << k) + off));
    }
  }
  std::uniform_int_distribution<std::uint32_t> any(1, 0x80000000u);
  for (int i = 0; i < 2000; ++i) divisors.push_back(any(rng));
  long long wrong = 0;
  for (std::uint32_t d : divisors) {
    const FastDiv f(d);
    for (std::uint32_t n : numerators(d, rng)) {
      const std::uint32_t q = f.div(n);
      if (q != n / d || f.mod(n, q) != n % d) {
        if (++wrong <= 5) FAIL_CHECK("d " << d << " n " << n << ": " << q << " for " << n / d);
      }
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("GroupedOrder visits every tile once, GROUP_M m tiles at a time, a short last group too",
          "[tile_order]") {
  for (std::uint32_t m_tiles : {1u, 7u, 8u, 9u, 17u, 64u, 100u}) {
    for (std::uint32_t n_tiles : {1u, 3u, 8u, 12u}) {
      const GroupedOrder<8, FastDiv> order(m_tiles, n_tiles);
      const GroupedOrder<8, PlainDiv> plain(m_tiles, n_tiles);
      std::vector<int> seen(m_tiles * n_tiles, 0);
      for (std::uint32_t pid = 0; pid < m_tiles * n_tiles; ++pid) {
        std::uint32_t m = 0, n = 0, plain_m = 0, plain_n = 0;
        order.tile(pid, m, n);
        plain.tile(pid, plain_m, plain_n);
        REQUIRE(plain_m == m);
        REQUIRE(plain_n == n);
        // The order's definition: group g holds m tiles [8g, 8g + rows), column-major within it.
        const std::uint32_t per_group = 8 * n_tiles, first_m = pid / per_group * 8;
        const std::uint32_t rows = std::min(m_tiles - first_m, 8u), in_group = pid % per_group;
        REQUIRE(m == first_m + in_group % rows);
        REQUIRE(n == in_group / rows);
        REQUIRE(m < m_tiles);
        REQUIRE(n < n_tiles);
        ++seen[m * n_tiles + n];
      }
      for (int s : seen) REQUIRE(s == 1);
    }
  }
}

TEST_CASE("snake shares name every item once and reverse every other round", "[tile_order]") {
  for (std::uint32_t blocks : {1u, 2u, 7u, 132u, 264u}) {
    for (std::uint32_t items : {1u, blocks - 1 > 0 ? blocks - 1 : 1u, blocks, blocks + 1, 2 * blocks, 2 * blocks + 5,
                                3 * blocks + 1, 3 * blocks + blocks / 2 + 1, 4 * blocks, 9 * blocks + 3}) {
      INFO("blocks " << blocks << ", items " << items);
      const moejit::SnakeOrder snake(items, blocks);
      std::vector<int> named(items, 0);
      for (std::uint32_t i = 0; i < items; ++i) {
        const std::uint32_t item = snake.item(i);
        REQUIRE(item < items);
        ++named[item];
        const std::uint32_t round = i / blocks, b = i % blocks, first = round * blocks;
        // Forward rounds keep their positions; a backward round reverses, within itself when short.
        const std::uint32_t width = std::min(blocks, items - first);
        CHECK(item == (round % 2 == 0 ? i : first + width - 1 - b));
      }
      CHECK(std::count(named.begin(), named.end(), 1) == static_cast<long>(items));
    }
  }
}
