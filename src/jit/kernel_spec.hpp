// What to build: a role's template at one config, for one dtype and one target arch.
#pragma once

#include <string>

#include "jit/role.hpp"
#include "moejit/types.hpp"
#include "tuner/tile_config.hpp"

namespace moejit::jit {

struct KernelSpec {
  Role role = Role::kRouting;
  TileConfig config;
  DType dtype = DType::kBF16;
  std::string arch = "sm_90a";  // NVRTC target

  // "routing.w8_i16.sm_90a", "fwd_up.bf16.bm128_bn128_bk64_s4_w8_g8.sm_90a"
  std::string readable_name() const;
};

}  // namespace moejit::jit
