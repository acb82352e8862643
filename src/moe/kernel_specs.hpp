// The kernel a role runs for a problem at a config: the one place that decides the variant
// flags (vector alignment, fused activation) from the problem.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "jit/kernel_spec.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// H and I multiples of 8: every row the GEMMs touch is 16-byte aligned.
bool vector_aligned(const MoeProblem& p);

jit::KernelSpec role_kernel_spec(Role role, const TileConfig& config, const MoeProblem& p, const std::string& arch);

// The kernels plans of `p` (its mode aside) in `modes` can load: role_kernel_spec at each config
// `configs` lists for each role a mode runs (roles_of), each kernel once, in mode, role and config
// order. Given every config of a role that passes pruning, it holds whatever config a plan resolves
// (tuner/config_resolver.hpp passes over any other): `moejit compile` precompiles it.
std::vector<jit::KernelSpec> plan_kernel_specs(const MoeProblem& p, const std::vector<Mode>& modes,
                                               const std::map<Role, std::vector<TileConfig>>& configs,
                                               const std::string& arch);

}  // namespace moejit
