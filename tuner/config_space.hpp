// The configuration space of each role and the heuristic default used when nothing is tuned.
#pragma once

#include <vector>

#include "cuda/device.hpp"
#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "moejit/moejit.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

// Every config of a role for a problem, for all architectures (pruning removes what a device
// cannot take). Token GEMMs all use the problem's token_block_m().
std::vector<TileConfig> config_space(Role role, const MoeShape& shape);

// A config expected to be good without tuning; it survives pruning for every problem moejit
// accepts on every sm_80+ device. `mode` picks the role's kernel variant (tuning_keys.hpp,
// key_mode): the memory-efficient bwd_dw2 recomputes its B operand and prefers other tiles.
TileConfig default_config(Role role, const MoeShape& shape, const cuda::DeviceInfo& device,
                          Mode mode = Mode::kTraining);

// Smallest BLOCK_N (fwd_up: columns of act) and BLOCK_M in a role's space: tiles up to these
// sizes are never pruned as wider than the problem.
int min_block_n(Role role);
int min_block_m(Role role);

}  // namespace moejit
