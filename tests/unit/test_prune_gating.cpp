// Pruning rules and arch gating, with fabricated devices: no GPU involved.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/device.hpp"
#include "moe/routing_layout.hpp"
#include "moe/tensor_maps.hpp"
#include "moejit/error.hpp"
#include "support/tile_configs.hpp"
#include "tuner/config_space.hpp"
#include "tuner/gating.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"

using namespace moejit;
namespace fab = moejit::cuda::fabricated;

namespace {

TileConfig routing_cfg(int warps, int items) {
  TileConfig c;
  c.warps = warps;
  c.items = items;
  return c;
}

MoeShape shape(long long tokens, int experts, int topk) { return {tokens, experts, 2048, 768, topk, DType::kBF16}; }

}  // namespace

TEST_CASE("arch strings and compute capabilities", "[device]") {
  CHECK(fab::h200().arch() == "sm_90a");
  CHECK(fab::a100().arch() == "sm_80");
  CHECK(fab::b200().arch() == "sm_100a");
  CHECK(fab::rtx5090().arch() == "sm_120a");
  CHECK(cuda::cc_from_arch("sm_90a") == 90);
  CHECK(cuda::cc_from_arch("sm_80") == 80);
  CHECK(cuda::cc_from_arch("sm_100a") == 100);
  // Only "sm_", digits and an optional 'a': strtol's leniency let the first ones through.
  for (const char* arch : {"100", "90", "sm_+90", "sm_ 90", "sm_-90", "sm_90 ", "sm_90b", "sm_90aa", "sm_90f", "sm_",
                           "sm_a", "SM_90", "sm_99999999999", "sm_49", "hopper", ""}) {
    INFO(arch);
    CHECK_THROWS_AS(cuda::cc_from_arch(arch), InvalidArgument);
  }
  CHECK(cuda::fabricated::for_arch("sm_90").arch() == "sm_90a");
  CHECK(cuda::fabricated::for_arch("sm_80").smem_optin_per_block == 166912);
  for (const char* consumer : {"sm_86", "sm_89"}) {
    CHECK(cuda::fabricated::for_arch(consumer).smem_optin_per_block == 101376);
  }
}

TEST_CASE("Blackwell-datacenter configs reach only sm_100/sm_103", "[gating]") {
  CHECK_FALSE(arch_gate_reason(ArchTag::kBlackwellDatacenter, 100));
  CHECK_FALSE(arch_gate_reason(ArchTag::kBlackwellDatacenter, 103));
  CHECK(arch_gate_reason(ArchTag::kBlackwellDatacenter, 90));   // H200
  CHECK(arch_gate_reason(ArchTag::kBlackwellDatacenter, 120));  // consumer Blackwell
  CHECK(arch_gate_reason(ArchTag::kBlackwellDatacenter, 80));
  TileConfig c = routing_cfg(8, 8);
  c.arch_tag = ArchTag::kBlackwellDatacenter;
  CHECK(arch_gate_reason(c, fab::h200()));
  CHECK(arch_gate_reason(c, fab::rtx5090()));
  CHECK_FALSE(arch_gate_reason(c, fab::b200()));
}

TEST_CASE("Hopper configs reach only sm_90", "[gating]") {
  CHECK_FALSE(arch_gate_reason(ArchTag::kHopper, 90));
  CHECK(arch_gate_reason(ArchTag::kHopper, 80));
  CHECK(arch_gate_reason(ArchTag::kHopper, 100));
  CHECK(arch_gate_reason(ArchTag::kHopper, 120));
  CHECK_FALSE(arch_gate_reason(ArchTag::kPortable, 80));
  CHECK(arch_gate_reason(ArchTag::kPortable, 75));
}

TEST_CASE("prune: shared memory over the device's opt-in limit", "[prune]") {
  // Scan + scatter needs (warps+2)(E+1) ints: 34 x 4097 ints = 544 KiB, over every device.
  auto why = prune_reason(Role::kRouting, routing_cfg(32, 4), shape(65536, 4096, 8), fab::h200());
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("shared memory"));
  // 10 x 2049 ints = 82.0 KB: fits an H200 (227 KB) and a consumer Blackwell (99 KB).
  CHECK_FALSE(prune_reason(Role::kRouting, routing_cfg(8, 4), shape(65536, 2048, 8), fab::h200()));
  // 18 x 2049 ints = 147.5 KB: fits an H200, not a consumer Blackwell.
  CHECK_FALSE(prune_reason(Role::kRouting, routing_cfg(16, 4), shape(65536, 2048, 8), fab::h200()));
  CHECK(prune_reason(Role::kRouting, routing_cfg(16, 4), shape(65536, 2048, 8), fab::rtx5090()));
  CHECK(role_smem_bytes(Role::kRouting, routing_cfg(16, 4), shape(65536, 2048, 8)) ==
        routing_smem_bytes(1, 512, 2048));
}

TEST_CASE("prune: chunk wider than the padded problem", "[prune]") {
  // T=1, K=1: padded to 1024 pairs; 256x4 = 1024 survives, 256x8 does not.
  CHECK_FALSE(prune_reason(Role::kRouting, routing_cfg(8, 4), shape(1, 8, 1), fab::h200()));
  auto why = prune_reason(Role::kRouting, routing_cfg(8, 8), shape(1, 8, 1), fab::h200());
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("wider than the padded problem"));
  CHECK_FALSE(prune_reason(Role::kRouting, routing_cfg(32, 32), shape(8192, 128, 8), fab::h200()));
}

TEST_CASE("prune: instructions the arch lacks", "[prune]") {
  TileConfig c = routing_cfg(8, 4);
  c.arch_tag = ArchTag::kHopper;
  auto why = prune_reason(Role::kRouting, c, shape(8192, 128, 8), fab::a100());
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Contains("sm_90a"));
}

