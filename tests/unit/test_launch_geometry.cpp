// Launch geometry: the grid each role's kernel decodes (templates/common/moe_tiles.cuh:
// TokenGrid, ExpertGrid; gather_sum's token x column-block grid), its block and shared memory.
#include <catch2/catch.hpp>

#include "moe/launch.hpp"
#include "moejit/error.hpp"
#include "support/tile_configs.hpp"
#include "tuner/role_traits.hpp"

using namespace moejit;

namespace {

// Warp-specialized configs copy with TMA here, as in the tuned spaces.
TileConfig gemm(int bm, int bn, int bk, int stages, int warps, bool ws) {
  TileConfig c = test::hopper_gemm(bm, bn, bk, stages, warps, ws);
  c.use_tma = ws;
  return c;
}

}  // namespace

TEST_CASE("token tiles cover the mean pairs per expert plus two spreads, in [16, 128]", "[launch]") {
  const auto block_m = [](long long tokens) { return token_block_m(MoeShape{tokens, 128, 2048, 768, 8, DType::kBF16}); };
  CHECK(block_m(1) == 16);
  CHECK(block_m(128) == 16);  // 8 pairs per expert: 8 + 2 * 2.8 = 13.7
  CHECK(block_m(256) == 32);  // 16: 24
  CHECK(block_m(512) == 64);  // 32: 43.3
  CHECK(block_m(768) == 64);  // 48: 61.9
  CHECK(block_m(800) == 128);  // 50: 64.1
  // 64: 80. A 64-row tile would give about half the experts a second, nearly empty tile.
  CHECK(block_m(1024) == 128);
  CHECK(block_m(32768) == 128);
}

TEST_CASE("token GEMM grids cover the routing's tile bound times the output column blocks", "[launch]") {
  const MoeShape s{32768, 128, 2048, 768, 8, DType::kBF16};
  const long long max_tiles = 2176;
  const TileConfig c = gemm(128, 128, 64, 4, 8, true);
  // N: I for fwd_up (per gate/up half) and bwd_down, H for fwd_down and bwd_dx.
  CHECK(launch_geometry(Role::kFwdUp, c, s, max_tiles, true).grid.x == max_tiles * 6);
  CHECK(launch_geometry(Role::kBwdDown, c, s, max_tiles, true).grid.x == max_tiles * 6);
  CHECK(launch_geometry(Role::kFwdDown, c, s, max_tiles, true).grid.x == max_tiles * 16);
  const TileConfig wide = gemm(128, 256, 64, 3, 8, true);
  const LaunchGeometry dx = launch_geometry(Role::kBwdDx, wide, s, max_tiles, true);
  CHECK(dx.grid.x == max_tiles * 8);
  CHECK(dx.grid.y == 1);
  CHECK(dx.block.x == 256 + 128);  // MMA warps plus the producer warpgroup
  CHECK(dx.smem_bytes == role_smem_bytes(Role::kBwdDx, wide, s));
  // Partial column blocks round up.
  const MoeShape odd{2048, 8, 264, 136, 2, DType::kBF16};
  CHECK(launch_geometry(Role::kFwdUp, c, odd, 40, true).grid.x == 40 * 2);
  CHECK(launch_geometry(Role::kFwdDown, c, odd, 40, true).grid.x == 40 * 3);
}

TEST_CASE("cluster pairs launch whole clusters: odd token grids gain one padding block", "[launch]") {
  const MoeShape s{2048, 8, 264, 136, 2, DType::kBF16};
  TileConfig c = gemm(128, 256, 64, 4, 8, true);
  CHECK(launch_geometry(Role::kFwdDown, c, s, 41, true).cluster == 1);
  c.cluster = 2;
  const LaunchGeometry odd = launch_geometry(Role::kFwdDown, c, s, 41, true);  // 41 x 2 column blocks
  CHECK(odd.cluster == 2);
  CHECK(odd.grid.x == 82);
  const LaunchGeometry padded = launch_geometry(Role::kBwdDown, c, s, 41, true);  // 41 x 1
  CHECK(padded.grid.x == 42);
  CHECK(padded.block.x == 256 + 128);
}

