// How a dW (expert GEMM) role's blocks find their work and run it: one gradient tile per block,
// or a persistent grid (persistent_main_loop) for the configs that keep one block per SM, where
// the producer copies the next tile while the epilogue writes the last. At small token counts
// a tile has one or two k tiles, so its epilogue is most of its time. A persistent grid's two
// MMA warpgroups run staggered (persistent_main_loop's LAG), each with its own epilogue.
#pragma once

#include "common/gemm.cuh"
#include "common/moe_tiles.cuh"

namespace moejit {

// The MMA threads that meet on an expert GEMM's barriers: each warpgroup alone in a persistent
// grid (staggered), all of them in a one-tile block.
template <bool PERSISTENT, int THREADS>
using ExpertTeam = typename Select<PERSISTENT, OwnWarpgroup, MmaThreads<THREADS>>::type;

// Stages the accumulators in `staged` and writes them as block b's tile of out [E, m_extent,
// n_extent]: a one-tile block's StagedTile row by row; in a persistent block each MMA warpgroup
// its own rows of a SwizzledTile, with TMA stores through `map` (out's as [E, m_extent,
// n_extent], boxes of 64 columns by a warpgroup's rows, which stop at the expert's last row).
template <int THREADS, bool ALIGNED, typename Staging, typename Mma, typename T>
__device__ __forceinline__ void store_expert_tile(const Staging& staged, Mma& mma, const ExpertBlock& b,
                                                  const TensorMap& map, T* out, int m_extent, int n_extent) {
  if constexpr (Staging::kTmaStore) {
    store_own_block_async(staged, mma, [&](const T* panel, int p, int row0) {
      tma_store(map, panel, b.n0 + 64 * p, b.m0 + row0, b.expert);
    });
  } else {
    T* base = out + (static_cast<int64>(b.expert) * m_extent + b.m0) * n_extent + b.n0;
    store_accumulators<THREADS, ALIGNED>(
        staged, mma,
        [&](int r) -> T* { return b.m0 + r < m_extent ? base + static_cast<int64>(r) * n_extent : nullptr; },
        n_extent - b.n0);
  }
}

// The landed step of an expert GEMM whose k tiles TMA copies (run_expert_gemm), in every MMA
// thread: `rows_left` of the expert's rows from the k tile's first on. A last k tile's rows past
// the expert's end hold the next expert's rows; those below the next k16 step are zeroed in A and,
// unless it is null, B, and the MMAs issue no k16 step past them. Returns the k rows to multiply.
// Staggered warpgroups (ExpertTeam) each zero the rows they read, both tiles whole: the second
// rewrites zeros the first may be reading, which changes no byte.
template <int BK, typename TileA, typename TileB, typename Team, typename T>
__device__ __forceinline__ int expert_tail_rows(T* a, T* b, int32 rows_left) {
  if (rows_left >= BK) return kWholeKTile;
  const int k_rows = __reduce_min_sync(0xffffffffu, rows_left);  // uniform: see WgmmaMma::compute_k_rows
  if (k_rows % 16 != 0) zero_stage_rows<TileA, TileB, Team>(a, b, k_rows, (k_rows + 15) / 16 * 16);
  return k_rows;
}

// Runs an expert GEMM over [m_extent, n_extent] gradients, one per expert, each over its
// expert's sorted rows in BK-row k tiles. load(stage, block, kt) fills a stage and
// landed(stage, block, kt) fixes it in the MMA threads (as gemm_main_loop's), then
// epilogue(block, staging) runs in the MMA threads with complete accumulators (zeros for an
// expert without rows), `staging` being where to stage the output tile: Smem::in_stages() (a
// StagedTile) after a one-tile block's main loop, Smem::apart() (a SwizzledTile, which
// store_accumulators_async can store with TMA) in a persistent block.
// prologue(block) runs in every thread of a one-tile block before its main loop. first_col: the
// gradient columns are [first_col, first_col + n_extent) (some columns).
template <int BM, int BN, int BK, int GROUP_M, bool PERSISTENT, int STAGES, int TMA_BYTES, typename Mma,
          typename Smem, typename Load, typename Landed, typename Epilogue, typename Prologue = NoStep>
__device__ __forceinline__ void run_expert_gemm(const RoutingView& r, int m_extent, int n_extent, Mma& mma,
                                                const Smem& sm, Load load, Landed landed, Epilogue epilogue,
                                                Prologue prologue = {}, int32 first_col = 0) {
  const auto k_tiles = [](const ExpertBlock& b) { return ceil_div(b.r_end - b.r_begin, BK); };
  const ExpertGrid<BM, BN, GROUP_M, typename Select<PERSISTENT, FastDiv, PlainDiv>::type> grid(r, m_extent, n_extent,
                                                                                               first_col);
  if constexpr (PERSISTENT) {
    // The second warpgroup's lag: as long as the producer keeps two stages ahead of the first.
    constexpr int kLag = STAGES > 3 ? STAGES - 2 : 1;
    // The experts come dearest first (routing's ranked_experts): snaking over them evens out the
    // blocks' shares when a few experts hold most rows (performance log, session 35).
    const SnakeOrder snake(grid.tiles, gridDim.x);
    persistent_main_loop<1, STAGES, TMA_BYTES, ExpertBlock, kLag>(
        mma, sm.a, sm.b, sm.barriers, grid.tiles,
        [&](int64 item, ExpertBlock& b) {
          b = grid.block(snake.item(static_cast<uint32>(item)));
          return true;
        },
        k_tiles, load, NoStep{}, landed, [&](const ExpertBlock& b) {
          if (b.r_end == b.r_begin) mma.zero();  // no k tile ran
          epilogue(b, sm.template apart<BM, BN>());
        });
    // Each warpgroup's last TMA stores are done before the block exits.
    if (threadIdx.x < Mma::kThreads && (threadIdx.x & 127) == 0) bulk_wait();
  } else {
    const ExpertBlock b = grid.block(blockIdx.x);
    prologue(b);
    const bool mma_thread = gemm_main_loop<STAGES, TMA_BYTES>(
        mma, sm.a, sm.b, sm.barriers, k_tiles(b), [&](int stage, int kt) { load(stage, b, kt); },
        [&](int stage, int kt) { return landed(stage, b, kt); });
    if (!mma_thread) return;
    if (b.r_end == b.r_begin) mma.zero();
    epilogue(b, sm.template in_stages<BM, BN>());
  }
}

}  // namespace moejit
