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
};

inline constexpr std::array<Role, 8> kAllRoles = {Role::kRouting, Role::kFwdUp,  Role::kFwdDown, Role::kGatherSum,
                                                 Role::kBwdDown, Role::kBwdDw2, Role::kBwdDx,   Role::kBwdDw1};

const char* role_name(Role r) noexcept;  // "routing", "fwd_up", ...
Role parse_role(std::string_view name);   // throws InvalidArgument

}  // namespace moejit
