// The persistent loops' epilogue (run_token_gemm, run_expert_gemm). The output tile is staged in
// 64-column panels swizzled as a TMA box lays them out (the 128-byte swizzle also spreads each
// warp's fragment writes over all banks), then written by TMA stores that one thread issues and
// the MMA warps do not wait for: they go on to the next tile while the copy engine drains this
// one, and only the next epilogue waits, for the stores to have read the staging. Beside the
// deepest pipelines the staging holds two panels, which the tile passes through in turn (a ring).
// A tile a box cannot write (a token tile short of BM rows: the rows past it are another tile's)
// is written row by row from the same staging. Warpgroups that do not wait for each other (an
// expert GEMM's) each stage and store their own block of the tile.
#pragma once

#include "common/tma_sm90.cuh"
#include "common/wgmma_sm90.cuh"

namespace moejit {

// BM x BN output tile in shared memory as PANELS panels of BM rows x 128 bytes, 128-byte swizzled
// (PanelTile's layout, what a {64, BM} box with a 128-byte swizzle reads): the whole tile
// (PANELS = BN / 64), or a ring of PANELS slots that the tile's 64-column panels pass through in
// turn (store_accumulators_async), where the whole tile would leave no room for another stage.
template <typename T, int BM, int BN, int PANELS = BN / 64>
struct SwizzledTile {
  static_assert(PANELS <= BN / 64, "at most the tile's panels");
  static constexpr bool kRing = PANELS < BN / 64;
  using Layout = PanelTile<BM, 64 * PANELS>;
  static constexpr int kElems = BM * 64 * PANELS;
  static constexpr int kBytes = kElems * 2;
  static constexpr bool kTmaStore = true;
  T* smem;

  // Two adjacent values of tile row r at columns c, c+1 (c even), in a ring in panel c / 64's slot.
  __device__ __forceinline__ void put(int r, int c, float v0, float v1) const {
    store_float2(smem + Layout::offset(r, kRing ? c % (64 * PANELS) : c), v0, v1);
  }
  // Panel p (columns 64p .. 64p + 63) in its slot.
  __device__ __forceinline__ const T* panel(int p) const { return smem + (kRing ? p % PANELS : p) * Layout::kPanelElems; }

