// Which tuning key each role of a problem is stored under, and which roles a mode runs.
#pragma once

#include <vector>

#include "cuda/device.hpp"
#include "db/tuning_key.hpp"
#include "jit/role.hpp"
#include "moe/shape.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// The roles a plan of this mode launches, in pipeline order.
std::vector<Role> roles_of(Mode mode);

// The key's mode string names the kernel variant, not the caller's mode, so identical kernels
// share rows: "infer" only for fwd_up without the pre_act store, "memeff" only for bwd_dw2
// (recomputed activation) and bwd_down (no weighted-activation store) where memory-efficient
// mode recomputes the activation (memeff_recomputes_act), "train" otherwise.
std::string key_mode(Role role, const MoeShape& shape, Mode mode);

db::TuningKey tuning_key(Role role, const MoeProblem& problem, const cuda::DeviceInfo& device);

// The smallest token count whose problem has the same key for `role` as `problem` (its key's
// fields grow with T: the bucket of tokens per expert, the token tile). A row stands for every T
// of its key, so a winner must be legal at this one too.
long long key_floor_tokens(Role role, const MoeProblem& problem, const cuda::DeviceInfo& device);

}  // namespace moejit
