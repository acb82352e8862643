// Pruning: decides, before anything is compiled, whether a config can serve a problem on a
// device. Pure; unit-tested with fabricated devices.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

// nullopt when the config is legal; otherwise the reason it is dropped.
std::optional<std::string> prune_reason(Role role, const TileConfig& config, const MoeShape& shape,
                                        const cuda::DeviceInfo& device);

struct PruneDecision {
  TileConfig config;
  std::optional<std::string> reason;  // set when pruned
};

std::vector<PruneDecision> prune_space(Role role, const MoeShape& shape, const cuda::DeviceInfo& device);

}  // namespace moejit
