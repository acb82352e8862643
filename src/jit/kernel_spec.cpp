#include "jit/kernel_spec.hpp"

#include <fmt/format.h>

namespace moejit::jit {

std::string KernelSpec::readable_name() const {
  std::string name = role == Role::kRouting
                         ? fmt::format("{}.{}.{}", role_name(role), config.name(), arch)
                         : fmt::format("{}.{}.{}.{}", role_name(role), dtype_name(dtype), config.name(), arch);
  if (!aligned) name += ".unaligned";
  if (fused_act) name += ".fused_act";
  return name;
}

}  // namespace moejit::jit
