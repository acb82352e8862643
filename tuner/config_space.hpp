// The configuration space of each role and the heuristic default used when nothing is tuned.
#pragma once

#include <vector>

#include "cuda/device.hpp"
#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

// Every config of a role, for all architectures (pruning removes what a target cannot take).
std::vector<TileConfig> config_space(Role role);

// A config expected to be good without tuning; always survives pruning for shapes moejit accepts.
TileConfig default_config(Role role, const MoeShape& shape, const cuda::DeviceInfo& device);

}  // namespace moejit
