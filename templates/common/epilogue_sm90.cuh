// The persistent loops' epilogue (run_token_gemm, run_expert_gemm). The output tile is staged in
// 64-column panels swizzled as a TMA box lays them out (the 128-byte swizzle also spreads each
// warp's fragment writes over all banks), then written by TMA stores that one thread issues and
// the MMA warps do not wait for: they go on to the next tile while the copy engine drains this
// one, and only the next epilogue waits, for the stores to have read the staging. A tile a box
// cannot write (a token tile short of BM rows: the rows past it are another tile's) is written
// row by row from the same staging.
#pragma once

#include "common/tma_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace moejit {

// BM x BN output tile in shared memory as BN / 64 panels of BM rows x 128 bytes, 128-byte
// swizzled (PanelTile's layout, what a {64, BM} box with a 128-byte swizzle reads).
template <typename T, int BM, int BN>
struct SwizzledTile {
  using Layout = PanelTile<BM, BN>;
  static constexpr int kBytes = BM * BN * 2;
  static constexpr bool kTmaStore = true;
  T* smem;

  // Two adjacent values of tile row r at columns c, c+1 (c even).
  __device__ __forceinline__ void put(int r, int c, float v0, float v1) const {
    store_float2(smem + Layout::offset(r, c), v0, v1);
  }
  // Panel p: columns 64p .. 64p + 63.
  __device__ __forceinline__ const T* panel(int p) const { return smem + p * Layout::kPanelElems; }

  // As StagedTile::write.
  template <int THREADS, bool ALIGNED, typename RowDst>
  __device__ __forceinline__ void write(RowDst row_dst, int cols_valid) const {
    write_staged_rows<BM, BN, THREADS, ALIGNED>([&](int r, int col) { return smem + Layout::offset(r, col); },
                                                row_dst, cols_valid);
  }
};

// Stages a tile in `tile` with put(tile) (every MMA thread puts its values), then, when `whole`,
// the first MMA thread stores it with store_panels(tile) (one tma_store per panel) and commits
// the group; otherwise the MMA threads write it row by row (row_dst, cols_valid as
// StagedTile::write). `whole` is the same in every MMA thread. The first MMA thread must
// bulk_wait() before the block exits.
template <int THREADS, bool ALIGNED, typename T, int BM, int BN, typename Put, typename StorePanels, typename RowDst>
__device__ __forceinline__ void store_staged_async(const SwizzledTile<T, BM, BN>& tile, Put put, bool whole,
                                                   StorePanels store_panels, RowDst row_dst, int cols_valid) {
  if (threadIdx.x == 0) bulk_wait_read();  // the last stores have read the staging
  sync_mma_threads<THREADS>();
  put(tile);
  if (whole) fence_proxy_async_shared();  // the stores read the staging through the async proxy
  sync_mma_threads<THREADS>();
  if (!whole) {
    tile.template write<THREADS, ALIGNED>(row_dst, cols_valid);
  } else if (threadIdx.x == 0) {
    store_panels(tile);
    bulk_commit();
  }
}

// store_staged_async of the accumulators, a split item's folded first in the staging (which
// holds a BM = 128 tile's fp32 partial sums of 64 rows exactly).
template <int THREADS, bool ALIGNED, typename T, int BM, int BN, typename Mma, typename StorePanels, typename RowDst>
__device__ __forceinline__ void store_accumulators_async(const SwizzledTile<T, BM, BN>& tile, Mma& mma, bool whole,
                                                         StorePanels store_panels, RowDst row_dst, int cols_valid) {
  store_staged_async<THREADS, ALIGNED>(
      tile,
      [&](const SwizzledTile<T, BM, BN>& t) {
        if constexpr (Mma::kCanSplit) {
          static_assert(Mma::kAccumulators * 128 * 4 <= SwizzledTile<T, BM, BN>::kBytes, "the staging holds a split's partial sums");
          mma.template fold_split<THREADS>(reinterpret_cast<float*>(t.smem));
        }
        for_each_acc_pair(mma, [&](int r, int c, float v0, float v1) { t.put(r, c, v0, v1); });
      },
      whole, store_panels, row_dst, cols_valid);
}

}  // namespace moejit