TEST_CASE("prune: sizes no block can have", "[prune]") {
  const MoeShape s = shape(8192, 128, 8);
  const TileConfig good = default_config(Role::kFwdDown, s, fab::h200());
  REQUIRE_FALSE(prune_reason(Role::kFwdDown, good, s, fab::h200()));
  for (int TileConfig::*field : {&TileConfig::block_m, &TileConfig::block_n, &TileConfig::block_k,
                                 &TileConfig::stages, &TileConfig::warps, &TileConfig::group_m}) {
    for (int bad : {0, -64}) {
      TileConfig c = good;
      c.*field = bad;
      INFO(c.name());
      const auto why = prune_reason(Role::kFwdDown, c, s, fab::h200());
      REQUIRE(why);
      CHECK_THAT(*why, Catch::Contains("must be positive"));
    }
  }
  for (int warps : {0, 33, 1 << 30}) {
    const auto why = prune_reason(Role::kRouting, routing_cfg(warps, 4), s, fab::h200());
    REQUIRE(why);
    CHECK_THAT(*why, Catch::Contains("1 to 32"));
  }
  // Routing's workspace is laid out for chunks of at least kRoutingMinChunk pairs.
  const auto small_chunk = prune_reason(Role::kRouting, routing_cfg(2, 4), s, fab::h200());  // 256 pairs
  REQUIRE(small_chunk);
  CHECK_THAT(*small_chunk, Catch::Contains("minimum of 512"));
  CHECK_FALSE(prune_reason(Role::kRouting, routing_cfg(4, 4), s, fab::h200()));
}

TEST_CASE("prune: gather_sum configs whose grid would need more than 65535 blocks per row of H", "[prune][launch]") {
  const auto warps = [](int w) {
    TileConfig c;
    c.warps = w;
    return c;
  };
  // The vector path (H and I multiples of 8): 8 columns a thread, so 1 warp covers 256 of H = 2^24.
  const MoeShape wide{1, 1, 1 << 24, 8, 1, DType::kBF16};
  const auto one_warp = prune_reason(Role::kGatherSum, warps(1), wide, fab::h200());
  REQUIRE(one_warp);
  CHECK_THAT(*one_warp, Catch::StartsWith("65536 blocks per row of H = 16777216"));
  CHECK_FALSE(prune_reason(Role::kGatherSum, warps(2), wide, fab::h200()));
  // A column a thread: the default's 4 warps would need 65536 blocks, so it takes 8.
  const MoeShape odd{1, 1, 65535 * 128 + 1, 7, 1, DType::kBF16};
  CHECK(prune_reason(Role::kGatherSum, warps(4), odd, fab::h200()));
  const TileConfig c = default_config(Role::kGatherSum, odd, fab::h200(), Mode::kTraining);
  CHECK(c.warps == 8);
  CHECK_FALSE(prune_reason(Role::kGatherSum, c, odd, fab::h200()));
  // Where the default fits, it is the usual one.
  CHECK(default_config(Role::kGatherSum, wide, fab::h200(), Mode::kTraining).warps == 4);
}

TEST_CASE("the default config survives pruning for small and large problems", "[prune]") {
  std::vector<MoeShape> shapes = {shape(1, 1, 1),       shape(1, 8, 8),         shape(3000, 64, 1),
                                  shape(32768, 128, 8), shape(1 << 20, 256, 8), shape(32768, 4096, 8)};
  shapes.push_back({4096, 8, 4096, 14336, 2, DType::kBF16});  // Mixtral-8x7B
  shapes.push_back({2048, 8, 264, 136, 2, DType::kBF16});     // H, I not multiples of the tile
  shapes.push_back({512, 8, 97, 47, 2, DType::kFP16});        // rows not 16-byte multiples
  shapes.push_back({45, 4, 24, 40, 2, DType::kBF16});         // H under one BLOCK_K of 64
  for (const MoeShape& s : shapes) {
    for (auto dev : {fab::h200(), fab::a100(), fab::rtx5090(), fab::b200()}) {
      for (Role r : kAllRoles) {
        for (Mode mode : {Mode::kTraining, Mode::kMemoryEfficient}) {
          const TileConfig c = default_config(r, s, dev, mode);
          INFO(dev.name << " T=" << s.tokens << " E=" << s.experts << " H=" << s.hidden << " " << role_name(r) << " "
                        << mode_name(mode) << " " << c.name());
          CHECK_FALSE(prune_reason(r, c, s, dev));
        }
      }
    }
  }
}

TEST_CASE("the memory-efficient bwd_dw2 defaults to mma.sync on Hopper past 32 tokens per expert", "[prune]") {
  // Where it recomputes its B operand while filling the stage, which the TMA tiles cannot copy:
  // past T = 2 E H I / 256 = 1572864 tokens here (memeff_recomputes_act). Below, memory-efficient
  // mode runs training's bwd_dw2 (in chunks of experts past T = 2 E H / K = 65536, in chunks of
  // one expert's columns past T = 2 E H = 524288).
  const MoeShape large = shape(1 << 21, 128, 8), small = shape(512, 128, 8);  // 131072 and 32 pairs per expert
  for (long long t : {65536LL, 131072LL, 524288LL, 1LL << 20}) {
    CHECK(default_config(Role::kBwdDw2, shape(t, 128, 8), fab::h200(), Mode::kMemoryEfficient) ==
          default_config(Role::kBwdDw2, shape(t, 128, 8), fab::h200()));
  }
  const TileConfig eff = default_config(Role::kBwdDw2, large, fab::h200(), Mode::kMemoryEfficient);
  CHECK(eff.arch_tag == ArchTag::kPortable);
  CHECK(eff.block_n == 64);
  CHECK(default_config(Role::kBwdDw2, large, fab::h200(), Mode::kTraining).use_tma);
  CHECK(default_config(Role::kBwdDw2, small, fab::h200(), Mode::kMemoryEfficient).use_tma);
  // Only bwd_dw2 has a memory-efficient tile of its own.
  for (Role r : kAllRoles) {
    if (r == Role::kBwdDw2) continue;
    CHECK(default_config(r, large, fab::h200(), Mode::kMemoryEfficient) == default_config(r, large, fab::h200()));
  }
}

TEST_CASE("the default routing chunk is one chunk for small problems and 4096 pairs for large ones", "[prune]") {
  auto chunk = [](const TileConfig& c) { return c.threads() * c.items; };
  // A single chunk is a single launch.
  CHECK(chunk(default_config(Role::kRouting, shape(1, 8, 8), fab::h200())) == 1024);
  CHECK(chunk(default_config(Role::kRouting, shape(256, 128, 8), fab::h200())) == 2048);
  CHECK(chunk(default_config(Role::kRouting, shape(512, 128, 8), fab::h200())) == 4096);
  // Every scatter block reads num_chunks * (E+1) counts: large problems keep chunks large.
  const TileConfig big = default_config(Role::kRouting, shape(32768, 128, 8), fab::h200());
  CHECK(big.warps == 16);
  CHECK(big.items == 8);
  // Many experts on a small shared memory: fewer warps, more items, the same chunk.
  const TileConfig wide = default_config(Role::kRouting, shape(32768, 4096, 8), fab::rtx5090());
  CHECK(wide.warps == 4);
  CHECK(chunk(wide) == 4096);
}

