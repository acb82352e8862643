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
  // Properties of the problem, not tuned: whether every row and offset the kernel touches is
  // 16-byte aligned (vector copies) or needs element-wise access; and, for bwd_dw2 in
  // memory-efficient mode, whether the weighted activation is recomputed from pre_act.
  bool aligned = true;
  bool fused_act = false;

  // "routing.w8_i16.sm_90a", "fwd_up.bf16.bm128_bn64_bk32_s4_w8_g8.sm_90a" (+ ".unaligned",
  // ".fused_act")
  std::string readable_name() const;
};

}  // namespace moejit::jit
