// The portable (sm_80+) GEMM building blocks every GEMM role composes: swizzled shared-memory
// tiles, a tile loader with zero fill, the warp-level MMA over one pipeline stage, and the
// multistage cp.async pipeline. A role supplies how tile rows map to global memory and what
// its epilogue does with the fp32 accumulators.
//
// Operand storage in shared memory (16-byte chunks XOR-swizzled per row, conflict-free for
// ldmatrix):
//   K-major  tile [rows = M or N][BK]   (K contiguous, e.g. x rows, weight rows)  -> ldmatrix
//   MN-major tile [BK][cols = M or N]   (M/N contiguous, e.g. token rows as k)    -> ldmatrix.trans
#pragma once

#include "common/mma_sm80.cuh"

namespace moejit {

// The dimensions every shared-memory tile layout states: ROWS x COLS 16-bit elements, rows of
// 16-byte chunks.
template <int ROWS, int COLS>
struct TileDims {
  static constexpr int kRows = ROWS;
  static constexpr int kCols = COLS;
  static constexpr int kChunks = COLS / 8;
  static constexpr int kElems = ROWS * COLS;
  static_assert(COLS % 8 == 0, "tile rows are made of 16-byte chunks");
};

// ROWS x COLS 16-bit elements, each row's chunks swizzled.
template <int ROWS, int COLS>
struct SmemTile : TileDims<ROWS, COLS> {
  // Rows of 8, 4, 2 and 1 chunks.
  __device__ __forceinline__ static int swizzle(int row, int chunk) {
    if constexpr (COLS >= 64) return chunk ^ (row & 7);
    else if constexpr (COLS == 32) return chunk ^ ((row >> 1) & 3);
    else if constexpr (COLS == 16) return chunk ^ ((row >> 2) & 1);
    else return chunk;
  }
  // Element offset of (row, col); col's low 3 bits stay inside the chunk.
  __device__ __forceinline__ static int offset(int row, int col) {
    return row * COLS + swizzle(row, col >> 3) * 8 + (col & 7);
  }
};

// The loaders below spread a tile over THREADS threads: the whole block on the portable path,
// the producer warpgroup (the block's last 128 threads) on the warp-specialized one.
template <int THREADS>
__device__ __forceinline__ int loader_index() {
  return static_cast<int>(threadIdx.x) % THREADS;
}

// Fills a Tile (a layout: SmemTile or PanelTile) with values computed per 16-byte chunk:
// fill(r, col, v) writes the 8 elements of tile row r starting at column col into v.
// Synchronous (plain loads and stores).
template <typename Tile, int THREADS, typename T, typename Fill>
__device__ __forceinline__ void fill_tile(T* smem, Fill fill) {
  constexpr int kTotal = Tile::kRows * Tile::kChunks;
  // Four chunks in flight per thread: fully unrolled, a warp-specialized producer spills.
#pragma unroll 4
  for (int it = 0; it < (kTotal + THREADS - 1) / THREADS; ++it) {
    const int idx = loader_index<THREADS>() + it * THREADS;
    if (kTotal % THREADS != 0 && idx >= kTotal) break;
    const int r = idx / Tile::kChunks;
    const int col = (idx % Tile::kChunks) * 8;
    uint16 v[8];
    fill(r, col, v);
    uint4 packed;
    packed.x = v[0] | (static_cast<uint32>(v[1]) << 16);
    packed.y = v[2] | (static_cast<uint32>(v[3]) << 16);
    packed.z = v[4] | (static_cast<uint32>(v[5]) << 16);
    packed.w = v[6] | (static_cast<uint32>(v[7]) << 16);
    *reinterpret_cast<uint4*>(smem + Tile::offset(r, col)) = packed;
  }
}

// Loads a Tile (kRows x kCols, laid out as Tile says) into shared memory. row_src(r) returns the global address of the
// element that lands in column 0 of tile row r, or nullptr to zero the row; `cols_valid` of the
// tile's columns exist in global memory (the rest are zeroed). ALIGNED: rows and column offsets
// are 16-byte aligned and cols_valid is a multiple of 8, so cp.async moves 16 bytes at a time;
// otherwise elements are loaded one by one.
template <typename Tile, int THREADS, bool ALIGNED, typename T, typename RowSrc>
__device__ __forceinline__ void load_tile(T* smem, RowSrc row_src, int cols_valid) {
  if constexpr (ALIGNED) {
    constexpr int kTotal = Tile::kRows * Tile::kChunks;
    // Batches of eight 16-byte copies per thread: fully unrolled, a producer warpgroup's share
    // of a stage (up to 16) holds too many addresses at once.
#pragma unroll 8
    for (int it = 0; it < (kTotal + THREADS - 1) / THREADS; ++it) {
      const int idx = loader_index<THREADS>() + it * THREADS;
      if (kTotal % THREADS != 0 && idx >= kTotal) break;
      const int r = idx / Tile::kChunks;
      const int col = (idx % Tile::kChunks) * 8;
      const T* src = row_src(r);
      T* dst = smem + Tile::offset(r, col);
      const bool ok = src != nullptr && col < cols_valid;
      cp_async_16(dst, ok ? static_cast<const void*>(src + col) : static_cast<const void*>(smem), ok ? 16 : 0);
    }
  } else {
    fill_tile<Tile, THREADS>(smem, [&](int r, int col, uint16 (&v)[8]) {
      const uint16* src = reinterpret_cast<const uint16*>(row_src(r));
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = (src != nullptr && col + j < cols_valid) ? src[col + j] : 0;
    });
  }
}

// Zeroes an accumulator array of any shape.
template <int N>
__device__ __forceinline__ void zero_fragments(float (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.f;
}
template <typename A, int N>
__device__ __forceinline__ void zero_fragments(A (&acc)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) zero_fragments(acc[i]);
}

// Warp-level MMA over one BM x BN x BK stage. WM x WN warps; each warp owns a
// (BM/WM) x (BN/WN) block of the fp32 accumulators in mma.sync's C-fragment layout:
// acc[mi][ni][0..1] -> row(mi, 0), cols col(ni)+{0,1}; acc[mi][ni][2..3] -> row(mi, 1).
// The interface (ATile, BTile, kThreads, kLoaders, kWarpSpecialized, kInFlight, kMi, kNi,
// kWarpN, row, col, zero, compute, drain) is shared with WgmmaMma (common/wgmma_sm90.cuh), so
// roles are written once for both.
template <typename T, int BM, int BN, int BK, int WM, int WN, bool A_KMAJOR, bool B_KMAJOR>
struct WarpMma {
  static constexpr int kWarpM = BM / WM;
  static constexpr int kWarpN = BN / WN;  // output columns one warp owns
  static constexpr int kMi = kWarpM / 16;
  static constexpr int kNi = kWarpN / 8;
  using Element = T;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kLoaders = kThreads;  // every thread loads (multistage_main_loop)
  static constexpr bool kWarpSpecialized = false;
  static constexpr int kInFlight = 0;  // compute() is synchronous
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tiles are multiples of 16x16");
  using ATile = typename Select<A_KMAJOR, SmemTile<BM, BK>, SmemTile<BK, BM>>::type;
  using BTile = typename Select<B_KMAJOR, SmemTile<BN, BK>, SmemTile<BK, BN>>::type;

