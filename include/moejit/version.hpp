#pragma once

namespace moejit {

// Library version; part of every tuning row's provenance.
inline constexpr const char* kLibraryVersion = "0.3.0";

}  // namespace moejit
