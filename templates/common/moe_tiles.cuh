// What the GEMM roles read from routing (templates/routing.cuh), and the lookup of a token
// tile: which expert it belongs to and which sorted rows it covers.
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/tile_order.cuh"
#include "common/tma_sm90.cuh"
#include "common/types.cuh"

namespace moejit {

// Mirrors src/moe/kernel_params.hpp.
struct RoutingView {
  const int32* sorted_pairs;         // [T*K] sorted row -> flat pair index t*K + k
  const int32* expert_offsets;       // [E+2] first sorted row of each expert; [E] = routed pairs
  const int32* expert_tile_offsets;  // [E+1]; [E] = number of token tiles
  const int32* tile_expert;          // [max_tiles]
  const int32* tile_row_begin;       // [max_tiles]
  const int4* ranked_experts;        // [E] (expert, first row, end row, 0) by pairs, most first;
                                     // null: the experts in id order
  int32 experts;
  int32 topk;
  int32 max_tiles;                   // host bound on token tiles: the grid's m extent
};

struct TokenTile {
  int32 expert;
  int32 row0;  // first sorted row
  int32 rows;  // valid rows, 1..BM
};

// False for grid positions past the device-side tile count: such blocks exit at once.
template <int BM>
__device__ __forceinline__ bool token_tile(const RoutingView& r, int64 m, TokenTile& t) {
  if (m >= r.expert_tile_offsets[r.experts]) return false;
  t.expert = r.tile_expert[m];
  t.row0 = r.tile_row_begin[m];
  t.rows = min_of(BM, r.expert_offsets[t.expert + 1] - t.row0);
  return true;
}

__device__ __forceinline__ int32 token_of_row(const RoutingView& r, int64 row) { return r.sorted_pairs[row] / r.topk; }

// The tokens of an expert GEMM's k tiles (BK sorted rows of one expert each), looked up one tile
// ahead: a lookup is a dependent global load, and issued just before the copies that need it
// it would stall the loaders once per k tile. Each of the LOADERS loading threads calls
// begin(kt), loads the tile with token(r) or load_rows(), then end(); for kt = 0, 1, 2, ... in
// order.
// `ring` holds 2 * BK int32 of shared memory.
template <int BK, int LOADERS>
struct KRowTokens {
  static_assert(BK <= LOADERS, "one loader looks up each row");
  const RoutingView& routing;
  int32 r_begin, r_end;
  int32* ring;
  int32 next = -1;  // this thread's row of the following tile
  const int32* current = nullptr;

  __device__ __forceinline__ int32 lookup(int64 row) const { return row < r_end ? token_of_row(routing, row) : -1; }

  __device__ __forceinline__ void begin(int kt) {
    const int i = loader_index<LOADERS>();
    if (kt == 0 && i < BK) ring[i] = lookup(static_cast<int64>(r_begin) + i);
    if (i < BK) next = lookup(static_cast<int64>(r_begin) + (kt + 1) * BK + i);  // lands by end()
    sync_loaders<LOADERS>();  // tile kt's tokens are published; tile kt - 1's slot is no longer read
    current = ring + (kt & 1) * BK;
  }
  // Token of row r of the current tile, -1 past the expert's rows.
  __device__ __forceinline__ int32 token(int r) const { return current[r]; }
  // Loads a K-major Tile whose row r is row token(r) of src ([T, stride], offset to the tile's
  // first column), zero past the expert's rows.
  template <typename Tile, bool ALIGNED, typename T>
  __device__ __forceinline__ void load_rows(T* dst, const T* src, int64 stride, int cols_valid) const {
    load_tile<Tile, LOADERS, ALIGNED>(
        dst,
        [&](int r) -> const T* {
          const int32 t = token(r);
          return t >= 0 ? src + t * stride : nullptr;
        },
        cols_valid);
  }
  __device__ __forceinline__ void end(int kt) {
    const int i = loader_index<LOADERS>();
    if (i < BK) ring[((kt + 1) & 1) * BK + i] = next;
  }
};

// Loads a K-major Tile whose row r is the token row at element offset rows[r] of src
// (gather_row_offsets; -1 zeroes the row), columns k0 on.
template <typename Tile, int LOADERS, bool ALIGNED, typename T>
__device__ __forceinline__ void load_gathered_rows(T* dst, const int64* rows, const T* src, int k0, int cols_valid) {
  load_tile<Tile, LOADERS, ALIGNED>(
      dst, [&](int r) -> const T* { return rows[r] < 0 ? nullptr : src + rows[r] + k0; }, cols_valid);
}

// rows[i] = element offset of tile row i's token in a [T, stride] matrix, -1 past the tile's
// rows; filled by the whole block, which it leaves synchronized.
template <int BM>
__device__ __forceinline__ void gather_row_offsets(const RoutingView& r, const TokenTile& t, int32 stride, int64* rows) {
  for (int i = threadIdx.x; i < BM; i += blockDim.x) {
    rows[i] = i < t.rows ? static_cast<int64>(token_of_row(r, t.row0 + i)) * stride : -1;
  }
  __syncthreads();
}

}  // namespace moejit