  float acc[kMi][kNi][4];
  int m0, n0;  // this warp's first tile row and column

  __device__ __forceinline__ WarpMma() {
    const int warp = static_cast<int>(threadIdx.x / 32);
    m0 = (warp / WN) * kWarpM;
    n0 = (warp % WN) * kWarpN;
  }

  __device__ __forceinline__ int row(int mi, int half) const {
    return m0 + mi * 16 + static_cast<int>((threadIdx.x & 31) >> 2) + half * 8;
  }
  __device__ __forceinline__ int col(int ni) const { return n0 + ni * 8 + 2 * static_cast<int>(threadIdx.x & 3); }

  __device__ __forceinline__ void zero() { zero_fragments(acc); }
  __device__ __forceinline__ void discard() {}  // compute(..., false) zeroes them

  // accumulate false: a tile's first k tile, which starts from zero (WgmmaMma's interface).
  __device__ __forceinline__ void compute(const T* sa, const T* sb, bool accumulate) {
    if (!accumulate) zero();
    const int lane = static_cast<int>(threadIdx.x & 31);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32 a[kMi][4];
      uint32 b[kNi][2];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        if constexpr (A_KMAJOR) {
          const int r = m0 + mi * 16 + (lane & 15), c = kk + (lane >> 4) * 8;
          ldmatrix_x4<false>(a[mi], smem_u32(sa + ATile::offset(r, c)));
        } else {
          const int r = kk + (lane & 7) + (lane >> 4) * 8, c = m0 + mi * 16 + ((lane >> 3) & 1) * 8;
          ldmatrix_x4<true>(a[mi], smem_u32(sa + ATile::offset(r, c)));
        }
      }
#pragma unroll
      for (int nj = 0; nj < kNi / 2; ++nj) {
        uint32 r4[4];
        if constexpr (B_KMAJOR) {
          const int r = n0 + nj * 16 + (lane & 7) + (lane >> 4) * 8, c = kk + ((lane >> 3) & 1) * 8;
          ldmatrix_x4<false>(r4, smem_u32(sb + BTile::offset(r, c)));
        } else {
          const int r = kk + (lane & 7) + ((lane >> 3) & 1) * 8, c = n0 + nj * 16 + (lane >> 4) * 8;
          ldmatrix_x4<true>(r4, smem_u32(sb + BTile::offset(r, c)));
        }
        b[2 * nj][0] = r4[0];
        b[2 * nj][1] = r4[1];
        b[2 * nj + 1][0] = r4[2];
        b[2 * nj + 1][1] = r4[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) mma_16816<T>(acc[mi][ni], a[mi], b[ni]);
    }
  }

