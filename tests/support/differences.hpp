// Element-wise equality of two arrays, for CHECKs that expect two runs to agree bit for bit.
// Catch prints both sides of a failed `==` whole: for a GPU case's million-element output that
// took longer than a GPU call's time limit (performance log, session 32), and the verdict was lost.
// This prints a line instead.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace moejit::test {

// "none" when both hold the same values (a NaN, e.g. a poisoned element never written, equals
// nothing), else how many elements differ and the first of them.
template <typename V>
std::string differences(const std::vector<V>& got, const std::vector<V>& want) {
  if (got.size() != want.size()) return fmt::format("{} elements against {}", got.size(), want.size());
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (count++ == 0) first = i;
  }
  if (count == 0) return "none";
  return fmt::format("{} of {} elements differ; the first at {}: {} against {}", count, got.size(), first, got[first],
                     want[first]);
}

}  // namespace moejit::test
