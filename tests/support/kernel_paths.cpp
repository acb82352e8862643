#include "support/kernel_paths.hpp"

#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"

namespace moejit::test {

std::vector<std::pair<std::string, Options>> kernel_paths(const CaseSpec& s, const cuda::DeviceInfo& device) {
  std::vector<std::pair<std::string, Options>> paths = {{"device defaults", Options{}}};
  if (!device.is_hopper()) return paths;
  cuda::DeviceInfo portable = device;
  portable.cc_major = 8;
  portable.cc_minor = 0;
  const MoeShape shape{s.tokens, s.experts, s.hidden, s.intermediate, s.topk, s.dtype};
  Options opt, other_pipeline;
  for (Role r : kAllRoles) {
    const RoleKind kind = role_kind(r);
    if (kind == RoleKind::kTokenGemm || kind == RoleKind::kExpertGemm) {
      opt.config_overrides[role_name(r)] = default_config(r, shape, portable).name();
      // The first legal config of the wgmma pipeline the default does not use (multistage <->
      // warp-specialized).
      const TileConfig d = default_config(r, shape, device);
      if (d.arch_tag != ArchTag::kHopper) continue;
      for (const TileConfig& c : config_space(r, shape)) {
        if (c.arch_tag == ArchTag::kHopper && c.warp_specialized != d.warp_specialized &&
            !prune_reason(r, c, shape, device)) {
          other_pipeline.config_overrides[role_name(r)] = c.name();
          break;
        }
      }
    }
  }
  paths.push_back({"portable mma.sync", opt});
  if (!other_pipeline.config_overrides.empty()) paths.push_back({"the other wgmma pipeline", other_pipeline});
  return paths;
}

}  // namespace moejit::test