  __device__ __forceinline__ void drain() {}
};

// The multistage main loop: load(stage, k_tile) issues the cp.asyncs (or synchronous fills) of
// one k tile into a stage, every thread loading and computing, one block barrier per k tile.
// Mma::kInFlight k tiles may still be read by the tensor cores after compute() returns
// (wgmma), so the loop keeps STAGES - 1 - kInFlight tiles loading ahead and never refills a
// stage that an in-flight MMA reads.
template <int STAGES, typename Mma, typename T, typename Load>
__device__ __forceinline__ void multistage_main_loop(Mma& mma, const T* sa, const T* sb, int k_tiles, Load load) {
  constexpr int kAhead = STAGES - 1 - Mma::kInFlight;
  static_assert(kAhead >= 1, "too few pipeline stages for this MMA");
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kAhead - 1>();
    // Stage writes are generic-proxy stores; wgmma reads shared memory through the async proxy.
    if constexpr (Mma::kInFlight > 0) fence_proxy_async_shared();
    __syncthreads();  // tile kt landed for every thread; the stage refilled below is free
    const int next = kt + kAhead;
    if (next < k_tiles) load(next % STAGES, next);
    cp_async_commit();
    mma.compute(sa + (kt % STAGES) * Mma::ATile::kElems, sb + (kt % STAGES) * Mma::BTile::kElems, kt > 0);
  }
  mma.drain();
  cp_async_wait<0>();
  __syncthreads();
}

// Barrier over the block's first THREADS threads, the ones holding accumulators: the whole
// block on the portable path, the MMA warpgroups (not the producer) when warp-specialized.
template <int THREADS>
__device__ __forceinline__ void sync_mma_threads() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
}

// Barrier over the THREADS threads that load stages (Mma::kLoaders), callable inside a load:
// the whole block on the portable path, the producer warpgroup when warp-specialized.
template <int THREADS>
__device__ __forceinline__ void sync_loaders() {
  asm volatile("bar.sync 2, %0;\n" ::"n"(THREADS) : "memory");
}

// Barrier over this thread's MMA warpgroup alone (ids 4 and 5), for warpgroups that never wait
// for each other (persistent_main_loop's LAG).
__device__ __forceinline__ void sync_own_warpgroup() {
  asm volatile("bar.sync %0, 128;\n" ::"r"(4 + static_cast<int>(threadIdx.x / 128)) : "memory");
}

// Barrier 6 starts persistent_main_loop's second MMA warpgroup once the first has done its LAG k
// tiles: the first arrives, the second waits.
__device__ __forceinline__ void stagger_start() { asm volatile("bar.arrive 6, 256;\n" ::: "memory"); }
__device__ __forceinline__ void stagger_wait() { asm volatile("bar.sync 6, 256;\n" ::: "memory"); }

// The MMA threads that share a barrier: all of them, or each warpgroup alone (OwnWarpgroup);
// rank() numbers a thread among them.
template <int THREADS>
struct MmaThreads {
  static constexpr int kThreads = THREADS;
  __device__ __forceinline__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ static void sync() { sync_mma_threads<THREADS>(); }
};
struct OwnWarpgroup {
  static constexpr int kThreads = 128;
  __device__ __forceinline__ static int rank() { return static_cast<int>(threadIdx.x & 127); }
  __device__ __forceinline__ static void sync() { sync_own_warpgroup(); }
};

}  // namespace moejit

