// A compiled kernel module: the cubin and what is needed to launch from it.
#pragma once

#include <string>
#include <vector>

#include "jit/kernel_key.hpp"
#include "jit/ptxas_info.hpp"

namespace moejit::jit {

// Where a compiled kernel came from on this request.
enum class Origin { kMemory, kDisk, kCompiled };

struct CompiledKernel {
  KernelKey key;
  std::string cubin;
  std::vector<std::string> name_expressions;
  std::vector<std::string> lowered_names;  // aligned with name_expressions
  std::vector<KernelResources> resources;
  std::vector<std::string> performance_losses;  // ptxas's advisories (parse_performance_losses)
  double compile_ms = 0;  // NVRTC time when it was built (also for disk hits)

  int max_registers() const;
  int max_spill_bytes() const;  // stores + loads, worst entry
  // Local memory ptxas gives arrays it cannot keep in registers: no spill in its count, yet every
  // access a round trip (bwd_down's 16 score-gradient sums took 64 bytes and 6 %, session 40).
  int max_stack_bytes() const;
};

}  // namespace moejit::jit
