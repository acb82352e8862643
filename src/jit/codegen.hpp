// Writes the tiny translation unit that instantiates one config of a role's template. The unit
// only includes the role's header and names the instantiations; kernel bodies live in templates/.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "jit/kernel_spec.hpp"

namespace moejit::jit {

struct GeneratedUnit {
  std::string file_name;                      // "routing.w8_i16.cu", shown in NVRTC logs
  std::string source;
  std::vector<std::string> name_expressions;  // one per __global__ instantiation, in launch order
};

// The utility module's kernels (templates/util.cuh) by their index in its name expressions, which
// LoadedKernel::launch takes; kUtilityKernels counts them.
enum UtilityKernel : std::size_t { kUtilityFill, kUtilityTopkIds, kUtilityRelDiff, kUtilityKernels };

// Pure: the same spec always yields the same unit. Throws InvalidArgument for a config the role
// cannot instantiate (missing fields).
GeneratedUnit generate_unit(const KernelSpec& spec);

}  // namespace moejit::jit
