// Routing: a stable counting sort of the flat (token, slot) pairs by expert, without any
// host synchronisation, plus the tile metadata the grouped GEMMs walk.
//
// Two or three launches of one template, selected by PHASE (one when a single chunk covers all pairs):
//   kRoutingCount   grid = chunks: per-chunk histogram over E+1 buckets (bucket E collects expert
//                   ids outside [0, E), which are dropped: they reach no expert and no output).
//                   Skipped when num_chunks == 1.
//   kRoutingScan    grid = E+1, only where the chunk table is large (`scanned`): each block turns
//                   its bucket's row of chunk counts into exclusive prefixes and writes the
//                   bucket's total to expert_counts, so kRoutingPlace reads two ints per bucket.
//   kRoutingPlace   grid = chunks: unless scanned, every block redoes the scan from the chunk
//                   counts (each bucket's total and its count in earlier chunks), which reads the
//                   whole table per block but saves a launch where it is small; then expert and tile offsets by block
//                   scans, block 0 writes the per-expert outputs, all blocks share the tile table
//                   (tile -> expert, first sorted row), block 0 also ranks the experts by pairs
//                   for the expert-major (dW) grids where asked, and each block scatters its chunk, stable
//                   in the flat index. With one chunk the block counts its pairs itself.
//   kRoutingCheck   grid-stride over a saved state's tables, before a backward takes a state it
//                   did not see written (an adopted copy, a captured forward): checks that the
//                   offsets run from 0 to at most T*K in order, that the tile table and the expert
//                   ranking are what kRoutingPlace derives from them, and that sorted_pairs and
//                   pair_rows are inverse permutations of [0, T*K) (which pair sits in which
//                   expert's rows cannot be checked: topk_ids is not in the state), so that every
//                   index the backward's kernels take from them is in bounds; a table that is not
//                   turns the state's stamp to kDamagedStamp (src/moe/saved_states.hpp).
//                   expert_counts and chunk_counts, which no backward reads, are not checked.
// A chunk is THREADS * ITEMS consecutive pairs, walked in ITEMS sub-tiles of THREADS.
// Dynamic shared memory per phase (ints): count E+1, scan THREADS+W+1, place 2(E+1) + max(W(E+1), E+1+W+1, 2P) with
// W = THREADS/32 and P = E rounded up to a power of two; src/moe/routing_layout.cpp computes the
// same sizes for the launch.
#pragma once

#include "common/block_scan.cuh"
#include "common/types.cuh"
#include "common/warp.cuh"

namespace moejit {

enum RoutingPhase : int { kRoutingCount = 0, kRoutingPlace = 1, kRoutingScan = 2, kRoutingCheck = 3 };

struct RoutingParams {
  const int32* topk_ids;     // [T*K] expert of each flat pair index t*K + k
  int32 num_pairs;           // T*K
  int32 num_experts;         // E
  int32 block_m;             // rows per GEMM tile
  int32 num_chunks;          // ceil(num_pairs / (THREADS*ITEMS))
  int32 max_tiles;           // host bound: num_pairs / block_m + min(E, num_pairs)
  int32 scanned;             // kRoutingScan ran: chunk_counts hold prefixes, expert_counts totals
  int32* chunk_counts;       // [(E+1) * num_chunks], bucket-major; unused when num_chunks == 1
  int32* expert_counts;      // [E+1]: pairs per expert; [E] = dropped pairs
  int32* expert_offsets;     // [E+2]: first sorted row of each expert; [E] = routed pairs, [E+1] = T*K
  int32* expert_tile_offsets;  // [E+1]: first tile of each expert; [E] = number of tiles
  int32* tile_expert;        // [max_tiles]: expert of each tile, -1 past the tile count
  int32* tile_row_begin;     // [max_tiles]: first sorted row of each tile, -1 past the tile count
  int32* sorted_pairs;       // [T*K]: sorted row -> flat pair index
  int32* pair_rows;          // [T*K]: flat pair index -> sorted row (>= expert_offsets[E]: dropped)
  int4* ranked_experts;      // [E] or null (not asked for): (expert, first row, end row, 0) by pairs,
                             // most first, ties by id
  uint32* stamp;             // kRoutingCheck: the state's stamp, word 0
  uint32 stamp_value;        // kRoutingCheck: what it holds for this problem
};

__device__ __forceinline__ int32 routing_bucket(const RoutingParams& p, int32 pair) {
  const int32 e = p.topk_ids[pair];
  return (e >= 0 && e < p.num_experts) ? e : p.num_experts;
}

// Histogram of this block's chunk over E+1 buckets into hist (shared), complete on return.
template <int THREADS, int ITEMS>
__device__ void routing_histogram(const RoutingParams& p, int32* hist) {
  const int32 buckets = p.num_experts + 1;
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) hist[b] = 0;
  __syncthreads();
  const int64 base = static_cast<int64>(blockIdx.x) * THREADS * ITEMS;
#pragma unroll 4
  for (int i = 0; i < ITEMS; ++i) {
    const int64 pair = base + static_cast<int64>(i) * THREADS + threadIdx.x;
    if (pair < p.num_pairs) atomicAdd(&hist[routing_bucket(p, static_cast<int32>(pair))], 1);
  }
  __syncthreads();
}

