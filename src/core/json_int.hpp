// Integers read from JSON (tuning tables) without narrowing: nlohmann's get<int>() wraps
// 2^32 + 2048 to 2048, and a hand-edited table would then name another problem.
#pragma once

#include <limits>
#include <nlohmann/json.hpp>

#include "moejit/error.hpp"

namespace moejit {

// The member `name` of `j` as an int; InvalidArgument(name) unless it is a JSON integer in range.
inline int json_int(const nlohmann::json& j, const char* name) {
  const nlohmann::json& v = j.at(name);
  constexpr int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  if (v.is_number_unsigned()) {
    if (const unsigned long long x = v.get<unsigned long long>(); x <= static_cast<unsigned long long>(kMax)) {
      return static_cast<int>(x);
    }
  } else if (v.is_number_integer()) {
    if (const long long x = v.get<long long>(); x >= kMin && x <= kMax) return static_cast<int>(x);
  }
  throw InvalidArgument(name, "must be an integer that fits an int, got " + v.dump());
}

// The same, `fallback` when `j` has no member `name` (a field added after the table was written).
inline int json_int_or(const nlohmann::json& j, const char* name, int fallback) {
  return j.contains(name) ? json_int(j, name) : fallback;
}

}  // namespace moejit
