#include "tuner/prune.hpp"

#include <algorithm>
#include <fmt/format.h>

#include "moe/routing_layout.hpp"
#include "tuner/config_space.hpp"
#include "tuner/gating.hpp"

namespace moejit {

long long config_smem_bytes(Role role, const TileConfig& c, const MoeShape& shape) {
  switch (role) {
    case Role::kRouting: {
      long long worst = 0;
      for (int phase = 0; phase < 3; ++phase) {
        worst = std::max(worst, routing_smem_bytes(phase, c.threads(), shape.experts));
      }
      return worst;
    }
    default:
      return 0;
  }
}

std::optional<std::string> prune_reason(Role role, const TileConfig& c, const MoeShape& shape,
                                        const cuda::DeviceInfo& device) {
  if (auto why = arch_gate_reason(c, device)) return *why;
  if (c.threads() > device.max_threads_per_block) {
    return fmt::format("{} threads per block exceed the device's {}", c.threads(), device.max_threads_per_block);
  }
  const long long smem = config_smem_bytes(role, c, shape);
  if (smem > device.smem_optin_per_block) {
    return fmt::format("needs {} B of shared memory; {} allows {} B per block", smem, device.arch(),
                       device.smem_optin_per_block);
  }
  if (role == Role::kRouting) {
    // Padding to 1024 pairs keeps the smallest chunks legal for every problem.
    const long long padded = std::max<long long>(1024, (shape.pairs() + 1023) / 1024 * 1024);
    const long long chunk = static_cast<long long>(c.threads()) * c.items;
    if (chunk > padded) {
      return fmt::format("chunk of {} pairs is wider than the padded problem ({} pairs)", chunk, padded);
    }
  }
  return std::nullopt;
}

std::vector<PruneDecision> prune_space(Role role, const MoeShape& shape, const cuda::DeviceInfo& device) {
  std::vector<PruneDecision> out;
  for (const TileConfig& c : config_space(role)) out.push_back({c, prune_reason(role, c, shape, device)});
  return out;
}

}  // namespace moejit
