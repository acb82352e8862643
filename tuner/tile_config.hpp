// One point of a kernel's configuration space. Every field is a template parameter of the
// role's __global__ template (0 = the role does not use it), so a config names a kernel exactly.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace moejit {

// Which devices a config may run on. Checked by pruning (compile targets) and again at first
// launch (gating), never at library load.
enum class ArchTag : int {
  kPortable = 0,          // sm_80 and newer (mma.sync, cp.async)
  kHopper = 1,            // sm_90a only (wgmma, TMA multicast, setmaxnreg)
  kBlackwellDatacenter = 2,  // sm_100a / sm_103a only (tcgen05, TMEM)
};

const char* arch_tag_name(ArchTag t) noexcept;  // "portable", "hopper", "blackwell_dc"

struct TileConfig {
  int block_m = 0;    // token rows per tile
  int block_n = 0;    // output columns per tile
  int block_k = 0;    // reduction depth per pipeline stage
  int stages = 0;     // shared-memory pipeline depth
  int warps = 0;      // warps per block; warp-specialized configs: MMA warps (see block_threads)
  int group_m = 0;    // tiles per L2 swizzle group
  int cluster = 1;    // thread-block cluster size
  int items = 0;      // elements per thread (routing)
  bool use_tma = false;
  // Hopper GEMMs: a producer warpgroup fills the stages, mbarriers instead of a block barrier per
  // k tile (templates/common/pipeline_sm90.cuh); otherwise the multistage loop every thread runs.
  bool warp_specialized = false;
  // A grid of the blocks the device runs at once, each looping over tiles while its producer
  // copies the next tile's first stages under the epilogue (templates/common/token_gemm.cuh,
  // expert_gemm.cuh); otherwise one block per tile. Two-warpgroup TMA tiles and cluster pairs
  // only (persistent_eligible).
  bool persistent = false;
  ArchTag arch_tag = ArchTag::kPortable;

  int threads() const { return warps * 32; }
  // Threads a launch needs: a warp-specialized block adds its producer warpgroup to the
  // `warps` MMA warps.
  int block_threads() const { return threads() + (warp_specialized ? 128 : 0); }

  // Readable, unique within a role: "bm128_bn128_bk64_s4_w8_g8_wg" (wgmma, multistage),
  // "bm128_bn128_bk32_s6_w4_g8_ws" (wgmma, warp-specialized),
  // "bm128_bn256_bk64_s3_w8_g8_tma_ws_persistent", "w8_i16".
  std::string name() const;

  // A total order by size (smaller first, then by name), used to break ties deterministically.
  bool smaller_than(const TileConfig& other) const;

  friend bool operator==(const TileConfig&, const TileConfig&) = default;
};

void to_json(nlohmann::json& j, const TileConfig& c);
void from_json(const nlohmann::json& j, TileConfig& c);

}  // namespace moejit
