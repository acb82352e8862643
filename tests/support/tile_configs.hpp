// Hopper GEMM tile configs the unit tests spell out by hand.
#pragma once

#include "tuner/tile_config.hpp"

namespace moejit::test {

// A wgmma config (group_m 8): warp-specialized or multistage, without TMA copies.
inline TileConfig hopper_gemm(int bm, int bn, int bk, int stages, int warps, bool warp_specialized) {
  TileConfig c;
  c.block_m = bm;
  c.block_n = bn;
  c.block_k = bk;
  c.stages = stages;
  c.warps = warps;
  c.group_m = 8;
  c.arch_tag = ArchTag::kHopper;
  c.warp_specialized = warp_specialized;
  return c;
}

}  // namespace moejit::test
