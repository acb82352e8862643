// How a token GEMM's blocks find their work and run it: one tile per block, or a persistent
// grid (persistent_main_loop) for the configs that keep one block per SM, where the producer
// copies the next tile while the epilogue writes the last.
#pragma once

#include "common/gemm.cuh"
#include "common/moe_tiles.cuh"

namespace moejit {

// A token GEMM block's work: a tile, its first output column, whether to store it, and its
// cluster pair.
struct TokenWork {
  TokenTile tile;
  int n0;
  bool store;
  ClusterPair pair;
};

// Item `item` of a persistent grid of CLUSTER-block clusters: tile `item` alone, or, for a pair,
// tiles 2 * item and 2 * item + 1 to ranks 0 and 1 (neighbouring m tiles of the same columns,
// mostly of one expert, within a group of GROUP_M m tiles; a short last group of odd height pairs
// tiles of two column blocks, which share nothing). False when no tile exists. A pair's block whose tile does not exist
// computes its partner's and stores nothing, so both blocks always run the same k tiles.
template <int CLUSTER, typename Grid>
__device__ __forceinline__ bool token_item_work(const Grid& grid, int64 item, TokenWork& w) {
  static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of one or two blocks");
  if constexpr (CLUSTER == 1) {
    w.store = true;
    return grid.work(item, w.tile, w.n0);
  } else {
    // Two named records and selects, not arrays: indexed by the runtime rank, arrays of them
    // lived in a 40-byte stack frame (session 40).
    TokenTile t0, t1;
    int n0, n1;
    const bool ok0 = grid.work(2 * item, t0, n0);
    const bool ok1 = grid.work(2 * item + 1, t1, n1);
    if (!ok0 && !ok1) return false;
    if (!ok0) {
      t0 = t1;
      n0 = n1;
    } else if (!ok1) {
      t1 = t0;
      n1 = n0;
    }
    const uint32 rank = cluster_rank();
    w.tile = rank == 0 ? t0 : t1;
    w.n0 = rank == 0 ? n0 : n1;
    w.store = rank == 0 ? ok0 : ok1;
    w.pair.rank = rank;
    w.pair.paired = true;
    w.pair.shared = t0.expert == t1.expert && n0 == n1;
    return true;
  }
}

// Stages the accumulators in `staged` and writes them as the tile at row w.tile.row0, column
// w.n0 of out [TK, n_extent]: a one-tile block's StagedTile row by row; a persistent block's
// SwizzledTile with TMA stores through `map` (out's, boxes of 64 columns by BM rows) when the
// tile has all BM rows, otherwise row by row.
template <int THREADS, bool ALIGNED, typename Staging, typename Mma, typename T>
__device__ __forceinline__ void store_token_tile(const Staging& staged, Mma& mma, const TokenWork& w,
                                                 const TensorMap& map, T* out, int n_extent) {
  T* base = out + static_cast<int64>(w.tile.row0) * n_extent + w.n0;
  const auto row_dst = [&](int r) -> T* {
    return w.store && r < w.tile.rows ? base + static_cast<int64>(r) * n_extent : nullptr;
  };
  if constexpr (Staging::kTmaStore) {
    constexpr int kBM = Staging::Layout::kRows;
    store_accumulators_async<THREADS, ALIGNED>(
        staged, mma, w.store && w.tile.rows == kBM,
        [&](const T* panel, int p) { tma_store(map, panel, w.n0 + 64 * p, w.tile.row0); }, row_dst, n_extent - w.n0);
  } else {
    store_accumulators<THREADS, ALIGNED>(staged, mma, row_dst, n_extent - w.n0);
  }
}

// Runs a token GEMM over output columns [0, n_extent) in k_tiles k tiles: load(stage, work, kt)
// fills a stage (as gemm_main_loop's load), then epilogue(work, staging) runs in the MMA threads
// with complete accumulators, `staging` being where to stage the output tile: Smem::in_stages()
// (a StagedTile) after a one-tile block's main loop, Smem::apart() (a SwizzledTile, which
// store_accumulators_async can store with TMA) in a persistent block.
// prologue(work) runs in every thread of a one-tile block before its main loop, after_loads(work)
// in a persistent block's producer threads, group_epilogue(work) in its epilogue warpgroup, if it
// has one (persistent_main_loop).
// SPLIT_TAILS: a persistent block splits an expert's last tile along K when it holds at most 64
// rows after whole ones (WgmmaMma::split), for an epilogue that folds it (store_token_tile does).
// first_tile: the token tiles start there, and end where r.experts' do (some experts' tiles).
// first_col: the output columns are [first_col, first_col + n_extent) (some columns).
template <int BM, int BN, int GROUP_M, int CLUSTER, bool PERSISTENT, int STAGES, int TMA_BYTES, bool SPLIT_TAILS = false, typename Mma,
          typename Smem, typename Load, typename Epilogue, typename Prologue = NoStep, typename AfterLoads = NoStep,
          typename GroupEpilogue = NoEpilogueGroup>
__device__ __forceinline__ void run_token_gemm(const RoutingView& r, int n_extent, int k_tiles, Mma& mma,
                                               const Smem& sm, Load load, Epilogue epilogue, Prologue prologue = {},
                                               AfterLoads after_loads = {}, GroupEpilogue group_epilogue = {},
                                               int32 first_tile = 0, int32 first_col = 0) {
  const TokenGrid<BM, BN, GROUP_M, typename Select<PERSISTENT, FastDiv, PlainDiv>::type> grid(r, n_extent, first_tile,
                                                                                              first_col);
  if constexpr (PERSISTENT) {
    persistent_main_loop<CLUSTER, STAGES, TMA_BYTES, TokenWork>(
        mma, sm.a, sm.b, sm.barriers, ceil_div<int64>(grid.tiles, CLUSTER),
        [&](int64 item, TokenWork& w) {
          if (!token_item_work<CLUSTER>(grid, item, w)) return false;
          // Only an expert's last tile after whole ones: those just streamed its weights through
          // L2, so its own time is MMA time. A lone tile streams them from memory, which splitting
          // does not speed up (T=1024: +5 % on the forward step, session 22).
          if constexpr (SPLIT_TAILS && CLUSTER == 1) {
            mma.set_split(w.tile.rows <= 64 && k_tiles >= 2 && w.tile.row0 > r.expert_offsets[w.tile.expert]);
          }
          return true;
        },
        [&](const TokenWork&) { return k_tiles; }, load, after_loads, [](int, const TokenWork&, int) { return kWholeKTile; },
        [&](const TokenWork& w) { epilogue(w, sm.template apart<BM, BN>()); }, group_epilogue);
    if (threadIdx.x == 0) bulk_wait();  // the last tile's TMA stores are done before the block exits
  } else {
    TokenWork w;
    w.store = true;
    if (!token_block<CLUSTER>(grid, w.tile, w.n0, w.pair)) return;
    prologue(w);
    const bool mma_thread = gemm_main_loop<STAGES, TMA_BYTES>(
        mma, sm.a, sm.b, sm.barriers, k_tiles, [&](int stage, int kt) { load(stage, w, kt); }, NothingToFix{},
        w.pair.paired);
    if (mma_thread) epilogue(w, sm.template in_stages<BM, BN>());
  }
}

}  // namespace moejit