TEST_CASE("routing config space covers every config once", "[prune]") {
  auto space = config_space(Role::kRouting, shape(8192, 128, 8));
  CHECK(space.size() == 16);
  for (std::size_t i = 0; i < space.size(); ++i) {
    CHECK(space[i].threads() * space[i].items >= kRoutingMinChunk);
    for (std::size_t j = i + 1; j < space.size(); ++j) CHECK(space[i].name() != space[j].name());
  }
}

TEST_CASE("wgmma GEMM configs reach only sm_90, where the large-tile defaults use them", "[gating][prune]") {
  const MoeShape large = shape(32768, 128, 8);  // 2048 pairs per expert: 128-row token tiles
  const MoeShape small = shape(128, 128, 8);    // 8 pairs per expert: 16-row token tiles
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    int multistage = 0, warp_specialized = 0;
    for (const TileConfig& c : config_space(r, large)) {
      INFO(c.name());
      CHECK((!c.warp_specialized || c.arch_tag == ArchTag::kHopper));
      if (c.arch_tag != ArchTag::kHopper) continue;
      ++(c.warp_specialized ? warp_specialized : multistage);
      CHECK_THAT(c.name(), Catch::EndsWith(c.persistent ? "_ws_persistent" : c.warp_specialized ? "_ws" : "_wg"));
      CHECK(c.block_threads() == c.threads() + (c.warp_specialized ? 128 : 0));
      for (auto dev : {fab::a100(), fab::rtx5090(), fab::b200()}) CHECK(prune_reason(r, c, large, dev));
    }
    CHECK(multistage > 0);
    CHECK(warp_specialized > 0);
    const TileConfig h = default_config(r, large, fab::h200());
    CHECK(h.arch_tag == ArchTag::kHopper);
    CHECK_FALSE(prune_reason(r, h, large, fab::h200()));
    for (auto dev : {fab::a100(), fab::rtx5090(), fab::b200()}) {
      const TileConfig c = default_config(r, large, dev);
      CHECK(c.arch_tag == ArchTag::kPortable);
      CHECK_FALSE(prune_reason(r, c, large, dev));
    }
    if (role_kind(r) == RoleKind::kTokenGemm) {
      // A warpgroup's MMA is 64 rows: 16-row tiles stay on mma.sync.
      for (const TileConfig& c : config_space(r, small)) CHECK(c.arch_tag == ArchTag::kPortable);
      CHECK(default_config(r, small, fab::h200()).arch_tag == ArchTag::kPortable);
    }
  }
}

TEST_CASE("wgmma warp layout: warpgroups along M, N of 64, 128 or 256 per warpgroup", "[prune]") {
  auto wg = [](int bm, int bn, int warps) {
    TileConfig c;
    c.block_m = bm;
    c.block_n = bn;
    c.warps = warps;
    c.arch_tag = ArchTag::kHopper;
    return c;
  };
  CHECK(gemm_warp_rows(Role::kFwdDown, wg(128, 128, 8)) == 2);  // two 64 x 128 warpgroups
  CHECK(gemm_warp_rows(Role::kFwdDown, wg(64, 128, 8)) == 1);   // two 64 x 64 side by side
  CHECK(gemm_warp_rows(Role::kFwdUp, wg(64, 128, 4)) == 1);     // gate + up: N = 256
  CHECK(gemm_warp_rows(Role::kFwdDown, wg(128, 96, 8)) == 0);   // N = 96 is not a wgmma tile here
  CHECK(gemm_warp_rows(Role::kFwdDown, wg(128, 128, 6)) == 0);  // not whole warpgroups
  CHECK(gemm_accumulators(Role::kFwdUp, wg(128, 128, 8)) == 128);
}

