#include "jit/role.hpp"

#include "moejit/error.hpp"

namespace moejit {

const char* role_name(Role r) noexcept {
  switch (r) {
    case Role::kRouting: return "routing";
    case Role::kFwdUp: return "fwd_up";
    case Role::kFwdDown: return "fwd_down";
    case Role::kGatherSum: return "gather_sum";
    case Role::kBwdDown: return "bwd_down";
    case Role::kBwdDw2: return "bwd_dw2";
    case Role::kBwdDx: return "bwd_dx";
    case Role::kBwdDw1: return "bwd_dw1";
    case Role::kUtility: return "utility";
  }
  return "unknown";
}

Role parse_role(std::string_view name) {
  for (Role r : kAllRoles) {
    if (name == role_name(r)) return r;
  }
  throw InvalidArgument("role", "unknown role '" + std::string(name) +
                                    "' (routing, fwd_up, fwd_down, gather_sum, bwd_down, bwd_dw2, bwd_dx, bwd_dw1)");
}

}  // namespace moejit
