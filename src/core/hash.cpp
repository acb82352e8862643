#include "core/hash.hpp"

#include <fmt/format.h>

namespace moejit {

Hasher& Hasher::add(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    state_ ^= p[i];
    state_ *= 0x100000001b3ull;
  }
  return *this;
}

Hasher& Hasher::add(std::string_view bytes) { return add(bytes.data(), bytes.size()); }

Hasher& Hasher::field(std::string_view bytes) {
  std::uint64_t n = bytes.size();
  add(&n, sizeof n);
  return add(bytes);
}

std::string Hasher::hex() const { return to_hex(state_); }

std::string to_hex(std::uint64_t value) { return fmt::format("{:016x}", value); }

}  // namespace moejit
