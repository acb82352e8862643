#include "moe/reference/routing_reference.hpp"

#include <algorithm>
#include <numeric>

#include "moe/routing_layout.hpp"

namespace moejit::reference {

RoutingReference routing_reference(const std::vector<std::int32_t>& ids, int experts, int block_m) {
  const auto n = static_cast<std::int32_t>(ids.size());
  auto bucket = [&](std::int32_t pair) { return (ids[pair] >= 0 && ids[pair] < experts) ? ids[pair] : experts; };
  RoutingReference r;
  r.sorted_pairs.resize(n);
  std::iota(r.sorted_pairs.begin(), r.sorted_pairs.end(), 0);
  std::stable_sort(r.sorted_pairs.begin(), r.sorted_pairs.end(),
                   [&](std::int32_t a, std::int32_t b) { return bucket(a) < bucket(b); });
  r.pair_rows.resize(n);
  for (std::int32_t row = 0; row < n; ++row) r.pair_rows[r.sorted_pairs[row]] = row;

  r.expert_counts.assign(experts + 1, 0);
  for (std::int32_t i = 0; i < n; ++i) ++r.expert_counts[bucket(i)];
  r.expert_offsets.assign(experts + 2, 0);
  for (int e = 0; e <= experts; ++e) r.expert_offsets[e + 1] = r.expert_offsets[e] + r.expert_counts[e];
  r.expert_tile_offsets.assign(experts + 1, 0);
  for (int e = 0; e < experts; ++e) {
    r.expert_tile_offsets[e + 1] = r.expert_tile_offsets[e] + (r.expert_counts[e] + block_m - 1) / block_m;
  }
  const auto max_tiles = std::max<long long>(1, routing_max_tiles(n, experts, block_m));
  r.tile_expert.assign(max_tiles, -1);
  r.tile_row_begin.assign(max_tiles, -1);
  std::int32_t tile = 0;
  for (int e = 0; e < experts; ++e) {
    for (std::int32_t row = r.expert_offsets[e]; row < r.expert_offsets[e + 1]; row += block_m, ++tile) {
      r.tile_expert[tile] = e;
      r.tile_row_begin[tile] = row;
    }
  }
  std::vector<std::int32_t> by_pairs(experts);
  std::iota(by_pairs.begin(), by_pairs.end(), 0);
  std::stable_sort(by_pairs.begin(), by_pairs.end(),
                   [&](std::int32_t a, std::int32_t b) { return r.expert_counts[a] > r.expert_counts[b]; });
  for (std::int32_t e : by_pairs) {
    r.ranked_experts.insert(r.ranked_experts.end(), {e, r.expert_offsets[e], r.expert_offsets[e + 1], 0});
  }
  return r;
}

}  // namespace moejit::reference