TEST_CASE("persistent grids: the GEMM roles' two-warpgroup TMA tiles and pairs, when the config says so", "[launch]") {
  TileConfig two = gemm(128, 256, 64, 3, 8, true);
  two.use_tma = true;
  TileConfig one = gemm(128, 128, 64, 3, 4, true);
  one.use_tma = true;
  // bwd_down keeps its g and u tiles beside the stages up to 128 columns; its 128 x 256 tiles hand
  // d_act to an epilogue warpgroup instead, in blocks of their own (no pairs).
  CHECK(persistent_eligible(Role::kBwdDown, two));
  TileConfig two_pair = two;
  two_pair.cluster = 2;
  CHECK_FALSE(persistent_eligible(Role::kBwdDown, two_pair));
  TileConfig narrow = gemm(128, 128, 64, 4, 8, true);
  narrow.use_tma = true;
  CHECK(persistent_eligible(Role::kBwdDown, narrow));
  for (Role r : {Role::kFwdUp, Role::kFwdDown, Role::kBwdDx}) {
    INFO(role_name(r));
    CHECK(persistent_eligible(r, two));
    CHECK_FALSE(persistent_eligible(r, one));  // two blocks per SM overlap their epilogues already
    TileConfig pair = two;
    pair.cluster = 2;
    CHECK(persistent_eligible(r, pair));
    TileConfig copies = two;
    copies.use_tma = false;
    CHECK_FALSE(persistent_eligible(r, copies));
  }
  for (Role r : {Role::kBwdDw1, Role::kBwdDw2}) {
    CHECK(persistent_eligible(r, two));
    CHECK_FALSE(persistent_eligible(r, one));
  }
  for (Role r : {Role::kRouting, Role::kGatherSum}) CHECK_FALSE(persistent_eligible(r, two));
  // Eligible tiles run one block per tile unless the config asks for the persistent grid.
  CHECK_FALSE(persistent_grid(Role::kFwdDown, two));
  TileConfig persistent = two;
  persistent.persistent = true;
  CHECK(persistent_grid(Role::kFwdDown, persistent));
  CHECK(persistent_grid(Role::kBwdDown, persistent));
  // The geometry keeps the whole tile grid; launch_role trims it to the resident blocks.
  const MoeShape s{32768, 128, 2048, 768, 8, DType::kBF16};
  CHECK(launch_geometry(Role::kBwdDown, persistent, s, 2176, true).block.x == 256 + 128 + 128);  // + the epilogue warpgroup
  CHECK(launch_geometry(Role::kFwdDown, persistent, s, 2176, true).block.x == 256 + 128);
  CHECK(launch_geometry(Role::kFwdDown, persistent, s, 2176, true).grid.x == 2176 * 8);
}

TEST_CASE("a persistent grid on a green context's share holds that share's part of the resident clusters", "[launch]") {
  // One block per SM of 132: a share of 72 SMs holds 72, not the 132 that would run in two rounds.
  CHECK(clusters_on_share(132, 72, 132) == 72);
  CHECK(clusters_on_share(264, 104, 132) == 208);  // two blocks per SM
  // Pairs: 66 resident on 132 SMs; a share of 72 SMs holds 36 of them, 40 SMs hold 20.
  CHECK(clusters_on_share(66, 72, 132) == 36);
  CHECK(clusters_on_share(66, 40, 132) == 20);
  // Rounded down, never below one cluster.
  CHECK(clusters_on_share(60, 8, 132) == 3);
  CHECK(clusters_on_share(1, 8, 132) == 1);
  // The whole device, or a share the driver did not describe, keeps the whole device's count.
  CHECK(clusters_on_share(132, 132, 132) == 132);
  CHECK(clusters_on_share(132, 0, 132) == 132);
  CHECK(clusters_on_share(132, 72, 0) == 132);
  // No overflow on products past 2^32.
  CHECK(clusters_on_share(4000000000u, 2, 4) == 2000000000u);
}

TEST_CASE("dW grids are experts times the gradient's tiles", "[launch]") {
  const MoeShape s{32768, 128, 2048, 768, 8, DType::kBF16};
  const TileConfig c = gemm(128, 128, 32, 6, 4, true);
  // dW1 [2I, H], dW2 [H, I], whatever the token count.
  CHECK(launch_geometry(Role::kBwdDw1, c, s, 1, true).grid.x == 128u * 12 * 16);
  CHECK(launch_geometry(Role::kBwdDw2, c, s, 1, true).grid.x == 128u * 16 * 6);
  CHECK(launch_geometry(Role::kBwdDw2, c, s, 1, true).block.x == 128 + 128);
}

TEST_CASE("gather_sum runs one block row per token and enough column blocks for H", "[launch]") {
  const MoeShape s{1000, 128, 2048, 768, 8, DType::kBF16};
  TileConfig c;
  c.warps = 2;
  const LaunchGeometry vec = launch_geometry(Role::kGatherSum, c, s, 1, true);
  CHECK(vec.grid.x == 1000);
  CHECK(vec.grid.y == 4);  // 64 threads x 8 columns
  CHECK(vec.block.x == 64);
  CHECK(vec.smem_bytes == 0);
  CHECK(launch_geometry(Role::kGatherSum, c, s, 1, false).grid.y == 32);  // one column per thread
}

TEST_CASE("launch geometry refuses roles with their own launcher and grids past 2^31 blocks", "[launch]") {
  const MoeShape s{1024, 8, 256, 128, 2, DType::kBF16};
  CHECK_THROWS_AS(launch_geometry(Role::kRouting, TileConfig{}, s, 1, true), InternalError);
  CHECK_THROWS_AS(launch_geometry(Role::kFwdDown, gemm(64, 64, 32, 4, 4, false), s, 1LL << 31, true),
                  UnsupportedError);
}

TEST_CASE("gather_sum refuses H past 65535 column blocks, CUDA's limit on grid.y", "[launch]") {
  TileConfig c;
  c.warps = 4;  // 128 columns a block, one a thread off the vector path
  const auto gather = [&](int hidden, bool vector) {
    return launch_geometry(Role::kGatherSum, c, MoeShape{1, 1, hidden, 1, 1, DType::kBF16}, 1, vector);
  };
  CHECK(gather(65535 * 128, false).grid.y == 65535);
  CHECK_THROWS_AS(gather(65535 * 128 + 1, false), UnsupportedError);
  CHECK_THROWS_AS(gather(8388609, false), UnsupportedError);  // 65537 blocks
  CHECK(gather(65535 * 1024, true).grid.y == 65535);  // 8 columns a thread
  CHECK_THROWS_AS(gather(65535 * 1024 + 8, true), UnsupportedError);
}