TEST_CASE("warp-specialized configs: producer threads, barrier memory, register-bound wgmma N", "[prune]") {
  const MoeShape large = shape(32768, 128, 8);
  const auto cfg = test::hopper_gemm;
  const TileConfig ms = cfg(128, 128, 32, 6, 4, false), ws = cfg(128, 128, 32, 6, 4, true);
  CHECK(ms.block_threads() == 128);
  CHECK(ws.block_threads() == 256);  // + the producer warpgroup
  // Token GEMM: stages of A and B, BLOCK_M int64 row offsets, then 2 mbarriers per stage.
  CHECK(role_smem_bytes(Role::kFwdDown, ms, large) == 2LL * 6 * (128 + 128) * 32 + 8 * 128);
  CHECK(role_smem_bytes(Role::kFwdDown, ws, large) == 2LL * 6 * (128 + 128) * 32 + 8 * 128 + 16 * 6);
  // Expert GEMM: stages, the 2 * BLOCK_K int32 token ring, the barriers.
  CHECK(role_smem_bytes(Role::kBwdDw1, ws, large) == 2LL * 6 * (128 + 128) * 32 + 8 * 32 + 16 * 6);
  // A persistent grid's block: stages, its output tile (BM x BLOCK_N), barriers, no row
  // offsets. fwd_up's B tile holds gate and up rows: 2 * BLOCK_N. The same tile one block per
  // tile keeps the row offsets (token GEMMs) or the token ring (dW) instead.
  TileConfig wide = cfg(128, 256, 64, 3, 8, true);
  wide.use_tma = true;
  CHECK(role_smem_bytes(Role::kFwdDown, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 8 * 128);
  CHECK(role_smem_bytes(Role::kBwdDw1, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 8 * 64);
  wide.persistent = true;
  CHECK(role_smem_bytes(Role::kFwdDown, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 2LL * 128 * 256);
  TileConfig up = cfg(128, 128, 64, 4, 8, true);
  up.use_tma = true;
  up.persistent = true;
  CHECK(role_smem_bytes(Role::kFwdUp, up, large) == 2LL * 4 * (128 + 256) * 64 + 16 * 4 + 2LL * 128 * 128);
  CHECK_FALSE(prune_reason(Role::kFwdUp, up, large, fab::h200()));  // 229440 B: fits without row offsets
  // fwd_up's persistent blocks beside at most 144 KB of stages hand g and u to the producer
  // warpgroup's spare warps: both tiles and two barriers (threads unchanged); not pairs.
  CHECK_FALSE(fwd_up_handoff(Role::kFwdUp, up));
  TileConfig up3 = up;
  up3.stages = 3;
  CHECK(fwd_up_handoff(Role::kFwdUp, up3));
  CHECK(role_smem_bytes(Role::kFwdUp, up3, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 4LL * 128 * 128 + 16);
  CHECK(role_block_threads(Role::kFwdUp, up3) == 384);
  CHECK_FALSE(prune_reason(Role::kFwdUp, up3, large, fab::h200()));
  TileConfig up3_pair = up3;
  up3_pair.cluster = 2;
  CHECK_FALSE(fwd_up_handoff(Role::kFwdUp, up3_pair));
  TileConfig up3_one_tile = up3;
  up3_one_tile.persistent = false;
  CHECK_FALSE(fwd_up_handoff(Role::kFwdUp, up3_one_tile));
  CHECK_FALSE(fwd_up_handoff(Role::kFwdDown, up3));
  CHECK(role_smem_bytes(Role::kBwdDw1, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 2LL * 128 * 256);
  // Beside more than 160 KB of stages, a persistent tile wider than 128 columns stages two of its
  // 64-column panels at a time (a ring): a fourth stage of BK 64, or an eighth of BK 32, then fits
  // a 128 x 256 tile (229440 and 229504 of 232448 bytes). Not bwd_down's, which stores its own way.
  CHECK_FALSE(ring_staging(Role::kFwdDown, wide));
  for (const auto& [bk, stages] : {std::pair{64, 4}, std::pair{32, 8}}) {
    TileConfig deep = wide;
    deep.block_k = bk;
    deep.stages = stages;
    for (Role r : {Role::kFwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
      INFO(role_name(r) << " " << deep.name());
      CHECK(ring_staging(r, deep));
      CHECK(role_smem_bytes(r, deep, large) == 2LL * stages * (128 + 256) * bk + 16 * stages + 2LL * 128 * 128);
      CHECK_FALSE(prune_reason(r, deep, large, fab::h200()));
    }
    CHECK_FALSE(ring_staging(Role::kBwdDown, deep));
    CHECK(prune_reason(Role::kBwdDown, deep, large, fab::h200()));
    TileConfig one_tile = deep;
    one_tile.persistent = false;
    CHECK_FALSE(ring_staging(Role::kFwdDown, one_tile));  // stages its tile in the stages, done with
  }
  CHECK_FALSE(ring_staging(Role::kFwdUp, up));  // 128 output columns: two panels, the whole tile
  // bwd_down's persistent block keeps the tile's g and u (2 x BM x BLOCK_N) and their two
  // barriers; its 256-column tiles hand d_act to an epilogue warpgroup: fp32 (as many bytes as g
  // and u) beside four stages of BK 32, bf16 beside three of BK 64, and nothing fits four.
  TileConfig down = cfg(128, 128, 64, 4, 8, true);
  down.use_tma = true;
  down.persistent = true;
  CHECK(role_smem_bytes(Role::kBwdDown, down, large) == 2LL * 4 * (128 + 128) * 64 + 16 * 4 + 4LL * 128 * 128 + 16);
  CHECK_FALSE(prune_reason(Role::kBwdDown, down, large, fab::h200()));
  CHECK_FALSE(epilogue_group(Role::kBwdDown, down));
  CHECK(role_block_threads(Role::kBwdDown, down) == 384);
  CHECK(epilogue_handoff_bytes(Role::kBwdDown, wide) == 2LL * 128 * 256);
  CHECK(role_smem_bytes(Role::kBwdDown, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 2LL * 128 * 256 + 16);
  CHECK_FALSE(prune_reason(Role::kBwdDown, wide, large, fab::h200()));
  TileConfig deeper = wide;
  deeper.stages = 4;
  const auto too_deep = prune_reason(Role::kBwdDown, deeper, large, fab::h200());
  REQUIRE(too_deep);
  CHECK_THAT(*too_deep, Catch::Contains("shared memory"));
  TileConfig grouped = cfg(128, 256, 32, 4, 8, true);
  grouped.use_tma = true;
  grouped.persistent = true;
  CHECK(epilogue_group(Role::kBwdDown, grouped));
  CHECK(role_block_threads(Role::kBwdDown, grouped) == 512);
  CHECK(epilogue_handoff_bytes(Role::kBwdDown, grouped) == 4LL * 128 * 256);
  CHECK(epilogue_handoff_bytes(Role::kBwdDown, down) == 0);
  CHECK(role_smem_bytes(Role::kBwdDown, grouped, large) == 2LL * 4 * (128 + 256) * 32 + 16 * 4 + 4LL * 128 * 256 + 16);
  CHECK_FALSE(prune_reason(Role::kBwdDown, grouped, large, fab::h200()));
  CHECK_FALSE(epilogue_group(Role::kFwdDown, grouped));  // the other roles' persistent blocks have none
  wide.persistent = false;
  CHECK(role_smem_bytes(Role::kBwdDown, wide, large) == 2LL * 3 * (128 + 256) * 64 + 16 * 3 + 8 * 128);
  CHECK(gemm_wgmma_n(Role::kFwdUp, cfg(64, 128, 32, 6, 4, true)) == 256);
  // One MMA warpgroup runs two blocks per SM at 128 registers: no 64 x 256 wgmma there.
  const MoeShape mid = shape(576, 128, 8);  // 36 pairs per expert: 64-row token tiles
  REQUIRE(token_block_m(mid) == 64);
  const auto two_per_sm = prune_reason(Role::kFwdUp, cfg(64, 128, 32, 6, 4, true), mid, fab::h200());
  REQUIRE(two_per_sm);
  CHECK_THAT(*two_per_sm, Catch::Contains("128 registers"));
  CHECK_FALSE(prune_reason(Role::kFwdUp, cfg(64, 128, 32, 6, 4, false), mid, fab::h200()));
  // A token GEMM takes the rows routing cuts each tile to, no other number.
  const auto other_height = prune_reason(Role::kFwdUp, cfg(64, 128, 32, 6, 4, false), large, fab::h200());
  REQUIRE(other_height);
  CHECK_THAT(*other_height, Catch::Contains("token tile of 128 rows"));
  CHECK_FALSE(prune_reason(Role::kFwdUp, cfg(128, 64, 32, 6, 4, true), large, fab::h200()));
  // The flag survives the database's JSON and names the config.
  const TileConfig back = nlohmann::json(ws).get<TileConfig>();
  CHECK(back == ws);
  CHECK(ws.name() == "bm128_bn128_bk32_s6_w4_g8_ws");
  CHECK(ms.name() == "bm128_bn128_bk32_s6_w4_g8_wg");
  CHECK(nlohmann::json(down).get<TileConfig>() == down);
  CHECK(down.name() == "bm128_bn128_bk64_s4_w8_g8_tma_ws_persistent");
  // Rows stored before the flag existed read as one block per tile.
  nlohmann::json old_row = nlohmann::json(down);
  old_row.erase("persistent");
  CHECK_FALSE(old_row.get<TileConfig>().persistent);
}

TEST_CASE("the space holds every tile that may run a persistent grid both ways", "[prune][launch]") {
  const MoeShape large = shape(32768, 128, 8);
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    const std::vector<TileConfig> space = config_space(r, large);
    int persistent = 0;
    for (const TileConfig& c : space) {
      INFO(c.name());
      TileConfig other = c;
      other.persistent = !c.persistent;
      CHECK(std::count(space.begin(), space.end(), other) == (persistent_eligible(r, c) ? 1 : 0));
      persistent += c.persistent;
    }
    CHECK(persistent > 0);
    // The tuned defaults of the two-warpgroup TMA tiles are persistent where that fits (not
    // bwd_down's 128 x 256 BK 64 tile, whose epilogue warpgroup's d_act would not).
    const TileConfig d = default_config(r, large, fab::h200());
    TileConfig as_persistent = d;
    as_persistent.persistent = true;
    const bool fits = role_smem_bytes(r, as_persistent, large) <= fab::h200().smem_optin_per_block;
    CHECK(d.persistent == (persistent_eligible(r, d) && fits));
  }
}

TEST_CASE("TMA configs: warp-specialized token GEMMs and bwd_dw1 on 16-byte rows only", "[prune][tma]") {
  const MoeShape aligned = shape(32768, 128, 8);
  MoeShape odd = aligned;
  odd.hidden = 2052;  // rows of 4104 bytes: not a multiple of 16
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    int tma = 0;
    for (const TileConfig& c : config_space(r, aligned)) {
      INFO(c.name());
      if (!c.use_tma) continue;
      ++tma;
      CHECK(c.warp_specialized);
      CHECK_THAT(c.name(), Catch::EndsWith(c.persistent ? "_tma_ws_persistent" : "_tma_ws"));
      CHECK(prune_reason(r, c, odd, fab::h200()));  // the same config on a shape TMA cannot take
      if (!prune_reason(r, c, aligned, fab::h200())) CHECK_FALSE(tensor_map_specs(r, c, aligned).empty());
      TileConfig multistage = c;
      multistage.warp_specialized = false;
      CHECK(prune_reason(r, multistage, aligned, fab::h200()));
    }
    CHECK((tma > 0) == (role_kind(r) == RoleKind::kTokenGemm || role_kind(r) == RoleKind::kExpertGemm));
    for (const TileConfig& c : config_space(r, odd)) CHECK_FALSE(c.use_tma);
  }
}

TEST_CASE("BLOCK_K 128: warp-specialized, three stages, where the tiles fit shared memory", "[prune]") {
  const MoeShape large = shape(32768, 128, 8);
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    int kept = 0;
    for (const TileConfig& c : config_space(r, large)) {
      if (c.block_k != 128) continue;
      INFO(c.name());
      CHECK(c.warp_specialized);
      CHECK(c.stages == 3);
      CHECK(c.cluster == 1);
      const auto why = prune_reason(r, c, large, fab::h200());
      if (!why) {
        ++kept;
        CHECK(role_smem_bytes(r, c, large) <= fab::h200().smem_optin_per_block);
      } else if (gemm_accumulators(r, c) <= 128) {
        CHECK_THAT(*why, Catch::Contains("shared memory"));  // 128 x 256 tiles: 288 KB
      }
    }
    CHECK(kept > 0);
  }
}

TEST_CASE("cluster pairs: the token GEMMs' two-warpgroup TMA tiles, on sm_90 only", "[prune][tma]") {
  const MoeShape large = shape(32768, 128, 8);
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    const std::vector<TileConfig> space = config_space(r, large);
    int pairs = 0;
    for (const TileConfig& c : space) {
      if (c.cluster == 1) continue;
      INFO(c.name());
      CHECK(c.cluster == 2);
      CHECK(c.warps == 8);
      CHECK_THAT(c.name(), Catch::EndsWith(c.persistent ? "_c2_tma_ws_persistent" : "_c2_tma_ws"));
      // The deepest fwd_down and bwd_dx pairs leave no room for a persistent block's output tile.
      if (const auto why = prune_reason(r, c, large, fab::h200())) {
        CHECK_THAT(*why, Catch::Contains("shared memory"));
        CHECK(persistent_grid(r, c));
      } else {
        ++pairs;
      }
      for (auto dev : {fab::a100(), fab::rtx5090(), fab::b200()}) CHECK(prune_reason(r, c, large, dev));
      TileConfig solo = c;  // the same tile without the pair is in the space too
      solo.cluster = 1;
      CHECK(std::count(space.begin(), space.end(), solo) == 1);
    }
    CHECK((pairs > 0) == (role_kind(r) == RoleKind::kTokenGemm));
    // 64-row tiles (32 pairs per expert) have no pairs.
    REQUIRE(token_block_m(shape(512, 128, 8)) == 64);
    for (const TileConfig& c : config_space(r, shape(512, 128, 8))) CHECK(c.cluster == 1);
  }
  TileConfig c = test::hopper_gemm(128, 256, 64, 3, 8, true);
  c.use_tma = true;
  c.cluster = 2;
  CHECK_FALSE(prune_reason(Role::kFwdDown, c, large, fab::h200()));
  CHECK(prune_reason(Role::kBwdDw1, c, large, fab::h200()));  // dW tiles share no weight tile
  c.cluster = 4;
  CHECK(prune_reason(Role::kFwdDown, c, large, fab::h200()));
  c.cluster = 2;
  c.use_tma = false;
  CHECK(prune_reason(Role::kFwdDown, c, large, fab::h200()));
}

TEST_CASE("TMA tensor maps: the tensors each role views and the boxes a config copies", "[tma]") {
  const MoeShape s{32768, 128, 2048, 768, 8, DType::kBF16};
  TileConfig c;
  c.block_m = 128;
  c.block_n = 128;
  c.block_k = 64;
  c.stages = 4;
  c.warps = 8;
  c.group_m = 8;
  c.arch_tag = ArchTag::kHopper;
  c.warp_specialized = true;
  c.use_tma = true;
  const std::uint64_t tk = 32768 * 8, h = 2048, i = 768, e = 128;
  // fwd_up: W1 [E, 2I, H] as [E, 2, I, H]; the two warpgroups split M, so each wgmma spans all
  // 128 gate and 128 up rows: boxes of 128 rows. Split along N (64-row tiles), 64-row boxes.
  // x_rows [TK, H] (x scattered into sorted order) in BLOCK_M-row boxes.
  // A persistent grid's TMA stores write act [TK, I] and pre_act [TK, 2I] as [TK, 2, I] in
  // 64-column panels of BLOCK_M rows.
  auto up = tensor_map_specs(Role::kFwdUp, c, s);
  REQUIRE(up.size() == 4);
  CHECK(up[2] == TensorMapSpec{2, {i, tk, 1, 1}, {2 * i, 0, 0}, {64, 128, 1, 1}, 128});
  CHECK(up[3] == TensorMapSpec{3, {i, 2, tk, 1}, {2 * i, 4 * i, 0}, {64, 1, 128, 1}, 128});
  CHECK(up[0] == TensorMapSpec{4, {h, i, 2, e}, {2 * h, 2 * i * h, 4 * i * h}, {64, 128, 1, 1}, 128});
  CHECK(up[1] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {64, 128, 1, 1}, 128});
  TileConfig split_n = c;
  split_n.block_m = 64;
  CHECK(tensor_map_specs(Role::kFwdUp, split_n, s)[0].box == std::array<std::uint32_t, 4>{64, 64, 1, 1});
  // fwd_down: act [TK, I] in BLOCK_M-row boxes, W2 [E, H, I] in BLOCK_N-row boxes.
  // A persistent grid's TMA stores write Y [TK, H] in 64-column panels of BLOCK_M rows.
  auto down = tensor_map_specs(Role::kFwdDown, c, s);
  REQUIRE(down.size() == 3);
  CHECK(down[0] == TensorMapSpec{2, {i, tk, 1, 1}, {2 * i, 0, 0}, {64, 128, 1, 1}, 128});
  CHECK(down[1] == TensorMapSpec{3, {i, h, e, 1}, {2 * i, 2 * h * i, 0}, {64, 128, 1, 1}, 128});
  CHECK(down[2] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {64, 128, 1, 1}, 128});
  // BLOCK_K 128: K-major tiles come as two boxes of 64 columns (one 128-byte swizzle row each);
  // MN-major panels just get 128 rows.
  TileConfig deep = c;
  deep.block_k = 128;
  CHECK(tensor_map_specs(Role::kFwdDown, deep, s)[0] == TensorMapSpec{2, {i, tk, 1, 1}, {2 * i, 0, 0}, {64, 128, 1, 1}, 128});
  CHECK(tensor_map_specs(Role::kBwdDw1, deep, s)[0].box == std::array<std::uint32_t, 4>{64, 128, 1, 1});
  // A cluster pair copies W2's tile as two boxes of BLOCK_N / 2 rows, one per block when shared.
  TileConfig pair = c;
  pair.cluster = 2;
  CHECK(tensor_map_specs(Role::kFwdDown, pair, s)[1].box == std::array<std::uint32_t, 4>{64, 64, 1, 1});
  // bwd_dx: d_pre_act [TK, 2I]; W1 [E, 2I, H] read MN-major in 64-column panels.
  c.block_k = 32;
  auto dx = tensor_map_specs(Role::kBwdDx, c, s);
  REQUIRE(dx.size() == 3);
  CHECK(dx[0] == TensorMapSpec{2, {2 * i, tk, 1, 1}, {4 * i, 0, 0}, {32, 128, 1, 1}, 64});
  CHECK(dx[1] == TensorMapSpec{3, {h, 2 * i, e, 1}, {2 * h, 4 * i * h, 0}, {64, 32, 1, 1}, 128});
  CHECK(dx[2] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {64, 128, 1, 1}, 128});  // dx_rows
  // bwd_down: W2 panels; d_out_rows [TK, H] (dO in sorted order) in BLOCK_M-row boxes.
  // The epilogue loads pre_act and stores d_pre_act [TK, 2I] viewed as [TK, 2, I], in 64-column
  // panels of BLOCK_M rows whatever BLOCK_K, so a g panel stops at column I.
  auto bd = tensor_map_specs(Role::kBwdDown, c, s);
  REQUIRE(bd.size() == 4);
  CHECK(bd[0] == TensorMapSpec{3, {i, h, e, 1}, {2 * i, 2 * h * i, 0}, {64, 32, 1, 1}, 128});
  CHECK(bd[1] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {32, 128, 1, 1}, 64});
  CHECK(bd[2] == TensorMapSpec{3, {i, 2, tk, 1}, {2 * i, 4 * i, 0}, {64, 1, 128, 1}, 128});
  CHECK(bd[3] == bd[2]);
  // The dW roles: both operands as panels of 64 columns by BLOCK_K sorted rows: d_pre_act
  // [TK, 2I] and x_rows [TK, H]; d_out_rows [TK, H] and weighted_act [TK, I].
  // Their stores write dW1 [E, 2I, H] and dW2 [E, H, I] per expert: a box stops at the expert,
  // and holds one MMA warpgroup's rows (each stores its own; the two split 128 rows here).
  auto dw1 = tensor_map_specs(Role::kBwdDw1, c, s);
  REQUIRE(dw1.size() == 3);
  CHECK(dw1[0] == TensorMapSpec{2, {2 * i, tk, 1, 1}, {4 * i, 0, 0}, {64, 32, 1, 1}, 128});
  CHECK(dw1[1] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {64, 32, 1, 1}, 128});
  CHECK(dw1[2] == TensorMapSpec{3, {h, 2 * i, e, 1}, {2 * h, 4 * i * h, 0}, {64, 64, 1, 1}, 128});
  auto dw2 = tensor_map_specs(Role::kBwdDw2, c, s);
  REQUIRE(dw2.size() == 3);
  CHECK(dw2[0] == TensorMapSpec{2, {h, tk, 1, 1}, {2 * h, 0, 0}, {64, 32, 1, 1}, 128});
  CHECK(dw2[1] == TensorMapSpec{2, {i, tk, 1, 1}, {2 * i, 0, 0}, {64, 32, 1, 1}, 128});
  CHECK(dw2[2] == TensorMapSpec{3, {i, h, e, 1}, {2 * i, 2 * h * i, 0}, {64, 64, 1, 1}, 128});
  TileConfig split_n_dw = c;
  split_n_dw.block_m = 64;  // the warpgroups split N: each stores all 64 rows
  CHECK(tensor_map_specs(Role::kBwdDw2, split_n_dw, s)[2].box == std::array<std::uint32_t, 4>{64, 64, 1, 1});
  TileConfig one_group = c;
  one_group.warps = 4;
  CHECK(tensor_map_specs(Role::kBwdDw1, one_group, s)[2].box == std::array<std::uint32_t, 4>{64, 128, 1, 1});
  CHECK_THROWS_AS(tensor_map_specs(Role::kGatherSum, c, s), InternalError);
  c.use_tma = false;
  CHECK_THROWS_AS(tensor_map_specs(Role::kFwdUp, c, s), InternalError);
}

