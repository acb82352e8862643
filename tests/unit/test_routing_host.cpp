// Routing's host side without a GPU: argument checks, workspace layout and the reference.
#include <catch2/catch.hpp>

#include "moe/reference/routing_reference.hpp"
#include "moe/routing.hpp"
#include "moejit/error.hpp"

using namespace moejit;

TEST_CASE("the routing reference on a hand-worked example", "[routing]") {
  // Pairs 0..5 -> experts 2,0,2,1,9(dropped),0 with E=3, BM=2.
  auto r = reference::routing_reference({2, 0, 2, 1, 9, 0}, 3, 2);
  CHECK(r.sorted_pairs == std::vector<std::int32_t>{1, 5, 3, 0, 2, 4});
  CHECK(r.pair_rows == std::vector<std::int32_t>{3, 0, 4, 2, 5, 1});
  CHECK(r.expert_counts == std::vector<std::int32_t>{2, 1, 2, 1});
  CHECK(r.expert_offsets == std::vector<std::int32_t>{0, 2, 3, 5, 6});
  CHECK(r.expert_tile_offsets == std::vector<std::int32_t>{0, 1, 2, 3});
  // max_tiles = 6/2 + min(3, 6) = 6
  CHECK(r.tile_expert == std::vector<std::int32_t>{0, 1, 2, -1, -1, -1});
  CHECK(r.tile_row_begin == std::vector<std::int32_t>{0, 2, 3, -1, -1, -1});
  // Experts by pairs, most first, ties by id: 0 (rows 0-2) and 2 (3-5) hold two, 1 (2-3) one.
  CHECK(r.ranked_experts == std::vector<std::int32_t>{0, 0, 2, 0, 2, 3, 5, 0, 1, 2, 3, 0});
}

TEST_CASE("routing workspace layout is aligned and sized at the host bound", "[routing]") {
  const RoutingLayout l = routing_layout(65536, 128, 64);
  CHECK(l.max_tiles == 65536 / 64 + 128);
  CHECK(l.max_chunks == 65536 / kRoutingMinChunk);
  for (std::size_t off : {l.chunk_counts, l.expert_counts, l.expert_offsets, l.expert_tile_offsets, l.tile_expert,
                          l.tile_row_begin, l.sorted_pairs, l.pair_rows, l.ranked_experts}) {
    CHECK(off % 256 == 0);
  }
  CHECK(l.pair_rows + 65536 * 4 <= l.ranked_experts);
  CHECK(l.ranked_experts + 128 * 16 <= l.total_bytes);
  CHECK(routing_max_tiles(3, 128, 64) == 3);
}

TEST_CASE("routing scans its chunk table only where reading it per block would cost more", "[routing]") {
  CHECK_FALSE(routing_scans(1, 4096));
  CHECK_FALSE(routing_scans(128, 128));  // T*K = 2^18 in chunks of 2048: 8.5 MB of reads
  CHECK(routing_scans(1024, 128));       // 2^21 pairs: 541 MB
  CHECK(routing_scans(64, 4096));        // 67 MB
}

TEST_CASE("routing shared memory per phase", "[routing]") {
  CHECK(routing_smem_bytes(0, 256, 127) == 4 * 128);
  CHECK(routing_smem_bytes(2, 256, 127) == 4 * (256 + 8 + 1));  // a tile of chunks, the scan's scratch
  // Next rows and offsets, then 8 warps' counts.
  CHECK(routing_smem_bytes(1, 256, 127) == 4 * (2 * 128 + 8 * 128));
  // One warp: the expert order's 8 sort keys of 8 bytes outgrow the per-warp counts, the tile
  // offsets and the scan scratch that share their space.
  CHECK(routing_smem_bytes(1, 32, 7) == 4 * (2 * 8 + 2 * 8));
  CHECK(routing_smem_bytes(1, 64, 129) == 4 * (2 * 130 + 2 * 256));
}

TEST_CASE("routing rejects bad arguments before launching", "[routing]") {
  RoutingArgs ok{0x1000, 16, 2, 8, 64, 0x2000, 1 << 20, nullptr};
  CHECK(validate_routing_args(ok).total_bytes == routing_layout(16 * 2, 8, 64).total_bytes);
  auto bad = ok;
  bad.topk = 9;
  CHECK_THROWS_AS(validate_routing_args(bad), InvalidArgument);
  bad = ok;
  bad.experts = 0;
  CHECK_THROWS_AS(validate_routing_args(bad), InvalidArgument);
  bad = ok;
  bad.workspace_bytes = 16;
  CHECK_THROWS_WITH(validate_routing_args(bad), Catch::Contains("workspace_bytes"));
  bad = ok;
  bad.topk_ids = 0x1002;
  CHECK_THROWS_WITH(validate_routing_args(bad), Catch::Contains("aligned"));
  bad = ok;
  bad.tokens = 1LL << 29;
  bad.topk = 8;
  CHECK_THROWS_WITH(validate_routing_args(bad), Catch::Contains("2^31"));
  // T·K up to 2^31 - 256: a row index plus a tile's rows or k-steps stays in int32 on the device.
  bad.tokens = (1LL << 31) - 255;
  bad.topk = 1;
  bad.experts = 1;
  CHECK_THROWS_WITH(validate_routing_args(bad), Catch::StartsWith("tokens") && Catch::Contains("2^31 - 256"));
  bad.tokens = (1LL << 31) - 256;
  bad.workspace_bytes = routing_layout(bad.tokens, 1, 64).total_bytes;
  CHECK_NOTHROW(validate_routing_args(bad));
  bad = ok;
  bad.block_m = 512;  // past the widest tile: its rows would overflow int32 near the pair limit
  CHECK_THROWS_WITH(validate_routing_args(bad), Catch::StartsWith("block_m"));
}
