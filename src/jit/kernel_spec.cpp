#include "jit/kernel_spec.hpp"

#include <fmt/format.h>

namespace moejit::jit {

std::string KernelSpec::readable_name() const {
  if (role == Role::kRouting) return fmt::format("{}.{}.{}", role_name(role), config.name(), arch);
  return fmt::format("{}.{}.{}.{}", role_name(role), dtype_name(dtype), config.name(), arch);
}

}  // namespace moejit::jit
