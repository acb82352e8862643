// Which configs may run on which device. Pure functions over fabricated or queried devices.
// Applied twice: by pruning (what to compile for a target) and at first launch (what the
// running device can execute), never when the library loads.
#pragma once

#include <optional>
#include <string>

#include "cuda/device.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

// nullopt when a config with this tag can run on a device of compute capability `cc`;
// otherwise the reason it cannot.
std::optional<std::string> arch_gate_reason(ArchTag tag, int cc);

inline std::optional<std::string> arch_gate_reason(const TileConfig& c, const cuda::DeviceInfo& d) {
  return arch_gate_reason(c.arch_tag, d.cc());
}

}  // namespace moejit
