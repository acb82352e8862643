#include "jit/kernel_key.hpp"

#include <nlohmann/json.hpp>

#include "core/hash.hpp"

namespace moejit::jit {

KernelKey make_kernel_key(const KernelSpec& spec, const GeneratedUnit& unit, const std::vector<std::string>& options,
                          const std::string& nvrtc_version, const std::string& template_hash) {
  Hasher h;
  h.field(role_name(spec.role))
      .field(nlohmann::json(spec.config).dump())
      .field(dtype_name(spec.dtype))
      .field(spec.arch)
      .field(spec.aligned ? "aligned" : "unaligned")
      .field(spec.fused_act ? "fused_act" : "")
      .field(unit.source)
      .field(nvrtc_version)
      .field(template_hash);
  for (const std::string& o : options) h.field(o);
  return {spec.readable_name(), h.hex()};
}

}  // namespace moejit::jit