TEST_CASE("TMA configs of the roles with gathered token rows read them pre-scattered", "[tma]") {
  TileConfig c;
  c.use_tma = true;
  CHECK(sorted_rows_read(Role::kFwdUp, c) == SortedRows::kX);
  CHECK(sorted_rows_read(Role::kBwdDw1, c) == SortedRows::kX);
  CHECK(sorted_rows_read(Role::kBwdDown, c) == SortedRows::kDOut);
  CHECK(sorted_rows_read(Role::kBwdDw2, c) == SortedRows::kDOut);
  // fwd_down and bwd_dx read rows already in sorted order; gather_sum does the scatter.
  for (Role r : {Role::kFwdDown, Role::kBwdDx, Role::kGatherSum, Role::kRouting}) {
    CHECK(sorted_rows_read(r, c) == SortedRows::kNone);
  }
  c.use_tma = false;
  for (Role r : kAllRoles) CHECK(sorted_rows_read(r, c) == SortedRows::kNone);
}

TEST_CASE("TMA tensor maps stay inside the driver's limits, or the shape takes no TMA", "[tma]") {
  // Every unpruned TMA config of every role, over shapes from tiny to the largest strides allowed.
  const MoeShape shapes[] = {{1, 8, 64, 32, 2, DType::kBF16},
                             {32768, 128, 2048, 768, 8, DType::kBF16},
                             {4096, 8, 4096, 14336, 2, DType::kFP16},
                             {1 << 20, 64, 1 << 18, 1 << 19, 8, DType::kBF16}};  // 4 H I = 2^39
  int checked = 0;
  for (const MoeShape& s : shapes) {
    for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw2, Role::kBwdDw1}) {
      for (const TileConfig& c : config_space(r, s)) {
        if (!c.use_tma || prune_reason(r, c, s, fab::h200())) continue;
        INFO(role_name(r) << " " << c.name() << " H=" << s.hidden << " I=" << s.intermediate);
        for (const TensorMapSpec& m : tensor_map_specs(r, c, s)) CHECK_FALSE(tensor_map_problem(m));
        ++checked;
      }
    }
  }
  CHECK(checked > 50);
  // One expert's W1 at 2^40 bytes or more: no TMA for any role, so no key asks for it.
  const MoeShape huge{1024, 4, 1 << 19, 1 << 19, 2, DType::kBF16};
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1}) {
    CHECK_FALSE(tma_eligible(r, huge));
    for (const TileConfig& c : config_space(r, huge)) CHECK_FALSE(c.use_tma);
  }
  // The checks themselves.
  TensorMapSpec ok{2, {64, 100, 1, 1}, {128, 0, 0}, {64, 32, 1, 1}, 128};
  CHECK_FALSE(tensor_map_problem(ok));
  TensorMapSpec bad = ok;
  bad.strides[0] = 136 + 4;  // not a multiple of 16
  CHECK(tensor_map_problem(bad));
  bad = ok;
  bad.box[1] = 512;
  CHECK(tensor_map_problem(bad));
  bad = ok;
  bad.swizzle_bytes = 64;  // 128-byte box rows under a 64-byte swizzle
  CHECK(tensor_map_problem(bad));
  bad = ok;
  bad.dims[1] = (1ULL << 32) + 1;
  CHECK(tensor_map_problem(bad));
}