namespace moejit {

// Calls f(row, col, v0, v1) for every accumulator pair this thread owns in the n8 blocks
// ni_begin .. ni_end - 1 (all by default; constants where the caller's loop is unrolled, so each
// call keeps only its own accumulators' code); row and col are tile-local, col even.
template <typename Mma, typename F>
__device__ __forceinline__ void for_each_acc_pair(const Mma& mma, F f, int ni_begin = 0, int ni_end = Mma::kNi) {
#pragma unroll
  for (int mi = 0; mi < Mma::kMi; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mma.row(mi, half);
#pragma unroll
      for (int ni = 0; ni < Mma::kNi; ++ni) {
        if (ni >= ni_begin && ni < ni_end) f(r, mma.col(ni), mma.acc[mi][ni][2 * half], mma.acc[mi][ni][2 * half + 1]);
      }
    }
}

}  // namespace moejit

namespace moejit {

// Writes a BM x BN tile staged in shared memory with 16-byte row-contiguous stores, its 8-element
// chunk (r, col) at chunk(r, col); row_dst and cols_valid as StagedTile::write. `thread` numbers
// the calling thread among the THREADS that share the work.
template <int BM, int BN, int THREADS, bool ALIGNED, typename Chunk, typename RowDst>
__device__ __forceinline__ void write_staged_rows(Chunk chunk, RowDst row_dst, int cols_valid,
                                                  int thread = static_cast<int>(threadIdx.x)) {
  constexpr int kChunks = BN / 8;
  for (int idx = thread; idx < BM * kChunks; idx += THREADS) {
    const int r = idx / kChunks, col = (idx % kChunks) * 8;
    auto* dst = row_dst(r);
    if (dst == nullptr || col >= cols_valid) continue;
    const auto* src = chunk(r, col);
    if constexpr (ALIGNED) {
      *reinterpret_cast<uint4*>(dst + col) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int j = 0; j < 8 && col + j < cols_valid; ++j) dst[col + j] = src[j];
    }
  }
}

// An output tile staged in shared memory so that global stores are 16-byte, row-contiguous
// and coalesced instead of the 4-byte scattered stores of the mma fragment layout. Rows
// are padded by 8 elements so the fragment writes (8 rows x 16 bytes per warp) hit distinct
// banks. Reuses the pipeline's shared memory once the main loop is done. THREADS: the MMA
// threads, which alone run epilogues.
template <typename T, int BM, int BN>
struct StagedTile {
  static constexpr int kStride = BN + 8;
  static constexpr int kBytes = BM * kStride * 2;
  static constexpr bool kTmaStore = false;  // written by the MMA threads (SwizzledTile: by TMA)
  T* smem;

  // Two adjacent values of tile row r at columns c, c+1 (c even).
  __device__ __forceinline__ void put(int r, int c, float v0, float v1) const { store_float2(smem + r * kStride + c, v0, v1); }

  // Writes the tile: row_dst(r) is the global address of tile row r's column 0, or nullptr to
  // skip the row; cols_valid columns exist. Call between sync_mma_threads() (after the puts,
  // and before the tile is reused).
  template <int THREADS, bool ALIGNED, typename RowDst>
  __device__ __forceinline__ void write(RowDst row_dst, int cols_valid) const {
    write_staged_rows<BM, BN, THREADS, ALIGNED>([&](int r, int col) { return smem + r * kStride + col; }, row_dst,
                                                cols_valid);
  }
};

// Stages every accumulator of `mma` in `tile` (a StagedTile, or anything with its put and write)
// and writes the tile.
template <int THREADS, bool ALIGNED, typename Tile, typename Mma, typename RowDst>
__device__ __forceinline__ void store_accumulators(const Tile& tile, const Mma& mma, RowDst row_dst, int cols_valid) {
  sync_mma_threads<THREADS>();
  for_each_acc_pair(mma, [&](int r, int c, float v0, float v1) { tile.put(r, c, v0, v1); });
  sync_mma_threads<THREADS>();
  tile.template write<THREADS, ALIGNED>(row_dst, cols_valid);
}

}  // namespace moejit
