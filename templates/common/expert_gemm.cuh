// How a dW (expert GEMM) role's blocks find their work and run it: one gradient tile per block,
// or a persistent grid (persistent_main_loop) for the configs that keep one block per SM, where
// the producer copies the next tile while the epilogue writes the last. At small token counts
// a tile has one or two k tiles, so its epilogue is most of its time.
#pragma once

#include "common/gemm.cuh"
#include "common/moe_tiles.cuh"

namespace moejit {

// Stages the accumulators in `staged` and writes them as block b's tile of out [E, m_extent,
// n_extent]: a one-tile block's StagedTile row by row; a persistent block's SwizzledTile with TMA
// stores through `map` (out's as [E, m_extent, n_extent], boxes of 64 columns by BM rows, which
// stop at the expert's last row).
template <int THREADS, bool ALIGNED, typename Staging, typename Mma, typename T>
__device__ __forceinline__ void store_expert_tile(const Staging& staged, Mma& mma, const ExpertBlock& b,
                                                  const TensorMap& map, T* out, int m_extent, int n_extent) {
  T* base = out + (static_cast<int64>(b.expert) * m_extent + b.m0) * n_extent + b.n0;
  const auto row_dst = [&](int r) -> T* {
    return b.m0 + r < m_extent ? base + static_cast<int64>(r) * n_extent : nullptr;
  };
  if constexpr (Staging::kTmaStore) {
    store_accumulators_async<THREADS, ALIGNED>(
        staged, mma, true, [&](const T* panel, int p) { tma_store(map, panel, b.n0 + 64 * p, b.m0, b.expert); }, row_dst,
        n_extent - b.n0);
  } else {
    store_accumulators<THREADS, ALIGNED>(staged, mma, row_dst, n_extent - b.n0);
  }
}

// The landed step of an expert GEMM whose k tiles TMA copies (run_expert_gemm), in every MMA
// thread: `rows_left` of the expert's rows from the k tile's first on. A last k tile's rows past
// the expert's end hold the next expert's rows; those below the next k16 step are zeroed in A and,
// unless it is null, B, and the MMAs issue no k16 step past them. Returns the k rows to multiply.
template <int BK, typename TileA, typename TileB, int THREADS, typename T>
__device__ __forceinline__ int expert_tail_rows(T* a, T* b, int32 rows_left) {
  if (rows_left >= BK) return kWholeKTile;
  const int k_rows = __reduce_min_sync(0xffffffffu, rows_left);  // in a uniform register: see WgmmaMma::compute
  if (k_rows % 16 != 0) zero_stage_rows<TileA, TileB, THREADS>(a, b, k_rows, (k_rows + 15) / 16 * 16);
  return k_rows;
}

// Runs an expert GEMM over [m_extent, n_extent] gradients, one per expert, each over its
// expert's sorted rows in BK-row k tiles. load(stage, block, kt) fills a stage and
// landed(stage, block, kt) fixes it in the MMA threads (as gemm_main_loop's), then
// epilogue(block, staging) runs in the MMA threads with complete accumulators (zeros for an
// expert without rows), `staging` being where to stage the output tile: Smem::in_stages() (a
// StagedTile) after a one-tile block's main loop, Smem::apart() (a SwizzledTile, which
// store_accumulators_async can store with TMA) in a persistent block.
// prologue(block) runs in every thread of a one-tile block before its main loop.
template <int BM, int BN, int BK, int GROUP_M, bool PERSISTENT, int STAGES, int TMA_BYTES, typename Mma,
          typename Smem, typename Load, typename Landed, typename Epilogue, typename Prologue = NoStep>
__device__ __forceinline__ void run_expert_gemm(const RoutingView& r, int m_extent, int n_extent, Mma& mma,
                                                const Smem& sm, Load load, Landed landed, Epilogue epilogue,
                                                Prologue prologue = {}) {
  const auto k_tiles = [](const ExpertBlock& b) { return ceil_div(b.r_end - b.r_begin, BK); };
  const ExpertGrid<BM, BN, GROUP_M, typename Select<PERSISTENT, FastDiv, PlainDiv>::type> grid(r, m_extent, n_extent);
  if constexpr (PERSISTENT) {
    persistent_main_loop<1, STAGES, TMA_BYTES, ExpertBlock>(
        mma, sm.a, sm.b, sm.barriers, grid.tiles,
        [&](int64 item, ExpertBlock& b) {
          b = grid.block(item);
          return true;
        },
        k_tiles, load, NoStep{}, landed, [&](const ExpertBlock& b) {
          if (b.r_end == b.r_begin) mma.zero();  // no k tile ran
          epilogue(b, sm.template apart<BM, BN>());
        });
    if (threadIdx.x == 0) bulk_wait();  // the last tile's TMA stores are done before the block exits
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
