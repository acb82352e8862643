#include "tuner/gating.hpp"

#include <fmt/format.h>

namespace moejit {

std::optional<std::string> arch_gate_reason(ArchTag tag, int cc) {
  switch (tag) {
    case ArchTag::kPortable:
      if (cc < 80) return fmt::format("needs sm_80 or newer (mma.sync bf16, cp.async); device is sm_{}", cc);
      return std::nullopt;
    case ArchTag::kHopper:
      if (cc != 90) return fmt::format("Hopper-only config (wgmma, setmaxnreg) needs sm_90a; device is sm_{}", cc);
      return std::nullopt;
    case ArchTag::kBlackwellDatacenter:
      if (cc != 100 && cc != 103) {
        return fmt::format("datacenter-Blackwell config (tcgen05, TMEM) needs sm_100a/sm_103a; device is sm_{}", cc);
      }
      return std::nullopt;
  }
  return "unknown arch tag";
}

}  // namespace moejit