TEST_CASE("the first call's space: TMA warp-specialized configs where a role has any legal, else BK 64 and deeper for small token tiles, else all",
          "[prune][tma]") {
  const auto kept = [](Role r, const MoeShape& s, const cuda::DeviceInfo& d) {
    const std::vector<PruneDecision> space = prune_space(r, s, d);
    int legal = 0, tma_ws = 0, first_call = 0;
    for (const PruneDecision& p : space) {
      if (p.reason) continue;
      ++legal;
      tma_ws += p.config.use_tma && p.config.warp_specialized;
      const auto why = first_call_exclusion(p.config, space);
      first_call += !why;
      if (why) CHECK_FALSE((p.config.use_tma && p.config.warp_specialized));
    }
    return std::tuple{legal, tma_ws, first_call};
  };
  MoeShape odd = shape(8192, 128, 8);
  odd.hidden = 2052;  // rows TMA cannot copy
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx, Role::kBwdDw1, Role::kBwdDw2}) {
    INFO(role_name(r));
    // 128-row token tiles on an H200: the TMA warp-specialized configs alone, a part of the space.
    const auto [legal, tma_ws, first_call] = kept(r, shape(8192, 128, 8), fab::h200());
    CHECK(tma_ws > 0);
    CHECK(first_call == tma_ws);
    CHECK(first_call < legal);
    // No legal TMA config: every legal config stays.
    for (const auto& [what, s, d] : {std::tuple{"an A100", shape(8192, 128, 8), fab::a100()},
                                     std::tuple{"rows TMA cannot copy", odd, fab::h200()}}) {
      INFO(what);
      const auto [all, none, same] = kept(r, s, d);
      CHECK(none == 0);
      CHECK(same == all);
    }
  }
  // 16- and 32-row token tiles (T=128 and 256: 8 and 16 pairs per expert): the token GEMMs have
  // no TMA config, so they keep every legal config of BK 64 or more and leave out BK 32; the dW
  // roles have TMA configs.
  for (long long t : {128LL, 256LL}) {
    for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDown, Role::kBwdDx}) {
      INFO(role_name(r) << " T=" << t);
      const std::vector<PruneDecision> space = prune_space(r, shape(t, 128, 8), fab::h200());
      int legal = 0, deep = 0, first_call = 0;
      for (const PruneDecision& p : space) {
        if (p.reason) continue;
        CHECK(p.config.block_m < 64);
        CHECK_FALSE(p.config.use_tma);
        ++legal;
        deep += p.config.block_k >= 64;
        const bool stays = !first_call_exclusion(p.config, space);
        CHECK(stays == (p.config.block_k >= 64));
        first_call += stays;
      }
      CHECK(deep > 0);
      CHECK(first_call == deep);
      CHECK(first_call < legal);
    }
  }
  const auto [legal, tma_ws, first_call] = kept(Role::kBwdDw1, shape(128, 128, 8), fab::h200());
  CHECK(tma_ws > 0);
  CHECK(first_call == tma_ws);
  // Routing and gather_sum have no TMA configs: the whole space.
  const auto [rlegal, rtma, rfirst] = kept(Role::kRouting, shape(8192, 128, 8), fab::h200());
  CHECK(rfirst == rlegal);
}