namespace moejit {

// A token GEMM's grid of tiles: max_tiles x ceil(n_extent / BN), grouped by GROUP_M m tiles,
// token tiles counted from first_tile (a launch over some experts' tiles: bwd_down's chunks),
// output columns from first_col (a launch over some columns: bwd_down's column chunks).
// Built once per block; with Div = FastDiv the divisions of its order then cost a multiply each
// per work item (GroupedOrder).
template <int BM, int BN, int GROUP_M, typename Div>
struct TokenGrid {
  const RoutingView& routing;
  uint32 tiles;
  GroupedOrder<GROUP_M, Div> order;
  uint32 first_tile;
  int32 first_col;

  __device__ __forceinline__ TokenGrid(const RoutingView& r, int n_extent, int32 first = 0, int32 col = 0)
      : routing(r),
        tiles(static_cast<uint32>(r.max_tiles) * static_cast<uint32>(ceil_div(n_extent, BN))),
        order(static_cast<uint32>(r.max_tiles), static_cast<uint32>(ceil_div(n_extent, BN))),
        first_tile(static_cast<uint32>(first)),
        first_col(col) {}

  // The work of grid position `id`: its token tile and output columns [n0, n0 + BN). False for ids
  // past the device-side tile count or past the grid's tiles (a cluster's padding block), which
  // exit at once.
  __device__ __forceinline__ bool work(int64 id, TokenTile& tile, int& n0) const {
    if (id >= tiles) return false;
    uint32 m, n;
    order.tile(static_cast<uint32>(id), m, n);
    n0 = first_col + static_cast<int>(n) * BN;
    return token_tile<BM>(routing, m + first_tile, tile);
  }
};

// The work of a one-tile block, with its cluster pair (CLUSTER 1 or 2): blocks 2c and 2c + 1,
// whose grouped tiles are neighbouring m tiles of the same columns, mostly of one expert.
template <int CLUSTER, typename Grid>
__device__ __forceinline__ bool token_block(const Grid& grid, TokenTile& tile, int& n0, ClusterPair& pair) {
  static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two blocks");
  if (!grid.work(blockIdx.x, tile, n0)) return false;
  if constexpr (CLUSTER == 2) {
    TokenTile other;
    int other_n0;
    pair.rank = cluster_rank();
    pair.paired = grid.work(blockIdx.x ^ 1u, other, other_n0);
    pair.shared = pair.paired && other.expert == tile.expert && other_n0 == n0;
  }
  return true;
}

// The work of an expert-major (dW) block: tiles [e * m_tiles * n_tiles, (e+1) * ...) cover
// expert e's [m_extent, n_extent] gradient, BM x BN tiles grouped by GROUP_M; the K range is
// the expert's sorted rows.
struct ExpertBlock {
  int32 expert;
  int m0, n0;            // first row and column of the gradient tile
  int32 r_begin, r_end;  // the expert's sorted rows
};

// An expert GEMM's tiles over all experts: the grid of one block per tile, or a persistent grid's
// items, gradient columns from first_col (bwd_dw2's column chunks). Built once per block, as
// TokenGrid.
template <int BM, int BN, int GROUP_M, typename Div>
struct ExpertGrid {
  const RoutingView& routing;
  uint32 tiles;
  Div per_expert;
  GroupedOrder<GROUP_M, Div> order;
  int32 first_col;

  __device__ __forceinline__ ExpertGrid(const RoutingView& r, int m_extent, int n_extent, int32 col = 0)
      : routing(r),
        tiles(static_cast<uint32>(r.experts) * static_cast<uint32>(ceil_div(m_extent, BM) * ceil_div(n_extent, BN))),
        per_expert(static_cast<uint32>(ceil_div(m_extent, BM) * ceil_div(n_extent, BN))),
        order(static_cast<uint32>(ceil_div(m_extent, BM)), static_cast<uint32>(ceil_div(n_extent, BN))),
        first_col(col) {}

  // Tile `id` (below `tiles`): the experts' tiles in routing's ranking, where given.
  __device__ __forceinline__ ExpertBlock block(int64 id) const {
    const uint32 i = static_cast<uint32>(id);
    const uint32 rank = per_expert.div(i);
    uint32 m, n;
    order.tile(per_expert.mod(i, rank), m, n);
    ExpertBlock b;
    if (routing.ranked_experts != nullptr) {
      const int4 ranked = routing.ranked_experts[rank];
      b.expert = ranked.x;
      b.r_begin = ranked.y;
      b.r_end = ranked.z;
    } else {
      b.expert = static_cast<int32>(rank);
      b.r_begin = routing.expert_offsets[b.expert];
      b.r_end = routing.expert_offsets[b.expert + 1];
    }
    b.m0 = static_cast<int>(m) * BM;
    b.n0 = first_col + static_cast<int>(n) * BN;
    return b;
  }
};

}  // namespace moejit
