// Routing on the GPU against the host reference: sorted order, counts, offsets and the tile
// table, for the routings that break MoE kernels, and the check phase passing every table it
// wrote. Outputs are poisoned before every run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "jit/kernel_cache.hpp"
#include "moe/reference/routing_reference.hpp"
#include "moe/routing.hpp"
#include "support/differences.hpp"
#include "support/gpu.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"

using namespace moejit;

namespace {

reference::RoutingReference run_routing(const test::Gpu& gpu, const std::vector<std::int32_t>& ids, long long tokens,
                                        int topk, int experts, int block_m, const TileConfig& config,
                                        bool rank_experts = true) {
  const RoutingLayout l = routing_layout(tokens * topk, experts, block_m);
  cuda::DeviceBuffer d_ids(ids.size() * 4);
  d_ids.upload(ids.data(), ids.size() * 4);
  cuda::DeviceBuffer ws(l.total_bytes);
  ws.fill_bytes(0xab);  // poison: any element the kernels fail to write shows up as 0xabababab
  const auto& kernel = jit::KernelCache::instance().load({Role::kRouting, config, DType::kBF16, gpu.info.arch()});
  cuda::Stream stream;
  RoutingArgs args{d_ids.get(), tokens, topk, experts, block_m, ws.get(), ws.bytes(), stream.get(), rank_experts};
  launch_routing(kernel, config, args);
  if (rank_experts) {
    // A saved state's check (as a backward over a copy runs it) finds every table as routing wrote
    // it: the stamp's word stays.
    constexpr std::uint32_t kStamp = 0x5a17c0de;
    cuda::DeviceBuffer stamp(4);
    stamp.upload(&kStamp, 4);
    launch_routing_check(kernel, config,
                         {ws.get(), l, tokens * topk, experts, block_m, stamp.get(), kStamp, stream.get()});
    std::uint32_t after = 0;
    stream.synchronize();
    stamp.download(&after, 4);
    CHECK(after == kStamp);
  }
  stream.synchronize();

  auto read = [&](std::size_t offset, std::size_t count) {
    std::vector<std::int32_t> v(count);
    ws.download(v.data(), count * 4, offset);
    return v;
  };
  const auto pairs = static_cast<std::size_t>(tokens * topk);
  reference::RoutingReference r;
  r.expert_counts = read(l.expert_counts, experts + 1);
  r.expert_offsets = read(l.expert_offsets, experts + 2);
  r.expert_tile_offsets = read(l.expert_tile_offsets, experts + 1);
  r.tile_expert = read(l.tile_expert, l.max_tiles);
  r.tile_row_begin = read(l.tile_row_begin, l.max_tiles);
  r.sorted_pairs = read(l.sorted_pairs, pairs);
  r.pair_rows = read(l.pair_rows, pairs);
  r.ranked_experts = read(l.ranked_experts, 4 * static_cast<std::size_t>(experts));
  return r;
}

void check_against_reference(const test::Gpu& gpu, const std::vector<std::int32_t>& ids, long long tokens, int topk,
                             int experts, int block_m, const TileConfig& config) {
  INFO("T=" << tokens << " K=" << topk << " E=" << experts << " BM=" << block_m << " config " << config.name());
  const auto want = reference::routing_reference(ids, experts, block_m);
  const auto got = run_routing(gpu, ids, tokens, topk, experts, block_m, config);
  CHECK(test::differences(got.expert_counts, want.expert_counts) == "none");
  CHECK(test::differences(got.expert_offsets, want.expert_offsets) == "none");
  CHECK(test::differences(got.expert_tile_offsets, want.expert_tile_offsets) == "none");
  CHECK(test::differences(got.tile_expert, want.tile_expert) == "none");
  CHECK(test::differences(got.tile_row_begin, want.tile_row_begin) == "none");
  CHECK(test::differences(got.sorted_pairs, want.sorted_pairs) == "none");
  CHECK(test::differences(got.pair_rows, want.pair_rows) == "none");
  CHECK(test::differences(got.ranked_experts, want.ranked_experts) == "none");
}

// Distinct experts per token, uniformly at random (what a router's top-k produces).
std::vector<std::int32_t> random_topk(long long tokens, int topk, int experts, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> ids(tokens * topk);
  std::vector<std::int32_t> perm(experts);
  for (int e = 0; e < experts; ++e) perm[e] = e;
  for (long long t = 0; t < tokens; ++t) {
    for (int k = 0; k < topk; ++k) {
      std::uniform_int_distribution<int> pick(k, experts - 1);
      std::swap(perm[k], perm[pick(rng)]);
      ids[t * topk + k] = perm[k];
    }
  }
  return ids;
}

TileConfig default_routing(const test::Gpu& gpu, long long tokens, int topk, int experts) {
  return default_config(Role::kRouting, {tokens, experts, 0, 0, topk, DType::kBF16}, gpu.info);
}

}  // namespace

TEST_CASE("routing matches the reference on random top-k routings", "[gpu][routing]") {
  MOEJIT_REQUIRE_GPU(gpu);
  for (auto [tokens, topk, experts, block_m] :
       {std::tuple{4096LL, 8, 128, 64}, {1000LL, 2, 8, 128}, {777LL, 6, 64, 16}, {8192LL, 8, 256, 128},
        // The expert order's sort: E not a power of two, and E = 4096 with most experts empty.
        std::tuple{3000LL, 3, 129, 32}, {2000LL, 4, 4096, 64}}) {
    auto ids = random_topk(tokens, topk, experts, static_cast<std::uint32_t>(tokens * 31 + experts));
    check_against_reference(*gpu, ids, tokens, topk, experts, block_m, default_routing(*gpu, tokens, topk, experts));
  }
}