TEST_CASE("a row timed over the first call's space only, or cut short by the budget, is told from a whole row",
          "[prune][tma]") {
  const MoeShape large = shape(8192, 128, 8);
  const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, large, fab::h200());
  db::TuningRow narrow, whole;
  narrow.key.role = whole.key.role = Role::kFwdUp;
  for (const PruneDecision& p : space) {
    if (p.reason) continue;
    db::CandidateResult c{p.config, 0.1, 0.0, false, ""};
    whole.candidates.push_back(c);
    if (auto why = first_call_exclusion(p.config, space)) {
      c.rejected = true;
      c.reason = *why;
      c.median_ms = c.spread_ms = std::numeric_limits<double>::quiet_NaN();
    }
    narrow.candidates.push_back(c);
  }
  CHECK(tuned_partly(narrow, large));
  CHECK_FALSE(tuned_partly(whole, large));
  // Likewise a small token tile's row, narrowed to BK 64 and deeper.
  const MoeShape small = shape(128, 128, 8);
  const std::vector<PruneDecision> small_space = prune_space(Role::kFwdUp, small, fab::h200());
  db::TuningRow small_narrow;
  small_narrow.key.role = Role::kFwdUp;
  for (const PruneDecision& p : small_space) {
    if (p.reason) continue;
    db::CandidateResult c{p.config, 0.1, 0.0, false, ""};
    if (auto why = first_call_exclusion(p.config, small_space)) {
      c.rejected = true;
      c.reason = *why;
    }
    small_narrow.candidates.push_back(c);
  }
  CHECK(tuned_partly(small_narrow, small));
  // Rejections for other reasons (pruning, a wrong answer) do not make a row narrow.
  whole.candidates.front().rejected = true;
  whole.candidates.front().reason = "wrong result";
  CHECK_FALSE(tuned_partly(whole, large));
  // A row whose budget ran out before some candidates were timed is partial too, whatever the
  // budget (rows of earlier builds carry the same text).
  for (double budget : {5.0, 60.0, 2.5}) {
    db::TuningRow cut = whole;
    cut.candidates.back().rejected = true;
    cut.candidates.back().reason = budget_skip_reason(budget);
    CHECK(tuned_partly(cut, large));
  }
  CHECK(budget_skip_reason(60) == "skipped: tuning budget of 60 s spent");
}

