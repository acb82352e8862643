// The kernel roles of the fused MoE block (DESIGN.md); each is one __global__ template.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace moejit {

enum class Role : int {
  kRouting = 0,
  kFwdUp,
  kFwdDown,
  kGatherSum,
  kBwdDown,
  kBwdDw2,
  kBwdDx,
  kBwdDw1,
  kUtility,  // not a MoE role: random fills and output comparison for the autotuner
};

inline constexpr std::array<Role, 8> kAllRoles = {Role::kRouting, Role::kFwdUp,  Role::kFwdDown, Role::kGatherSum,
                                                 Role::kBwdDown, Role::kBwdDw2, Role::kBwdDx,   Role::kBwdDw1};

// The kernel roles of the MoE block, in pipeline order (kUtility is not one of them).
const char* role_name(Role r) noexcept;  // "routing", "fwd_up", ..., "utility"
Role parse_role(std::string_view name);   // throws InvalidArgument

}  // namespace moejit