TEST_CASE("routing edge cases: empty experts, one expert, T=1, K=E", "[gpu][routing]") {
  MOEJIT_REQUIRE_GPU(gpu);
  SECTION("experts with zero tokens") {
    // Only even experts receive tokens.
    auto ids = random_topk(2048, 4, 32, 7);
    for (auto& e : ids) e = (e / 2) * 2;
    check_against_reference(*gpu, ids, 2048, 4, 64, 64, default_routing(*gpu, 2048, 4, 64));
  }
  SECTION("all tokens on one expert") {
    std::vector<std::int32_t> ids(5000, 13);
    check_against_reference(*gpu, ids, 5000, 1, 128, 64, default_routing(*gpu, 5000, 1, 128));
  }
  SECTION("T = 1") {
    check_against_reference(*gpu, {3}, 1, 1, 8, 64, default_routing(*gpu, 1, 1, 8));
    auto ids = random_topk(1, 8, 128, 3);
    check_against_reference(*gpu, ids, 1, 8, 128, 16, default_routing(*gpu, 1, 8, 128));
  }
  SECTION("K = E") {
    auto ids = random_topk(999, 8, 8, 11);
    check_against_reference(*gpu, ids, 999, 8, 8, 32, default_routing(*gpu, 999, 8, 8));
  }
  SECTION("E = 1") {
    std::vector<std::int32_t> ids(300, 0);
    check_against_reference(*gpu, ids, 300, 1, 1, 128, default_routing(*gpu, 300, 1, 1));
  }
  SECTION("an inference plan's routing leaves the experts unranked") {
    auto ids = random_topk(2048, 4, 64, 8);
    const auto got = run_routing(*gpu, ids, 2048, 4, 64, 64, default_routing(*gpu, 2048, 4, 64), false);
    CHECK(std::all_of(got.ranked_experts.begin(), got.ranked_experts.end(),
                      [](std::int32_t v) { return v == static_cast<std::int32_t>(0xabababab); }));
    CHECK(test::differences(got.sorted_pairs, reference::routing_reference(ids, 64, 64).sorted_pairs) == "none");
  }
}

TEST_CASE("routing drops expert ids outside [0, E) without touching other rows", "[gpu][routing]") {
  MOEJIT_REQUIRE_GPU(gpu);
  auto ids = random_topk(3000, 4, 16, 5);
  ids[0] = -1;
  ids[17] = 16;
  ids[2999] = 1 << 30;
  ids[1234] = -2147483647 - 1;
  const auto want = reference::routing_reference(ids, 16, 64);
  CHECK(want.expert_counts[16] == 4);
  check_against_reference(*gpu, ids, 3000, 4, 16, 64, default_routing(*gpu, 3000, 4, 16));
}

TEST_CASE("routing above 2^20 pairs", "[gpu][routing]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const long long tokens = 262144 + 3;  // T*K = 2,097,176 pairs
  auto ids = random_topk(tokens, 8, 128, 99);
  check_against_reference(*gpu, ids, tokens, 8, 128, 128, default_routing(*gpu, tokens, 8, 128));
}

TEST_CASE("every routing config in the space agrees with the reference, in one chunk and in many",
          "[gpu][routing]") {
  MOEJIT_REQUIRE_GPU(gpu);
  const long long tokens = 20000;
  auto ids = random_topk(tokens, 8, 128, 1234);
  const MoeShape shape{tokens, 128, 0, 0, 8, DType::kBF16};
  int run = 0, scanned = 0;
  for (const PruneDecision& d : prune_space(Role::kRouting, shape, gpu->info)) {
    if (d.reason) continue;
    const long long chunk = static_cast<long long>(d.config.threads()) * d.config.items;
    // Many chunks (count, then place + scatter): 5 of the widest, 313 of the narrowest, whose
    // chunk table is large enough for its own scan launch.
    const long long chunks = (tokens * 8 + chunk - 1) / chunk;
    REQUIRE(chunks >= 5);
    scanned += routing_scans(chunks, 128);
    check_against_reference(*gpu, ids, tokens, 8, 128, 64, d.config);
    // One chunk, full and partial (the scatter launch counts by itself), with a dropped id.
    auto full = random_topk(chunk / 8, 8, 128, 77);
    check_against_reference(*gpu, full, chunk / 8, 8, 128, 64, d.config);
    auto partial = random_topk(chunk / 8 - 3, 8, 128, 78);
    partial[5] = 128;
    check_against_reference(*gpu, partial, chunk / 8 - 3, 8, 128, 64, d.config);
    // Two chunks, the second holding a single pair.
    auto two = random_topk(chunk + 1, 1, 128, 79);
    check_against_reference(*gpu, two, chunk + 1, 1, 128, 16, d.config);
    ++run;
  }
  CHECK(run == 16);
  CHECK(scanned > 0);  // both forms of the place launch ran
  CHECK(scanned < run);
}

TEST_CASE("kernels load again after the primary context is destroyed and re-created", "[gpu][routing]") {
  std::string why;
  if (!cuda::device_available(&why)) {
    WARN("SKIPPED (no GPU): " << why);
    return;
  }
  auto ids = random_topk(512, 2, 8, 2);
  for (int round = 0; round < 3; ++round) {
    // Each Gpu retains and releases the primary context; with nothing else holding it, the
    // context is destroyed in between and its successor may reuse the same address.
    INFO("round " << round);
    test::Gpu gpu;
    check_against_reference(gpu, ids, 512, 2, 8, 64, default_routing(gpu, 512, 2, 8));
  }
}