template <int THREADS, int ITEMS>
__device__ void routing_count(const RoutingParams& p, int32* smem) {
  const int32 buckets = p.num_experts + 1;
  routing_histogram<THREADS, ITEMS>(p, smem);
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    p.chunk_counts[static_cast<int64>(b) * p.num_chunks + blockIdx.x] = smem[b];
  }
}

// Per bucket: totals[b] = its pairs in all chunks, before[b] = its pairs in chunks before this
// block's. Scanned (p.scanned: routing_scan_bucket ran first), one thread per bucket reads its
// prefix and total; else one warp per bucket sums it, lanes across chunks (coalesced over a
// bucket-major row).
// chunk_counts is only read: other blocks read it concurrently.
template <int THREADS>
__device__ void routing_chunk_sums(const RoutingParams& p, int32* totals, int32* before) {
  constexpr int kWarps = THREADS / 32;
  const int32 buckets = p.num_experts + 1;
  const int32 chunk = static_cast<int32>(blockIdx.x);
  if (p.scanned) {
    for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
      totals[b] = p.expert_counts[b];
      before[b] = p.chunk_counts[static_cast<int64>(b) * p.num_chunks + chunk];
    }
    __syncthreads();
    return;
  }
  for (int32 b = threadIdx.x / 32; b < buckets; b += kWarps) {
    const int32* row = p.chunk_counts + static_cast<int64>(b) * p.num_chunks;
    int32 total = 0, earlier = 0;
    for (int32 c = static_cast<int32>(lane_id()); c < p.num_chunks; c += 32) {
      const int32 v = row[c];
      total += v;
      if (c < chunk) earlier += v;
    }
    total = warp_sum(total);
    earlier = warp_sum(earlier);
    if (lane_id() == 0) {
      totals[b] = total;
      before[b] = earlier;
    }
  }
  __syncthreads();
}

