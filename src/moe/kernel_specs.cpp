#include "moe/kernel_specs.hpp"

#include "moe/memory_layout.hpp"

namespace moejit {

bool vector_aligned(const MoeProblem& p) { return p.hidden % 8 == 0 && p.intermediate % 8 == 0; }

jit::KernelSpec role_kernel_spec(Role role, const TileConfig& config, const MoeProblem& p, const std::string& arch) {
  jit::KernelSpec spec{role, config, p.dtype, arch};
  spec.aligned = role == Role::kRouting || vector_aligned(p);
  spec.fused_act = role == Role::kBwdDw2 &&
                   memeff_recomputes_act(shape_of(p), p.mode);
  return spec;
}

}  // namespace moejit