TEST_CASE("a row's marks on configs its role's space no longer holds leave it whole", "[prune][tma]") {
  // What a space trimmed in host code (no template change, so the row stays current) leaves in a
  // stored row: the first call's or the budget's marks on configs no tune times any more.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const MoeShape& s : {shape(8192, 128, 8), shape(128, 128, 8)}) {
    INFO("T=" << s.tokens);
    const std::vector<PruneDecision> space = prune_space(Role::kFwdUp, s, fab::h200());
    db::TuningRow whole;
    whole.key.role = Role::kFwdUp;
    std::optional<std::size_t> excluded;  // a candidate outside the first call's space
    std::string why;
    for (const PruneDecision& p : space) {
      if (p.reason) continue;
      if (auto w = first_call_exclusion(p.config, space); w && !excluded) {
        excluded = whole.candidates.size();
        why = *w;
      }
      whole.candidates.push_back({p.config, 0.1, 0.0, false, ""});
    }
    REQUIRE(excluded);
    REQUIRE_FALSE(tuned_partly(whole, s));
    const auto trimmed = [&](TileConfig c) {
      c.stages = 7;  // no depth of the space
      REQUIRE(std::none_of(space.begin(), space.end(), [&](const PruneDecision& p) { return p.config == c; }));
      return c;
    };
    db::TuningRow stale = whole;
    stale.candidates.push_back({trimmed(whole.candidates[*excluded].config), nan, nan, true, why});
    stale.candidates.push_back({trimmed(whole.candidates.front().config), nan, nan, true, budget_skip_reason(60)});
    CHECK_FALSE(tuned_partly(stale, s));
    // Beside them, a mark on a config the space still holds keeps the row partial.
    const auto marked = [&](std::size_t at, const std::string& reason) {
      db::TuningRow r = stale;
      r.candidates[at] = {r.candidates[at].config, nan, nan, true, reason};
      return r;
    };
    CHECK(tuned_partly(marked(*excluded, why), s));
    CHECK(tuned_partly(marked(0, budget_skip_reason(60)), s));
  }
}
