// Routing: a stable counting sort of the flat (token, slot) pairs by expert, without any
// host synchronisation, plus the tile metadata the grouped GEMMs walk.
//
// Three launches of one template, selected by PHASE:
//   kRoutingCount   grid = chunks: per-chunk histogram over E+1 buckets (bucket E collects expert
//                   ids outside [0, E), which are dropped: they reach no expert and no output).
//   kRoutingScan    one block: per-bucket offsets of every chunk, expert counts and offsets,
//                   tiles per expert and the tile table (tile -> expert, first sorted row).
//   kRoutingScatter grid = chunks: each pair's sorted position, stable in the flat index.
// A chunk is THREADS * ITEMS consecutive pairs, walked in ITEMS sub-tiles of THREADS.
// Dynamic shared memory per phase (ints): count E+1, scan 2(E+1)+THREADS/32+1,
// scatter (THREADS/32+1)(E+1); src/moe/routing.cpp computes the same sizes for the launch.
#pragma once

#include "common/block_scan.cuh"
#include "common/types.cuh"
#include "common/warp.cuh"

namespace moejit {

enum RoutingPhase : int { kRoutingCount = 0, kRoutingScan = 1, kRoutingScatter = 2 };

struct RoutingParams {
  const int32* topk_ids;     // [T*K] expert of each flat pair index t*K + k
  int32 num_pairs;           // T*K
  int32 num_experts;         // E
  int32 block_m;             // rows per GEMM tile
  int32 num_chunks;          // ceil(num_pairs / (THREADS*ITEMS))
  int32 max_tiles;           // host bound: num_pairs / block_m + min(E, num_pairs)
  int32* chunk_counts;       // [(E+1) * num_chunks], bucket-major; the scan turns counts into offsets
  int32* expert_counts;      // [E+1]: pairs per expert; [E] = dropped pairs
  int32* expert_offsets;     // [E+2]: first sorted row of each expert; [E] = routed pairs, [E+1] = T*K
  int32* expert_tile_offsets;  // [E+1]: first tile of each expert; [E] = number of tiles
  int32* tile_expert;        // [max_tiles]: expert of each tile, -1 past the tile count
  int32* tile_row_begin;     // [max_tiles]: first sorted row of each tile, -1 past the tile count
  int32* sorted_pairs;       // [T*K]: sorted row -> flat pair index
  int32* pair_rows;          // [T*K]: flat pair index -> sorted row (>= expert_offsets[E]: dropped)
};

__device__ __forceinline__ int32 routing_bucket(const RoutingParams& p, int32 pair) {
  const int32 e = p.topk_ids[pair];
  return (e >= 0 && e < p.num_experts) ? e : p.num_experts;
}

template <int THREADS, int ITEMS>
__device__ void routing_count(const RoutingParams& p, int32* smem) {
  const int32 buckets = p.num_experts + 1;
  int32* hist = smem;
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) hist[b] = 0;
  __syncthreads();
  const int64 base = static_cast<int64>(blockIdx.x) * THREADS * ITEMS;
#pragma unroll 4
  for (int i = 0; i < ITEMS; ++i) {
    const int64 pair = base + static_cast<int64>(i) * THREADS + threadIdx.x;
    if (pair < p.num_pairs) atomicAdd(&hist[routing_bucket(p, static_cast<int32>(pair))], 1);
  }
  __syncthreads();
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    p.chunk_counts[static_cast<int64>(b) * p.num_chunks + blockIdx.x] = hist[b];
  }
}

