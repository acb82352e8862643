// Host reference for the routing role: a plain stable sort, written independently of the
// kernel, that tests compare every routing output against.
#pragma once

#include <cstdint>
#include <vector>

namespace moejit::reference {

struct RoutingReference {
  std::vector<std::int32_t> expert_counts;        // [E+1], [E] = dropped pairs
  std::vector<std::int32_t> expert_offsets;       // [E+2]
  std::vector<std::int32_t> expert_tile_offsets;  // [E+1]
  std::vector<std::int32_t> tile_expert;          // [max_tiles], -1 past the tile count
  std::vector<std::int32_t> tile_row_begin;       // [max_tiles], -1 past the tile count
  std::vector<std::int32_t> sorted_pairs;         // [T*K]
  std::vector<std::int32_t> pair_rows;            // [T*K]
  std::vector<std::int32_t> ranked_experts;       // [E][4]: (expert, first row, end row, 0) by pairs,
                                                  // most first, ties by id
};

RoutingReference routing_reference(const std::vector<std::int32_t>& topk_ids, int experts, int block_m);

}  // namespace moejit::reference
