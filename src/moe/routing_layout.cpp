#include "moe/routing_layout.hpp"

#include <algorithm>

namespace moejit {

long long routing_max_tiles(long long pairs, int experts, int block_m) {
  return pairs / block_m + std::min<long long>(experts, pairs);
}

long long routing_smem_bytes(int phase, int threads, int experts) {
  const long long buckets = experts + 1;
  const long long warps = threads / 32;
  if (phase == 0) return 4 * buckets;
  if (phase == 2) return 4 * (threads + warps + 1);
  if (phase == 3) return 0;
  long long pow2 = 1;
  while (pow2 < experts) pow2 *= 2;
  // Next rows and offsets, then the per-warp counts, whose space first holds the tile offsets
  // and the scan scratch, then block 0's sort keys (8 bytes per expert, E rounded up to a power of two).
  return 4 * (2 * buckets + std::max({warps * buckets, buckets + warps + 1, 2 * pow2}));
}

bool routing_scans(long long chunks, int experts) {
  // 32 MB of table reads, tens of microseconds from L2, against a launch's few.
  return chunks > 1 && static_cast<double>(chunks) * static_cast<double>(chunks) * (experts + 1) * 4 > 32e6;
}

RoutingLayout routing_layout(long long pairs, int experts, int block_m) {
  RoutingLayout l;
  l.max_tiles = std::max<long long>(1, routing_max_tiles(pairs, experts, block_m));
  l.max_chunks = std::max<long long>(1, (pairs + kRoutingMinChunk - 1) / kRoutingMinChunk);
  std::size_t at = 0;
  auto place = [&](std::size_t& field, long long ints) {
    field = at;
    at += (static_cast<std::size_t>(ints) * 4 + 255) / 256 * 256;
  };
  place(l.chunk_counts, (experts + 1) * l.max_chunks);
  place(l.expert_counts, experts + 1);
  place(l.expert_offsets, experts + 2);
  place(l.expert_tile_offsets, experts + 1);
  place(l.tile_expert, l.max_tiles);
  place(l.tile_row_begin, l.max_tiles);
  place(l.sorted_pairs, std::max<long long>(pairs, 1));
  place(l.pair_rows, std::max<long long>(pairs, 1));
  place(l.ranked_experts, 4LL * experts);
  l.total_bytes = at;
  return l;
}

}  // namespace moejit