template <int THREADS>
__device__ void routing_scan(const RoutingParams& p, int32* smem) {
  constexpr int kWarps = THREADS / 32;
  const int32 E = p.num_experts;
  const int32 buckets = E + 1;
  int32* offsets = smem;                  // [E+1]
  int32* tile_offsets = smem + buckets;   // [E+1]
  int32* scratch = smem + 2 * buckets;    // [kWarps+1]
  // Per bucket, an exclusive scan over chunks: one warp per bucket, lanes across chunks.
  const int warp = threadIdx.x / 32;
  for (int32 b = warp; b < buckets; b += kWarps) {
    int32* row = p.chunk_counts + static_cast<int64>(b) * p.num_chunks;
    int32 carry = 0;
    for (int32 c0 = 0; c0 < p.num_chunks; c0 += 32) {
      const int32 c = c0 + static_cast<int32>(lane_id());
      const int32 v = c < p.num_chunks ? row[c] : 0;
      const int32 incl = warp_inclusive_scan(v);
      if (c < p.num_chunks) row[c] = carry + incl - v;
      carry += __shfl_sync(kFullWarp, incl, 31);
    }
    if (lane_id() == 0) {
      p.expert_counts[b] = carry;
      offsets[b] = carry;
      tile_offsets[b] = b < E ? (carry + p.block_m - 1) / p.block_m : 0;
    }
  }
  __syncthreads();
  block_exclusive_scan<THREADS>(offsets, buckets, scratch);
  const int32 num_tiles = block_exclusive_scan<THREADS>(tile_offsets, buckets, scratch);
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    p.expert_offsets[b] = offsets[b];
    p.expert_tile_offsets[b] = tile_offsets[b];
  }
  if (threadIdx.x == 0) p.expert_offsets[buckets] = p.num_pairs;
  // Tile table: each tile finds its expert by binary search over the tile offsets.
  for (int32 t = threadIdx.x; t < p.max_tiles; t += THREADS) {
    int32 expert = -1, row = -1;
    if (t < num_tiles) {
      int32 lo = 0, hi = E - 1;  // last expert whose first tile <= t
      while (lo < hi) {
        const int32 mid = (lo + hi + 1) / 2;
        if (tile_offsets[mid] <= t) lo = mid; else hi = mid - 1;
      }
      expert = lo;
      row = offsets[lo] + (t - tile_offsets[lo]) * p.block_m;
    }
    p.tile_expert[t] = expert;
    p.tile_row_begin[t] = row;
  }
}

template <int THREADS, int ITEMS>
__device__ void routing_scatter(const RoutingParams& p, int32* smem) {
  constexpr int kWarps = THREADS / 32;
  const int32 buckets = p.num_experts + 1;
  int32* next_row = smem;                 // [E+1]: next free sorted row of each bucket
  int32* warp_counts = smem + buckets;    // [kWarps][E+1]: pairs of each bucket per warp
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    next_row[b] = p.expert_offsets[b] + p.chunk_counts[static_cast<int64>(b) * p.num_chunks + blockIdx.x];
  }
  for (int32 i = threadIdx.x; i < kWarps * buckets; i += THREADS) warp_counts[i] = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int64 base = static_cast<int64>(blockIdx.x) * THREADS * ITEMS;
  for (int i = 0; i < ITEMS; ++i) {
    const int64 pair = base + static_cast<int64>(i) * THREADS + threadIdx.x;
    const bool valid = pair < p.num_pairs;
    const int32 bucket = valid ? routing_bucket(p, static_cast<int32>(pair)) : -1;
    const uint32 peers = __match_any_sync(kFullWarp, bucket);
    const int32 rank = __popc(peers & lanemask_lt());
    const bool leader = rank == 0;
    if (valid && leader) warp_counts[warp * buckets + bucket] = __popc(peers);
    __syncthreads();
    if (valid) {
      int32 row = next_row[bucket] + rank;
      for (int w = 0; w < warp; ++w) row += warp_counts[w * buckets + bucket];
      p.sorted_pairs[row] = static_cast<int32>(pair);
      p.pair_rows[pair] = row;
    }
    __syncthreads();
    if (valid && leader) {
      atomicAdd(&next_row[bucket], __popc(peers));
      warp_counts[warp * buckets + bucket] = 0;
    }
    __syncwarp();
  }
}

template <int PHASE, int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS) routing_kernel(const __grid_constant__ RoutingParams p) {
  extern __shared__ int32 routing_smem[];
  if constexpr (PHASE == kRoutingCount) {
    routing_count<THREADS, ITEMS>(p, routing_smem);
  } else if constexpr (PHASE == kRoutingScan) {
    routing_scan<THREADS>(p, routing_smem);
  } else {
    routing_scatter<THREADS, ITEMS>(p, routing_smem);
  }
}

}  // namespace moejit