// Stable scatter of this block's chunk: next_row[b] is the first sorted row of bucket b's pairs
// in this chunk; warp_counts ([kWarps][E+1]) must be zero.
template <int THREADS, int ITEMS>
__device__ void routing_scatter(const RoutingParams& p, int32* next_row, int32* warp_counts) {
  const int32 buckets = p.num_experts + 1;
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

// ranked_experts from the first sorted rows (offsets, scanned: an expert's pairs are the next
// offset less its own), by a bitonic sort of (pairs descending, id) keys in `keys`, P = E rounded
// up to a power of two of them. Hot experts' dW tiles run longest: taken first, a persistent grid
// can even out its blocks' shares (templates/common/expert_gemm.cuh). Each entry carries the
// expert's rows too, so a dW block finds them with one load. Leaves the block synchronized.
template <int THREADS>
__device__ void routing_rank_experts(const RoutingParams& p, const int32* offsets, uint64* keys) {
  const int32 E = p.num_experts;
  int32 n = 1;
  while (n < E) n *= 2;
  for (int32 i = threadIdx.x; i < n; i += THREADS) {
    const uint32 fewer = i < E ? static_cast<uint32>(0x7fffffff - (offsets[i + 1] - offsets[i])) : 0xffffffffu;
    keys[i] = static_cast<uint64>(fewer) << 32 | static_cast<uint32>(i);
  }
  __syncthreads();
  for (int32 size = 2; size <= n; size *= 2) {
    for (int32 stride = size / 2; stride > 0; stride /= 2) {
      for (int32 i = threadIdx.x; i < n; i += THREADS) {
        const int32 j = i ^ stride;
        if (j > i) {
          const uint64 a = keys[i], b = keys[j];
          if ((a > b) == ((i & size) == 0)) {
            keys[i] = b;
            keys[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int32 i = threadIdx.x; i < E; i += THREADS) {
    const int32 e = static_cast<int32>(keys[i] & 0xffffffffu);
    // Four scalar stores: one make_int4 store here made ptxas spill 12-24 bytes.
    int32* entry = reinterpret_cast<int32*>(p.ranked_experts + i);
    entry[0] = e;
    entry[1] = offsets[e];
    entry[2] = offsets[e + 1];
    entry[3] = 0;
  }
  __syncthreads();
}

// Block b: bucket b's row of chunk counts becomes its exclusive prefixes, THREADS chunks at a
// time with the carry between them, and expert_counts[b] its total.
template <int THREADS>
__device__ void routing_scan_bucket(const RoutingParams& p, int32* smem) {
  int32* tile = smem;              // [THREADS]
  int32* scratch = smem + THREADS;  // [THREADS/32 + 1]
  int32* row = p.chunk_counts + static_cast<int64>(blockIdx.x) * p.num_chunks;
  int32 carry = 0;
  for (int32 c0 = 0; c0 < p.num_chunks; c0 += THREADS) {
    const int32 c = c0 + static_cast<int32>(threadIdx.x);
    tile[threadIdx.x] = c < p.num_chunks ? row[c] : 0;
    __syncthreads();
    const int32 total = block_exclusive_scan<THREADS>(tile, THREADS, scratch);
    if (c < p.num_chunks) row[c] = carry + tile[threadIdx.x];
    carry += total;
    __syncthreads();  // before the next tile's loads overwrite `tile`
  }
  if (threadIdx.x == 0) p.expert_counts[blockIdx.x] = carry;
}

template <int THREADS, int ITEMS>
__device__ void routing_place(const RoutingParams& p, int32* smem) {
  constexpr int kWarps = THREADS / 32;
  const int32 E = p.num_experts;
  const int32 buckets = E + 1;
  const bool first = blockIdx.x == 0;
  int32* next_row = smem;           // [E+1]: pairs in earlier chunks, then next free sorted row
  int32* offsets = smem + buckets;  // [E+1]: pairs per bucket, then its first sorted row
  // [kWarps][E+1]: the scatter's per-warp counts; until the scatter, the same space holds the
  // tile offsets [E+1] and the block scans' scratch [kWarps+1].
  int32* warp_counts = smem + 2 * buckets;
  int32* tile_offsets = warp_counts;
  int32* scratch = warp_counts + buckets;
  if (p.num_chunks == 1) {
    routing_histogram<THREADS, ITEMS>(p, offsets);
    for (int32 b = threadIdx.x; b < buckets; b += THREADS) next_row[b] = 0;
  } else {
    routing_chunk_sums<THREADS>(p, offsets, next_row);
  }
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    const int32 count = offsets[b];
    if (first && !p.scanned) p.expert_counts[b] = count;  // scanned: there already, read by every block
    tile_offsets[b] = b < E ? (count + p.block_m - 1) / p.block_m : 0;
  }
  __syncthreads();
  block_exclusive_scan<THREADS>(offsets, buckets, scratch);
  const int32 num_tiles = block_exclusive_scan<THREADS>(tile_offsets, buckets, scratch);
  for (int32 b = threadIdx.x; b < buckets; b += THREADS) {
    if (first) {
      p.expert_offsets[b] = offsets[b];
      p.expert_tile_offsets[b] = tile_offsets[b];
    }
    next_row[b] += offsets[b];
  }
  if (first && threadIdx.x == 0) p.expert_offsets[buckets] = p.num_pairs;
  // Tile table, each entry written by one thread of the grid: the tile's expert is found by
  // binary search over the tile offsets.
  for (int64 t = static_cast<int64>(blockIdx.x) * THREADS + threadIdx.x; t < p.max_tiles;
       t += static_cast<int64>(gridDim.x) * THREADS) {
    const int32 tile = static_cast<int32>(t);
    int32 expert = -1, row = -1;
    if (tile < num_tiles) {
      int32 lo = 0, hi = E - 1;  // last expert whose first tile <= tile
      while (lo < hi) {
        const int32 mid = (lo + hi + 1) / 2;
        if (tile_offsets[mid] <= tile) lo = mid; else hi = mid - 1;
      }
      expert = lo;
      row = offsets[lo] + (tile - tile_offsets[lo]) * p.block_m;
    }
    p.tile_expert[tile] = expert;
    p.tile_row_begin[tile] = row;
  }
  __syncthreads();  // the tile offsets and scratch make way for the expert order's keys
  if (first && p.ranked_experts != nullptr) {
    routing_rank_experts<THREADS>(p, offsets, reinterpret_cast<uint64*>(warp_counts));
  }
  for (int32 i = threadIdx.x; i < kWarps * buckets; i += THREADS) warp_counts[i] = 0;
  __syncthreads();
  routing_scatter<THREADS, ITEMS>(p, next_row, warp_counts);
}

// Each value the backward's kernels index with is compared with what routing_place derives from
// the expert offsets (which are checked to run from 0 to at most T*K, in order), so a state that
// passes indexes only inside its tables and buffers, and bounds every dW tile's k loop. Reads
// stay inside the tables whatever they hold: every index is a grid position, or clamped first.
template <int THREADS>
__device__ void routing_check(const RoutingParams& p) {
  const int32 E = p.num_experts, N = p.num_pairs;
  const int32* off = p.expert_offsets;
  const int32* tile_off = p.expert_tile_offsets;
  const int64 stride = static_cast<int64>(gridDim.x) * THREADS;
  const int64 first = static_cast<int64>(blockIdx.x) * THREADS + threadIdx.x;
  bool bad = false;
  for (int64 i = first; i < E; i += stride) {
    const int32 e = static_cast<int32>(i);
    if (e == 0) bad |= off[0] != 0 || tile_off[0] != 0 || off[E] > N || off[E + 1] != N || tile_off[E] > p.max_tiles;
    const int64 rows = static_cast<int64>(off[e + 1]) - off[e];
    bad |= rows < 0 || static_cast<int64>(tile_off[e + 1]) - tile_off[e] != (rows + p.block_m - 1) / p.block_m;
    if (p.ranked_experts != nullptr) {
      const int4 r = p.ranked_experts[e];
      const int32 x = min(max(r.x, 0), E - 1);
      bad |= r.x != x || r.y != off[x] || r.z != off[x + 1];
      // Strictly in routing_rank_experts' order (pairs descending, then id): no expert twice.
      if (e + 1 < E) {
        const int4 next = p.ranked_experts[e + 1];
        const int64 pairs = static_cast<int64>(r.z) - r.y, next_pairs = static_cast<int64>(next.z) - next.y;
        bad |= pairs < next_pairs || (pairs == next_pairs && r.x >= next.x);
      }
    }
  }
  const int32 tiles = min(max(tile_off[E], 0), p.max_tiles);
  for (int64 t = first; t < p.max_tiles; t += stride) {
    const int32 tile = static_cast<int32>(t);
    int32 expert = -1;
    int64 row = -1;
    if (tile < tiles) {
      int32 lo = 0, hi = E - 1;  // as routing_place's search
      while (lo < hi) {
        const int32 mid = (lo + hi + 1) / 2;
        if (tile_off[mid] <= tile) lo = mid; else hi = mid - 1;
      }
      expert = lo;
      row = off[lo] + static_cast<int64>(tile - tile_off[lo]) * p.block_m;
    }
    bad |= p.tile_expert[tile] != expert || p.tile_row_begin[tile] != row;
  }
  for (int64 i = first; i < N; i += stride) {
    const int32 pair = p.sorted_pairs[i];
    const int32 row = p.pair_rows[i];
    bad |= pair < 0 || pair >= N || row < 0 || row >= N;
    if (pair >= 0 && pair < N) bad |= p.pair_rows[pair] != i;
  }
  // Only over this problem's stamp: another's, or none, already tells the host the state is not one.
  // 0xffffffff is kDamagedStamp (src/moe/saved_states.hpp), which no state_stamp equals.
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicCAS(p.stamp, p.stamp_value, 0xffffffffu);
}

template <int PHASE, int THREADS, int ITEMS>
__global__ void __launch_bounds__(THREADS) routing_kernel(const __grid_constant__ RoutingParams p) {
  extern __shared__ int32 routing_smem[];
  if constexpr (PHASE == kRoutingCount) {
    routing_count<THREADS, ITEMS>(p, routing_smem);
  } else if constexpr (PHASE == kRoutingScan) {
    routing_scan_bucket<THREADS>(p, routing_smem);
  } else if constexpr (PHASE == kRoutingCheck) {
    routing_check<THREADS>(p);
  } else {
    routing_place<THREADS, ITEMS>(p, routing_smem);
  }
}

}  // namespace moejit
