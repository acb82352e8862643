// Kernel cache keys: a readable prefix plus a hash over everything that changes the cubin.
#pragma once

#include <string>
#include <vector>

#include "jit/codegen.hpp"
#include "jit/kernel_spec.hpp"

namespace moejit::jit {

struct KernelKey {
  std::string readable;  // "routing.w8_i16.sm_90a"
  std::string hash;      // 16 hex digits
  // File stem in the disk cache: "routing.w8_i16.sm_90a.1f2e3d4c5b6a7988".
  std::string stem() const { return readable + "." + hash; }
  friend bool operator==(const KernelKey&, const KernelKey&) = default;
};

// Pure. The hash covers role, every config field, dtype, arch, the generated source, the NVRTC
// options and version, and the template hash.
KernelKey make_kernel_key(const KernelSpec& spec, const GeneratedUnit& unit, const std::vector<std::string>& options,
                          const std::string& nvrtc_version, const std::string& template_hash);

}  // namespace moejit::jit