  // As StagedTile::write (the whole tile).
  template <int THREADS, bool ALIGNED, typename RowDst>
  __device__ __forceinline__ void write(RowDst row_dst, int cols_valid) const {
    static_assert(!kRing, "a ring holds part of the tile");
    write_staged_rows<BM, BN, THREADS, ALIGNED>([&](int r, int col) { return smem + Layout::offset(r, col); },
                                                row_dst, cols_valid);
  }
  // As write, panel p alone, from its slot.
  template <int THREADS, bool ALIGNED, typename RowDst>
  __device__ __forceinline__ void write_panel(int p, RowDst row_dst, int cols_valid) const {
    const T* slot = panel(p);
    write_staged_rows<BM, 64, THREADS, ALIGNED>(
        [&](int r, int col) { return slot + PanelTile<BM, 64>::offset(r, col); },
        [&](int r) {
          auto* dst = row_dst(r);
          return dst == nullptr ? dst : dst + 64 * p;
        },
        cols_valid - 64 * p);
  }
};

// One round of a staged epilogue in Team's threads (MmaThreads, OwnWarpgroup), `whole` the same
// in all of them: once the stores that Team's first thread issued have read the staging (but for
// PENDING commit groups where `whole`; rows written one by one commit none, so otherwise all),
// every thread puts its values (put()), and then the first thread stores them (store(), one
// commit group, read through the async proxy) or, not whole, Team writes them row by row
// (write()).
template <typename Team, int PENDING, typename Put, typename Store, typename Write>
__device__ __forceinline__ void staging_round(bool whole, Put put, Store store, Write write) {
  if (Team::rank() == 0) {
    if (PENDING > 0 && whole) bulk_wait_read<PENDING>();
    else bulk_wait_read();
  }
  Team::sync();
  put();
  if (whole) fence_proxy_async_shared();
  Team::sync();
  if (!whole) {
    write();
  } else if (Team::rank() == 0) {
    store();
    bulk_commit();
  }
}

// Stages a tile in `tile` with put(tile) (every MMA thread puts its values), then, when `whole`,
// the first MMA thread stores it with store_panels(tile) (one tma_store per panel) and commits
// the group; otherwise the MMA threads write it row by row (row_dst, cols_valid as
// StagedTile::write). `whole` is the same in every MMA thread. The first MMA thread must
// bulk_wait() before the block exits.
template <int THREADS, bool ALIGNED, typename T, int BM, int BN, typename Put, typename StorePanels, typename RowDst>
__device__ __forceinline__ void store_staged_async(const SwizzledTile<T, BM, BN>& tile, Put put, bool whole,
                                                   StorePanels store_panels, RowDst row_dst, int cols_valid) {
  staging_round<MmaThreads<THREADS>, 0>(
      whole, [&] { put(tile); }, [&] { store_panels(tile); },
      [&] { tile.template write<THREADS, ALIGNED>(row_dst, cols_valid); });
}

// store_staged_async of the accumulators, a split item's folded first through the staging (which
// holds a BM = 128 tile's fp32 partial sums of 64 rows in as many passes as it needs);
// store_panel(smem, p) stores panel p from `smem` (a TMA store).
// A ring (SwizzledTile::kRing) takes the tile panel by panel: each goes into its slot once the
// stores that last read the slot, PANELS - 1 commit groups back, have, and is stored at once as a
// group of its own, so that the copy engine reads one panel while the MMA threads put the next.
template <int THREADS, bool ALIGNED, typename T, int BM, int BN, int PANELS, typename Mma, typename StorePanel,
          typename RowDst>
__device__ __forceinline__ void store_accumulators_async(const SwizzledTile<T, BM, BN, PANELS>& tile, Mma& mma,
                                                         bool whole, StorePanel store_panel, RowDst row_dst,
                                                         int cols_valid) {
  using Tile = SwizzledTile<T, BM, BN, PANELS>;
  constexpr int kFoldBytes = Mma::kAccumulators * 128 * 4;  // a warpgroup's partial sums
  constexpr int kFoldChunks = kFoldBytes > Tile::kBytes ? kFoldBytes / Tile::kBytes : 1;
  static_assert(!Mma::kCanSplit || kFoldChunks * Tile::kBytes >= kFoldBytes, "the staging holds a split's partial sums in passes");
  if constexpr (!Tile::kRing) {
    store_staged_async<THREADS, ALIGNED>(
        tile,
        [&](const Tile& t) {
          if constexpr (Mma::kCanSplit) mma.template fold_split<THREADS, kFoldChunks>(reinterpret_cast<float*>(t.smem));
          for_each_acc_pair(mma, [&](int r, int c, float v0, float v1) { t.put(r, c, v0, v1); });
        },
        whole,
        [&](const Tile& t) {
#pragma unroll
          for (int p = 0; p < BN / 64; ++p) store_panel(t.panel(p), p);
        },
        row_dst, cols_valid);
  } else {
    static_assert(Mma::kWarpN == BN, "every MMA warpgroup holds all the tile's columns");
    if constexpr (Mma::kCanSplit) {
      if (mma.split) {
        if (threadIdx.x == 0) bulk_wait_read();
        sync_mma_threads<THREADS>();
        mma.template fold_split<THREADS, kFoldChunks>(reinterpret_cast<float*>(tile.smem));
      }
    }
#pragma unroll
    for (int p = 0; p < BN / 64; ++p) {
      staging_round<MmaThreads<THREADS>, PANELS - 1>(
          whole,
          [&] { for_each_acc_pair(mma, [&](int r, int c, float v0, float v1) { tile.put(r, c, v0, v1); }, 8 * p, 8 * p + 8); },
          [&] { store_panel(tile.panel(p), p); }, [&] { tile.template write_panel<THREADS, ALIGNED>(p, row_dst, cols_valid); });
    }
  }
}

// store_accumulators_async for MMA warpgroups that never wait for each other (a persistent loop's
// LAG, run_expert_gemm): each stages its own block of the tile (rows m0 .., columns n0 ..) and
// stores it with TMA stores of its own, issued and awaited by its first thread, behind a barrier
// of its own: store_panel(smem, p, row0) stores panel p's Mma::kGroupRows rows from row0 on,
// staged at smem. Every tile is whole and none is split (expert tiles). A ring's slots hold whole
// tile rows, so there the warpgroups split M, each passing its rows of the slots.
template <typename T, int BM, int BN, int PANELS, typename Mma, typename StorePanel>
__device__ __forceinline__ void store_own_block_async(const SwizzledTile<T, BM, BN, PANELS>& tile, Mma& mma,
                                                      StorePanel store_panel) {
  using Tile = SwizzledTile<T, BM, BN, PANELS>;
  static_assert(!Tile::kRing || Mma::kWarpN == BN, "a ring's warpgroups split M");
  constexpr int kPanels = Mma::kWarpN / 64;
  constexpr int kStep = Tile::kRing ? 1 : kPanels;  // panels staged per round: a ring slot's, or the block's
#pragma unroll
  for (int q = 0; q < kPanels; q += kStep) {
    staging_round<OwnWarpgroup, Tile::kRing ? PANELS - 1 : 0>(
        true,
        [&] { for_each_acc_pair(mma, [&](int r, int c, float v0, float v1) { tile.put(r, c, v0, v1); }, 8 * q, 8 * (q + kStep)); },
        [&] {
#pragma unroll
          for (int j = q; j < q + kStep; ++j) {
            const int p = mma.n0 / 64 + j;
            store_panel(tile.panel(p) + mma.m0 * 64, p, mma.m0);
          }
        },
        [] {});
  }
}

}  // namespace moejit
