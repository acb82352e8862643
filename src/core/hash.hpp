// Stable 64-bit content hashing (FNV-1a). Used for cache keys and file checksums, so its values
// must never change between releases: tests pin known values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moejit {

class Hasher {
 public:
  Hasher& add(std::string_view bytes);
  Hasher& add(const void* data, std::size_t size);
  // Adds a field with its length so ("ab","c") and ("a","bc") hash differently.
  Hasher& field(std::string_view bytes);
  std::uint64_t value() const { return state_; }
  std::string hex() const;

 private:
  std::uint64_t state_ = 0xcbf29ce484222325ull;
};

std::string to_hex(std::uint64_t value);

}  // namespace moejit
