// The kernel a role runs for a problem at a config: the one place that decides the variant
// flags (vector alignment, fused activation) from the problem.
#pragma once

#include <string>

#include "jit/kernel_spec.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// H and I multiples of 8: every row the GEMMs touch is 16-byte aligned.
bool vector_aligned(const MoeProblem& p);

jit::KernelSpec role_kernel_spec(Role role, const TileConfig& config, const MoeProblem& p, const std::string& arch);

}  // namespace moejit
