#include "moe/kernel_specs.hpp"

#include <set>

#include "moe/memory_layout.hpp"
#include "tuner/tuning_keys.hpp"

namespace moejit {

bool vector_aligned(const MoeProblem& p) { return shape_of(p).vector_aligned(); }

jit::KernelSpec role_kernel_spec(Role role, const TileConfig& config, const MoeProblem& p, const std::string& arch) {
  jit::KernelSpec spec{role, config, p.dtype, arch};
  spec.aligned = role == Role::kRouting || vector_aligned(p);
  spec.fused_act = role == Role::kBwdDw2 &&
                   memeff_recomputes_act(shape_of(p), p.mode);
  return spec;
}

std::vector<jit::KernelSpec> plan_kernel_specs(const MoeProblem& p, const std::vector<Mode>& modes,
                                               const std::map<Role, std::vector<TileConfig>>& configs,
                                               const std::string& arch) {
  std::vector<jit::KernelSpec> out;
  std::set<std::string> seen;  // readable names: most kernels serve every mode
  for (Mode mode : modes) {
    MoeProblem in_mode = p;
    in_mode.mode = mode;
    for (Role role : roles_of(mode)) {
      const auto it = configs.find(role);
      if (it == configs.end()) continue;
      for (const TileConfig& c : it->second) {
        jit::KernelSpec spec = role_kernel_spec(role, c, in_mode, arch);
        if (seen.insert(spec.readable_name()).second) out.push_back(std::move(spec));
      }
    }
  }
  return out;
}

}  // namespace moejit
