#include "jit/compiled_kernel.hpp"

#include <algorithm>

namespace moejit::jit {

int CompiledKernel::max_registers() const {
  int r = 0;
  for (const auto& k : resources) r = std::max(r, k.registers);
  return r;
}

int CompiledKernel::max_spill_bytes() const {
  int s = 0;
  for (const auto& k : resources) s = std::max(s, k.spill_store_bytes + k.spill_load_bytes);
  return s;
}

int CompiledKernel::max_stack_bytes() const {
  int s = 0;
  for (const auto& k : resources) s = std::max(s, k.stack_bytes);
  return s;
}

}  // namespace moejit::jit
