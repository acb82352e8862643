// Sizes and placement of the routing outputs and scratch in one caller-provided workspace.
// Pure functions, shared by the launcher, the pruning rules and the tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moejit {

// Smallest chunk (pairs per routing block) in the routing config space; the workspace is sized
// for it so one workspace serves every routing config.
inline constexpr long long kRoutingMinChunk = 512;
inline constexpr int kMaxExperts = 4096;
// Pairs (T·K) a problem may have: 2^31 less the widest tile edge, so the kernels' int32 row
// indices stay in range with a tile's rows or k-steps (BLOCK_M, BLOCK_K ≤ kMaxBlockM) added.
inline constexpr int kMaxBlockM = 256;
inline constexpr long long kMaxPairs = (1LL << 31) - kMaxBlockM;

// Host bound on the number of GEMM tiles: TK/BM + min(E, TK) (each non-empty expert adds at
// most one partial tile). The real count stays on the device.
long long routing_max_tiles(long long pairs, int experts, int block_m);

// Launches of the routing template: phase 0 counts per chunk, phase 2 scans the chunk table where
// it is large (routing_scans), phase 1 places and scatters (templates/routing.cuh); a single
// chunk launches phase 1 only. Phase 3 checks a saved state's tables (launch_routing_check).
inline constexpr int kRoutingPhases = 4;

// Whether routing runs its scan launch: where every place block reading the whole chunk table
// (chunks^2 (E+1) ints) would cost more than the launch.
bool routing_scans(long long chunks, int experts);

// Dynamic shared memory of a routing phase (0 count, 1 place and scatter, 2 scan, 3 check: none),
// bytes.
long long routing_smem_bytes(int phase, int threads, int experts);

struct RoutingLayout {
  // Byte offsets into the workspace (each 256-byte aligned) and element counts.
  std::size_t chunk_counts = 0, expert_counts = 0, expert_offsets = 0, expert_tile_offsets = 0, tile_expert = 0,
              tile_row_begin = 0, sorted_pairs = 0, pair_rows = 0, ranked_experts = 0;
  long long max_tiles = 0;
  long long max_chunks = 0;
  std::size_t total_bytes = 0;
};

RoutingLayout routing_layout(long long pairs, int experts, int block_m);

}  // namespace moejit
