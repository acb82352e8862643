// tests/support/differences.hpp: the one-line verdict of the GPU cases' bit-for-bit comparisons.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "support/differences.hpp"

using moejit::test::differences;

TEST_CASE("differences names the count and the first differing element, or none", "[support]") {
  const std::vector<double> a = {1.0, 2.0, 3.0, 4.0};
  CHECK(differences(a, a) == "none");
  CHECK(differences(a, {1.0, 2.5, 3.0, -4.0}) == "2 of 4 elements differ; the first at 1: 2 against 2.5");
  CHECK(differences(a, {1.0, 2.0}) == "4 elements against 2");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // An element left unwritten (poisoned: NaN) never passes, even against another NaN.
  CHECK(differences(std::vector<double>{1.0, nan}, std::vector<double>{1.0, nan}) ==
        "1 of 2 elements differ; the first at 1: nan against nan");
  CHECK(differences(std::vector<std::int32_t>{7, 8, 9}, std::vector<std::int32_t>{7, 8, 10}) ==
        "1 of 3 elements differ; the first at 2: 9 against 10");
  CHECK(differences(std::vector<int>{}, std::vector<int>{}) == "none");
}
